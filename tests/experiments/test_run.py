"""``run_experiment`` called directly, without the command line, on the tiny model of tests/tiny.py."""

import json

import pytest

from hf_calibration.errors import ParameterError

from experiments.calm_config import CALMExperimentConfig
from experiments.run import ExperimentConfig, run_experiment


def test_run_experiment_passes_results_in_memory(tiny_model_dir, tmp_path, monkeypatch):
    """A fresh run reads no file it wrote: the table comes from the sub-runs' results."""
    from pathlib import Path

    out = tmp_path / "exp"
    read = []
    real = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **kw: read.append(self) or real(self, *a, **kw))
    config = ExperimentConfig(name="diagnose", models=str(tiny_model_dir), datasets="mmlu", limit=4, n_resamples=20,
                              output_dir=str(out))
    result = run_experiment(config, progress=False)
    assert not [p for p in read if out in p.parents], read
    alias = tiny_model_dir.name
    on_disk = json.loads((out / alias / "mmlu" / "diagnosis.json").read_text())
    assert result.metrics["results"][alias]["mmlu"]["signals"] == on_disk["signals"]
    assert set(result.paths) == {"metrics.json", "table.md", f"{alias}/mmlu"}
    assert result.run["limit"] == {"mmlu": 4} and "ΔAUROC" in result.table


@pytest.mark.parametrize("kwargs, calm, parameter", [
    ({"name": "calm", "models": "a,b"}, None, "models"),
    ({"name": "calm", "limit": 5}, None, "limit"),
    ({"name": "secl", "datasets": "gsm8k", "limit": 1}, None, "limit"),  # SECL's limit_per_domain, renamed
    ({"name": "diagnose", "limit_open": 3, "datasets": "mmlu"}, None, "limit_open"),
    ({"name": "diagnose"}, CALMExperimentConfig(), "calm"),
])
def test_experiment_checks_name_its_fields(kwargs, calm, parameter, tmp_path, no_model_load):
    with pytest.raises(ParameterError) as err:
        run_experiment(ExperimentConfig(output_dir=str(tmp_path / "x"), **kwargs), calm)
    assert err.value.parameter == parameter
    assert not (tmp_path / "x").exists()


def _options(help_text: str) -> set:
    import re

    return set(re.findall(r"--[a-z][a-z-]*", help_text))


def test_each_experiment_help_lists_only_the_options_it_accepts():
    """``python -m experiments NAME --help`` lists an option only where NAME reads it (``hf-calibration experiment
    calm --help`` listed --limit, --limit-open and --workers, which calm rejects; secl's listed --limit-open)."""
    from experiments.cli import build_parser

    helps = {name: _options(p.format_help()) for name, p in build_parser().commands.items()}
    assert {"--limit", "--limit-open", "--workers"}.isdisjoint(helps["calm"])
    assert {"--n-train", "--open-ended", "--seeds", "--batch-size", "--models"} <= helps["calm"]
    assert "--limit-open" not in helps["secl"] and {"--limit", "--workers"} <= helps["secl"]
    assert "--workers" not in helps["diagnose"] and {"--limit", "--limit-open", "--batch-size"} <= helps["diagnose"]
    # secl's stream job takes no scoring batch size
    assert "--batch-size" not in helps["secl"]
    for name, parser in build_parser().commands.items():  # every help formats (a bare "%" would break it)
        assert parser.format_help(), name


@pytest.mark.parametrize("argv, option", [(["calm", "--limit", "5"], "--limit"),
                                          (["secl", "--limit-open", "3"], "--limit-open"),
                                          (["diagnose", "--workers", "2"], "--workers")])
def test_an_option_the_experiment_does_not_list_is_a_usage_error(argv, option, tmp_path, capsys):
    from experiments.cli import main

    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--output-dir", str(tmp_path / "x")])
    err = capsys.readouterr().err.strip().splitlines()
    # the CLI's wording for an option a command does not take (one line, the option named, maybe a suggestion)
    assert exit_.value.code == 2 and len(err) == 1 and err[0].startswith(f"experiments: error: {option}: unknown option"), err
    assert not (tmp_path / "x").exists()


def test_python_dash_m_experiments_runs():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).parents[2]
    out = subprocess.run([sys.executable, "-m", "experiments", "calm", "--help"], cwd=root, capture_output=True,
                         text=True, check=True).stdout
    assert out.startswith("usage: python -m experiments calm") and "--n-train" in out


def _documented_commands():
    """Every ``python -m experiments NAME …`` command in README.md and docs/*.md, as argument lists (continuation
    lines joined, environment assignments and the interpreter path dropped)."""
    import re
    import shlex
    from pathlib import Path

    root = Path(__file__).parents[2]
    commands = []
    for path in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        text = path.read_text(encoding="utf-8").replace("\\\n", " ")
        for line in text.splitlines():
            match = re.search(r"python -m experiments (diagnose|secl|calm)\b([^`#]*)", line)
            if match and "-m experiments NAME" not in line:
                commands.append((path.name, [match.group(1), *shlex.split(match.group(2))]))
    return commands


def test_every_documented_experiment_command_parses():
    """The commands of the recorded results still parse into valid configs (their runs are the smoke tests of
    tests/experiments/test_experiments.py, at tiny sizes)."""
    from experiments.cli import build_parser

    commands = _documented_commands()
    assert {argv[0] for _, argv in commands} == {"diagnose", "secl", "calm"}
    parsers = build_parser().commands
    for source, argv in commands:
        configs = parsers[argv[0]].parse(argv[1:])
        assert configs[0].name == argv[0], (source, argv)


def test_every_documented_study_command_parses(tmp_path):
    """``python -m experiments.secl_learnability …`` and ``experiments.secl_schedule …`` in the docs parse with
    their scripts' own parsers (options renamed since would be a usage error, exit 2)."""
    import re
    import shlex
    from pathlib import Path

    from experiments import secl_learnability, secl_schedule

    root = Path(__file__).parents[2]
    parsers = {"secl_learnability": secl_learnability.parse_args, "secl_schedule": secl_schedule.parse_args}
    seen = set()
    for path in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        text = path.read_text(encoding="utf-8").replace("\\\n", " ")
        for match in re.finditer(r"python -m experiments\.(secl_learnability|secl_schedule)\b([^`#\n]*)", text):
            argv = shlex.split(match.group(2))
            parsers[match.group(1)](argv)
            seen.add(match.group(1))
    assert seen == set(parsers)
