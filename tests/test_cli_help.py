"""What a new user meets first: help that answers at once and is about the user's task, one wording for errors,
``--version``, ``calm --help`` without transformers' ~120 training options, Ctrl-C as one line."""

import json
import subprocess
import sys

import pytest

from hf_calibration import __version__, cli
from hf_calibration.cli import main

HEAVY = ("torch", "transformers.trainer", "transformers.modeling_utils", "datasets", "matplotlib", "trl.trainer",
         "peft", "sklearn")


def _modules_after(argv) -> set:
    """The heavy modules a fresh interpreter holds after running ``hf-calibration *argv`` (help exits)."""
    code = ("import json, sys\nfrom hf_calibration.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n"
            "    pass\nprint(json.dumps(sorted(m for m in sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True)
    loaded = set(json.loads(done.stdout.splitlines()[-1]))
    return {h for h in HEAVY if h in loaded}


@pytest.mark.parametrize("argv", [["--help"], ["evalute"], ["--version"], ["report", "--help"],
                                  ["lm-eval-import", "--help"], ["evaluate", "--help"], ["fit-posthoc", "--help"]])
def test_help_and_typos_load_no_heavy_stack(argv):
    """The top-level help, a mistyped command, and the help of the commands that need no model before they run
    import neither torch nor transformers' trainer, datasets, matplotlib or TRL (14 s before, on a busy machine)."""
    allowed = {"datasets"} if argv[0] == "evaluate" else set()  # evaluate's config checks a dataset's columns
    assert _modules_after(argv) - allowed == set()


def test_top_level_help_is_for_users(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "Calibrated confidence" in out and "examples:" in out and "COMMAND --help" in out
    assert "``" not in out and "hf_calibration.jobs" not in out  # not the module's developer docstring


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"hf-calibration {__version__}"


def test_calm_help_shows_calm_options_and_says_how_to_see_the_rest(capsys):
    text = cli.command_parser("calm").format_help()
    assert "--inner-steps" in text and "--learning-rate" in text and "--output-dir" in text
    assert "--help-all" in text and "--adafactor" not in text and "--ddp-timeout" not in text
    assert text.count("\n") < 400, text.count("\n")  # 979 lines before
    with pytest.raises(SystemExit):
        main(["calm", "--help-all"])
    assert "--ddp-timeout" in capsys.readouterr().out


def test_calm_output_dir_is_required(tmp_path, capsys, monkeypatch):
    """Without it TrainingArguments trained into ./trainer_output, though the help said required."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(["calm", "--n-train", "4"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == "hf-calibration: error: --output-dir: required\n"
    assert not (tmp_path / "trainer_output").exists()


@pytest.mark.parametrize("command", ["evaluate", "fit-posthoc", "lm-eval-import", "report"])
def test_required_options_show_no_default(command):
    text = cli.command_parser(command).format_help()
    assert "(default: None)" not in text and "(default: MISSING)" not in text


@pytest.mark.parametrize("command", ["evaluate", "report", "lm-eval-import", "fit-posthoc", "diagnose"])
def test_config_help_example_is_the_commands_own(command):
    """Every --config help showed ``limit_per_domain: 5``, an option of secl only."""
    parser = cli.command_parser(command)
    help_ = next(a.help for a in parser._actions if a.dest == "config")
    fields = {a.dest for a in parser._actions}
    example = help_.split("(")[1].split(")")[0]
    assert all(part.split(":")[0].strip() in fields for part in example.split(", ")), help_


@pytest.mark.parametrize("argv, expected", [
    (["evalute"], "hf-calibration: error: unknown command 'evalute' (choose from evaluate, fit-posthoc, calm, "
                  "diagnose, secl, secl-serve, report, lm-eval-import, serve)\n"),
    (["fit-posthoc", "--method", "platt", "--predictions", "p", "--output", "o", "--outptu", "x"],
     "hf-calibration: error: --outptu: unknown option (did you mean --output?)\n"),
    (["fit-posthoc", "--method", "plat", "--predictions", "p", "--output", "o"],
     "hf-calibration: error: --method: invalid choice: 'plat' (choose from 'histogram', 'isotonic', 'platt', "
     "'temperature', 'vector')\n"),
    (["report", "d", "--n-bins", "x"], "hf-calibration: error: --n-bins: invalid int value: 'x'\n"),
])
def test_usage_errors_are_one_line_in_one_wording(argv, expected, capsys):
    """"--x: …", never argparse's "argument --x/--x_y: …"."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and capsys.readouterr().err == expected


def test_no_greater_equal_ascii_in_messages():
    assert cli._one_line("argument --limit/--limit_x: must be >= 2") == "--limit: must be ≥ 2"


def test_config_file_type_error_names_the_file(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("limit: many\n")
    with pytest.raises(SystemExit):
        main(["evaluate", "--output-dir", str(tmp_path / "o"), "--config", str(config)])
    err = capsys.readouterr().err
    assert err == f"hf-calibration: error: --config: {str(config)!r}: limit: invalid int value: 'many'\n"
    config.write_text("limit: [1, 2]\n")
    with pytest.raises(SystemExit):
        main(["evaluate", "--output-dir", str(tmp_path / "o"), "--config", str(config)])
    assert str(config) in capsys.readouterr().err
    # the same option on the command line is the command line's error, not the file's
    assert main(["evaluate", "--output-dir", str(tmp_path / "o"), "--config", str(config), "--limit", "0"]) == 2
    assert capsys.readouterr().err == "hf-calibration: error: --limit: must be a positive integer, got 0\n"


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys):
    import dataclasses

    def job(*configs):
        raise KeyboardInterrupt

    monkeypatch.setitem(cli.COMMANDS, "fit-posthoc", dataclasses.replace(cli.COMMANDS["fit-posthoc"], job=job))
    assert main(["fit-posthoc", "--method", "platt", "--predictions", "p", "--output", "o"]) == 130
    assert capsys.readouterr().err == "hf-calibration: interrupted\n"
    # a command that keeps its finished questions says that running it again continues
    monkeypatch.setitem(cli.COMMANDS, "secl", dataclasses.replace(cli.COMMANDS["secl"], job=job))
    assert main(["secl", "--output-dir", "o"]) == 130
    assert capsys.readouterr().err == "hf-calibration: interrupted; the same command resumes where it stopped\n"


def test_fit_posthoc_methods_are_the_calibrators():
    """fit-posthoc lists its methods without importing posthoc (torch, scikit-learn): the same names."""
    from hf_calibration.jobs.fit_posthoc import METHODS
    from hf_calibration.posthoc import CALIBRATORS

    assert sorted(METHODS) == sorted(CALIBRATORS)


@pytest.mark.parametrize("command", ["secl", "calm", "evaluate", "diagnose"])
def test_help_prints_percent_signs_literally(command):
    """argparse %-formats help strings: a help holding "−44 % and …" printed the whole argparse action as a dict
    (``{'option_strings': …}``). Every "%" a field's help holds is printed as written."""
    import argparse

    text = cli.command_parser(command).format_help()
    assert "option_strings" not in text
    parser = argparse.ArgumentParser(prog="x")
    action = parser.add_argument("--cut", help="a cut of −44 % and a 95%% interval, default %(default)s", default=3)
    action.help = cli._percent_escaped(action.help)
    assert "a cut of −44 % and a 95% interval, default 3" in " ".join(parser.format_help().split())


def test_every_docs_section_an_option_help_cites_exists():
    """An option's help that cites "docs/<file>.md, '<section>'" names a heading of that file (the replay_scope help
    cited a section that had not been written)."""
    import re
    from pathlib import Path

    from hf_calibration.cli import COMMANDS, command_parser

    root = Path(__file__).resolve().parents[1]
    cited = set()
    for command in COMMANDS:
        for action in command_parser(command)._actions:
            text = " ".join((action.help or "").split())
            cited |= set(re.findall(r"(docs/[\w/]+\.md), '([^']+)'", text))
    assert ("docs/methods.md", "SECL: consolidation") in cited  # the scan sees the helps
    for doc, section in sorted(cited):
        headings = [line.lower() for line in (root / doc).read_text(encoding="utf-8").splitlines()
                    if line.startswith("#")]
        assert any(section.lower() in h for h in headings), f"{doc}: no heading with {section!r}"


@pytest.mark.parametrize("command", ["secl", "evaluate", "diagnose"])
def test_bool_options_show_the_values_they_take(command):
    """HfArgumentParser shows a bool field as "--overwrite [OVERWRITE]"; the help says what goes there."""
    import re

    text = cli.command_parser(command).format_help()
    assert "--overwrite [true|false]" in text and not re.search(r"\[[A-Z_]+\]", text)


def test_scripts_outside_the_cli_print_one_line_errors(capsys):
    """Every script of experiments/ and examples/ builds its parser with ``script_parser`` (the CLI's one-line
    errors, exit 2), not a bare argparse parser that prints its usage first."""
    from pathlib import Path

    from hf_calibration.cli import script_parser

    root = Path(__file__).resolve().parents[1]
    bare = [str(p.relative_to(root)) for folder in ("experiments", "examples")
            for p in sorted((root / folder).glob("*.py")) if "argparse.ArgumentParser(" in p.read_text(encoding="utf-8")]
    assert not bare, f"scripts with a bare argparse parser: {bare}"
    parser = script_parser("python -m experiments.x", "x")
    parser.add_argument("--n-resamples", type=int, default=1)
    with pytest.raises(SystemExit) as err:
        parser.parse_args(["--n-resamples", "many"])
    printed = capsys.readouterr().err
    assert err.value.code == 2 and printed == "python -m experiments.x: error: --n-resamples: invalid int value: 'many'\n"
    with pytest.raises(SystemExit):
        parser.parse_args(["--n-res", "2"])  # no abbreviations
