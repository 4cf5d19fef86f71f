"""bootstrap / calibration_report: the vectorised resampling equals calling the metric per resample."""

import functools
import importlib
import time

import numpy as np
import pytest

import hf_calibration.metrics as metrics_mod

from hf_calibration.metrics import (
    BootstrapResult,
    adaptive_calibration_error,
    aurc,
    bootstrap,
    brier_score,
    calibration_report,
    classwise_ece,
    confidence_auprc,
    confidence_auroc,
    expected_calibration_error,
    negative_log_likelihood,
    smooth_ece,
    top_label,
)
import scipy.stats

from tests.metrics.data import make_binary, make_multiclass

# the package re-exports the function ``bootstrap`` under the module's name
bootstrap_module = importlib.import_module("hf_calibration.metrics.bootstrap")

CASES = [
    (expected_calibration_error, {}),
    (expected_calibration_error, {"binning": "quantile", "n_bins": 10}),
    (expected_calibration_error, {"norm": "max"}),
    (expected_calibration_error, {"norm": "l2", "debiased": True}),
    (expected_calibration_error, {"debiased": True}),
    (adaptive_calibration_error, {}),
    (smooth_ece, {}),
    (smooth_ece, {"sigma": 0.05}),
    (brier_score, {}),
    (negative_log_likelihood, {}),
    (confidence_auroc, {}),
    (confidence_auprc, {}),
    (aurc, {}),
]


def _looped(metric, y, p, kwargs, n_resamples, seed, level=0.95):
    """Reference: draw the documented indices and call the public metric once per resample."""
    idx = np.random.default_rng(seed).integers(0, len(y), size=(n_resamples, len(y)))
    stats = np.array([metric(y[i], p[i], **kwargs) for i in idx])
    stats = stats[~np.isnan(stats)]
    return np.percentile(stats, [100 * (1 - level) / 2, 100 * (1 + level) / 2])


@pytest.fixture
def small_blocks(monkeypatch):
    # force several resample blocks, to check that the block-wise draws form one stream
    monkeypatch.setattr(bootstrap_module, "_BLOCK_CELLS", 7 * 150)


@pytest.mark.parametrize("metric, kwargs", CASES, ids=lambda v: getattr(v, "__name__", str(v)))
def test_vectorised_equals_loop(metric, kwargs, small_blocks):
    labels, probs = make_multiclass(150, 4, seed=1, concentration=0.6)
    probs[:30] = np.round(probs[:30], 1)  # ties
    probs[:30] /= probs[:30].sum(axis=1, keepdims=True)
    result = bootstrap(metric, labels, probs, n_resamples=60, seed=3, metric_kwargs=kwargs, method="percentile")
    assert isinstance(result, BootstrapResult)
    assert result.estimate == pytest.approx(metric(labels, probs, **kwargs), abs=1e-12)
    np.testing.assert_allclose([result.low, result.high], _looped(metric, labels, probs, kwargs, 60, 3), atol=1e-12)


def test_vectorised_classwise_and_conf_view(small_blocks):
    labels, probs = make_multiclass(150, 3, seed=2)
    result = bootstrap(classwise_ece, labels, probs, n_resamples=40, seed=0, method="percentile")
    np.testing.assert_allclose([result.low, result.high], _looped(classwise_ece, labels, probs, {}, 40, 0), atol=1e-12)
    outcome, conf = make_binary(150, seed=3)
    for metric, kwargs in CASES:
        result = bootstrap(metric, outcome, conf, n_resamples=30, seed=1, metric_kwargs=kwargs, method="percentile")
        expected = _looped(metric, outcome, conf, kwargs, 30, 1)
        np.testing.assert_allclose([result.low, result.high], expected, atol=1e-12, err_msg=metric.__name__)


def test_partial_and_arbitrary_callables():
    labels, probs = make_multiclass(200, 4, seed=4)
    via_partial = bootstrap(functools.partial(expected_calibration_error, n_bins=10), labels, probs, n_resamples=50)
    via_kwargs = bootstrap(expected_calibration_error, labels, probs, n_resamples=50, metric_kwargs={"n_bins": 10})
    assert via_partial == via_kwargs

    def accuracy(y, p):
        return float(np.mean(p.argmax(axis=1) == y))

    est, low, high = bootstrap(accuracy, labels, probs, n_resamples=200, seed=0, method="percentile")
    correct = probs.argmax(axis=1) == labels
    assert est == pytest.approx(correct.mean())
    idx = np.random.default_rng(0).integers(0, 200, size=(200, 200))
    assert [low, high] == pytest.approx(np.percentile(correct[idx].mean(axis=1), [2.5, 97.5]))


def test_bootstrap_argument_errors():
    with pytest.raises(ValueError, match="n_resamples: must be ≥ 1, got 0"):
        bootstrap(brier_score, [1], [0.5], n_resamples=0)
    with pytest.raises(ValueError, match=r"confidence_level: must be in \(0, 1\), got 95"):
        bootstrap(brier_score, [1], [0.5], confidence_level=95)
    with pytest.raises(TypeError, match="n_resamples: must be an int"):
        bootstrap(brier_score, [1], [0.5], n_resamples=10.0)


def test_report_multiclass_matches_metrics():
    labels, probs = make_multiclass(500, 4, seed=5)
    report = calibration_report(labels, probs, n_resamples=1000, seed=0)
    conf, correct = top_label(labels, probs)
    expected = {
        "accuracy": correct.mean(),
        "mean_confidence": conf.mean(),
        "conf_ece": expected_calibration_error(labels, probs),
        "mce": expected_calibration_error(labels, probs, norm="max"),
        "ace": adaptive_calibration_error(labels, probs),
        "cw_ece": classwise_ece(labels, probs),
        "smece": smooth_ece(labels, probs),
        "brier": brier_score(labels, probs),
        "nll": negative_log_likelihood(labels, probs),
        "auroc": confidence_auroc(labels, probs),
        "aurc": aurc(labels, probs),
    }
    assert set(report) == set(expected) | {"n"} and report["n"] == 500
    for name, value in expected.items():
        entry = report[name]
        assert set(entry) == {"value", "low", "high"}
        assert entry["value"] == pytest.approx(value, abs=1e-12), name
        assert entry["low"] <= entry["high"]
    # the same resamples as bootstrap() with the same seed
    ece = bootstrap(expected_calibration_error, labels, probs, n_resamples=1000, seed=0)
    assert (report["conf_ece"]["low"], report["conf_ece"]["high"]) == pytest.approx((ece.low, ece.high), abs=1e-12)


def test_report_conf_view():
    outcome, conf = make_binary(300, seed=6)
    report = calibration_report(outcome, conf, n_resamples=200)
    assert "cw_ece" not in report
    assert report["accuracy"]["value"] == pytest.approx(outcome.mean())
    assert report["brier"]["value"] == pytest.approx(np.mean((conf - outcome) ** 2))
    assert report["nll"]["value"] == pytest.approx(negative_log_likelihood(outcome, conf))


def test_report_speed_for_the_main_job():
    labels, probs = make_multiclass(500, 4, seed=7)
    start = time.perf_counter()
    calibration_report(labels, probs, n_resamples=1000)
    assert time.perf_counter() - start < 20  # ~1 s on a free core; generous for loaded CI machines


def _paired_by_hand(metric, y_a, p_a, y_b, p_b, n_resamples, seed, level=0.95):
    """metric(a[i]) − metric(b[i]) on the shared draws default_rng(seed).integers(0, n, (R, n)), percentiles."""
    rng = np.random.default_rng(seed)
    diffs = []
    for i in rng.integers(0, len(y_a), size=(n_resamples, len(y_a))):
        if len(set(y_a[i])) < 2 or len(set(y_b[i])) < 2:
            if metric is metrics_mod.confidence_auroc:
                continue
        diffs.append(metric(y_a[i], p_a[i]) - metric(y_b[i], p_b[i]))
    return np.percentile(diffs, [100 * (1 - level) / 2, 100 * (1 + level) / 2])


@pytest.mark.parametrize("name", ["expected_calibration_error", "brier_score", "confidence_auroc"])
def test_paired_bootstrap_equals_a_hand_loop_over_shared_draws(name):
    metric = getattr(metrics_mod, name)
    rng = np.random.default_rng(11)
    y_a = (rng.uniform(size=60) < 0.6).astype(int)
    y_b = np.where(rng.uniform(size=60) < 0.2, 1 - y_a, y_a)  # another method's answers to the same questions
    p_a, p_b = rng.uniform(0.3, 1.0, 60), rng.uniform(0.0, 1.0, 60)
    est, low, high = metrics_mod.paired_bootstrap(metric, y_a, p_a, y_b, p_b, n_resamples=200, seed=4,
                                                  method="percentile")
    assert est == pytest.approx(metric(y_a, p_a) - metric(y_b, p_b), abs=1e-12)
    hand_low, hand_high = _paired_by_hand(metric, y_a, p_a, y_b, p_b, 200, 4)
    # the same draws, float64 sums of 60 terms ≤ 1 in another order: bound 60 · 2.2e-16 · a few
    assert (low, high) == (pytest.approx(hand_low, abs=1e-12), pytest.approx(hand_high, abs=1e-12))
    # paired: a set against itself is exactly 0 in every resample
    assert tuple(metrics_mod.paired_bootstrap(metric, y_a, p_a, y_a, p_a, n_resamples=50)) == (0.0, 0.0, 0.0)


def test_paired_bootstrap_names_unequal_sizes():
    with pytest.raises(ValueError, match="y_prob_b: the paired sets need the same number of items, got 3 and 2"):
        metrics_mod.paired_bootstrap(metrics_mod.brier_score, [1, 0, 1], [0.5, 0.5, 0.5], [1, 0], [0.5, 0.5])


def test_stratified_bootstrap_with_one_stratum_is_the_paired_hand_loop():
    rng = np.random.default_rng(12)
    y_a = (rng.uniform(size=50) < 0.6).astype(int)
    y_b = np.where(rng.uniform(size=50) < 0.2, 1 - y_a, y_a)
    p_a, p_b = rng.uniform(0.3, 1.0, 50), rng.uniform(0.0, 1.0, 50)
    ece = expected_calibration_error

    def delta(k, idx):
        return ece(y_a[idx], p_a[idx]) - ece(y_b[idx], p_b[idx])

    est, low, high = metrics_mod.stratified_bootstrap(delta, [50], n_resamples=150, seed=3, method="percentile")
    assert est == pytest.approx(ece(y_a, p_a) - ece(y_b, p_b), abs=1e-12)
    hand_low, hand_high = _paired_by_hand(ece, y_a, p_a, y_b, p_b, 150, 3)
    assert (low, high) == (pytest.approx(hand_low, abs=1e-12), pytest.approx(hand_high, abs=1e-12))


def test_stratified_bootstrap_of_constant_strata_is_their_weighted_mean():
    values = [np.ones(3), np.full(2, 3.0)]
    result = metrics_mod.stratified_bootstrap(lambda k, idx: float(values[k][idx].mean()), [3, 2], weights=[1, 3],
                                              n_resamples=20)
    assert tuple(result) == (2.5, 2.5, 2.5)  # 0.25 · 1 + 0.75 · 3 on every resample


def test_stratified_bootstrap_spread_of_a_mean_matches_the_stratified_standard_error():
    """For the mean, the bootstrap standard error of Σ w_k x̄_k is sqrt(Σ w_k² s_k² / n_k) with s_k² the plug-in
    variance (Davison & Hinkley 1997, §3.2); the 95 % interval is then ≈ ±1.96 of it."""
    rng = np.random.default_rng(5)
    values = [rng.normal(0, 1, 80), rng.normal(2, 3, 40)]
    w = np.array([0.5, 0.5])
    se = np.sqrt(sum(wk**2 * v.var() / len(v) for wk, v in zip(w, values)))
    est, low, high = metrics_mod.stratified_bootstrap(lambda k, idx: float(values[k][idx].mean()), [80, 40],
                                                      n_resamples=4000, seed=1, method="percentile")
    assert est == pytest.approx(0.5 * values[0].mean() + 0.5 * values[1].mean(), abs=1e-12)
    assert (high - low) / 2 == pytest.approx(1.96 * se, rel=0.08)  # Monte Carlo error of 4000 resamples ≈ 3 %


@pytest.mark.parametrize("kwargs, message", [
    (dict(sizes=[]), "sizes: must be one or more"), (dict(sizes=[3, 0]), "sizes: must be one or more"),
    (dict(sizes=[3], weights=[1, 1]), "weights: must be 1 finite"),
    (dict(sizes=[3, 3], weights=[-1, 2]), "weights: must be 2 finite"),
    (dict(sizes=[3, 3], weights=[0, 0]), "weights: must be 2 finite"),
    (dict(sizes=[3], n_resamples=0), "n_resamples: must be ≥ 1"),
])
def test_stratified_bootstrap_names_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        metrics_mod.stratified_bootstrap(lambda k, idx: 0.0, **kwargs)


def test_stratified_bootstrap_undefined_everywhere_is_an_error():
    with pytest.raises(ValueError, match="undefined on every resample"):
        metrics_mod.stratified_bootstrap(lambda k, idx: float("nan"), [4], n_resamples=5)


# ---- BCa (the default): scipy.stats.bootstrap(method="BCa") on the same resample indices ------------------------
# scipy draws default_rng(seed).integers(0, n, (n_resamples, n)) per sample, as bootstrap() documents, and takes
# its jackknife leaving one item out; below 1000 items ours does too, so the two intervals are the same numbers.


def _scipy_bca(statistic, sizes, n_resamples, seed, level=0.95):
    data = tuple(np.arange(n) for n in sizes)
    result = scipy.stats.bootstrap(data, statistic, paired=len(sizes) == 1, vectorized=False,
                                   n_resamples=n_resamples, confidence_level=level, method="BCa",
                                   rng=np.random.default_rng(seed))
    return result.confidence_interval.low, result.confidence_interval.high


def _small_sample(n, seed):
    """n questions with confidences in [0.3, 0.95] (2 decimals, so ties) and correctness drawn from them."""
    rng = np.random.default_rng(seed)
    conf = np.round(rng.uniform(0.3, 0.95, n), 2)
    return (rng.uniform(size=n) < conf).astype(int), conf


def test_ace_on_50_questions_holds_its_value_and_is_scipys_bca():
    # 50 questions, 15 equal-mass bins: resampled ACE is biased upwards (duplicated items), so the percentile
    # interval lies above the sample's ACE; BCa's bias correction brings it back around the value
    y, conf = _small_sample(50, 17)
    value = adaptive_calibration_error(y, conf)
    percentile = bootstrap(adaptive_calibration_error, y, conf, n_resamples=500, seed=0, method="percentile")
    assert not percentile.low <= value <= percentile.high
    est, low, high = bootstrap(adaptive_calibration_error, y, conf, n_resamples=500, seed=0)
    assert est == value and low <= value <= high
    expected = _scipy_bca(lambda i: adaptive_calibration_error(y[i], conf[i]), [50], 500, 0)
    assert (low, high) == (pytest.approx(expected[0], abs=1e-12), pytest.approx(expected[1], abs=1e-12))
    report = calibration_report(y, conf, n_resamples=500, seed=0)
    assert (report["ace"]["low"], report["ace"]["high"]) == pytest.approx((low, high), abs=1e-12)


@pytest.mark.parametrize("metric, kwargs", CASES[:6] + CASES[8:9], ids=lambda v: getattr(v, "__name__", str(v)))
def test_bca_equals_scipy_where_scipys_interval_holds_the_value(metric, kwargs):
    y, conf = _small_sample(120, 3)
    est, low, high = bootstrap(metric, y, conf, n_resamples=300, seed=2, metric_kwargs=kwargs)
    expected = _scipy_bca(lambda i: metric(y[i], conf[i], **kwargs), [120], 300, 2)
    if expected[0] <= est <= expected[1]:
        assert (low, high) == (pytest.approx(expected[0], abs=1e-12), pytest.approx(expected[1], abs=1e-12))
    else:  # our documented deviation: the end that excludes the value moves to it
        assert low == pytest.approx(min(expected[0], est), abs=1e-12) and high == pytest.approx(max(expected[1], est), abs=1e-12)


def test_bca_never_excludes_the_value_where_every_resample_lies_above_it():
    y, conf = _small_sample(50, 2)  # every resampled ACE exceeds the sample's: BCa undefined (scipy: NaN)
    value = adaptive_calibration_error(y, conf)
    idx = np.random.default_rng(0).integers(0, 50, size=(500, 50))
    resampled = np.array([adaptive_calibration_error(y[i], conf[i]) for i in idx])
    assert resampled.min() > value
    est, low, high = bootstrap(adaptive_calibration_error, y, conf, n_resamples=500, seed=0)
    assert (low, high) == (value, pytest.approx(np.percentile(resampled, 97.5), abs=1e-12))


def test_paired_bca_equals_scipy():
    # seeds without a resample within rounding of the estimate: there scipy's exact comparison and our tie
    # tolerance (bootstrap_interval) may count it differently
    y_a, p_a = _small_sample(80, 11)
    y_b, p_b = _small_sample(80, 12)
    ece = expected_calibration_error
    est, low, high = metrics_mod.paired_bootstrap(ece, y_a, p_a, y_b, p_b, n_resamples=300, seed=1)
    expected = _scipy_bca(lambda i: ece(y_a[i], p_a[i]) - ece(y_b[i], p_b[i]), [80], 300, 1)
    assert expected[0] <= est <= expected[1]
    assert (low, high) == (pytest.approx(expected[0], abs=1e-12), pytest.approx(expected[1], abs=1e-12))


def test_stratified_bca_equals_scipys_multi_sample_bca():
    rng = np.random.default_rng(8)
    values = [rng.exponential(1.0, 40), rng.exponential(3.0, 25)]  # skewed: BCa differs from the percentiles
    w = [0.3, 0.7]
    est, low, high = metrics_mod.stratified_bootstrap(lambda k, idx: float(values[k][idx].mean()), [40, 25],
                                                      weights=w, n_resamples=400, seed=4)
    expected = _scipy_bca(lambda i, j: w[0] * values[0][i].mean() + w[1] * values[1][j].mean(), [40, 25], 400, 4)
    assert (low, high) == (pytest.approx(expected[0], abs=1e-12), pytest.approx(expected[1], abs=1e-12))
    _, p_low, p_high = metrics_mod.stratified_bootstrap(lambda k, idx: float(values[k][idx].mean()), [40, 25],
                                                        weights=w, n_resamples=400, seed=4, method="percentile")
    assert (p_low, p_high) != pytest.approx((low, high), abs=1e-3)
