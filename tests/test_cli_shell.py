"""The command line as a thin shell over the jobs: options from the config dataclasses, ``--config`` YAML,
ParameterError mapped to its option through the field, and no library module importing the CLI."""

import ast
import dataclasses
from pathlib import Path

import pytest

from hf_calibration import cli
from hf_calibration.cli import main, parse_command
from hf_calibration.errors import ParameterError

PACKAGE = Path(cli.__file__).parent


def _exit_code(argv):
    try:
        return main(argv)
    except SystemExit as exit_:  # argparse's usage errors exit from inside the parser
        return exit_.code


@pytest.mark.parametrize("reason", ["must be ≥ 2, got {limit_per_domain} 1", "limit_per_domain is reworded: 1"])
def test_parameter_error_names_the_option_of_its_field(monkeypatch, tmp_path, capsys, reason):
    """The option comes from err.parameter and the field, whatever the message says."""

    def job(config, secl):
        raise ParameterError("limit_per_domain", 1, reason)

    monkeypatch.setitem(cli.COMMANDS, "secl", dataclasses.replace(cli.COMMANDS["secl"], job=job))
    assert main(["secl", "--output-dir", str(tmp_path / "o")]) == 2
    expected = reason.replace("{limit_per_domain}", "--limit-per-domain")
    assert capsys.readouterr().err == f"hf-calibration: error: --limit-per-domain: {expected}\n"


def test_parameter_of_no_field_keeps_its_name(monkeypatch, tmp_path, capsys):
    def job(config):
        raise ParameterError("records", None, "logit calibrators need the same number of options")

    monkeypatch.setitem(cli.COMMANDS, "fit-posthoc", dataclasses.replace(cli.COMMANDS["fit-posthoc"], job=job))
    assert main(["fit-posthoc", "--method", "platt", "--predictions", "p", "--output", str(tmp_path / "c")]) == 2
    assert capsys.readouterr().err == "hf-calibration: error: records: logit calibrators need the same number of options\n"


def test_options_are_the_config_fields_with_dashes():
    command, (job, secl) = parse_command(["secl", "--output-dir", "o", "--limit-per-domain", "3", "--burst-size", "7",
                                          "--ph_threshold", "5", "--target-modules", "q_proj", "k_proj"])
    assert command == "secl" and job.limit_per_domain == 3 and job.output_dir == "o"
    assert (secl.burst_size, secl.ph_threshold, secl.target_modules) == (7, 5.0, ["q_proj", "k_proj"])
    help_text = cli.command_parser("secl").format_help()
    assert "--limit-per-domain LIMIT_PER_DOMAIN, --limit_per_domain" in help_text  # the dashed spelling first


def test_config_file(tmp_path, capsys):
    config = tmp_path / "evaluate.yaml"
    config.write_text(f"model: some/model\nlimit: 4\nn_resamples: 20\noutput_dir: {tmp_path / 'o'}\n")
    _, (evaluate,) = parse_command(["evaluate", "--config", str(config)])
    assert (evaluate.model, evaluate.limit, evaluate.n_resamples, evaluate.output_dir) == (
        "some/model", 4, 20, str(tmp_path / "o"))
    _, (evaluate,) = parse_command(["evaluate", "--config", str(config), "--limit", "6"])  # the command line wins
    assert evaluate.limit == 6
    config.write_text("limit: 4\nlimitt: 5\n")
    assert _exit_code(["evaluate", "--config", str(config), "--output-dir", "o"]) == 2
    err = capsys.readouterr().err
    assert err == "hf-calibration: error: --config: unknown fields limitt\n", err
    config.write_text("limit: 0\n")  # a value the config refuses, from the file: the file and the field named
    assert _exit_code(["evaluate", "--config", str(config), "--output-dir", "o"]) == 2
    assert capsys.readouterr().err == (f"hf-calibration: error: --config: {str(config)!r}: limit: must be a positive "
                                       "integer, got 0\n")
    assert _exit_code(["evaluate", "--config", str(tmp_path / "none.yaml")]) == 2
    assert "--config" in capsys.readouterr().err


def test_config_file_runs_a_job(tiny_model, tiny_tokenizer, tmp_path, capsys):
    model_dir = tmp_path / "tiny"
    tiny_model.save_pretrained(model_dir)
    tiny_tokenizer.save_pretrained(model_dir)
    config = tmp_path / "diagnose.yaml"
    config.write_text(f"model: {model_dir}\ndataset: halueval_qa_lm\nlimit: 4\nn_resamples: 20\n"
                      f"output_dir: {tmp_path / 'd'}\n")
    assert main(["diagnose", "--config", str(config)]) == 0
    assert "verdict:" in capsys.readouterr().out and (tmp_path / "d" / "diagnosis.json").is_file()


# moved from tests/calm/test_cli.py with calm/cli.py: `calm` parses (CALMJobConfig, CALMConfig)


def test_calm_config_fields_become_options(tmp_path):
    _, (job, training) = parse_command(["calm", "--output-dir", str(tmp_path), "--method", "iterate", "--inner-steps",
                                        "3", "--eta", "0.25", "--train-subjects", "stem", "--n-train", "8",
                                        "--bf16", "false"])
    assert (training.method, training.inner_steps, training.eta, training.bf16) == ("iterate", 3, 0.25, False)
    assert job.n_train == 8 and job.train_subjects == "stem"


@pytest.mark.parametrize("argv, fragment", [
    (["--eta", "2"], "--eta: must lie in (0, 1], got 2.0"),  # a CALMConfig check: named through the field too
    (["--cft-num-bins", "0"], "--cft-num-bins: must be a positive integer, got 0"),
    (["--train-subjects", "astrology"], "--train-subjects"),
    (["--n-train", "0"], "--n-train"),
])
def test_calm_bad_values_name_the_option(argv, fragment, tmp_path, capsys):
    assert main(["calm", "--output-dir", str(tmp_path / "o"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hf-calibration: error: ") and fragment in err, err
    assert not (tmp_path / "o").exists()


def _imports(tree) -> list[tuple[str, str | None]]:
    """(module, name) of every import in ``tree``; name None for ``import module``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found += [("." * node.level + (node.module or ""), alias.name) for alias in node.names]
    return found


def test_no_library_module_imports_the_cli_or_a_main():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "cli.py":
            continue
        for module, name in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            if module.endswith("cli") or name in ("cli", "main") or (name or "").endswith("_main"):
                offenders.append(f"{path.relative_to(PACKAGE)}: {module} {name}")
    assert not offenders, offenders
    assert not [p for p in PACKAGE.rglob("*.py") if p.name in ("cli.py", "_cli_args.py", "experiments.py")
                and p != PACKAGE / "cli.py"]


def test_config_file_with_equals_sign(tmp_path, capsys):
    """--config=FILE is read like --config FILE (it was silently ignored, and the job ran with the defaults)."""
    config = tmp_path / "c.yaml"
    config.write_text("no_such_field: 1\n")
    assert _exit_code(["evaluate", "--output-dir", str(tmp_path / "o"), f"--config={config}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--config: unknown fields no_such_field" in err, err
    assert not (tmp_path / "o").exists()


def test_every_command_help_formats():
    """argparse %-formats each option's help: a bare "%" in a help text (e.g. "4 %") breaks --help of the whole
    command with a TypeError."""
    from hf_calibration import cli

    assert {"secl", "secl-serve", "evaluate"} <= set(cli.COMMANDS)
    for name in cli.COMMANDS:
        assert cli.command_parser(name).format_help(), name
    assert cli.build_parser().format_help()
