"""Parity with the peer libraries (to 1e-6) on data where their conventions and ours coincide.

Where a peer's convention differs (bin edges at exact k/B values, confidence 1.0 in torchmetrics,
netcal's reading of (n, 2) arrays) the difference is tested explicitly in test_boundaries.py.
"""

import numpy as np
import pytest
import relplot
import torch
from netcal.metrics import ACE, ECE, MCE
from sklearn.calibration import calibration_curve
from sklearn.metrics import average_precision_score, brier_score_loss, log_loss, roc_auc_score
from torchmetrics.functional.classification import binary_calibration_error, multiclass_calibration_error

from hf_calibration.metrics import (
    adaptive_calibration_error,
    brier_score,
    confidence_auprc,
    confidence_auroc,
    expected_calibration_error,
    negative_log_likelihood,
    reliability_diagram,
    smooth_ece,
    top_label,
)

from tests.metrics.data import make_binary, make_multiclass

TOL = 1e-6


def _top(labels, probs):
    return probs.max(axis=1), (probs.argmax(axis=1) == labels)


# -- torchmetrics ------------------------------------------------------------------------------


@pytest.mark.parametrize("norm", ["l1", "l2", "max"])
@pytest.mark.parametrize("n_bins", [10, 15])
def test_torchmetrics_binary(binary, norm, n_bins):
    outcome, conf = binary
    expected = binary_calibration_error(torch.from_numpy(conf), torch.from_numpy(outcome), n_bins=n_bins, norm=norm)
    got = expected_calibration_error(outcome, conf, n_bins=n_bins, norm=norm)
    assert got == pytest.approx(float(expected), abs=TOL)


@pytest.mark.parametrize("norm", ["l1", "l2", "max"])
def test_torchmetrics_multiclass(multiclass, norm):
    labels, probs = multiclass
    expected = multiclass_calibration_error(
        torch.from_numpy(probs), torch.from_numpy(labels), num_classes=4, n_bins=15, norm=norm
    )
    assert expected_calibration_error(labels, probs, norm=norm) == pytest.approx(float(expected), abs=TOL)


def test_torchmetrics_multiclass_float32_input():
    labels, probs = make_multiclass(5000, 6, seed=3)
    p32 = probs.astype(np.float32)
    expected = multiclass_calibration_error(
        torch.from_numpy(p32).double(), torch.from_numpy(labels), num_classes=6, n_bins=15
    )
    assert expected_calibration_error(labels, p32) == pytest.approx(float(expected), abs=TOL)


# -- netcal --------------------------------------------------------------------------------------


@pytest.mark.parametrize("equal_intervals", [True, False])
@pytest.mark.parametrize("n_bins", [10, 15])
def test_netcal_ece_binary(binary, equal_intervals, n_bins):
    outcome, conf = binary
    expected = ECE(bins=n_bins, equal_intervals=equal_intervals).measure(conf, outcome)
    binning = "uniform" if equal_intervals else "quantile"
    assert expected_calibration_error(outcome, conf, n_bins=n_bins, binning=binning) == pytest.approx(expected, abs=TOL)


@pytest.mark.parametrize("equal_intervals", [True, False])
def test_netcal_ece_multiclass(multiclass, equal_intervals):
    labels, probs = multiclass
    expected = ECE(bins=15, equal_intervals=equal_intervals).measure(probs, labels)
    binning = "uniform" if equal_intervals else "quantile"
    assert expected_calibration_error(labels, probs, binning=binning) == pytest.approx(expected, abs=TOL)


def test_netcal_mce(multiclass):
    labels, probs = multiclass
    expected = MCE(bins=15).measure(probs, labels)
    assert expected_calibration_error(labels, probs, norm="max") == pytest.approx(expected, abs=TOL)


@pytest.mark.parametrize("n_bins", [5, 15])
def test_netcal_ace(multiclass, binary, n_bins):
    labels, probs = multiclass
    expected = ACE(bins=n_bins, equal_intervals=False).measure(probs, labels)
    assert adaptive_calibration_error(labels, probs, n_bins=n_bins) == pytest.approx(expected, abs=TOL)
    outcome, conf = binary
    expected = ACE(bins=n_bins, equal_intervals=False).measure(conf, outcome)
    assert adaptive_calibration_error(outcome, conf, n_bins=n_bins) == pytest.approx(expected, abs=TOL)


# -- relplot -------------------------------------------------------------------------------------


@pytest.mark.parametrize("n, seed", [(1, 0), (2, 1), (7, 2), (300, 3), (3002, 4), (100_000, 5)])
def test_relplot_smece_binary(n, seed):
    outcome, conf = make_binary(n, seed)
    expected = relplot.smECE(conf, outcome.astype(float))
    assert smooth_ece(outcome, conf) == pytest.approx(expected, abs=TOL)


def test_relplot_smece_calibrated_large_sample():
    # smECE ~ 1e-3: the bandwidth search goes below sigma = 0.01, where the grid changes size.
    rng = np.random.default_rng(6)
    conf = rng.uniform(size=200_000)
    outcome = (rng.uniform(size=conf.size) < conf).astype(float)
    assert smooth_ece(outcome, conf) == pytest.approx(relplot.smECE(conf, outcome), abs=TOL)


def test_relplot_smece_multiclass(multiclass):
    labels, probs = multiclass
    conf, correct = relplot.multiclass_logits_to_confidences(probs, labels, probs=True)
    assert smooth_ece(labels, probs) == pytest.approx(relplot.smECE(conf, correct), abs=TOL)


@pytest.mark.parametrize("sigma", [0.5, 0.05, 0.004])
def test_relplot_smece_fixed_sigma(binary, sigma):
    outcome, conf = binary
    expected = relplot.smECE_sigma(conf, outcome.astype(float), sigma)
    assert smooth_ece(outcome, conf, sigma=sigma) == pytest.approx(expected, abs=TOL)


# -- scikit-learn --------------------------------------------------------------------------------


def test_sklearn_brier(binary, multiclass):
    outcome, conf = binary
    assert brier_score(outcome, conf) == pytest.approx(brier_score_loss(outcome, conf), abs=TOL)
    labels, probs = multiclass
    expected = brier_score_loss(labels, probs, labels=[0, 1, 2, 3], scale_by_half=False)
    assert brier_score(labels, probs) == pytest.approx(expected, abs=TOL)


def test_sklearn_log_loss(binary, multiclass):
    outcome, conf = binary
    assert negative_log_likelihood(outcome, conf) == pytest.approx(log_loss(outcome, conf), abs=TOL)
    labels, probs = multiclass
    assert negative_log_likelihood(labels, probs) == pytest.approx(log_loss(labels, probs, labels=range(4)), abs=TOL)


def test_sklearn_log_loss_clips_zero_probability():
    labels, probs = np.array([0, 1, 1]), np.array([[1.0, 0.0], [0.5, 0.5], [1.0, 0.0]])
    assert negative_log_likelihood(labels, probs) == pytest.approx(log_loss(labels, probs, labels=[0, 1]), abs=TOL)


@pytest.mark.parametrize("rounded", [False, True])
def test_sklearn_roc_and_average_precision(multiclass, rounded):
    labels, probs = multiclass
    if rounded:  # many tied confidences
        probs = np.round(probs, 1)
        probs /= probs.sum(axis=1, keepdims=True)
    conf, correct = _top(labels, probs)
    assert confidence_auroc(labels, probs) == pytest.approx(roc_auc_score(correct, conf), abs=TOL)
    assert confidence_auprc(labels, probs) == pytest.approx(average_precision_score(correct, conf), abs=TOL)


@pytest.mark.parametrize("strategy", ["uniform", "quantile"])
@pytest.mark.parametrize("n_bins", [7, 15])
def test_sklearn_calibration_curve(binary, strategy, n_bins):
    outcome, conf = binary
    prob_true, prob_pred = calibration_curve(outcome, conf, n_bins=n_bins, strategy=strategy)
    table = reliability_diagram(outcome, conf, n_bins=n_bins, binning=strategy)
    filled = table.counts > 0
    np.testing.assert_allclose(table.accuracy[filled], prob_true, atol=TOL)
    np.testing.assert_allclose(table.mean_confidence[filled], prob_pred, atol=TOL)


def test_top_label_matches_argmax(multiclass):
    labels, probs = multiclass
    conf, correct = top_label(labels, probs)
    np.testing.assert_array_equal(conf, probs.max(axis=1))
    np.testing.assert_array_equal(correct, probs.argmax(axis=1) == labels)
    # first index wins ties, as np.argmax
    tied = np.array([[0.4, 0.4, 0.2], [0.2, 0.4, 0.4], [1 / 3, 1 / 3, 1 / 3]])
    np.testing.assert_array_equal(top_label([1, 2, 0], tied)[1], tied.argmax(axis=1) == [1, 2, 0])
