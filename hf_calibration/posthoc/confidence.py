"""Platt scaling, isotonic regression and histogram binning of a confidence against correctness.
docs/methods.md, "Post-hoc calibrators"."""

from __future__ import annotations

import numpy as np
from scipy.special import expit
from sklearn.isotonic import IsotonicRegression

from hf_calibration.errors import ParameterTypeError
from hf_calibration.metrics.binning import uniform_bin_index
from hf_calibration.posthoc.base import _check_int_param, _ConfidenceCalibrator, _lbfgs, _log_odds, _probability, _short


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
    (Clipping c to [1e-6, 1 - 1e-6] instead would tie every float32 softmax output above 1 - 1e-6 and
    lower AUROC.) ``transform`` returns probabilities, whose own float64 resolution
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
    _probability_attrs = ("y_thresholds_",)

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
    _probability_attrs = ("bin_values_",)

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
