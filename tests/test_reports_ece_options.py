"""The ECE options (n_bins, binning, norm) in the job reports: hand-computed bins, and the defaults unchanged."""

import math

import numpy as np
import pytest

from hf_calibration.metrics import calibration_report
from hf_calibration.reporting.reports import references

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
    report = calibration_report(CORRECT, CONF, n_bins=2, binning="quantile", norm=norm, n_resamples=10)
    assert report["conf_ece"]["value"] == pytest.approx(expected, abs=1e-15)
    assert report["mce"]["value"] == pytest.approx(0.35, abs=1e-15)  # the same bins, max norm
    assert report["conf_ece"]["low"] <= report["conf_ece"]["high"]


def test_quantile_bins_change_only_conf_ece_and_mce():
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(4), size=60)
    labels = rng.integers(0, 4, size=60)
    plain = calibration_report(labels, probs, n_bins=10, n_resamples=50, seed=3)
    quantile = calibration_report(labels, probs, n_bins=10, binning="quantile", n_resamples=50, seed=3)
    unchanged = set(plain) - {"conf_ece", "mce"}
    assert {k: quantile[k] for k in unchanged} == {k: plain[k] for k in unchanged}
    assert quantile["conf_ece"] != plain["conf_ece"]


def test_references_take_the_ece_options():
    refs = references(CORRECT, 4, n_bins=2, binning="quantile", norm="max", n_resamples=10)
    # constant 1/4 against accuracy 3/4: every bin has the gap 1/2
    assert refs["constant_1/K"]["conf_ece"]["value"] == pytest.approx(0.5, abs=1e-15)
    assert refs["constant_accuracy"]["conf_ece"]["value"] == pytest.approx(0.0, abs=1e-15)


@pytest.mark.parametrize("binning, norm", [("quantile", "l1"), ("quantile", "l2"), ("uniform", "max")])
def test_calibration_report_takes_binning_and_norm(binning, norm):
    """conf-ECE and MCE of ``calibration_report`` under its own ``binning``/``norm``, against the metric called
    directly (point values) and against ``bootstrap`` on the same resamples (intervals)."""
    from hf_calibration.metrics import bootstrap, calibration_report, expected_calibration_error

    rng = np.random.default_rng(5)
    conf = rng.uniform(0.2, 1.0, 120)
    correct = (rng.uniform(size=120) < conf ** 2).astype(int)
    report = calibration_report(correct, conf, n_bins=7, binning=binning, norm=norm, n_resamples=30, seed=2)
    for key, key_norm in (("conf_ece", norm), ("mce", "max")):
        options = dict(n_bins=7, binning=binning, norm=key_norm)
        value, low, high = bootstrap(expected_calibration_error, correct, conf, n_resamples=30, seed=2,
                                     metric_kwargs=options)
        # 120 terms ≤ 1 summed in two orders: bound 120 · 2.2e-16
        assert report[key]["value"] == pytest.approx(expected_calibration_error(correct, conf, **options), abs=1e-13)
        assert (report[key]["low"], report[key]["high"]) == (pytest.approx(low, abs=1e-13), pytest.approx(high, abs=1e-13))


@pytest.mark.parametrize("kwargs, name", [({"binning": "equal"}, "binning"), ({"norm": "l3"}, "norm")])
def test_calibration_report_names_a_bad_ece_option(kwargs, name):
    from hf_calibration.metrics import calibration_report

    with pytest.raises(ValueError, match=name):
        calibration_report([1, 0], [0.7, 0.4], n_resamples=5, **kwargs)
