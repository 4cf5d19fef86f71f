import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import sklearn
import torch
from scipy.special import log_softmax, logit
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.calibration import CalibratedClassifierCV
from sklearn.exceptions import NotFittedError
from sklearn.isotonic import IsotonicRegression
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

try:
    from sklearn.frozen import FrozenEstimator
except ImportError:  # scikit-learn < 1.6; the tests that need it are skipped
    FrozenEstimator = None

from hf_calibration.posthoc import (
    CALIBRATORS,
    HistogramBinningCalibrator,
    IsotonicCalibrator,
    PlattScaler,
    TemperatureScaler,
    TemperatureScalingLogitsProcessor,
    VectorScaler,
    load_calibrator,
)


SKLEARN_VERSION = tuple(int(p) for p in sklearn.__version__.split(".")[:2])


def _sample_labels(rng, probs):
    """One categorical draw per row of probs (n, K)."""
    return (rng.random(probs.shape[0])[:, None] > probs.cumsum(axis=1)).sum(axis=1)


def _softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.fixture(scope="module")
def mc_data():
    """Overconfident 4-class logits: labels drawn from softmax(z / 2)."""
    rng = np.random.default_rng(0)
    z = rng.normal(0.0, 3.0, size=(600, 4))
    y = _sample_labels(rng, _softmax(z / 2.0))
    return z, y


@pytest.fixture(scope="module")
def binary_data():
    """Overconfident confidences: P(correct | c) = c ** 2."""
    rng = np.random.default_rng(1)
    c = rng.uniform(0.25, 1.0, size=500)
    correct = (rng.random(500) < c**2).astype(int)
    return c, correct


def _mean_nll(probs, y):
    return -np.mean(np.log(probs[np.arange(len(y)), y]))


# --------------------------------------------------------------------------------------------------
# Temperature scaling
# --------------------------------------------------------------------------------------------------
def test_temperature_matches_grid_search(mc_data):
    z, y = mc_data
    log_t = np.linspace(-3.0, 3.0, 60001)  # step 1e-4 in log T
    nll = [-np.mean(log_softmax(z / np.exp(s), axis=1)[np.arange(len(y)), y]) for s in log_t[::100]]
    coarse = log_t[::100][int(np.argmin(nll))]
    fine = log_t[np.abs(log_t - coarse) <= 0.02]
    nll = [-np.mean(log_softmax(z / np.exp(s), axis=1)[np.arange(len(y)), y]) for s in fine]
    t_grid = np.exp(fine[int(np.argmin(nll))])
    scaler = TemperatureScaler().fit(z, y)
    assert abs(scaler.temperature_ - t_grid) < 1e-3
    assert scaler.temperature_ > 1.0  # data are overconfident


class _LogitsAsDecisionFunction(ClassifierMixin, BaseEstimator):
    """A 'classifier' whose decision_function is its input, so sklearn calibrates given logits."""

    def fit(self, X, y):
        self.classes_ = np.unique(y)
        return self

    def decision_function(self, X):
        X = np.asarray(X)
        return X[:, 0] if X.shape[1] == 1 else X

    def predict(self, X):
        return self.classes_[np.asarray(X).argmax(axis=1)]  # only for sklearn's API check


@pytest.mark.skipif(SKLEARN_VERSION < (1, 8), reason='CalibratedClassifierCV(method="temperature") is new in 1.8')
def test_temperature_matches_sklearn_calibrated_classifier(mc_data):
    z, y = mc_data
    est = _LogitsAsDecisionFunction().fit(z, y)
    cal = CalibratedClassifierCV(FrozenEstimator(est), method="temperature").fit(z, y)
    beta = float(cal.calibrated_classifiers_[0].calibrators[0].beta_)  # sklearn fits 1 / T
    scaler = TemperatureScaler().fit(z, y)
    assert scaler.temperature_ == pytest.approx(1.0 / beta, abs=1e-3)
    np.testing.assert_allclose(scaler.transform(z), cal.predict_proba(z), atol=1e-6)


def test_temperature_recovers_known_temperature():
    rng = np.random.default_rng(123)
    z = rng.normal(0.0, 3.0, size=(50000, 4))
    true_t = 1.7
    y = _sample_labels(rng, _softmax(z / true_t))
    t = TemperatureScaler().fit(z, y).temperature_
    assert abs(t - true_t) / true_t < 0.02


def test_temperature_transform_is_softmax_over_t_and_keeps_argmax(mc_data):
    z, y = mc_data
    scaler = TemperatureScaler()
    probs = scaler.fit_transform(z, y)
    np.testing.assert_allclose(probs, _softmax(z / scaler.temperature_), rtol=1e-12)
    np.testing.assert_array_equal(probs.argmax(axis=1), z.argmax(axis=1))
    assert _mean_nll(probs, y) < _mean_nll(_softmax(z), y)


def test_temperature_accepts_lists_and_torch(mc_data):
    z, y = mc_data
    expected = TemperatureScaler().fit(z, y).temperature_
    assert TemperatureScaler().fit(z.tolist(), y.tolist()).temperature_ == pytest.approx(expected, rel=1e-9)
    t_torch = TemperatureScaler().fit(torch.tensor(z, dtype=torch.float64), torch.tensor(y)).temperature_
    assert t_torch == pytest.approx(expected, rel=1e-9)
    bf16 = TemperatureScaler().fit(torch.tensor(z).to(torch.bfloat16), torch.tensor(y))
    assert bf16.temperature_ == pytest.approx(expected, rel=0.02)


# --------------------------------------------------------------------------------------------------
# Vector scaling
# --------------------------------------------------------------------------------------------------
def test_vector_scaling_reduces_nll(mc_data):
    z, y = mc_data
    scaler = VectorScaler().fit(z, y)
    probs = scaler.transform(z)
    assert probs.shape == z.shape
    np.testing.assert_allclose(probs.sum(axis=1), 1.0)
    assert _mean_nll(probs, y) < _mean_nll(_softmax(z), y) - 0.05
    # it contains temperature scaling (w = 1/T, b = 0), so it fits at least as well
    assert _mean_nll(probs, y) <= _mean_nll(TemperatureScaler().fit(z, y).transform(z), y) + 1e-9
    assert scaler.intercept_.sum() == pytest.approx(0.0, abs=1e-12)


def test_vector_scaling_huge_l2_is_identity(mc_data):
    z, y = mc_data
    scaler = VectorScaler(l2=1e8).fit(z, y)
    np.testing.assert_allclose(scaler.coef_, 1.0, atol=1e-6)
    np.testing.assert_allclose(scaler.intercept_, 0.0, atol=1e-6)
    np.testing.assert_allclose(scaler.transform(z), _softmax(z), atol=1e-5)


def test_vector_scaling_matches_torch_autograd_fit(mc_data):
    """Same objective minimised by torch LBFGS with autograd: an independent gradient and solver."""
    z, y = mc_data
    l2 = 0.01
    zt, yt = torch.tensor(z), torch.tensor(y)
    w = torch.ones(4, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(4, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], lr=1.0, max_iter=500, tolerance_grad=1e-12, tolerance_change=1e-15,
                            line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(zt * w + b, yt) + l2 * (((w - 1) ** 2).sum() + (b**2).sum())
        loss.backward()
        return loss

    opt.step(closure)
    scaler = VectorScaler(l2=l2).fit(z, y)
    np.testing.assert_allclose(scaler.coef_, w.detach().numpy(), atol=1e-5)
    np.testing.assert_allclose(scaler.intercept_, b.detach().numpy(), atol=1e-5)


def test_vector_scaling_rejects_other_k(mc_data):
    z, y = mc_data
    scaler = VectorScaler().fit(z, y)
    with pytest.raises(ValueError, match=r"logits: .*K=3.*K=4"):
        scaler.transform(z[:, :3])


# --------------------------------------------------------------------------------------------------
# Binary calibrators
# --------------------------------------------------------------------------------------------------
def test_platt_matches_sklearn_logistic_regression(binary_data):
    c, correct = binary_data
    x = logit(c)[:, None]
    lr = LogisticRegression(C=1e12, tol=1e-12, max_iter=10000).fit(x, correct)
    platt = PlattScaler().fit(c, correct)
    assert platt.coef_ == pytest.approx(lr.coef_[0, 0], abs=1e-5)
    assert platt.intercept_ == pytest.approx(lr.intercept_[0], abs=1e-5)
    np.testing.assert_allclose(platt.transform(c), lr.predict_proba(x)[:, 1], atol=1e-6)


@pytest.mark.skipif(SKLEARN_VERSION < (1, 6), reason="sklearn.frozen is new in 1.6")
def test_platt_target_smoothing_matches_sklearn_sigmoid(binary_data):
    """Platt's Bayesian targets, as CalibratedClassifierCV(method="sigmoid") fits them."""
    c, correct = binary_data
    x = logit(c)[:, None]
    est = _LogitsAsDecisionFunction().fit(x, correct)
    cal = CalibratedClassifierCV(FrozenEstimator(est), method="sigmoid").fit(x, correct)
    platt = PlattScaler(target_smoothing=True).fit(c, correct)
    np.testing.assert_allclose(platt.transform(c), cal.predict_proba(x)[:, 1], atol=1e-5)


def test_isotonic_monotone_in_unit_interval_and_matches_sklearn(binary_data):
    c, correct = binary_data
    iso = IsotonicCalibrator().fit(c, correct)
    grid = np.linspace(0.0, 1.0, 1001)  # includes values outside the fitted range (c >= 0.25)
    out = iso.transform(grid)
    assert np.all(np.diff(out) >= 0)
    assert out.min() >= 0.0 and out.max() <= 1.0
    ref = IsotonicRegression(out_of_bounds="clip", y_min=0, y_max=1).fit(c, correct)
    np.testing.assert_allclose(out, ref.predict(grid), atol=1e-12)


def test_histogram_binning_by_hand():
    c = np.array([0.0, 0.05, 0.1, 0.45, 0.5, 0.95, 1.0, 1.0])
    correct = np.array([0, 0, 1, 1, 0, 1, 1, 0])
    cal = HistogramBinningCalibrator(n_bins=4).fit(c, correct)
    # bins [0,.25) [.25,.5) [.5,.75) [.75,1]; bin 2 holds only c=0.5
    np.testing.assert_array_equal(cal.bin_counts_, [3, 1, 1, 3])
    np.testing.assert_allclose(cal.bin_values_, [1 / 3, 1.0, 0.0, 2 / 3])
    np.testing.assert_allclose(cal.transform([0.2, 0.25, 0.74, 0.75, 1.0]), [1 / 3, 1.0, 0.0, 2 / 3, 2 / 3])


def test_histogram_empty_bins_get_overall_accuracy():
    c = np.array([0.05, 0.1, 0.9, 0.95])
    correct = np.array([0, 0, 1, 0])
    cal = HistogramBinningCalibrator(n_bins=10).fit(c, correct)
    assert cal.transform([0.5])[0] == pytest.approx(0.25)
    np.testing.assert_allclose(cal.transform([0.05, 0.95]), [0.0, 0.5])


def test_binary_calibrators_improve_brier(binary_data):
    c, correct = binary_data
    base = np.mean((c - correct) ** 2)
    for cls in (PlattScaler, IsotonicCalibrator, HistogramBinningCalibrator):
        out = cls().fit_transform(c, correct)
        assert out.shape == c.shape and out.min() >= 0 and out.max() <= 1
        assert np.mean((out - correct) ** 2) < base


# Issue 14 replay: a wrong answer at 0.999999 and right ones nearer to 1. Clipping at 1 - 1e-6 tied them all
# and AUROC fell; a monotone calibrator must leave the ranking, hence AUROC, as it is.
SATURATED_CONF = np.array([0.2, 0.3, 0.35, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.8, 0.85, 0.9, 0.95,
                           0.999999, 1 - 1e-7, 1 - 1e-8, 1 - 1e-9, 1.0])
SATURATED_CORRECT = np.array([0, 0, 1, 0, 1, 0, 1, 1, 0, 1, 0, 1, 1, 0, 1, 1, 1, 1])


@pytest.mark.parametrize("target_smoothing", [False, True])
def test_platt_keeps_the_ranking_near_one(target_smoothing):
    raw_auroc = roc_auc_score(SATURATED_CORRECT, SATURATED_CONF)
    platt = PlattScaler(target_smoothing=target_smoothing).fit(SATURATED_CONF, SATURATED_CORRECT)
    assert platt.coef_ > 0
    assert roc_auc_score(SATURATED_CORRECT, platt.transform(SATURATED_CONF)) == raw_auroc
    same = PlattScaler(target_smoothing=target_smoothing, input_format="log_probability")
    same.fit(np.log(SATURATED_CONF), SATURATED_CORRECT)
    assert roc_auc_score(SATURATED_CORRECT, same.transform(np.log(SATURATED_CONF))) == raw_auroc


def test_platt_identity_keeps_confidences_within_1e_9_of_the_ends():
    platt = PlattScaler()
    platt.coef_, platt.intercept_ = 1.0, 0.0  # sigmoid(logit(c)) = c, as a loaded calibrator would hold
    c = np.array([1e-300, 1e-20, 1e-12, 1e-9, 0.5, 1 - 1e-9, 1 - 1e-12, 1 - 1e-15])
    out = platt.transform(c)  # the identity, up to the rounding of exp(log(c)) and of 1 - c
    np.testing.assert_allclose(out, c, rtol=1e-12, atol=0)
    np.testing.assert_allclose(1 - out, 1 - c, rtol=1e-12, atol=2 * np.finfo(float).eps)
    ends = platt.transform(np.concatenate([[0.0], c, [np.nextafter(1.0, 0.0), 1.0]]))
    assert np.all(np.diff(ends[:-1]) > 0) and ends[-1] >= ends[-2]


@pytest.mark.parametrize("cls", [PlattScaler, IsotonicCalibrator, HistogramBinningCalibrator])
def test_log_probability_and_log_odds_inputs_give_the_confidence_fit(cls, binary_data):
    c, correct = binary_data
    ref = cls().fit(c, correct)
    for input_format, x in (("log_probability", np.log(c)), ("log_odds", logit(c))):
        cal = cls(input_format=input_format).fit(x, correct)
        np.testing.assert_allclose(cal.transform(x), ref.transform(c), rtol=0, atol=1e-9)
        if cls is PlattScaler:
            assert cal.coef_ == pytest.approx(ref.coef_, abs=1e-9)
            assert cal.intercept_ == pytest.approx(ref.intercept_, abs=1e-9)


@pytest.mark.parametrize("cls", [PlattScaler, IsotonicCalibrator, HistogramBinningCalibrator])
def test_input_format_survives_save_and_load(cls, binary_data, tmp_path):
    c, correct = binary_data
    cal = cls(input_format="log_probability").fit(np.log(c), correct)
    cal.save(tmp_path / "cal.json")
    assert json.loads((tmp_path / "cal.json").read_text())["params"]["input_format"] == "log_probability"
    x_new = np.log(np.random.default_rng(6).uniform(0.01, 1.0, size=50))
    for loaded in (cls.load(tmp_path / "cal.json"), load_calibrator(tmp_path / "cal.json")):
        assert loaded.get_params() == cal.get_params()
        np.testing.assert_array_equal(loaded.transform(x_new), cal.transform(x_new))


@pytest.mark.parametrize("cls", [PlattScaler, IsotonicCalibrator, HistogramBinningCalibrator])
@pytest.mark.parametrize(
    ("input_format", "x", "exc", "pattern"),
    [
        ("logit", [0.2, 0.6, 0.9, 0.4], ValueError,
         r"input_format: must be one of 'probability', 'log_probability', 'log_odds', got 'logit'"),
        ("log_probability", [-1.0, 0.5, -0.1, -2.0], ValueError,
         r"confidence: must be finite log-probabilities ≤ 0 \(input_format='log_probability'\), got 0\.5 at 1"),
        ("log_probability", [-1.0, -np.inf, -0.1, -2.0], ValueError, r"confidence: must be finite.*got -inf at 1"),
        ("log_odds", [-1.0, 2.0, np.nan, 0.0], ValueError,
         r"confidence: must be finite log-odds \(input_format='log_odds'\), got nan at 2"),
    ],
)
def test_input_format_errors(cls, input_format, x, exc, pattern):
    with pytest.raises(exc, match=pattern):
        cls(input_format=input_format).fit(x, GOOD_T)


# --------------------------------------------------------------------------------------------------
# Save / load
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", sorted(CALIBRATORS))
def test_save_load_round_trip(method, mc_data, binary_data, tmp_path):
    cls = CALIBRATORS[method]
    if cls.input_kind == "logits":
        X, y = mc_data
        X_new = np.random.default_rng(5).normal(0, 4, size=(50, 4))
    else:
        X, y = binary_data
        X_new = np.random.default_rng(5).uniform(0, 1, size=50)
    cal = {"vector": VectorScaler(l2=0.5), "histogram": HistogramBinningCalibrator(n_bins=7)}.get(method, cls())
    cal.fit(X, y)
    path = tmp_path / f"{method}.json"
    cal.save(path)
    payload = json.loads(path.read_text())
    assert payload["method"] == method and payload["format_version"] == 1
    for loaded in (cls.load(path), load_calibrator(str(path))):
        assert type(loaded) is cls and loaded.get_params() == cal.get_params()
        np.testing.assert_array_equal(loaded.transform(X_new), cal.transform(X_new))


def test_load_wrong_method_or_version(mc_data, tmp_path):
    z, y = mc_data
    path = tmp_path / "t.json"
    TemperatureScaler().fit(z, y).save(path)
    with pytest.raises(ValueError, match="'temperature'.*'vector'"):
        VectorScaler.load(path)
    payload = json.loads(path.read_text())
    payload["format_version"] = 99
    path.write_text(json.dumps(payload))
    with pytest.raises(ValueError, match="format_version=99"):
        load_calibrator(path)
    payload.update(format_version=1, method="magic")
    path.write_text(json.dumps(payload))
    with pytest.raises(ValueError, match="unknown method 'magic'"):
        load_calibrator(path)


def test_input_kinds():
    assert {m: c.input_kind for m, c in CALIBRATORS.items()} == {
        "temperature": "logits", "vector": "logits",
        "platt": "confidence", "isotonic": "confidence", "histogram": "confidence",
    }


# --------------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------------
GOOD_Z = np.array([[1.0, 0.0, -1.0], [0.0, 2.0, 0.5], [0.3, 0.1, 0.2]])
GOOD_Y = np.array([0, 1, 2])
GOOD_C = np.array([0.2, 0.6, 0.9, 0.4])
GOOD_T = np.array([0, 1, 1, 0])


@pytest.mark.parametrize("cls", [TemperatureScaler, VectorScaler])
@pytest.mark.parametrize(
    ("logits", "labels", "exc", "pattern"),
    [
        (GOOD_Z, [0, 1, 3], ValueError, r"labels: .*\[0, 2\].*got 3"),
        (GOOD_Z, [0, -1, 2], ValueError, r"labels: .*got -1"),
        (GOOD_Z, [0, 1.5, 2], ValueError, r"labels: .*integer.*1\.5"),
        (GOOD_Z, [0, 1], ValueError, r"labels: has 2 entries.*logits has 3"),
        (GOOD_Z[:, :1], [0, 0, 0], ValueError, r"logits: .*1 class.*at least 2 classes"),
        (GOOD_Z[0], [0], ValueError, r"logits: .*shape \(n, K\)"),
        (np.where(GOOD_Z == 2.0, np.nan, GOOD_Z), GOOD_Y, ValueError, r"logits: .*finite.*nan"),
        (np.where(GOOD_Z == 2.0, np.inf, GOOD_Z), GOOD_Y, ValueError, r"logits: .*finite.*inf"),
        ([["a", "b"], ["c", "d"]], [0, 1], TypeError, r"logits: must hold numbers"),
        (GOOD_Z, ["a", "b", "c"], TypeError, r"labels: must hold numbers"),
    ],
)
def test_logit_calibrators_reject_bad_input(cls, logits, labels, exc, pattern):
    with pytest.raises(exc, match=pattern):
        cls().fit(logits, labels)


@pytest.mark.parametrize("cls", [PlattScaler, IsotonicCalibrator, HistogramBinningCalibrator])
@pytest.mark.parametrize(
    ("conf", "correct", "exc", "pattern"),
    [
        ([0.2, 1.5, 0.9, 0.4], GOOD_T, ValueError, r"confidence: .*\[0, 1\].*1\.5"),
        ([0.2, -0.1, 0.9, 0.4], GOOD_T, ValueError, r"confidence: .*-0\.1"),
        ([0.2, np.nan, 0.9, 0.4], GOOD_T, ValueError, r"confidence: .*nan"),
        (GOOD_C, [0, 1, 1], ValueError, r"correct: has 3 entries.*confidence has 4"),
        (GOOD_C, [0, 1, 2, 0], ValueError, r"correct: .*binary.*2"),
        (GOOD_C, [1, 1, 1, 1], ValueError, r"correct: .*only one class"),
        (GOOD_C[:, None], GOOD_T, ValueError, r"confidence: .*shape \(n,\)"),
        (["x", "y", "z", "w"], GOOD_T, TypeError, r"confidence: must hold numbers"),
    ],
)
def test_confidence_calibrators_reject_bad_input(cls, conf, correct, exc, pattern):
    with pytest.raises(exc, match=pattern):
        cls().fit(conf, correct)


@pytest.mark.parametrize("method", sorted(CALIBRATORS))
def test_unfitted_transform_and_save_raise(method, tmp_path):
    cal = CALIBRATORS[method]()
    X = GOOD_Z if cal.input_kind == "logits" else GOOD_C
    with pytest.raises(NotFittedError, match="not fitted"):
        cal.transform(X)
    with pytest.raises(ValueError, match="not fitted"):  # NotFittedError is a ValueError
        cal.save(tmp_path / "x.json")


def test_transform_validates_input():
    with pytest.raises(ValueError, match="logits: .*nan"):
        TemperatureScaler().fit(GOOD_Z, GOOD_Y).transform([[np.nan, 1.0]])
    with pytest.raises(ValueError, match=r"confidence: .*2\.0"):
        PlattScaler().fit(GOOD_C, GOOD_T).transform([2.0])


@pytest.mark.parametrize(
    ("cal", "exc", "pattern"),
    [
        (TemperatureScaler(init_temperature=0.0), ValueError, r"init_temperature: .*> 0.*0\.0"),
        (TemperatureScaler(max_iter=0), ValueError, r"max_iter: must be ≥ 1, got 0"),
        (TemperatureScaler(max_iter=2.5), TypeError, r"max_iter: must be an int, got 2\.5"),
        (VectorScaler(l2=-1.0), ValueError, r"l2: .*≥ 0.*-1\.0"),
        (HistogramBinningCalibrator(n_bins=0), ValueError, r"n_bins: must be ≥ 1, got 0"),
        (PlattScaler(target_smoothing="yes"), TypeError, r"target_smoothing: must be a bool"),
    ],
)
def test_bad_hyperparameters(cal, exc, pattern):
    X, y = (GOOD_Z, GOOD_Y) if cal.input_kind == "logits" else (GOOD_C, GOOD_T)
    with pytest.raises(exc, match=pattern):
        cal.fit(X, y)


# --------------------------------------------------------------------------------------------------
# Logits processor
# --------------------------------------------------------------------------------------------------
def test_processor_changes_only_requested_token_ids():
    scores = torch.randn(3, 20)
    original = scores.clone()
    proc = TemperatureScalingLogitsProcessor(2.0, token_ids=[3, 7, 11])
    out = proc(torch.zeros(3, 1, dtype=torch.long), scores)
    torch.testing.assert_close(scores, original)  # input untouched
    mask = torch.zeros(20, dtype=torch.bool)
    mask[[3, 7, 11]] = True
    top = original[:, mask].max(dim=1, keepdim=True).values  # scaled about the options' maximum, by hand
    torch.testing.assert_close(out[:, mask], top + (original[:, mask] - top) / 2.0)
    assert torch.equal(out[:, ~mask], original[:, ~mask])
    assert torch.equal(out[:, mask].max(dim=1).values, top[:, 0])  # the top option keeps its score
    # the option softmax equals the scaler's calibrated probabilities
    scaler = TemperatureScaler()
    scaler.temperature_ = 2.0
    np.testing.assert_allclose(
        torch.softmax(out[:, [3, 7, 11]].double(), dim=-1).numpy(),
        scaler.transform(original[:, [3, 7, 11]].double()),
        atol=1e-6,
    )


def test_processor_all_tokens_and_from_scaler(mc_data):
    z, y = mc_data
    scaler = TemperatureScaler().fit(z, y)
    proc = TemperatureScalingLogitsProcessor.from_scaler(scaler)
    scores = torch.randn(2, 10)
    torch.testing.assert_close(proc(None, scores), scores / scaler.temperature_)
    with pytest.raises(TypeError, match="scaler: must be a TemperatureScaler"):
        TemperatureScalingLogitsProcessor.from_scaler(VectorScaler().fit(z, y))
    with pytest.raises(NotFittedError):
        TemperatureScalingLogitsProcessor.from_scaler(TemperatureScaler())


@pytest.mark.parametrize(
    ("kwargs", "exc", "pattern"),
    [
        ({"temperature": 0.0}, ValueError, r"temperature: .*> 0.*0\.0"),
        ({"temperature": -1.0}, ValueError, r"temperature: .*-1\.0"),
        ({"temperature": float("nan")}, ValueError, r"temperature: .*nan"),
        ({"temperature": "2"}, TypeError, r"temperature: must be a real number"),
        ({"temperature": 2.0, "token_ids": [1, -2]}, ValueError, r"token_ids: must be ≥ 0, got -2"),
        ({"temperature": 2.0, "token_ids": [1.5]}, TypeError, r"token_ids: must be integers"),
        ({"temperature": 2.0, "token_ids": []}, ValueError, r"token_ids: must be a non-empty"),
    ],
)
def test_processor_rejects_bad_arguments(kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        TemperatureScalingLogitsProcessor(**kwargs)


def test_processor_token_id_outside_vocab():
    proc = TemperatureScalingLogitsProcessor(2.0, token_ids=[1, 64])
    with pytest.raises(ValueError, match=r"token_ids: contains \[64\].*size 64"):
        proc(None, torch.zeros(1, 64))


def test_processor_inside_generate():
    from transformers import LlamaConfig, LlamaForCausalLM, LogitsProcessorList

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)
    model = LlamaForCausalLM(config).eval()
    ids = [5, 9, 40]
    proc = TemperatureScalingLogitsProcessor(0.5, token_ids=ids)
    out = model.generate(
        torch.tensor([[1, 2, 3]]), max_new_tokens=3, do_sample=False, pad_token_id=0,
        logits_processor=LogitsProcessorList([proc]),
        output_scores=True, output_logits=True, return_dict_in_generate=True,
    )
    others = torch.ones(64, dtype=torch.bool)
    others[ids] = False
    for raw, processed in zip(out.logits, out.scores):
        top = raw[:, ids].max(dim=1, keepdim=True).values
        torch.testing.assert_close(processed[:, ids], top + (raw[:, ids] - top) / 0.5)
        assert torch.equal(processed[:, others], raw[:, others])


def test_processor_keeps_greedy_on_the_options_for_t_above_1():
    # option letters at 10 and 9, a non-option word at 6: dividing the letters by T = 4 (2.5, 2.25) let the word win
    scores = torch.tensor([[10.0, 9.0, 6.0, 0.0]])
    out = TemperatureScalingLogitsProcessor(4.0, token_ids=[0, 1])(None, scores)
    assert out.argmax().item() == 0
    torch.testing.assert_close(out, torch.tensor([[10.0, 9.75, 6.0, 0.0]]))  # 10 + (9 − 10) / 4 = 9.75


def test_iteration_cap_warns(mc_data):
    from sklearn.exceptions import ConvergenceWarning

    z, y = mc_data
    with pytest.warns(ConvergenceWarning, match="max_iter=1"):
        VectorScaler(max_iter=1).fit(z, y)


def test_temperature_at_bound_warns_for_uninformative_logits():
    # Labels independent of the logits: NLL keeps falling as T grows (the uniform prediction is best),
    # so the optimum is the upper bound exp(10) and the fit says so.
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(400, 4)) * 3
    labels = rng.integers(0, 4, size=400)
    logits[np.arange(400), (labels + 1) % 4] += 5.0  # confidently wrong everywhere
    with pytest.warns(RuntimeWarning, match="bound"):
        ts = TemperatureScaler().fit(logits, labels)
    assert ts.temperature_ == pytest.approx(np.exp(10.0))


@pytest.mark.parametrize("bad", [-1.0, 0.0, float("nan")])
def test_loading_a_non_positive_or_nan_temperature_fails(tmp_path, bad):
    ts = TemperatureScaler().fit(np.array([[2.0, 0.0], [0.0, 1.0], [1.0, 0.5]]), np.array([0, 1, 1]))
    path = tmp_path / "ts.json"
    ts.save(path)
    payload = json.loads(path.read_text())
    payload["state"]["temperature_"] = bad
    path.write_text(json.dumps(payload))
    with pytest.raises(ValueError, match="temperature_"):
        TemperatureScaler.load(path)


def test_evaluate_report_feeds_a_confidence_calibrator_its_own_input_format():
    """``evaluate --posthoc`` with a calibrator fitted on log-odds or log-probabilities must give it those,
    not probabilities: Platt fitted on the same answers in each format reports the same metrics."""
    from scipy.special import log_softmax, logit, softmax

    from hf_calibration.modeling.scoring import MCQAScores
    from hf_calibration.posthoc import PlattScaler
    from hf_calibration.reporting.reports import posthoc_report

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(60, 4)) * 2
    labels = rng.integers(0, 4, 60)
    probs = softmax(logits, axis=1)
    scores = MCQAScores(option_logits=logits, probs=probs, option_mass=np.ones(60), prediction=probs.argmax(1),
                        confidence=probs.max(1), labels=labels, correct=probs.argmax(1) == labels, prompt_format="plain")
    conf, correct = probs.max(1), (probs.argmax(1) == labels).astype(int)
    reports = {}
    for fmt, x in (("probability", conf), ("log_probability", log_softmax(logits, axis=1).max(1)),
                   ("log_odds", logit(conf))):
        reports[fmt] = posthoc_report(PlattScaler(input_format=fmt).fit(x, correct), scores, n_resamples=10, seed=0)
    # The three inputs are the same log-odds up to float64 rounding (~1e-15 relative); the fits are iterative
    # optimisations stopped at a gradient tolerance, so their parameters (and metrics) agree to ~1e-8, not exactly.
    # Fed probabilities instead, the log-odds calibrators score every answer ~0 or ~1 (ECE moves by > 0.1).
    for fmt in ("log_probability", "log_odds"):
        for metric in ("conf_ece", "brier", "auroc"):
            assert reports[fmt][metric]["value"] == pytest.approx(reports["probability"][metric]["value"], abs=1e-6)
