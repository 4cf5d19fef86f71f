"""The SECL table's paired intervals and its check of the paper's claims, on hand-made records."""

import numpy as np
import pytest
import torch
from sklearn.metrics import brier_score_loss, roc_auc_score

from hf_calibration.metrics import expected_calibration_error
from hf_calibration.evaluation.stream import summarize_stream

from experiments.common import format_claim_check
from tests.secl.stream_records import level_shift_stream as _level_shift_stream
from tests.secl.stream_records import records as _records
from experiments.run import secl_table
from experiments.secl_claims import secl_claim_check as claim_check

# summarize_stream also cross-fits TS on the verbalized confidence, which carries no information here
pytestmark = pytest.mark.filterwarnings("ignore:TemperatureScaler:RuntimeWarning")


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


def test_overall_auroc_claim_reads_the_within_domain_difference():
    recs = _level_shift_stream()
    summary = summarize_stream(recs, n_resamples=200, seed=0, signals=("verbalized", "secl"))
    y = np.array([r["correct"] for r in recs], dtype=int)
    secl, verb = np.array([r["secl"] for r in recs]), np.array([r["verbalized"] for r in recs])
    # pooled: SECL's level shift ranks "easy" above "hard" and beats the verbalized confidence
    assert roc_auc_score(y, secl) > roc_auc_score(y, verb)
    assert summary["overall"]["paired"]["delta_auroc"]["low"] > 0
    within = summary["overall"]["paired"]["delta_auroc_within_domains"]
    hand = {d: roc_auc_score(y[k * 100:(k + 1) * 100], secl[k * 100:(k + 1) * 100])
            - roc_auc_score(y[k * 100:(k + 1) * 100], verb[k * 100:(k + 1) * 100]) for k, d in enumerate(("easy", "hard"))}
    assert within["per_domain"] == pytest.approx(hand, abs=1e-12)
    assert within["value"] == pytest.approx(0.5 * hand["easy"] + 0.5 * hand["hard"], abs=1e-12)
    assert within["high"] < 0  # within each domain SECL (0.5) ranks worse than verbalized (≈ 1)
    checks = {claim: (held, evidence) for claim, held, evidence in claim_check(summary["overall"])}
    held, evidence = checks["AUROC not below verbalized"]
    assert held is False and evidence.startswith("within-domain ΔAUROC")
    # Brier: pooled, SECL's two levels beat the one pooled constant (0.5); within each domain a constant at the
    # domain's own accuracy is exactly SECL's level on "easy" (0.8) and 0.3 closer than it on "hard" (0.2 vs 0.5)
    pooled = summary["overall"]["paired"]["delta_brier_vs_constant"]
    assert pooled["high"] < 0
    brier = summary["overall"]["paired"]["delta_brier_vs_constant_within_domains"]
    hand_brier = {"easy": 0.0, "hard": float(np.mean((0.5 - y[100:]) ** 2) - np.mean((0.2 - y[100:]) ** 2))}
    assert brier["per_domain"] == pytest.approx(hand_brier, abs=1e-12)
    assert brier["value"] == pytest.approx(0.5 * hand_brier["hard"], abs=1e-12) and brier["low"] > 0
    held, evidence = checks["Brier below the constant-accuracy Brier"]
    assert held is False and evidence.startswith("within-domain ΔBrier")
    # ECE: per domain against torchmetrics' binary ECE (15 uniform bins, L1); SECL's constant level is the domain's
    # accuracy on "easy" (ECE 0) and 0.3 above it on "hard"; the cut is over the n-weighted mean verbalized ECE
    from torchmetrics.functional.classification import binary_calibration_error

    def tm_ece(conf, correct):
        return float(binary_calibration_error(torch.tensor(conf, dtype=torch.float64), torch.tensor(correct),
                                              n_bins=15, norm="l1"))

    ece = summary["overall"]["paired"]["delta_ece_within_domains"]
    verb_ece = {d: tm_ece(verb[k * 100:(k + 1) * 100], y[k * 100:(k + 1) * 100]) for k, d in enumerate(("easy", "hard"))}
    hand_ece = {"easy": 0.0 - verb_ece["easy"], "hard": 0.3 - verb_ece["hard"]}
    assert ece["per_domain"] == pytest.approx(hand_ece, abs=1e-9)
    assert ece["value"] == pytest.approx(0.5 * hand_ece["easy"] + 0.5 * hand_ece["hard"], abs=1e-9)
    assert ece["baseline"] == pytest.approx(0.5 * verb_ece["easy"] + 0.5 * verb_ece["hard"], abs=1e-9)
    held, evidence = checks["ECE ≥ 56 % below verbalized"]
    assert evidence.startswith(f"cut {-ece['value'] / ece['baseline']:+.0%}; within-domain ΔECE")
    # one domain: the pooled (= within-domain) difference, as before
    one = summarize_stream(recs[:100], n_resamples=50, seed=0, signals=("verbalized", "secl"))
    assert "delta_auroc_within_domains" not in one["overall"]["paired"]
