"""Post-hoc calibrators: temperature, vector, Platt, isotonic and histogram-binning scaling.

Each calibrator is a scikit-learn-style object with ``fit`` / ``transform`` / ``fit_transform``,
fitted on a labelled validation split and applied unchanged to new data. Two kinds of input exist,
named by the class attribute ``input_kind`` so that callers (the CLI) know what to feed:

- ``"logits"`` (:class:`TemperatureScaler`, :class:`VectorScaler`): option logits of shape
  (n, K) and integer labels in [0, K); ``transform`` returns probabilities of shape (n, K).
- ``"confidence"`` (:class:`PlattScaler`, :class:`IsotonicCalibrator`,
  :class:`HistogramBinningCalibrator`): a confidence c of shape (n,) and binary correctness of
  shape (n,); ``transform`` returns the calibrated probability of being correct, shape (n,), in
  [0, 1]. The constructor parameter ``input_format`` says how c is given (:data:`INPUT_FORMATS`):
  ``"probability"`` (default, c in [0, 1]), ``"log_probability"`` (log c, finite and <= 0, e.g. a
  log-softmax entry) or ``"log_odds"`` (log(c / (1 - c)), finite, e.g. the logit of P(True)). The
  log formats resolve confidences closer to 0 and 1 than float64 probabilities can (1 - 1e-20 is
  1.0 as a probability), and none of the three is clipped, so the ranking of confidences near the
  ends survives calibration (see :class:`PlattScaler` for exact 0 and 1).

Inputs may be numpy arrays, nested lists or torch tensors; outputs are numpy float64 arrays.
Hyperparameters are validated in ``fit`` (the scikit-learn convention), data in every call.

A fitted calibrator is saved as one small JSON file::

    {"format_version": 1, "method": "temperature", "params": {...}, "state": {...}}

``params`` holds the constructor arguments and ``state`` the fitted values (plain floats and lists;
Python's float repr round-trips exactly, so a loaded calibrator reproduces the saved one's outputs
bit for bit). :func:`load_calibrator` dispatches on ``"method"`` through :data:`CALIBRATORS`.

:class:`TemperatureScalingLogitsProcessor` applies a fitted temperature inside
``model.generate``, optionally only to the option tokens.

References: Guo, Pleiss, Sun, Weinberger, "On Calibration of Modern Neural Networks", ICML 2017
(temperature and vector scaling); Platt, "Probabilistic Outputs for Support Vector Machines", 1999;
Zadrozny & Elkan, "Obtaining calibrated probability estimates from decision trees and naive
Bayesian classifiers", ICML 2001 (histogram binning); Zadrozny & Elkan, KDD 2002 (isotonic).
"""

from __future__ import annotations

import json
import os
import warnings
from numbers import Integral, Real

import numpy as np
import torch
from scipy.optimize import minimize
from scipy.special import expit, log_softmax, logit, softmax
from sklearn.base import BaseEstimator
from sklearn.exceptions import ConvergenceWarning, NotFittedError
from sklearn.isotonic import IsotonicRegression
from transformers import LogitsProcessor

from hf_calibration.errors import ParameterError, ParameterTypeError, check_choice
from hf_calibration.metrics._validation import check_labels, to_numpy
from hf_calibration.metrics.binning import uniform_bin_index

__all__ = [
    "CALIBRATORS",
    "FORMAT_VERSION",
    "INPUT_FORMATS",
    "HistogramBinningCalibrator",
    "IsotonicCalibrator",
    "NotFittedError",
    "PlattScaler",
    "TemperatureScaler",
    "TemperatureScalingLogitsProcessor",
    "VectorScaler",
    "load_calibrator",
    "log_odds",
]

FORMAT_VERSION = 1

# Bounds on log(temperature) for TemperatureScaler, as scikit-learn bounds log(1/T): they keep the
# optimiser finite when the NLL is monotone in T (e.g. every argmax is correct, so T -> 0).
_LOG_TEMPERATURE_BOUNDS = (-10.0, 10.0)
#: Ways a confidence calibrator takes its confidence c: c itself, log c, or log(c / (1 - c)).
INPUT_FORMATS = ("probability", "log_probability", "log_odds")
# Finite log-odds that PlattScaler gives the exact ends (whose log-odds are infinite): each end is read
# as lying half-way to the nearest representable value of its format, so it ranks beyond every other
# input. Probability 0 -> 2**-1075 (half the smallest subnormal), probability 1 -> 1 - 2**-54 (half an
# ulp below 1), log-probability 0 -> -2**-1075.
_LOG_ODDS_OF_PROBABILITY_0 = -1075 * np.log(2.0)  # -745.13
_LOG_ODDS_OF_PROBABILITY_1 = 54 * np.log(2.0)  # 37.43; logit of the largest float64 below 1 is 36.74
_LOG_ODDS_OF_LOG_PROBABILITY_0 = 1075 * np.log(2.0)  # 745.13; log-probability -5e-324 gives 744.44


# --------------------------------------------------------------------------------------------------
# Input validation
# --------------------------------------------------------------------------------------------------
def _short(value, limit=80):
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _first_bad(arr, mask):
    idx = tuple(int(i) for i in np.argwhere(mask)[0])
    return (idx[0] if len(idx) == 1 else idx), arr[idx]


def _check_logits(logits, name="logits"):
    """float64 array of shape (n, K) with K >= 2, n >= 1, all finite."""
    arr = to_numpy(logits, name)
    if arr.dtype == bool:
        raise ParameterTypeError(name, logits, f"must be real-valued logits, got dtype bool")
    if arr.ndim != 2:
        raise ParameterError(name, logits, f"must have shape (n, K), got shape {arr.shape}")
    n, k = arr.shape
    if n == 0:
        raise ParameterError(name, logits, f"is empty (shape {arr.shape}); need at least 1 sample")
    if k < 2:
        raise ParameterError(name, logits, f"has {k} class column(s) (shape {arr.shape}); need at least 2 classes")
    arr = arr.astype(np.float64)
    bad = ~np.isfinite(arr)
    if bad.any():
        where, value = _first_bad(arr, bad)
        raise ParameterError(
            name, logits, f"must be finite; found {int(bad.sum())} NaN/inf value(s), first {value} at {where}"
        )
    return arr


def _check_confidence(confidence, input_format="probability", name="confidence"):
    """float64 array of shape (n,): probabilities in [0, 1], finite log-probabilities <= 0, or finite log-odds."""
    check_choice(input_format, "input_format", INPUT_FORMATS)
    arr = to_numpy(confidence, name)
    if arr.ndim != 1:
        raise ParameterError(name, confidence, f"must have shape (n,), got shape {arr.shape}")
    if arr.shape[0] == 0:
        raise ParameterError(name, confidence, f"is empty; need at least 1 sample")
    arr = arr.astype(np.float64)
    bad = ~np.isfinite(arr)
    if input_format == "probability":
        bad |= (arr < 0.0) | (arr > 1.0)
        what = "finite and in [0, 1]"
    elif input_format == "log_probability":
        bad |= arr > 0.0
        what = "finite log-probabilities <= 0 (input_format='log_probability')"
    else:
        what = "finite log-odds (input_format='log_odds')"
    if bad.any():
        where, value = _first_bad(arr, bad)
        raise ParameterError(name, confidence, f"must be {what}, got {value} at {where}")
    return arr


def _log_odds(x, input_format):
    """log(c / (1 - c)) of validated confidences, unclipped; the exact ends as set out at the top."""
    if input_format == "log_odds":
        return x
    with np.errstate(divide="ignore"):
        if input_format == "probability":
            z = logit(x)  # log(x / (1 - x)): 1 - x is exact near 1, so this is ordered up to 1 - 2**-53
            return np.where(x == 0.0, _LOG_ODDS_OF_PROBABILITY_0, np.where(x == 1.0, _LOG_ODDS_OF_PROBABILITY_1, z))
        z = x - np.log(-np.expm1(x))  # log c - log(1 - c) from log c, without forming c
    return np.where(x == 0.0, _LOG_ODDS_OF_LOG_PROBABILITY_0, z)


def log_odds(confidence, *, input_format: str = "probability") -> np.ndarray:
    """log(c / (1 - c)) of confidences, shape (n,) float64, without clipping (what Platt scaling regresses on).

    ``confidence`` has shape (n,) in the given ``input_format`` (:data:`INPUT_FORMATS`); exact 0 and 1
    map to the finite values set out in :class:`PlattScaler`, so every float64 input stays strictly
    ordered. Raises ValueError naming ``confidence`` or ``input_format`` for values outside the format's
    range, NaN, an empty or non-1-D array, or an unknown format.
    """
    return _log_odds(_check_confidence(confidence, input_format), input_format)


def _probability(x, input_format):
    """c in [0, 1] of validated confidences."""
    if input_format == "probability":
        return x
    return np.exp(x) if input_format == "log_probability" else expit(x)


def _check_correct(correct, n_samples, name="correct"):
    """float64 array of shape (n,) with values in {0, 1}, both present."""
    arr = to_numpy(correct, name)
    if arr.ndim != 1:
        raise ParameterError(name, correct, f"must have shape (n,), got shape {arr.shape}")
    if arr.shape[0] != n_samples:
        raise ParameterError(name, correct, f"has {arr.shape[0]} entries but {{confidence}} has {n_samples}",
                             related=("confidence",))
    arr = arr.astype(np.float64)
    bad = (arr != 0.0) & (arr != 1.0)
    if bad.any():
        where, value = _first_bad(arr, bad)
        raise ParameterError(name, correct, f"must be binary (0/1 or bool), got {value} at {where}")
    if np.unique(arr).size < 2:
        raise ParameterError(
            name, correct, f"contains only one class ({arr[0]:g} for all {n_samples} samples); "
            "need both correct and wrong examples to fit a calibrator"
        )
    return arr


def _check_int_param(value, name, low):
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise ParameterTypeError(name, value, f"must be an int, got {_short(value)}")
    if value < low:
        raise ParameterError(name, value, f"must be >= {low}, got {value}")


def _check_real_param(value, name, *, positive):
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ParameterTypeError(name, value, f"must be a real number, got {_short(value)}")
    value = float(value)
    if not np.isfinite(value) or (value <= 0 if positive else value < 0):
        raise ParameterError(name, value, f"must be finite and {'> 0' if positive else '>= 0'}, got {value}")


def _lbfgs(fun, x0, *, max_iter, name, bounds=None):
    """L-BFGS-B on ``fun(x) -> (loss, grad)``, tolerances tight enough for 1e-6-level parameters."""
    result = minimize(
        fun, x0, jac=True, method="L-BFGS-B", bounds=bounds,
        options={"maxiter": max_iter, "ftol": 1e-15, "gtol": 1e-10},
    )
    # ABNORMAL line-search ends at the floating-point floor are a converged optimum; only report
    # hitting the iteration cap.
    if result.nit >= max_iter:
        warnings.warn(
            f"{name} did not converge in max_iter={max_iter} L-BFGS iterations ({result.message}); "
            "increase `max_iter`",
            ConvergenceWarning,
            stacklevel=3,
        )
    return result.x


# --------------------------------------------------------------------------------------------------
# Base class: fit_transform, fitted check, JSON save / load
# --------------------------------------------------------------------------------------------------
class _PosthocCalibrator(BaseEstimator):
    """Shared plumbing. Subclasses set ``method``, ``input_kind`` and ``_state_attrs``."""

    method: str = ""
    input_kind: str = ""
    _state_attrs: tuple[str, ...] = ()

    def fit_transform(self, X, y):
        """``fit(X, y)`` then ``transform(X)``; see the subclass's ``fit`` for shapes."""
        return self.fit(X, y).transform(X)

    def _check_is_fitted(self):
        if not all(hasattr(self, attr) for attr in self._state_attrs):
            raise NotFittedError(
                f"This {type(self).__name__} is not fitted yet; call `fit` before `transform` or `save`."
            )

    # JSON round trip ----------------------------------------------------------------------------
    def _state_to_json(self):
        return {attr: np.asarray(getattr(self, attr)).tolist() for attr in self._state_attrs}

    def _state_from_json(self, state):
        for attr in self._state_attrs:
            if attr not in state:
                raise ValueError(f"saved {self.method!r} calibrator lacks state field {attr!r}")
            value = np.asarray(state[attr], dtype=np.float64)
            if not np.all(np.isfinite(value)):
                raise ValueError(f"saved {self.method!r} calibrator has a non-finite {attr!r}: {state[attr]!r}")
            setattr(self, attr, float(value) if value.ndim == 0 else value)

    def save(self, path):
        """Write the fitted calibrator to ``path`` as JSON (see the module docstring for the format).

        Raises ``NotFittedError`` (a ``ValueError``) if the calibrator is unfitted.
        """
        self._check_is_fitted()
        payload = {
            "format_version": FORMAT_VERSION,
            "method": self.method,
            "params": self.get_params(),
            "state": self._state_to_json(),
        }
        with open(os.fspath(path), "w", encoding="utf-8") as fh:
            json.dump(payload, fh, indent=2)
            fh.write("\n")

    @classmethod
    def load(cls, path):
        """Read a calibrator written by ``save``.

        Raises ``ValueError`` if the file's ``"method"`` is not this class's (use
        :func:`load_calibrator` to dispatch) or its ``"format_version"`` is unknown.
        """
        payload = _read_payload(path)
        if payload["method"] != cls.method:
            raise ValueError(
                f"{os.fspath(path)!r} holds a {payload['method']!r} calibrator, not {cls.method!r}; "
                "use hf_calibration.posthoc.load_calibrator to load any method"
            )
        return cls._from_payload(payload)

    @classmethod
    def _from_payload(cls, payload):
        obj = cls(**payload.get("params", {}))
        obj._state_from_json(payload["state"])
        return obj


def _read_payload(path):
    with open(os.fspath(path), encoding="utf-8") as fh:
        payload = json.load(fh)
    if not isinstance(payload, dict) or "method" not in payload or "state" not in payload:
        raise ValueError(f"{os.fspath(path)!r} is not a saved hf_calibration calibrator (no 'method'/'state')")
    version = payload.get("format_version")
    if version != FORMAT_VERSION:
        raise ValueError(
            f"{os.fspath(path)!r} has format_version={version!r}; this version reads {FORMAT_VERSION}"
        )
    if payload["method"] not in CALIBRATORS:
        raise ValueError(
            f"{os.fspath(path)!r} has unknown method {payload['method']!r}; known: {sorted(CALIBRATORS)}"
        )
    return payload


# --------------------------------------------------------------------------------------------------
# Multiclass: temperature and vector scaling on logits
# --------------------------------------------------------------------------------------------------
class TemperatureScaler(_PosthocCalibrator):
    """Temperature scaling (Guo et al., ICML 2017, §4.2): ``p = softmax(z / T)`` with one scalar T > 0.

    T minimises the mean negative log-likelihood of the labels on the fitting set. The optimiser
    is L-BFGS-B over log T (so T stays positive) with the analytic gradient
    ``d NLL / d log T = -(1/T) * mean_i (E_{p_i}[z_i] - z_{i,y_i})``; log T is bounded to
    [-10, 10]. When the NLL keeps falling as T -> 0 (every argmax correct) the fit stops where the
    loss is flat to float precision, at a small T. Scaling does not change the argmax, so accuracy
    is unchanged.

    Parameters
    ----------
    max_iter : int, default 100
        L-BFGS iteration cap; a ``ConvergenceWarning`` is raised when it is reached.
    init_temperature : float, default 1.0
        Starting T (> 0).

    Attributes
    ----------
    temperature_ : float
        Fitted T; T > 1 softens (less confident), T < 1 sharpens.

    ``input_kind = "logits"``: ``fit(logits, labels)`` with logits (n, K), K >= 2, and integer
    labels (n,) in [0, K); ``transform(logits)`` returns probabilities (n, K) summing to 1.
    """

    method = "temperature"
    input_kind = "logits"
    _state_attrs = ("temperature_",)

    def __init__(self, *, max_iter=100, init_temperature=1.0):
        self.max_iter = max_iter
        self.init_temperature = init_temperature

    def fit(self, logits, labels):
        """Fit T on ``logits`` (n, K) and ``labels`` (n,); returns ``self``.

        Raises ``TypeError`` for non-numeric input and ``ValueError`` for a wrong shape, K < 2,
        NaN/inf logits, labels outside [0, K) or of a different length, or bad hyperparameters.
        """
        _check_int_param(self.max_iter, "max_iter", 1)
        _check_real_param(self.init_temperature, "init_temperature", positive=True)
        z = _check_logits(logits)
        y = check_labels(labels, z.shape[0], z.shape[1], name="labels", rows="logits").astype(np.int64)
        z_true = z[np.arange(z.shape[0]), y]

        def nll_and_grad(params):
            inv_t = np.exp(-params[0])
            scaled = z * inv_t
            log_p = log_softmax(scaled, axis=1)
            nll = -np.mean(log_p[np.arange(z.shape[0]), y])
            expected_z = np.sum(np.exp(log_p) * z, axis=1)
            grad = -inv_t * np.mean(expected_z - z_true)
            return nll, np.array([grad])

        lo, hi = _LOG_TEMPERATURE_BOUNDS
        x0 = np.clip(np.log(float(self.init_temperature)), lo, hi)
        (log_t,) = _lbfgs(nll_and_grad, np.array([x0]), max_iter=self.max_iter,
                          name="TemperatureScaler", bounds=[_LOG_TEMPERATURE_BOUNDS])
        self.temperature_ = float(np.exp(log_t))
        if log_t >= hi or log_t <= lo:
            # At the upper bound the NLL still falls as T grows: the logits rank the labels no better
            # than chance on this data, and TS collapses every prediction to the uniform 1/K.
            warnings.warn(
                f"TemperatureScaler: the fitted temperature {self.temperature_:.4g} sits at the bound "
                f"exp({log_t:+.0f}); the NLL is monotone in T on these logits "
                + ("(no information about the labels: the output is ~uniform)" if log_t >= hi else "(every argmax is right)"),
                RuntimeWarning,
                stacklevel=2,
            )
        return self

    def _state_from_json(self, state):
        super()._state_from_json(state)
        if not self.temperature_ > 0:
            raise ValueError(f"saved temperature calibrator has temperature_={self.temperature_!r}; it must be > 0")

    def transform(self, logits):
        """Calibrated probabilities ``softmax(logits / temperature_)``, shape (n, K), float64."""
        self._check_is_fitted()
        return softmax(_check_logits(logits) / self.temperature_, axis=1)


class VectorScaler(_PosthocCalibrator):
    """Vector scaling (Guo et al., ICML 2017, §4.2): ``p = softmax(z * w + b)``, w, b in R^K.

    Fitted by L-BFGS on ``mean NLL + l2 * (||w - 1||^2 + ||b||^2)`` with the analytic gradient,
    starting from the identity (w = 1, b = 0); the penalty pulls towards the identity, so a huge
    ``l2`` leaves the logits unchanged. w is unconstrained (it may change the argmax, unlike
    temperature scaling). Softmax ignores a common shift of b, so the fitted b is centred to
    mean 0 (with ``l2 > 0`` the optimum already is).

    Parameters
    ----------
    l2 : float, default 0.0
        Penalty strength (>= 0).
    max_iter : int, default 1000
        L-BFGS iteration cap; a ``ConvergenceWarning`` is raised when it is reached.

    Attributes
    ----------
    coef_ : ndarray (K,)
        Per-class multiplier w.
    intercept_ : ndarray (K,)
        Per-class bias b.

    ``input_kind = "logits"``: ``fit(logits, labels)`` as :class:`TemperatureScaler`;
    ``transform`` requires the same K as ``fit``.
    """

    method = "vector"
    input_kind = "logits"
    _state_attrs = ("coef_", "intercept_")

    def __init__(self, *, l2=0.0, max_iter=1000):
        self.l2 = l2
        self.max_iter = max_iter

    def fit(self, logits, labels):
        """Fit w, b on ``logits`` (n, K) and ``labels`` (n,); returns ``self``.

        Raises as :meth:`TemperatureScaler.fit`, and ``ValueError`` for ``l2 < 0``.
        """
        _check_real_param(self.l2, "l2", positive=False)
        _check_int_param(self.max_iter, "max_iter", 1)
        l2 = float(self.l2)
        z = _check_logits(logits)
        n, k = z.shape
        y = check_labels(labels, n, k, name="labels", rows="logits").astype(np.int64)
        onehot = np.zeros_like(z)
        onehot[np.arange(n), y] = 1.0

        def loss_and_grad(params):
            w, b = params[:k], params[k:]
            log_p = log_softmax(z * w + b, axis=1)
            residual = (np.exp(log_p) - onehot) / n  # d mean-NLL / d adjusted logits
            loss = -np.sum(log_p * onehot) / n + l2 * (np.sum((w - 1.0) ** 2) + np.sum(b**2))
            grad_w = np.sum(residual * z, axis=0) + 2.0 * l2 * (w - 1.0)
            grad_b = np.sum(residual, axis=0) + 2.0 * l2 * b
            return loss, np.concatenate([grad_w, grad_b])

        x0 = np.concatenate([np.ones(k), np.zeros(k)])
        params = _lbfgs(loss_and_grad, x0, max_iter=self.max_iter, name="VectorScaler")
        self.coef_ = params[:k].copy()
        self.intercept_ = params[k:] - params[k:].mean()
        return self

    def transform(self, logits):
        """Calibrated probabilities ``softmax(logits * coef_ + intercept_)``, shape (n, K), float64."""
        self._check_is_fitted()
        z = _check_logits(logits)
        if z.shape[1] != self.coef_.shape[0]:
            raise ParameterError(
                "logits", logits, f"has K={z.shape[1]} columns but this VectorScaler was fitted with "
                f"K={self.coef_.shape[0]}"
            )
        return softmax(z * self.coef_ + self.intercept_, axis=1)


# --------------------------------------------------------------------------------------------------
# Binary: confidence -> probability of being correct
# --------------------------------------------------------------------------------------------------
class _ConfidenceCalibrator(_PosthocCalibrator):
    """Shared input handling of the ``input_kind = "confidence"`` calibrators (``input_format``)."""

    input_kind = "confidence"

    def _inputs(self, confidence):
        return _check_confidence(confidence, self.input_format)

    def _fit_inputs(self, confidence, correct):
        c = self._inputs(confidence)
        return c, _check_correct(correct, c.shape[0])


class PlattScaler(_ConfidenceCalibrator):
    """Platt scaling (Platt, 1999): ``P(correct) = sigmoid(a * logit(c) + b)``.

    The feature is the log-odds ``logit(c) = log(c / (1 - c))`` of the confidence, not c itself: on
    this scale a = 1, b = 0 is the identity, so the fit only has to learn a sharpening (a) and a
    shift (b), which is temperature scaling of the binary top-label probability. To use a raw score
    s instead, pass it with ``input_format="log_odds"``.

    The log-odds are not clipped, so confidences near 0 and 1 keep their order: in float64 a
    probability c has finite, ordered log-odds from the smallest subnormal (-744.4) up to
    1 - 2**-53 (36.7); a log-probability resolves c near 1 much further, down to 1 - c = 5e-324. The
    exact ends have infinite log-odds and are read as lying half-way to the nearest representable
    value (``input_format``): probability 0 as 2**-1075 (log-odds -745.1), probability 1 as
    1 - 2**-54 (+37.4), log-probability 0 as -2**-1075 (+745.1); so they rank beyond every other
    input, and a wrong answer at exactly 1.0 weighs on the fit like one at 1 - 5.6e-17.
    (Until issue 14 c was clipped to [1e-6, 1 - 1e-6], which tied every float32 softmax output above
    1 - 1e-6 and lowered AUROC.) ``transform`` returns probabilities, whose own float64 resolution
    (1 - 2**-53) can still tie outputs that the fitted log-odds rank apart when a > 1.

    a, b are the unpenalised maximum-likelihood logistic regression (the same fit as scikit-learn
    ``LogisticRegression(C=inf)`` on that single feature), found by L-BFGS with the analytic
    gradient. ``target_smoothing=True`` uses Platt's Bayesian targets ``(N+ + 1)/(N+ + 2)`` and
    ``1/(N- + 2)`` instead of 1 and 0 (Platt 1999, §2.2; scikit-learn's
    ``CalibratedClassifierCV(method="sigmoid")``), which keeps a, b finite on separable data
    (without it the maximum-likelihood slope is infinite, and the fit stops at a large a once the
    loss is flat to float precision).

    Parameters
    ----------
    target_smoothing : bool, default False
    max_iter : int, default 1000
    input_format : {"probability", "log_probability", "log_odds"}, default "probability"
        How ``fit`` and ``transform`` receive the confidence c: c in [0, 1], log c (finite, <= 0)
        or log(c / (1 - c)) (finite). The same data in any format gives the same fit (up to
        rounding) where no exact end is involved.

    Attributes
    ----------
    coef_ : float
        Slope a on logit(c).
    intercept_ : float
        Intercept b.

    ``input_kind = "confidence"``: ``fit(confidence, correct)`` with confidence (n,) in
    ``input_format`` and binary correct (n,) holding both 0 and 1; ``transform(confidence)``
    returns (n,) probabilities in [0, 1].
    """

    method = "platt"
    _state_attrs = ("coef_", "intercept_")

    def __init__(self, *, target_smoothing=False, max_iter=1000, input_format="probability"):
        self.target_smoothing = target_smoothing
        self.max_iter = max_iter
        self.input_format = input_format

    def fit(self, confidence, correct):
        """Fit a, b on ``confidence`` (n,) and ``correct`` (n,); returns ``self``.

        Raises ``TypeError`` for non-numeric input and ``ValueError`` for a wrong shape, a
        confidence outside its ``input_format``'s range (probability outside [0, 1], log-probability
        > 0, NaN, or inf in the log formats), non-binary or single-class ``correct``, mismatched
        lengths, or an unknown ``input_format``.
        """
        if not isinstance(self.target_smoothing, (bool, np.bool_)):
            raise ParameterTypeError("target_smoothing", self.target_smoothing, f"must be a bool, got {_short(self.target_smoothing)}")
        _check_int_param(self.max_iter, "max_iter", 1)
        c, t = self._fit_inputs(confidence, correct)
        if self.target_smoothing:
            n_pos = t.sum()
            n_neg = t.size - n_pos
            t = np.where(t == 1.0, (n_pos + 1.0) / (n_pos + 2.0), 1.0 / (n_neg + 2.0))
        x = _log_odds(c, self.input_format)

        def loss_and_grad(params):
            a, b = params
            s = a * x + b
            # binary cross-entropy with logits: log(1 + e^s) - t s
            loss = np.mean(np.logaddexp(0.0, s) - t * s)
            r = expit(s) - t
            return loss, np.array([np.mean(r * x), np.mean(r)])

        a, b = _lbfgs(loss_and_grad, np.array([1.0, 0.0]), max_iter=self.max_iter, name="PlattScaler")
        self.coef_, self.intercept_ = float(a), float(b)
        return self

    def transform(self, confidence):
        """Calibrated P(correct) = ``sigmoid(coef_ * logit(c) + intercept_)``, shape (n,), float64."""
        self._check_is_fitted()
        return expit(self.coef_ * _log_odds(self._inputs(confidence), self.input_format) + self.intercept_)


class IsotonicCalibrator(_ConfidenceCalibrator):
    """Isotonic regression (Zadrozny & Elkan, KDD 2002): the non-decreasing step map from
    confidence to P(correct) that minimises squared error, by scikit-learn
    ``IsotonicRegression(out_of_bounds="clip", y_min=0, y_max=1)``.

    The regression runs on the confidence as given (``input_format``): the fitted values only
    depend on the order of the inputs, which no format conversion disturbs, so confidences near 0
    and 1 are not merged by rounding. ``transform`` interpolates linearly between the fitted
    thresholds (as scikit-learn's ``predict`` does), on that same scale, and clips outside them,
    so the output is monotone and in [0, 1].

    Parameters
    ----------
    input_format : {"probability", "log_probability", "log_odds"}, default "probability"
        As :class:`PlattScaler`.

    Attributes
    ----------
    X_thresholds_, y_thresholds_ : ndarray (m,)
        The fitted breakpoints (confidence in ``input_format``, P(correct)).

    ``input_kind = "confidence"``: ``fit(confidence, correct)`` / ``transform(confidence)`` as
    :class:`PlattScaler`.
    """

    method = "isotonic"
    _state_attrs = ("X_thresholds_", "y_thresholds_")

    def __init__(self, *, input_format="probability"):
        self.input_format = input_format

    def fit(self, confidence, correct):
        """Fit the step map on ``confidence`` (n,) and ``correct`` (n,); returns ``self``.

        Raises as :meth:`PlattScaler.fit`.
        """
        c, t = self._fit_inputs(confidence, correct)
        iso = IsotonicRegression(out_of_bounds="clip", y_min=0.0, y_max=1.0, increasing=True).fit(c, t)
        self.X_thresholds_ = np.asarray(iso.X_thresholds_, dtype=np.float64)
        self.y_thresholds_ = np.asarray(iso.y_thresholds_, dtype=np.float64)
        return self

    def transform(self, confidence):
        """Calibrated P(correct), shape (n,), in [0, 1], non-decreasing in ``confidence``."""
        self._check_is_fitted()
        return np.interp(self._inputs(confidence), self.X_thresholds_, self.y_thresholds_)


class HistogramBinningCalibrator(_ConfidenceCalibrator):
    """Histogram binning (Zadrozny & Elkan, ICML 2001): split [0, 1] into ``n_bins`` equal-width
    bins and map each confidence to the accuracy of its bin on the fitting set.

    Bins are those of ECE and the reliability diagram (:func:`hf_calibration.metrics.uniform_bin_index`):
    [k/B, (k+1)/B) with each edge the float64 nearest to k/B, c = 0 in the first bin and c = 1 in
    the last, so histogram binning agrees with the diagram of the same data (scikit-learn's
    ``calibration_curve`` uses right-closed bins instead). Confidences given as log-probabilities or
    log-odds are binned as ``exp(x)`` or ``sigmoid(x)`` in float64. A bin that received no fitting
    sample maps to the overall accuracy of the fitting set: with no evidence for the bin, the base
    rate is the calibrated guess (the bin centre would keep the uncalibrated confidence instead).

    Parameters
    ----------
    n_bins : int, default 15
    input_format : {"probability", "log_probability", "log_odds"}, default "probability"
        As :class:`PlattScaler`.

    Attributes
    ----------
    bin_values_ : ndarray (n_bins,)
        P(correct) assigned to each bin.
    bin_counts_ : ndarray (n_bins,)
        Fitting samples per bin (float, for the JSON round trip).

    ``input_kind = "confidence"``: ``fit(confidence, correct)`` / ``transform(confidence)`` as
    :class:`PlattScaler`; the output takes at most ``n_bins`` distinct values.
    """

    method = "histogram"
    _state_attrs = ("bin_values_", "bin_counts_")

    def __init__(self, *, n_bins=15, input_format="probability"):
        self.n_bins = n_bins
        self.input_format = input_format

    def _bin_index(self, x):
        return uniform_bin_index(_probability(x, self.input_format), self.n_bins)

    def fit(self, confidence, correct):
        """Fit bin accuracies on ``confidence`` (n,) and ``correct`` (n,); returns ``self``.

        Raises as :meth:`PlattScaler.fit`, and for ``n_bins`` < 1 or not an int.
        """
        _check_int_param(self.n_bins, "n_bins", 1)
        c, t = self._fit_inputs(confidence, correct)
        idx = self._bin_index(c)
        counts = np.bincount(idx, minlength=self.n_bins).astype(np.float64)
        hits = np.bincount(idx, weights=t, minlength=self.n_bins)
        values = np.full(self.n_bins, t.mean())
        np.divide(hits, counts, out=values, where=counts > 0)
        self.bin_values_, self.bin_counts_ = values, counts
        return self

    def transform(self, confidence):
        """Calibrated P(correct): the fitted value of each confidence's bin, shape (n,)."""
        self._check_is_fitted()
        return self.bin_values_[self._bin_index(self._inputs(confidence))]


CALIBRATORS = {
    "temperature": TemperatureScaler,
    "vector": VectorScaler,
    "platt": PlattScaler,
    "isotonic": IsotonicCalibrator,
    "histogram": HistogramBinningCalibrator,
}


def load_calibrator(path):
    """Load any calibrator saved by ``save``, choosing the class from the file's ``"method"``.

    Raises ``ValueError`` for a file that is not a saved calibrator, an unknown method or an
    unsupported ``format_version``.
    """
    payload = _read_payload(path)
    return CALIBRATORS[payload["method"]]._from_payload(payload)


# --------------------------------------------------------------------------------------------------
# Generation
# --------------------------------------------------------------------------------------------------
class TemperatureScalingLogitsProcessor(LogitsProcessor):
    """Divide next-token scores by a temperature inside ``model.generate``.

    With ``token_ids=None`` every score is divided by ``temperature`` (the same as transformers'
    ``TemperatureLogitsWarper``, but usable with greedy decoding and composable with a fitted
    :class:`TemperatureScaler`). With ``token_ids`` (e.g. the MCQA option-letter tokens) only those
    columns change, scaled about their maximum m: ``m + (s − m) / T``; all others pass through
    unchanged. The softmax restricted to the options then equals ``TemperatureScaler.transform`` of the
    option logits (it is invariant to the shift m), and the top option keeps its score, so greedy decoding
    picks the same option it would without calibration instead of a non-option token (dividing the option
    scores alone by T > 1 pulled them towards 0, below words such as "False").

    Parameters
    ----------
    temperature : float
        T > 0 and finite; ``ValueError`` otherwise, ``TypeError`` if not a real number.
    token_ids : sequence of int, 1-D tensor or None
        Non-negative vocabulary ids; checked against the vocabulary size (the last dimension of
        ``scores``) at call time, where an id >= vocabulary size raises ``ValueError``.

    ``__call__(input_ids, scores)``: scores (batch, vocab) float tensor → new tensor, same shape
    and dtype; the input is not modified.
    """

    supports_continuous_batching = True  # element-wise over the last dimension

    def __init__(self, temperature, token_ids=None):
        if isinstance(temperature, torch.Tensor) and temperature.numel() == 1:
            temperature = temperature.item()
        _check_real_param(temperature, "temperature", positive=True)
        self.temperature = float(temperature)
        if token_ids is None:
            self.token_ids = None
            return
        ids = to_numpy(token_ids, "token_ids")
        if ids.ndim != 1 or ids.size == 0:
            raise ParameterError("token_ids", token_ids, f"must be a non-empty 1-D sequence of ints, got {_short(token_ids)}")
        if not np.issubdtype(ids.dtype, np.integer):
            raise ParameterTypeError("token_ids", token_ids, f"must be integers, got dtype {ids.dtype} ({_short(token_ids)})")
        if (ids < 0).any():
            raise ParameterError("token_ids", token_ids, f"must be >= 0, got {int(ids[ids < 0][0])}")
        self.token_ids = torch.as_tensor(np.unique(ids), dtype=torch.long)

    @classmethod
    def from_scaler(cls, scaler, token_ids=None):
        """Build the processor from a fitted :class:`TemperatureScaler` (its ``temperature_``)."""
        if not isinstance(scaler, TemperatureScaler):
            raise ParameterTypeError("scaler", scaler, f"must be a TemperatureScaler, got {type(scaler).__name__}")
        scaler._check_is_fitted()
        return cls(scaler.temperature_, token_ids=token_ids)

    def __call__(self, input_ids, scores):
        if self.token_ids is None:
            return scores / self.temperature
        vocab_size = scores.shape[-1]
        too_big = self.token_ids >= vocab_size
        if too_big.any():
            raise ParameterError(
                "token_ids", self.token_ids.tolist(), f"contains {self.token_ids[too_big].tolist()}, outside the "
                f"vocabulary of size {vocab_size} (last dimension of {{scores}})", related=("scores",)
            )
        ids = self.token_ids.to(scores.device)
        processed = scores.clone()
        chosen = scores[..., ids]
        top = chosen.max(dim=-1, keepdim=True).values
        processed[..., ids] = top + (chosen - top) / self.temperature
        return processed

    def __repr__(self):
        ids = None if self.token_ids is None else self.token_ids.tolist()
        return f"{type(self).__name__}(temperature={self.temperature!r}, token_ids={ids!r})"
