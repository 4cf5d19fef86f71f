"""Consistency resampling (Bröcker & Smith 2007) against null distributions derived by hand or by exact enumeration."""

import functools
import itertools

import numpy as np
import pytest
from scipy.stats import binom

from hf_calibration.metrics import (brier_score, consistency_resampling, draw_calibrated_labels,
                                    expected_calibration_error)


def test_a_constant_confidence_has_the_binomial_null_of_ece():
    # Every item in one bin: ECE = |k/n − p| with k ~ Binomial(n, p); E|k/n − p| summed over k by hand.
    n, p = 100, 0.58
    k = np.arange(n + 1)
    exact = float(np.sum(binom.pmf(k, n, p) * np.abs(k / n - p)))
    sd = float(np.sqrt(np.sum(binom.pmf(k, n, p) * (np.abs(k / n - p) - exact) ** 2)))
    r = consistency_resampling(expected_calibration_error, np.full(n, p), n_resamples=20000, seed=1)
    assert abs(r.null_mean - exact) < 4 * sd / np.sqrt(20000)
    # the 95 % range: quantiles of |k/n − p| from the same pmf
    values, probs = np.abs(k / n - p), binom.pmf(k, n, p)
    order = np.argsort(values)
    cdf = np.cumsum(probs[order])
    assert r.high == pytest.approx(values[order][np.searchsorted(cdf, 0.975)])


def _enumerated_mean(metric, prob):
    """E[metric(labels, prob)] over every label vector, each weighted by its probability under prob."""
    n = prob.shape[0]
    classes = [range(prob.shape[1])] if prob.ndim == 2 else [range(2)]
    total, second = 0.0, 0.0
    for labels in itertools.product(*(classes * n)):
        labels = np.array(labels)
        if prob.ndim == 1:
            weight = np.prod(np.where(labels == 1, prob, 1 - prob))
        else:
            weight = np.prod(prob[np.arange(n), labels])
        value = metric(labels, prob)
        total += weight * value
        second += weight * value ** 2
    return total, np.sqrt(second - total ** 2)


@pytest.mark.parametrize("prob", [np.array([0.9, 0.35, 0.62, 0.05]), np.array([0.5, 0.97, 0.2])])
def test_the_null_mean_of_ece_matches_exact_enumeration(prob):
    ece = functools.partial(expected_calibration_error, n_bins=10)
    exact, sd = _enumerated_mean(ece, prob)
    r = consistency_resampling(ece, prob, n_resamples=20000, seed=3)
    assert abs(r.null_mean - exact) < 4 * sd / np.sqrt(20000)


def test_multiclass_labels_are_drawn_from_each_row():
    prob = np.array([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]])
    exact, sd = _enumerated_mean(brier_score, prob)
    r = consistency_resampling(brier_score, prob, n_resamples=20000, seed=5)
    assert abs(r.null_mean - exact) < 4 * sd / np.sqrt(20000)


def test_drawn_class_frequencies_follow_the_row():
    rng = np.random.default_rng(0)
    row = np.array([[0.2, 0.5, 0.3]])
    drawn = np.array([draw_calibrated_labels(row, rng)[0] for _ in range(30000)])
    freq = np.bincount(drawn, minlength=3) / drawn.size
    assert np.allclose(freq, row[0], atol=4 * np.sqrt(0.25 / drawn.size))


def test_observed_and_p_value():
    prob = np.full(50, 0.9)
    wrong = np.zeros(50, dtype=int)  # a 0.9 read that is always wrong: ECE 0.9, far outside the null
    r = consistency_resampling(expected_calibration_error, prob, wrong, n_resamples=500)
    assert r.observed == pytest.approx(0.9)
    assert r.p_value == pytest.approx(1 / 501)
    assert r.low <= r.null_mean <= r.high < 0.9
    # labels at the confidence's own rate: 45 of 50 right, ECE 0, every draw is ≥ 0
    right = np.r_[np.ones(45, dtype=int), np.zeros(5, dtype=int)]
    r = consistency_resampling(expected_calibration_error, prob, right, n_resamples=500)
    assert r.observed == pytest.approx(0.0, abs=1e-12) and r.p_value == pytest.approx(1.0)


def test_the_same_seed_gives_the_same_draws():
    prob = np.linspace(0.05, 0.95, 40)
    a = consistency_resampling(expected_calibration_error, prob, n_resamples=300, seed=7)
    b = consistency_resampling(expected_calibration_error, prob, n_resamples=300, seed=7)
    assert a == b
    c, draws = consistency_resampling(expected_calibration_error, prob, n_resamples=300, seed=7, return_draws=True)
    assert c == a and draws.shape == (300,) and draws.mean() == pytest.approx(a.null_mean)


@pytest.mark.parametrize("kwargs, name", [
    (dict(n_resamples=0), "n_resamples"),
    (dict(confidence_level=1.5), "confidence_level"),
    (dict(seed="x"), "seed"),
])
def test_bad_arguments_name_themselves(kwargs, name):
    with pytest.raises((ValueError, TypeError), match=name):
        consistency_resampling(expected_calibration_error, np.full(10, 0.5), **kwargs)


def test_bad_confidences_are_refused():
    with pytest.raises(ValueError, match="y_prob"):
        consistency_resampling(expected_calibration_error, np.array([0.5, 1.5]))
    with pytest.raises(ValueError, match="y_true"):
        consistency_resampling(expected_calibration_error, np.array([0.5, 0.5]), np.array([1]))


def test_an_undefined_observed_value_has_no_p_value():
    def nan_on_all_right(y, p):  # undefined on the given labels only
        return float("nan") if np.all(np.asarray(y) == 1) else expected_calibration_error(y, p)

    r = consistency_resampling(nan_on_all_right, np.full(30, 0.5), np.ones(30, dtype=int), n_resamples=50)
    assert np.isnan(r.observed) and np.isnan(r.p_value)


def test_dropped_draws_are_announced():
    calls = iter(range(10 ** 6))

    def sometimes_undefined(y, p):
        return float("nan") if next(calls) % 4 == 0 else expected_calibration_error(y, p)

    with pytest.warns(RuntimeWarning, match="undefined on 25 of 100"):
        r, draws = consistency_resampling(sometimes_undefined, np.full(20, 0.7), n_resamples=100, return_draws=True)
    assert draws.size == 75 and np.isfinite(r.null_mean)


def test_half_precision_probabilities_are_taken_as_the_metric_takes_them():
    rng = np.random.default_rng(0)
    prob = rng.dirichlet(np.ones(5), size=200).astype(np.float16)
    labels = rng.integers(0, 5, 200)
    r = consistency_resampling(expected_calibration_error, prob, labels, n_resamples=20)
    assert r.observed == pytest.approx(expected_calibration_error(labels, prob))


def test_a_class_of_probability_zero_is_never_drawn():
    row = np.array([[0.49996, 0.49996, 0.0]])  # sums to 0.99992, inside the tolerance
    rng = np.random.default_rng(0)
    drawn = np.concatenate([draw_calibrated_labels(np.repeat(row, 1000, axis=0), rng) for _ in range(50)])
    assert not np.any(drawn == 2)


@pytest.mark.parametrize("call, name", [
    (lambda: consistency_resampling(expected_calibration_error, 0.5), "y_prob"),
    (lambda: consistency_resampling(expected_calibration_error, [[0.5, 0.5], [1.0]]), "y_prob"),
    (lambda: consistency_resampling(expected_calibration_error, np.full(5, 0.5), seed=-1), "seed"),
    (lambda: consistency_resampling("ece", np.full(5, 0.5)), "metric"),
    (lambda: consistency_resampling(expected_calibration_error, np.full(5, 0.5), metric_kwargs=[1]), "metric_kwargs"),
    (lambda: consistency_resampling(expected_calibration_error, np.full(5, 0.5), return_draws="no"), "return_draws"),
    (lambda: consistency_resampling(lambda y, p: "x", np.full(5, 0.5)), "metric"),
    (lambda: consistency_resampling(functools.partial(expected_calibration_error, n_bins=5), np.full(5, 0.5),
                                    np.ones(4, dtype=int)), "y_true"),
    (lambda: draw_calibrated_labels([0.5, 1.5], 0), "y_prob"),
    (lambda: draw_calibrated_labels([np.nan, 0.5], 0), "y_prob"),
    (lambda: draw_calibrated_labels([[0.1, 0.1, 0.1]], 0), "y_prob"),
    (lambda: draw_calibrated_labels(np.zeros((2, 2, 2)), 0), "y_prob"),
    (lambda: draw_calibrated_labels([0.5], "seed"), "rng"),
])
def test_bad_input_names_the_argument(call, name):
    with pytest.raises((ValueError, TypeError), match=name):
        call()


def test_ranking_scores_are_refused():
    from hf_calibration.metrics import confidence_auroc

    with pytest.raises(ValueError, match="metric: .*larger is better|larger is better"):
        consistency_resampling(confidence_auroc, np.linspace(0.1, 0.9, 20), np.r_[np.zeros(10), np.ones(10)])
