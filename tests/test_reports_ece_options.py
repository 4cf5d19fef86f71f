"""The ECE options (n_bins, binning, norm) in the job reports: hand-computed bins, and the defaults unchanged."""

import math

import numpy as np
import pytest

from hf_calibration.metrics import calibration_report
from hf_calibration.reports import binned_entries, references, report_with_ece_options

# Two equal-mass bins split at the median 0.5: {0.1, 0.2} with accuracy 1/2 and mean confidence 0.15 (gap 0.35),
# {0.8, 0.9} with accuracy 1 and mean confidence 0.85 (gap 0.15); each holds half the answers.
CONF = np.array([0.1, 0.2, 0.8, 0.9])
CORRECT = np.array([0, 1, 1, 1])


@pytest.mark.parametrize("norm, expected", [
    ("l1", 0.5 * 0.35 + 0.5 * 0.15),
    ("l2", math.sqrt(0.5 * 0.35 ** 2 + 0.5 * 0.15 ** 2)),
    ("max", 0.35),
])
def test_quantile_bins_by_hand(norm, expected):
    report = report_with_ece_options(CORRECT, CONF, n_bins=2, binning="quantile", norm=norm, n_resamples=10)
    assert report["conf_ece"]["value"] == pytest.approx(expected, abs=1e-15)
    assert report["mce"]["value"] == pytest.approx(0.35, abs=1e-15)  # the same bins, max norm
    assert report["conf_ece"]["low"] <= report["conf_ece"]["high"]


def test_the_other_metrics_and_the_defaults_are_calibration_reports():
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(4), size=60)
    labels = rng.integers(0, 4, size=60)
    plain = calibration_report(labels, probs, n_bins=10, n_resamples=50, seed=3)
    # same implementation on the same resamples (both draw default_rng(seed)): equal by construction
    assert report_with_ece_options(labels, probs, n_bins=10, n_resamples=50, seed=3) == plain
    assert binned_entries(labels, probs, n_bins=10, n_resamples=50, seed=3) == {
        key: plain[key] for key in ("conf_ece", "mce", "ace", "cw_ece")}
    quantile = report_with_ece_options(labels, probs, n_bins=10, binning="quantile", n_resamples=50, seed=3)
    unchanged = set(plain) - {"conf_ece", "mce"}
    assert {k: quantile[k] for k in unchanged} == {k: plain[k] for k in unchanged}
    assert quantile["conf_ece"] != plain["conf_ece"]


def test_references_take_the_ece_options():
    refs = references(CORRECT, 4, n_bins=2, binning="quantile", norm="max", n_resamples=10)
    # constant 1/4 against accuracy 3/4: every bin has the gap 1/2
    assert refs["constant_1/K"]["conf_ece"]["value"] == pytest.approx(0.5, abs=1e-15)
    assert refs["constant_accuracy"]["conf_ece"]["value"] == pytest.approx(0.0, abs=1e-15)
