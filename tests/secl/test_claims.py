"""The SECL table's paired intervals and its check of the paper's claims (issue 16.6), on hand-made records."""

import numpy as np
import pytest
from sklearn.metrics import brier_score_loss, roc_auc_score

from hf_calibration.jobs.experiment import secl_table
from hf_calibration.metrics import expected_calibration_error
from hf_calibration.secl.stream import claim_check, format_claim_check, paired_differences, summarize_stream

# summarize_stream also cross-fits TS on the verbalized confidence, which carries no information here
pytestmark = pytest.mark.filterwarnings("ignore:TemperatureScaler:RuntimeWarning")


def _records(n=80, seed=0):
    """A stream of one domain: verbalized confidence overconfident and uninformative, SECL's informative."""
    rng = np.random.default_rng(seed)
    correct = rng.uniform(size=n) < 0.5
    out = []
    for i, c in enumerate(correct):
        secl = float(np.clip((0.9 if c else 0.1) + rng.normal(0, 0.05), 0.01, 0.99))
        out.append({
            "domain": "d", "n_options": 2, "correct": bool(c), "verbalized": float(rng.uniform(0.85, 0.99)),
            "p_true": 0.5, "norm_p_true": 0.5, "dinco": 0.5, "secl": secl, "secl_correct": bool(c),
            "burst": i < 20, "updated": i < 10, "skipped_by_bin_gate": 10 <= i < 20, "alarm": i == 0,
            "passes": {"verbalized": 3, "p_true": 2, "norm_p_true": 3, "dinco": 3, "secl": 4 if i < 20 else 3},
        })
    return out


def test_paired_differences_against_the_metrics_called_directly():
    recs = _records()
    y = np.array([r["correct"] for r in recs], dtype=int)
    secl, verb = np.array([r["secl"] for r in recs]), np.array([r["verbalized"] for r in recs])
    p = paired_differences(y, secl, y, verb, n_resamples=200, seed=1)
    assert p["delta_ece"]["value"] == pytest.approx(expected_calibration_error(y, secl) - expected_calibration_error(y, verb),
                                                    abs=1e-12)
    assert p["delta_auroc"]["value"] == pytest.approx(roc_auc_score(y, secl) - roc_auc_score(y, verb), abs=1e-12)
    assert p["delta_brier"]["value"] == pytest.approx(brier_score_loss(y, secl) - brier_score_loss(y, verb), abs=1e-12)
    assert p["delta_brier_vs_constant"]["value"] == pytest.approx(
        brier_score_loss(y, secl) - brier_score_loss(y, np.full(len(y), y.mean())), abs=1e-12)
    for d in p.values():
        assert d["low"] <= d["value"] <= d["high"]


def test_claim_check_on_a_stream_where_secl_helps():
    summary = summarize_stream(_records(), n_resamples=200, seed=0, signals=("verbalized", "secl"))
    checks = dict((claim, held) for claim, held, _ in claim_check(summary["d"]))
    # by construction: SECL's ECE is far below the overconfident verbalized one and it ranks (AUROC ≈ 1 vs ≈ 0.5),
    # the answers are the same, 10 of 80 = 12.5 % trained, passes (20·4 + 60·3) / 80 = 3.25
    assert checks == {"ECE ≥ 56 % below verbalized": True, "AUROC not below verbalized": True,
                      "Brier below the constant-accuracy Brier": True, "accuracy unchanged": True,
                      "6–26 % of the questions trained": True, "≤ 4.6 forward passes per question": True}
    assert summary["d"]["signals"]["secl"]["forward_passes"] == pytest.approx(3.25)
    table = format_claim_check(claim_check(summary["d"]))
    assert table.count("| held |") == 6


def test_claim_check_reports_failures_and_undecided():
    recs = _records()
    for i, r in enumerate(recs):  # SECL = verbalized: no cut, no ranking gain; everything trained; 6 passes
        r["secl"], r["updated"], r["passes"]["secl"] = r["verbalized"], True, 6
        if i < 4:
            r["secl_correct"] = not r["correct"]  # answers changed
    summary = summarize_stream(recs, n_resamples=200, seed=0, signals=("verbalized", "secl"))
    checks = {claim: held for claim, held, _ in claim_check(summary["d"])}
    assert checks["ECE ≥ 56 % below verbalized"] is False
    assert checks["accuracy unchanged"] is False
    assert checks["6–26 % of the questions trained"] is False
    assert checks["≤ 4.6 forward passes per question"] is False
    assert checks["Brier below the constant-accuracy Brier"] is False  # overconfident at 0.9 on a 50 % domain


def test_experiment_table_prints_the_paired_intervals_and_the_claims():
    recs = _records()
    summary = summarize_stream(recs, n_resamples=50, seed=0, signals=("verbalized", "secl"))
    run = {"stream": "d", "limit_per_domain": 80, "seed": 0, "burst_at_start": True, "wall_seconds": 1.0}
    text = secl_table({"smollm2": {"run": run, "summary": summary}})
    assert "SECL − verbalized, paired bootstrap: ΔECE" in text and "| claim | result | evidence |" in text
