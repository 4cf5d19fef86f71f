"""examples/secl_target_study.py (issue 16 item 4) on the tiny model: the offline teacher rows agree with the
P(True)Norm the baseline pass read through the model, every SECL pass keeps the baseline's answers, and the
choice rule follows the paired intervals."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from hf_calibration.metrics import brier_score, expected_calibration_error

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "secl_target_study.py"


def load_study():
    spec = importlib.util.spec_from_file_location("secl_target_study", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_target_study_on_the_tiny_model(tiny_model_dir, tmp_path, capsys):
    study = load_study()
    out = tmp_path / "t"
    argv = ["--model", str(tiny_model_dir), "--stream", "mmlu:stem", "--per-domain", "6", "--burst-size", "4",
            "--variants", "tau_n=0.1", "--n-resamples", "50", "--output-dir", str(out)]
    study.main(argv)
    report = json.loads((out / "targets.json").read_text())
    records = [json.loads(line) for line in (out / "baseline.jsonl").read_text().splitlines()[1:]]
    y = np.array([r["correct"] for r in records], dtype=int)
    # SECLConfig's τ_n offline is the P(True)Norm the model read in the baseline pass
    from hf_calibration.secl.config import SECLConfig

    at_default = next(t for t in report["teacher"] if t["tau_n"] == SECLConfig().tau_n)
    norm = np.array([r["norm_p_true"] for r in records])
    assert at_default["brier"] == pytest.approx(float(np.mean((norm - y) ** 2)), abs=1e-9)
    assert at_default["ece"] == pytest.approx(float(expected_calibration_error(y, norm)), abs=1e-9)
    # a larger τ_n pulls c* towards 1/K (4 options here)
    means = [t["mean_confidence"] for t in report["teacher"]]
    assert abs(means[-1] - 0.25) < abs(means[0] - 0.25)
    assert set(report["passes"]) == {"defaults", "tau_n=0.1"}
    for row in report["passes"].values():
        assert row["answers_as_baseline"] and row["counters"]["burst_questions"] == 4
    d = report["passes"]["tau_n=0.1"]["delta_brier_vs_defaults"]
    conf = {n: np.array(r["confidence"]) for n, r in report["passes"].items()}
    assert d["value"] == pytest.approx(brier_score(y, conf["tau_n=0.1"]) - brier_score(y, conf["defaults"]), abs=1e-12)
    assert report["chosen"] == ("tau_n=0.1" if d["high"] < 0 else "defaults")
    assert "Choice rule" in (out / "targets.md").read_text()
    # a rerun reads the baseline pass back
    capsys.readouterr()
    study.main(argv)
    assert "baseline pass: read" in capsys.readouterr().out
