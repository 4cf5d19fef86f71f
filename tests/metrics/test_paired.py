"""``metrics.paired``: the paired differences against the metrics called directly (scikit-learn), the interval
verdict and the stratified difference on hand-computed values."""

import numpy as np
import pytest
from sklearn.metrics import brier_score_loss, roc_auc_score

from hf_calibration.errors import ParameterError
from hf_calibration.metrics import expected_calibration_error, interval_verdict, paired_differences, paired_strata_difference
from tests.secl.stream_records import records as _records


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


@pytest.mark.parametrize("low, high, below, above", [(-0.3, -0.1, True, False), (0.1, 0.2, False, True),
                                                      (-0.1, 0.2, None, None), (float("nan"), 0.1, None, None)])
def test_interval_verdict(low, high, below, above):
    interval = {"value": 0.0, "low": low, "high": high}
    assert interval_verdict(interval) is below
    assert interval_verdict(interval, held_when="above") is above
    with pytest.raises(ParameterError, match="held_when"):
        interval_verdict(interval, held_when="inside")


def test_paired_strata_difference_by_hand():
    # stratum 1: a right 3 of 4, b 1 of 4; stratum 2: a 1 of 2, b 2 of 2
    strata = [((np.array([1, 1, 1, 0]), np.full(4, 0.5)), (np.array([1, 0, 0, 0]), np.full(4, 0.5))),
              ((np.array([1, 0]), np.full(2, 0.5)), (np.array([1, 1]), np.full(2, 0.5)))]
    equal = paired_strata_difference(strata, metric="accuracy", n_resamples=200)
    assert equal["per_stratum"] == pytest.approx([0.5, -0.5])
    assert equal["value"] == pytest.approx(0.0) and equal["baseline"] == pytest.approx((0.25 + 1.0) / 2)
    size = paired_strata_difference(strata, metric="accuracy", weights="size", n_resamples=200)
    assert size["value"] == pytest.approx((4 * 0.5 + 2 * -0.5) / 6)
    share = paired_strata_difference(strata, metric="accuracy", share=0.5, n_resamples=200)
    assert share["value"] == pytest.approx(((0.75 - 0.125) + (0.5 - 0.5)) / 2)
    assert share["low"] <= share["value"] <= share["high"]
    # conf-ECE of a constant 0.5: |acc − 0.5| (one bin)
    ece = paired_strata_difference(strata[:1], metric="conf_ece", n_resamples=50)
    assert ece["value"] == pytest.approx(abs(0.75 - 0.5) - abs(0.25 - 0.5))
    with pytest.raises(ParameterError, match="metric"):
        paired_strata_difference(strata, metric="nll")


def test_auroc_strata_leave_out_a_one_class_stratum_without_a_warning():
    """The documented rule (an undefined stratum is left out) is the notice here: confidence_auroc's one-class
    warning is not repeated for every resample."""
    import warnings

    from sklearn.metrics import roc_auc_score

    y1, a1, b1 = np.array([1, 0, 1, 0, 1]), np.array([0.9, 0.2, 0.8, 0.3, 0.7]), np.array([0.4, 0.6, 0.5, 0.7, 0.3])
    strata = [((y1, a1), (y1, b1)), ((np.ones(3, int), np.full(3, 0.6)), (np.ones(3, int), np.full(3, 0.7)))]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = paired_strata_difference(strata, metric="auroc", n_resamples=50)
    assert got["per_stratum"][0] == pytest.approx(roc_auc_score(y1, a1) - roc_auc_score(y1, b1))
    assert np.isnan(got["per_stratum"][1]) and got["value"] == pytest.approx(got["per_stratum"][0])
