"""`hf-calibration evaluate` on the user's own CSV with a column mapping and the ECE options, end to end on the
tiny model, and one-line errors naming the option for bad values."""

import json

import numpy as np
import pytest

from hf_calibration.cli import main
from hf_calibration.metrics import expected_calibration_error

QUIZ = "Question,A,B,C,D,Answer\n" + "".join(f"{i} + 1 = ?,{i},{i + 1},{i + 2},{i + 3},B\n" for i in range(10))
MAPPING = ["--question-column", "Question", "--choices-column", "A,B,C,D", "--answer-column", "Answer"]


@pytest.fixture()
def no_model_load(monkeypatch):
    """Bad input must be rejected before a model is loaded: loading fails the test (also through
    ``open_backend``, which imports ``load_model`` from ``modeling.loading``)."""
    import hf_calibration.modeling
    import hf_calibration.modeling.loading

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the bad input was rejected")

    monkeypatch.setattr(hf_calibration.modeling, "load_model", refuse)
    monkeypatch.setattr(hf_calibration.modeling.loading, "load_model", refuse)


@pytest.fixture()
def quiz(tmp_path):
    path = tmp_path / "quiz.csv"
    path.write_text(QUIZ, encoding="utf-8")
    return str(path)


def test_evaluate_own_csv_with_quantile_bins(tiny_model_dir, tmp_path, quiz, capsys):
    out = tmp_path / "run"
    argv = ["evaluate", "--model", str(tiny_model_dir), "--dataset", quiz, *MAPPING, "--limit", "10",
            "--n-bins", "10", "--binning", "quantile", "--n-resamples", "20", "--output-dir", str(out)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "conf-ECE: 10 quantile bins, l1" in captured.out and "warning" not in captured.err
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["run"]["dataset"] == quiz and metrics["run"]["choices_column"] == "A,B,C,D"
    assert (metrics["run"]["n_bins"], metrics["run"]["binning"], metrics["run"]["norm"]) == (10, "quantile", "l1")
    records = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert [r["answer"] for r in records] == [1] * 10  # every answer is the letter B
    correct = np.array([r["correct"] for r in records], dtype=int)
    conf = np.array([r["confidence"] for r in records])
    # the same float64 confidences and bins: equal up to the summation order of 10 terms ≤ 1 (10 · 2.2e-16)
    assert metrics["signals"]["option_probability"]["conf_ece"]["value"] == pytest.approx(
        expected_calibration_error(correct, conf, n_bins=10, binning="quantile"), abs=1e-14)


def _exit_code(argv) -> int:
    """main's return value, or the code of the SystemExit a usage error (argparse) raises."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


def _fails_with_one_line(argv, capsys, *fragments):
    assert _exit_code(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hf-calibration: error:") and "Traceback" not in err, err
    assert all(f in err for f in fragments), err


@pytest.mark.parametrize("args, fragments", [
    (["--binning", "equal"], ["--binning", "equal"]),
    (["--norm", "l3"], ["--norm", "l3"]),
    (["--n-bins", "0"], ["--n-bins", "0"]),
    (["--answer-column", "Gold"], ["--answer-column", "'Gold'"]),
    (["--choices-column", "A,B,E"], ["--choices-column", "'E'"]),
    (["--split", "test"], ["--split", "--dataset"]),
])
def test_bad_options_name_themselves(tiny_model_dir, tmp_path, quiz, capsys, no_model_load, args, fragments):
    argv = ["evaluate", "--model", str(tiny_model_dir), "--dataset", quiz, *MAPPING, "--limit", "10",
            "--output-dir", str(tmp_path / "out"), *args]
    _fails_with_one_line(argv, capsys, *fragments)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("dataset, fragments", [
    ("someone/their-quiz", ["--dataset", "'someone/their-quiz'", "offline"]),  # no network retries either
    ("quiz.txt", ["--dataset", "unknown extension '.txt'"]),
    ("nowhere.csv", ["--dataset", "is not a file"]),
])
def test_bad_datasets_name_the_option(tiny_model_dir, tmp_path, capsys, no_model_load, monkeypatch, dataset, fragments):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "quiz.txt").write_text(QUIZ, encoding="utf-8")
    argv = ["evaluate", "--model", str(tiny_model_dir), "--dataset", dataset, *MAPPING, "--output-dir", "out"]
    _fails_with_one_line(argv, capsys, *fragments)


def test_own_data_below_the_default_limit_warns_about_no_limit(tiny_model_dir, tmp_path, quiz, capsys):
    """Before: "--limit 500: only 10 questions" for a --limit the user never gave; a given one still warns."""
    argv = ["evaluate", "--model", str(tiny_model_dir), "--dataset", quiz, *MAPPING, "--n-resamples", "10"]
    assert main([*argv, "--output-dir", str(tmp_path / "a")]) == 0
    assert "--limit" not in capsys.readouterr().err
    assert main([*argv, "--output-dir", str(tmp_path / "b"), "--limit", "50"]) == 0
    assert "--limit 50: only 10 questions" in capsys.readouterr().err


@pytest.mark.parametrize("option", ["--subjects"])
def test_empty_subjects_is_named_as_given(option, capsys):
    """Before: "--subjects: [] names no subject"."""
    assert main(["evaluate", "--output-dir", "o", option, ""]) == 2
    assert capsys.readouterr().err == f"hf-calibration: error: {option}: must not be empty, got ''\n"


def test_diagnose_refuses_more_bins_than_the_file_has_questions_before_the_model_loads(tiny_model_dir, tmp_path, quiz,
                                                                                      capsys, no_model_load):
    """--n-bins 50 passes the check against --limit (200, the default), but the file has 10 questions (at most
    max(10, 15) = 15 bins: docs/methods.md). Before: diagnose loaded the model and scored every question first."""
    out = tmp_path / "out"
    argv = ["diagnose", "--model", str(tiny_model_dir), "--dataset", quiz, *MAPPING, "--n-bins", "50",
            "--output-dir", str(out)]
    _fails_with_one_line(argv, capsys, "--n-bins: must be ≤ 15 for 10 questions", "got 50")
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["quiz.csv"]
