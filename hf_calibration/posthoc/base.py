"""Shared pieces of the post-hoc calibrators: input checks, the log-odds of a confidence, the L-BFGS fit, and
the base class with its JSON save / load (format in the package docstring)."""

from __future__ import annotations

import json
import os
import warnings
from numbers import Integral, Real

import numpy as np
from scipy.optimize import minimize
from scipy.special import expit, logit
from sklearn.base import BaseEstimator
from sklearn.exceptions import ConvergenceWarning, NotFittedError

from hf_calibration.errors import ParameterError, ParameterTypeError, check_choice
from hf_calibration.metrics.validation import to_numpy

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
    """float64 array of shape (n, K) with K ≥ 2, n ≥ 1, all finite."""
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
        what = "finite log-probabilities ≤ 0 (input_format='log_probability')"
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
        raise ParameterError(name, value, f"must be ≥ {low}, got {value}")


def _check_real_param(value, name, *, positive):
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ParameterTypeError(name, value, f"must be a real number, got {_short(value)}")
    value = float(value)
    if not np.isfinite(value) or (value <= 0 if positive else value < 0):
        raise ParameterError(name, value, f"must be finite and {'> 0' if positive else '≥ 0'}, got {value}")


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
    _probability_attrs: tuple[str, ...] = ()  # state that holds probabilities: checked in [0, 1] on load

    #: The option counts of the questions the calibrator was fitted on (sorted list of ints), set by whoever knows
    #: them (``hf-calibration fit-posthoc``) and saved with it; None: unknown (``fit`` alone sees no options).
    n_options_ = None

    def fit_transform(self, X, y):
        """``fit(X, y)`` then ``transform(X)``; see the subclass's ``fit`` for shapes."""
        return self.fit(X, y).transform(X)

    def option_counts(self) -> list[int] | None:
        """The option counts this calibrator was fitted for: ``n_options_``, else None (a file saved before they
        were recorded). A confidence of a 2-option question lies in [1/2, 1], of a 4-option one in [1/4, 1]: a
        map fitted on one does not carry over to the other."""
        return None if self.n_options_ is None else list(self.n_options_)

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
            outside = (value < 0) | (value > 1)
            if attr in self._probability_attrs and np.any(outside):
                i = int(np.argmax(outside.ravel()))
                raise ValueError(f"saved {self.method!r} calibrator's {attr!r} holds {float(value.ravel()[i])!r} at "
                                 f"index {i}, outside [0, 1] (a probability)")
            setattr(self, attr, float(value) if value.ndim == 0 else value)

    def save(self, path, *, fitted_on: dict | None = None):
        """Write the fitted calibrator to ``path`` as JSON (see the module docstring for the format).

        ``fitted_on`` : optional provenance written as ``"fitted_on"`` (``fit-posthoc`` records the signal, the
        model and the predictions file; the calibration gateway refuses a calibrator fitted on another signal or
        model). Readers of this format ignore it. Raises ``NotFittedError`` (a ``ValueError``) if the calibrator
        is unfitted.
        """
        self._check_is_fitted()
        payload = {
            "format_version": FORMAT_VERSION,
            "method": self.method,
            "params": self.get_params(),
            "state": self._state_to_json(),
        }
        if self.n_options_ is not None:  # optional: files without it load, their option counts unknown
            payload["n_options"] = [int(k) for k in self.n_options_]
        if fitted_on is not None:
            payload["fitted_on"] = fitted_on
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
        counts = payload.get("n_options")
        if counts is not None:
            if not (isinstance(counts, list) and counts and all(isinstance(k, int) and not isinstance(k, bool)
                                                                and k >= 2 for k in counts)):
                raise ValueError(f"saved {cls.method!r} calibrator has 'n_options' {counts!r}; expected a list of "
                                 "option counts ≥ 2")
            obj.n_options_ = sorted(counts)
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
    return payload




class _ConfidenceCalibrator(_PosthocCalibrator):
    """Shared input handling of the ``input_kind = "confidence"`` calibrators (``input_format``)."""

    input_kind = "confidence"

    def _inputs(self, confidence):
        return _check_confidence(confidence, self.input_format)

    def _fit_inputs(self, confidence, correct):
        c = self._inputs(confidence)
        return c, _check_correct(correct, c.shape[0])
