"""Issue 52: what a new user's bad input must meet (one line naming the option and the value, exit 2, nothing
already saved lost), on the CLI."""

import json
import os

import numpy as np
import pytest

from hf_calibration.cli import main

QUIZ = os.path.join(os.path.dirname(__file__), "..", "examples", "data", "quiz.csv")  # 20 questions, 4 options


@pytest.fixture()
def no_model_load(monkeypatch):
    """Bad input must be rejected before the model is loaded: loading fails the test."""
    import hf_calibration.modeling

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the bad input was rejected")

    monkeypatch.setattr(hf_calibration.modeling, "load_model", refuse)


def _code(argv):
    try:
        return main(argv)
    except SystemExit as exit_:  # argparse's errors exit from inside parse_args
        return exit_.code


def _one_line(capsys, *fragments):
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hf-calibration: error:") and "Traceback" not in err, err
    assert all(f in err for f in fragments), err
    return err


# ------------------------------------------------------------------------------------------ 1. --n-bins bounded


def test_n_bins_above_the_limit_is_refused_before_the_model_loads(tiny_model_dir, tmp_path, capsys, no_model_load):
    out = tmp_path / "o"
    assert _code(["evaluate", "--model", str(tiny_model_dir), "--limit", "20", "--n-bins", "1000000",
                  "--output-dir", str(out)]) == 2
    _one_line(capsys, "--n-bins", "1000000", "≤ 20")
    assert not out.exists()


def test_n_bins_above_the_questions_loaded_is_refused_before_the_model_loads(tiny_model_dir, tmp_path, capsys,
                                                                            no_model_load):
    # --limit 500 allows 500 bins, but the file holds 20 questions: refused once they are loaded, no model read
    out = tmp_path / "o"
    assert _code(["evaluate", "--model", str(tiny_model_dir), "--dataset", QUIZ, "--choices-column", "A,B,C,D",
                  "--limit", "500", "--n-bins", "100", "--output-dir", str(out)]) == 2
    _one_line(capsys, "--n-bins", "100", "≤ 20", "20 questions")
    assert not out.exists()


# ------------------------------------------------------------------------------ 2. calm owns its output folder


def _evaluate(model_dir, out):
    return main(["evaluate", "--model", str(model_dir), "--limit", "4", "--n-resamples", "20", "--output-dir", str(out)])


def test_calm_refuses_an_evaluate_folder_before_the_model_loads(tiny_model_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "quiz"
    assert _evaluate(tiny_model_dir, out) == 0
    saved = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    import hf_calibration.modeling

    monkeypatch.setattr(hf_calibration.modeling, "load_model", lambda *a, **k: pytest.fail("model loaded"))
    assert _code(["calm", "--model", str(tiny_model_dir), "--output-dir", str(out)]) == 2
    _one_line(capsys, "--output-dir", str(out), "evaluate", "--overwrite")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == saved


def test_calm_refuses_an_adapter_saved_without_the_marker(tiny_model_dir, tmp_path, capsys, no_model_load):
    # what the README's Python block leaves: CALMTrainer.save_model writes the adapter, no marker of a CLI job
    out = tmp_path / "calm-smollm2"
    out.mkdir()
    (out / "adapter_model.safetensors").write_bytes(b"the Python block's adapter")
    assert _code(["calm", "--model", str(tiny_model_dir), "--output-dir", str(out)]) == 2
    _one_line(capsys, "--output-dir", "adapter_model.safetensors", "--overwrite")
    assert (out / "adapter_model.safetensors").read_bytes() == b"the Python block's adapter"


def test_calm_marks_its_folder_and_evaluate_then_refuses_it(tiny_model_dir, tmp_path, capsys):
    from hf_calibration.calm import CALMConfig
    from hf_calibration.jobs import CALMJobConfig, run_calm
    from hf_calibration.outputs import read_manifest

    out = tmp_path / "c"
    config = CALMJobConfig(model=str(tiny_model_dir), train_dataset="halueval_qa_lm", n_train=4, n_calibration=4,
                           n_eval=0, lora_r=2)
    training = CALMConfig(output_dir=str(out), max_steps=1, per_device_train_batch_size=2, num_options=2,
                          bf16=False, activation_checkpointing=False, report_to="none", save_strategy="no",
                          use_cpu=True, disable_tqdm=True, max_length=None, dataset_num_proc=None)
    run_calm(config, training)
    manifest = read_manifest(out)
    on_disk = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and p.name != ".hf-calibration.json")
    assert manifest["job"] == "calm" and manifest["files"] == on_disk
    assert "logit_adjustment.safetensors" in manifest["files"]
    adapter = (out / "logit_adjustment.safetensors").read_bytes()
    capsys.readouterr()
    assert _evaluate(tiny_model_dir, out) == 2
    _one_line(capsys, "--output-dir", "holds the results of calm")
    assert (out / "logit_adjustment.safetensors").read_bytes() == adapter


# ---------------------------------------------------------------------- 6. duplicate options, unknown options


@pytest.mark.parametrize("argv, fragment", [(["--bogus"], "--bogus: unknown option"),
                                            (["--bogus", "evaluate"], "--bogus: unknown option"),
                                            (["--verison"], "did you mean --version?"),
                                            (["-q"], "-q: unknown option")])
def test_an_unknown_option_before_the_command_is_named(argv, fragment, capsys):
    assert _code(argv) == 2
    err = _one_line(capsys, fragment)
    assert "COMMAND: required" not in err


def test_duplicate_options_warn_once_naming_the_column(tiny_model_dir, tmp_path, capsys):
    data = tmp_path / "dup.csv"
    data.write_text("question,A,B,C,D,answer\n"
                    "Capital of France?,Paris,Rome,paris ,Berlin,A\n"       # Paris twice (case and space apart)
                    "2 + 2?,3,4,5,6,B\n"
                    "Largest planet?,Jupiter,Mars,Venus,Jupiter,A\n"
                    "Water boils at?,90,100,110,120,B\n")
    out = tmp_path / "o"
    assert main(["evaluate", "--model", str(tiny_model_dir), "--dataset", str(data), "--choices-column", "A,B,C,D",
                 "--limit", "4", "--n-resamples", "20", "--output-dir", str(out)]) == 0
    err = capsys.readouterr().err
    warned = [line for line in err.splitlines() if "warning" in line]
    assert len(warned) == 1, err
    assert "--choices-column" in warned[0] and "2 row(s)" in warned[0] and "row 0, 'Paris' and 'paris '" in warned[0]
    assert (out / "metrics.json").is_file()  # a warning: the run goes on
