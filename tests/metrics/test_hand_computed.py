"""Values worked out by hand (arithmetic written out in the test) for metrics without a peer library."""

import itertools
import math

import numpy as np
import pytest
from scipy.stats import norm as normal

from hf_calibration.metrics import (
    adaptive_calibration_error,
    aurc,
    classwise_ece,
    expected_calibration_error,
)


def test_classwise_ece_by_hand():
    probs = [[0.6, 0.3, 0.1], [0.2, 0.5, 0.3], [0.7, 0.2, 0.1], [0.1, 0.1, 0.8]]
    labels = [0, 2, 0, 2]
    # 2 bins, [0, 0.5) and [0.5, 1].
    # class 0: p = .6 .2 .7 .1, 1[y=0] = 1 0 1 0 -> {.2,.1}: acc 0, conf .15; {.6,.7}: acc 1, conf .65
    cls0 = 0.5 * 0.15 + 0.5 * 0.35
    # class 1: p = .3 .5 .2 .1, 1[y=1] = 0 0 0 0 -> {.3,.2,.1}: conf .2; {.5}: conf .5
    cls1 = 0.75 * 0.2 + 0.25 * 0.5
    # class 2: p = .1 .3 .1 .8, 1[y=2] = 0 1 0 1 -> {.1,.3,.1}: acc 1/3, conf 0.5/3; {.8}: acc 1
    cls2 = 0.75 * abs(1 / 3 - 0.5 / 3) + 0.25 * 0.2
    assert classwise_ece(labels, probs, n_bins=2) == pytest.approx((cls0 + cls1 + cls2) / 3, abs=1e-12)
    assert (cls0 + cls1 + cls2) / 3 == pytest.approx(0.7 / 3)


def test_classwise_ece_equals_top_label_ece_for_confident_two_class_case():
    # K = 2 with both classes' probabilities in mirrored bins: the two per-class errors coincide with
    # the top-label ECE when every prediction is correct and confidences avoid the 0.5 bin edge.
    probs = [[0.9, 0.1], [0.2, 0.8], [0.7, 0.3]]
    labels = [0, 1, 0]
    # top-label: conf .9 .8 .7 all correct, 10 bins: gaps .1 .2 .3 -> mean .2
    assert expected_calibration_error(labels, probs, n_bins=10) == pytest.approx(0.2, abs=1e-12)
    # class 0: p .9 .2 .7 vs 1 0 1 -> gaps .1 .2 .3 ; class 1: p .1 .8 .3 vs 0 1 0 -> gaps .1 .2 .3
    assert classwise_ece(labels, probs, n_bins=10) == pytest.approx(0.2, abs=1e-12)


def _aurc_one_order(correct_in_order):
    errors = np.cumsum(1 - np.asarray(correct_in_order))
    return float(np.mean(errors / np.arange(1, len(errors) + 1)))


def _aurc_average_over_tie_orders(conf, correct):
    """Brute force: average the plain AURC over every order of tied confidences."""
    conf, correct = np.asarray(conf), np.asarray(correct)
    levels = sorted(set(conf.tolist()), reverse=True)
    groups = [correct[conf == level].tolist() for level in levels]
    values = []
    for orders in itertools.product(*(set(itertools.permutations(g)) for g in groups)):
        values.append(_aurc_one_order([c for g in orders for c in g]))
    return float(np.mean(values))


def test_aurc_by_hand():
    # accepted in order .9 (right), .8 (wrong), .7 (right): risks 0, 1/2, 1/3
    assert aurc([1, 0, 1], [0.9, 0.8, 0.7]) == pytest.approx((0 + 1 / 2 + 1 / 3) / 3, abs=1e-12)
    assert aurc([1, 1, 1], [0.2, 0.5, 0.9]) == 0.0
    assert aurc([0, 0], [0.2, 0.9]) == pytest.approx(1.0)
    # perfect ranking with accuracy 2/4: risks 0, 0, 1/3, 2/4
    assert aurc([1, 1, 0, 0], [0.9, 0.8, 0.3, 0.2]) == pytest.approx((1 / 3 + 1 / 2) / 4, abs=1e-12)


@pytest.mark.parametrize(
    "conf, correct",
    [
        ([0.6, 0.6], [1, 0]),
        ([0.9, 0.7, 0.7, 0.7, 0.2], [0, 1, 0, 1, 1]),
        ([0.5, 0.5, 0.5, 0.5], [1, 0, 0, 1]),
        ([0.8, 0.8, 0.3, 0.3, 0.3, 0.1], [1, 0, 0, 1, 0, 1]),
    ],
)
def test_aurc_ties_are_averaged_over_orders(conf, correct):
    assert aurc(correct, conf) == pytest.approx(_aurc_average_over_tie_orders(conf, correct), abs=1e-12)


def test_aurc_multiclass_uses_top_label():
    probs = [[0.7, 0.3], [0.4, 0.6], [0.55, 0.45]]
    labels = [0, 0, 0]  # correct, wrong (predicts 1), correct
    # confidences .7 .6 .55 -> accepted right, wrong, right
    assert aurc(labels, probs) == pytest.approx((0 + 1 / 2 + 1 / 3) / 3, abs=1e-12)


# -- debiased ECE (Kumar, Liang & Ma 2019) --------------------------------------------------------

CONF = [0.1, 0.2, 0.3, 0.9, 0.95, 0.85, 0.9]
OUTCOME = [1, 1, 0, 1, 0, 0, 0]
# two bins: [0, .5) holds .1 .2 .3 (acc 2/3, conf .2, n 3); [.5, 1] holds .9 .95 .85 .9 (acc 1/4, conf .9, n 4)


def test_debiased_l2_by_hand():
    bin0 = (2 / 3 - 0.2) ** 2 - (2 / 3) * (1 / 3) / (3 - 1)
    bin1 = (0.9 - 0.25) ** 2 - 0.25 * 0.75 / (4 - 1)
    expected = math.sqrt(3 / 7 * bin0 + 4 / 7 * bin1)
    got = expected_calibration_error(OUTCOME, CONF, n_bins=2, norm="l2", debiased=True)
    assert got == pytest.approx(expected, abs=1e-12)
    plugin = math.sqrt(3 / 7 * (2 / 3 - 0.2) ** 2 + 4 / 7 * 0.65**2)
    assert expected_calibration_error(OUTCOME, CONF, n_bins=2, norm="l2") == pytest.approx(plugin, abs=1e-12)


def test_debiased_l2_clips_at_zero_and_skips_single_prediction_bins():
    # Well calibrated bins: the variance correction exceeds the squared gap -> 0 after clipping.
    assert expected_calibration_error([1, 0, 1, 0], [0.5, 0.5, 0.5, 0.5], n_bins=2, norm="l2", debiased=True) == 0.0
    # A lone prediction in a bin contributes nothing (Kumar et al.'s reference code); the other bin:
    # acc 1/2, conf .75, n 2 -> gap^2 1/16, variance 1/4 / 1 -> negative -> clipped to 0.
    assert expected_calibration_error([1, 1, 0], [0.1, 0.7, 0.8], n_bins=2, norm="l2", debiased=True) == 0.0


def test_debiased_l1_by_hand():
    def expected_abs_normal(mean, sd):  # E|X| for X ~ N(mean, sd^2)
        return sd * math.sqrt(2 / math.pi) * math.exp(-mean**2 / (2 * sd**2)) + mean * (1 - 2 * normal.cdf(-mean / sd))

    d0, s0 = 2 / 3 - 0.2, math.sqrt((2 / 3) * (1 / 3) / 3)
    d1, s1 = 0.25 - 0.9, math.sqrt(0.25 * 0.75 / 4)
    plugin = 3 / 7 * abs(d0) + 4 / 7 * abs(d1)
    expected = 2 * plugin - (3 / 7 * expected_abs_normal(d0, s0) + 4 / 7 * expected_abs_normal(d1, s1))
    assert expected_calibration_error(OUTCOME, CONF, n_bins=2, debiased=True) == pytest.approx(expected, abs=1e-12)


def test_debiased_l1_matches_kumar_monte_carlo():
    # Kumar et al.'s normal_debiased_ce: 2 * plug-in - mean plug-in ECE over bin accuracies redrawn
    # from N(acc_b, acc_b (1 - acc_b) / n_b). Our closed form is its limit; 400k draws agree to ~1e-3.
    rng = np.random.default_rng(0)
    acc, conf, weight, n_b = np.array([2 / 3, 0.25]), np.array([0.2, 0.9]), np.array([3 / 7, 4 / 7]), np.array([3, 4])
    draws = rng.normal(acc, np.sqrt(acc * (1 - acc) / n_b), size=(400_000, 2))
    monte_carlo = 2 * np.sum(weight * np.abs(acc - conf)) - np.mean(np.abs(draws - conf) @ weight)
    got = expected_calibration_error(OUTCOME, CONF, n_bins=2, debiased=True)
    assert got == pytest.approx(monte_carlo, abs=2e-3)


# -- binned ECE, ACE -----------------------------------------------------------------------------


def test_ece_norms_by_hand():
    # 2 bins: {.1 .2 .3} acc 2/3 conf .2 (w 3/7); {.85 .9 .9 .95} acc 1/4 conf .9 (w 4/7)
    gaps, weights = np.array([2 / 3 - 0.2, 0.65]), np.array([3 / 7, 4 / 7])
    assert expected_calibration_error(OUTCOME, CONF, n_bins=2) == pytest.approx(weights @ gaps, abs=1e-12)
    assert expected_calibration_error(OUTCOME, CONF, n_bins=2, norm="max") == pytest.approx(0.65, abs=1e-12)
    assert expected_calibration_error(OUTCOME, CONF, n_bins=2, norm="l2") == pytest.approx(
        math.sqrt(weights @ gaps**2), abs=1e-12
    )


def test_quantile_ece_and_ace_by_hand():
    conf = [0.1, 0.2, 0.3, 0.4, 0.6, 0.7, 0.8, 0.9]
    outcome = [0, 0, 1, 0, 1, 1, 0, 1]
    # median of 8 values: 0.5 -> bins {.1 .2 .3 .4} (acc 1/4, conf .25) and {.6 .7 .8 .9} (acc 3/4, conf .75)
    assert expected_calibration_error(outcome, conf, n_bins=2, binning="quantile") == pytest.approx(0.0, abs=1e-12)
    # 4 bins, edges at the linear quantiles .275, .5, .725:
    # {.1 .2} acc 0 conf .15 | {.3 .4} acc 1/2 conf .35 | {.6 .7} acc 1 conf .65 | {.8 .9} acc 1/2 conf .85
    gaps = [0.15, 0.15, 0.35, 0.35]
    assert expected_calibration_error(outcome, conf, n_bins=4, binning="quantile") == pytest.approx(
        np.mean(gaps), abs=1e-12
    )
    assert adaptive_calibration_error(outcome, conf, n_bins=4) == pytest.approx(np.mean(gaps), abs=1e-12)
