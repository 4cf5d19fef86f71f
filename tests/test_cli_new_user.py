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
