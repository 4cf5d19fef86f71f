"""Binned calibration errors: ECE / RMSCE / MCE (+ debiased), cw-ECE and ACE."""

from __future__ import annotations

import numpy as np
from scipy.special import ndtr

from hf_calibration.errors import ParameterError, ParameterTypeError
from hf_calibration.metrics.registry import register
from hf_calibration.metrics.validation import Inputs, check_choice, check_n_bins, prepare
from hf_calibration.metrics.binning import (BINNINGS, accumulate_bin_sums, bin_index, bin_sums, prepared_top_label,
                                           uniform_bin_index)

NORMS = ("l1", "l2", "max")


def check_norm(norm: str, debiased: bool) -> None:
    check_choice(norm, "norm", NORMS)
    if not isinstance(debiased, (bool, np.bool_)):
        raise ParameterTypeError("debiased", debiased, f"must be a bool, got {debiased!r}")
    if debiased and norm == "max":
        raise ParameterError("debiased", debiased, "must be False with {norm}='max' (the debiased estimator is defined "
                             "for {norm}='l1' and {norm}='l2', Kumar et al. 2019), got True", related=("norm",))


def calibration_error_from_sums(sums: np.ndarray, *, norm: str = "l1", debiased: bool = False) -> np.ndarray:
    """Calibration error from per-bin sums ``(count, sum confidence, sum correct)`` on axis 0.

    ``sums``: (3, ..., n_bins). Returns an array of the leading shape ``...``. Empty bins carry no
    weight (and are ignored by ``max``).
    """
    counts, conf_sum, correct_sum = sums
    n = counts.sum(-1)
    safe = np.maximum(counts, 1.0)
    conf, acc = conf_sum / safe, correct_sum / safe
    weight = counts / n[..., None]
    gap = np.abs(acc - conf)
    if norm == "max":
        return np.max(np.where(counts > 0, gap, 0.0), axis=-1)
    if norm == "l2":
        sq = gap**2
        if debiased:
            # Kumar et al. 2019, Sec. 5: subtract the variance of each bin's accuracy estimate;
            # bins with fewer than 2 predictions contribute nothing (as in their reference code).
            var = acc * (1.0 - acc) / np.maximum(counts - 1.0, 1.0)
            sq = np.where(counts >= 2, sq - var, 0.0)
            return np.sqrt(np.maximum(np.sum(weight * sq, axis=-1), 0.0))
        return np.sqrt(np.sum(weight * sq, axis=-1))
    ece = np.sum(weight * gap, axis=-1)
    if debiased:
        # Kumar et al. 2019 ("normal debiasing"): 2 * plug-in minus the expected plug-in when each bin
        # accuracy is drawn from N(acc_b, acc_b (1 - acc_b) / n_b). Their code averages 1000 random
        # draws; E|N(d, s^2)| has the closed form below, which is the limit of that average.
        s = np.sqrt(acc * (1.0 - acc) / safe)
        d = acc - conf
        with np.errstate(divide="ignore", invalid="ignore"):
            z = np.where(s > 0, d / s, 0.0)
            expected = np.where(
                s > 0, s * np.sqrt(2.0 / np.pi) * np.exp(-0.5 * z**2) + d * (1.0 - 2.0 * ndtr(-z)), np.abs(d)
            )
        ece = 2.0 * ece - np.sum(weight * expected, axis=-1)
    return ece


def _top_label_sums(inputs: Inputs, weights, n_bins: int, binning: str) -> np.ndarray:
    """(3, [R,] n_bins) top-label sums for one evaluation or R weighted resamples."""
    if weights is None and binning == "uniform":
        return accumulate_bin_sums(inputs, n_bins, classwise=False)
    conf, correct = prepared_top_label(inputs)
    idx = bin_index(conf, n_bins, binning, weights)
    if weights is None:
        return bin_sums(idx, conf, correct, n_bins)
    idx = idx.reshape(-1, conf.shape[0], 1)
    return bin_sums(idx, conf[None, :, None], correct[None, :, None], n_bins, weights)[:, :, 0]


def _ece_options(n_bins=15, binning="uniform", norm="l1", debiased=False) -> dict:
    check_choice(binning, "binning", BINNINGS)
    check_norm(norm, debiased)
    return dict(n_bins=check_n_bins(n_bins), binning=binning, norm=norm, debiased=bool(debiased))


def _ece_impl(inputs: Inputs, weights, *, n_bins: int, binning: str, norm: str, debiased: bool) -> np.ndarray:
    check_n_bins(n_bins, inputs.n)
    sums = _top_label_sums(inputs, weights, n_bins, binning)
    return np.atleast_1d(calibration_error_from_sums(sums, norm=norm, debiased=debiased))


def expected_calibration_error(
    y_true, y_prob, *, n_bins: int = 15, binning: str = "uniform", norm: str = "l1", debiased: bool = False
) -> float:
    r"""Binned expected calibration error of the top-label confidence (conf-ECE).

    .. math::
        \mathrm{ECE}_p = \Big(\sum_b \tfrac{n_b}{n}\,|\mathrm{acc}_b - \mathrm{conf}_b|^p\Big)^{1/p}

    with p = 1 (ECE; Naeini et al. 2015, Guo et al. 2017 Eq. 3), p = 2 (RMSCE) or p = ∞ (MCE, the
    largest gap over non-empty bins). Empty bins carry no weight.

    Parameters
    ----------
    y_true : array-like of shape (n,)
        Integer labels in [0, K) for (n, K) probabilities; 0/1 correctness for (n,) confidences.
        Floats are accepted when integral.
    y_prob : array-like of shape (n, K) or (n,)
        Probability rows summing to 1 within ``max(1e-4, K * eps(dtype))`` (the top-label confidence
        ``max_k p_ik`` and prediction ``argmax_k p_ik`` are used), or confidences in [0, 1]. An
        (n, 2) array is treated as K = 2 classes (top-label), not as a positive-class column.
        numpy arrays, lists and torch tensors (any float dtype, incl. bfloat16) are accepted.
    n_bins : int, default 15
        Number of bins, 1 to ``max(n, 15)`` (at most one bin per prediction; docs/methods.md). 15 follows
        Guo et al. 2017.
    binning : {"uniform", "quantile"}, default "uniform"
        Equal-width or equal-mass bins; conventions in :mod:`hf_calibration.metrics.binning`.
    norm : {"l1", "l2", "max"}, default "l1"
        ECE, RMSCE or MCE.
    debiased : bool, default False
        Kumar et al. 2019 ("Verified Uncertainty Calibration", Sec. 5). ``l2``: subtract each bin's
        estimated variance ``acc_b (1 - acc_b) / (n_b - 1)`` from the squared gap (bins with one
        prediction contribute 0), clip the sum at 0, take the root. ``l1``: ``2 ECE - E[ECE*]`` where
        ECE* redraws each bin accuracy from N(acc_b, acc_b (1 - acc_b) / n_b), in closed form.
        Not defined for ``max``.

    Returns
    -------
    float
        In [0, 1].

    Raises
    ------
    ParameterError
        (a ValueError; ``err.parameter`` is the argument's name, e.g. ``"y_prob"``) Shapes or lengths that do
        not match, empty input, NaN/inf, values outside [0, 1], rows not summing to 1, labels outside [0, K)
        (or not 0/1), non-integral labels, ``n_bins <= 0`` or above ``max(n, 15)``, unknown
        ``binning``/``norm``, ``debiased`` with ``norm="max"``. Messages name the argument and the first
        offending value.
    ParameterTypeError
        (a ParameterError and a TypeError) Non-numeric arrays, non-integer ``n_bins``.

    Examples
    --------
    >>> round(expected_calibration_error([1, 0, 1, 1], [0.9, 0.8, 0.3, 1.0], n_bins=2), 6)
    0.35
    >>> round(expected_calibration_error([0, 1], [[0.8, 0.2], [0.3, 0.7]], n_bins=10), 6)
    0.25
    """
    options = _ece_options(n_bins, binning, norm, debiased)
    inputs = prepare(y_true, y_prob, check_values=binning != "uniform")
    return float(_ece_impl(inputs, None, **options)[0])


def _cw_options(n_bins=15) -> dict:
    return dict(n_bins=check_n_bins(n_bins))


def _cw_impl(inputs: Inputs, weights, *, n_bins: int) -> np.ndarray:
    check_n_bins(n_bins, inputs.n)
    if weights is None:
        sums = accumulate_bin_sums(inputs, n_bins, classwise=True)
    else:
        p = inputs.y_prob.astype(np.float64)
        onehot = inputs.y_true[:, None] == np.arange(p.shape[1])
        sums = bin_sums(uniform_bin_index(p, n_bins)[None], p[None], onehot[None], n_bins, weights)
    return np.atleast_1d(calibration_error_from_sums(sums).mean(axis=-1))


def classwise_ece(y_true, y_prob, *, n_bins: int = 15) -> float:
    r"""Classwise ECE (cw-ECE): every class's probability binned against its indicator, averaged.

    .. math::
        \mathrm{cwECE} = \frac{1}{K}\sum_{k=1}^{K}\sum_b \frac{n_{bk}}{n}\,
        \big|\,\overline{1[y=k]}_{bk} - \overline{p_{\cdot k}}_{bk}\big|

    with equal-width bins per class. This is the static calibration error (SCE) of Nixon et al. 2019
    and the marginal ECE of Kumar et al. 2019 with p = 1, as computed by the CFT evaluator (docs/methods.md, 'Classwise ECE').

    Parameters
    ----------
    y_true : array-like of shape (n,)
        Integer labels in [0, K).
    y_prob : array-like of shape (n, K), K ≥ 2
        Probability rows summing to 1 (tolerance as in :func:`expected_calibration_error`).
    n_bins : int, default 15
        Equal-width bins per class (> 0).

    Returns
    -------
    float
        In [0, 1].

    Raises
    ------
    ValueError, TypeError
        As :func:`expected_calibration_error`; also for 1-D ``y_prob`` (the classwise view needs
        the whole probability vector).

    Examples
    --------
    >>> round(classwise_ece([0, 1], [[0.8, 0.2], [0.3, 0.7]], n_bins=10), 6)
    0.25
    """
    options = _cw_options(n_bins)
    inputs = prepare(y_true, y_prob, check_values=False, multiclass=True)
    return float(_cw_impl(inputs, None, **options)[0])


def _ace_impl(inputs: Inputs, weights, *, n_bins: int) -> np.ndarray:
    check_n_bins(n_bins, inputs.n)
    counts, conf_sum, correct_sum = _top_label_sums(inputs, weights, n_bins, "quantile")
    nonempty = counts > 0
    safe = np.maximum(counts, 1.0)
    gap = np.where(nonempty, np.abs(correct_sum / safe - conf_sum / safe), 0.0)
    return np.atleast_1d(gap.sum(-1) / nonempty.sum(-1))


def adaptive_calibration_error(y_true, y_prob, *, n_bins: int = 15) -> float:
    r"""Adaptive calibration error (ACE): equal-mass bins, each non-empty bin weighted equally.

    .. math::
        \mathrm{ACE} = \frac{1}{|\{b: n_b > 0\}|}\sum_{b: n_b > 0} |\mathrm{acc}_b - \mathrm{conf}_b|

    over ``n_bins`` equal-mass (quantile) bins of the top-label confidence. This is netcal's ``ACE``
    with ``equal_intervals=False`` (docs/methods.md, 'ACE'); Nixon et al. 2019 introduced adaptive binning (their
    ACE additionally averages over classes).

    Parameters
    ----------
    y_true, y_prob
        As :func:`expected_calibration_error`.
    n_bins : int, default 15
        Number of equal-mass bins (> 0); ties can leave some empty, and those are skipped.

    Returns
    -------
    float
        In [0, 1].

    Raises
    ------
    ValueError, TypeError
        As :func:`expected_calibration_error`.

    Examples
    --------
    >>> # median edge 0.85: bins {0.3, 0.8} (acc 0.5, conf 0.55) and {0.9, 1.0} (acc 1, conf 0.95)
    >>> round(adaptive_calibration_error([1, 0, 1, 1], [0.9, 0.8, 0.3, 1.0], n_bins=2), 6)
    0.05
    """
    options = _cw_options(n_bins)
    return float(_ace_impl(prepare(y_true, y_prob), None, **options)[0])


register("conf_ece", _ece_impl, options=_ece_options, function=expected_calibration_error)
register("cw_ece", _cw_impl, options=_cw_options, multiclass=True, function=classwise_ece)
register("ace", _ace_impl, options=_cw_options, function=adaptive_calibration_error)
