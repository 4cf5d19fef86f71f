"""Consistency resampling: the distribution a calibration statistic has when the confidences are calibrated.

Method and source: docs/methods.md, "Consistency resampling" (Bröcker & Smith 2007, "Increasing the reliability of
reliability diagrams", Weather and Forecasting 22(3), §3). A binned ECE of n items is positive even for perfectly
calibrated confidences, and how positive depends on n, the bins and how spread the confidences are (a read spread
over several bins shows a larger floor than a constant one; docs/methods.md gives the sizes). Drawing
the labels from the confidences themselves gives that floor for the very confidences at hand, so an observed ECE
(or a cut in it) can be read against it.
"""

from __future__ import annotations

import warnings
from typing import Callable, NamedTuple

import numpy as np

from hf_calibration.errors import ParameterError, ParameterTypeError
from hf_calibration.metrics.validation import prepare, to_numpy
from hf_calibration.metrics.bootstrap import _check_bootstrap_args, _resolve_metric


class ConsistencyResult(NamedTuple):
    """``observed``: the statistic on the given labels (None without them); ``null_mean``, ``low``, ``high``: the
    mean and the central ``confidence_level`` range of the statistic over labels drawn from the confidences;
    ``p_value``: (1 + #{draws ≥ observed}) / (1 + draws), None without labels, NaN where ``observed`` is."""

    observed: float | None
    null_mean: float
    low: float
    high: float
    p_value: float | None


#: Metrics where a larger value is better: the one-sided test ("larger = less calibrated") would read the wrong tail.
HIGHER_IS_BETTER = ("confidence_auroc", "confidence_auprc")


def draw_calibrated_labels(y_prob, rng) -> np.ndarray:
    """Labels drawn so that ``y_prob`` is calibrated for them.

    Parameters
    ----------
    y_prob : (n,) confidences in [0, 1] give 0/1 correctness ``u < y_prob`` (u uniform on [0, 1)); (n, K)
        probabilities whose rows sum to 1 give a class per row drawn from that row (inverse CDF of the row divided
        by its sum, so a class of probability 0 is never drawn). Arrays, lists or torch tensors.
    rng : ``numpy.random.Generator`` or an int seed.

    Returns
    -------
    (n,) int64.

    Raises
    ------
    ValueError, TypeError
        ``y_prob`` not of shape (n,) or (n, K), NaN/inf, values outside [0, 1], rows not summing to 1; ``rng``
        neither a Generator nor an int.
    """
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        rng = np.random.default_rng(rng)
    if not isinstance(rng, np.random.Generator):
        raise ParameterTypeError("rng", rng, f"must be a numpy.random.Generator or an int seed, got {rng!r}")
    prob = _validated_prob(y_prob)
    return _draw(prob, rng)


def _validated_prob(y_prob, y_true=None) -> np.ndarray:
    """``y_prob`` as a float64 array of shape (n,) or (n, K), validated with ``y_true`` (when given) as the metrics
    validate them."""
    if y_true is None:
        arr = to_numpy(y_prob, "y_prob")
        y_true = np.zeros(arr.shape[0] if arr.ndim else 0, dtype=np.int64)
    # the original y_prob: a half-precision input keeps its own row-sum tolerance, as in the metrics
    return prepare(y_true, y_prob).y_prob.astype(np.float64, copy=False)


def _draw(prob: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    u = rng.random(prob.shape[0])
    if prob.ndim == 1:
        return (u < prob).astype(np.int64)
    cdf = np.cumsum(prob, axis=1)
    cdf /= cdf[:, -1:]
    return np.minimum((u[:, None] >= cdf).sum(axis=1), prob.shape[1] - 1).astype(np.int64)


def _checked_metric(metric, metric_kwargs, return_draws):
    """(function, keyword options, name) of a metric the test can read, or the error naming the argument."""
    if not callable(metric):
        raise ParameterTypeError("metric", metric, f"must be a metric function, got {metric!r}")
    if metric_kwargs is not None and not isinstance(metric_kwargs, dict):
        raise ParameterTypeError("metric_kwargs", metric_kwargs, f"must be a dict or None, got {metric_kwargs!r}")
    if not isinstance(return_draws, (bool, np.bool_)):
        raise ParameterTypeError("return_draws", return_draws, f"must be True or False, got {return_draws!r}")
    func, kwargs, _ = _resolve_metric(metric, metric_kwargs)
    name = getattr(func, "__name__", repr(func))
    if name in HIGHER_IS_BETTER:
        raise ParameterError("metric", name, "ranks answers (larger is better); the test reads larger values as less "
                             "calibrated: pass a calibration error or a proper score (ECE, Brier, NLL, smECE)")
    return func, kwargs, name


def _value(func, labels, y_prob, kwargs) -> float:
    value = func(labels, y_prob, **kwargs)
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ParameterTypeError("metric", getattr(func, "__name__", func),
                                 f"must return one number, returned {value!r}") from None


def consistency_resampling(
    metric: Callable,
    y_prob,
    y_true=None,
    *,
    n_resamples: int = 1000,
    confidence_level: float = 0.95,
    seed: int | None = 0,
    metric_kwargs: dict | None = None,
    return_draws: bool = False,
):
    """The null distribution of a calibration statistic under perfect calibration of ``y_prob`` (consistency
    resampling, Bröcker & Smith 2007 §3): ``n_resamples`` label sets are drawn from the confidences themselves
    (:func:`draw_calibrated_labels`) and ``metric(labels, y_prob)`` is computed on each.

    Read an observed ECE against ``null_mean`` / ``[low, high]``: a value inside the range is what a calibrated
    read with the same confidences shows at this n, so ECE differences smaller than the range's width are not
    calibration differences; ``p_value`` tests "calibrated" against "less calibrated" (a larger statistic).

    Parameters
    ----------
    metric : callable ``metric(y_true, y_prob, **metric_kwargs) -> float`` where larger means less calibrated
        (``expected_calibration_error``, ``brier_score``, ``smooth_ece``, ...); a ``functools.partial`` is
        accepted as :func:`bootstrap` takes it. Ranking scores (``confidence_auroc``, ``confidence_auprc``:
        larger is better) are refused.
    y_prob : (n,) confidences in [0, 1] or (n, K) probabilities whose rows sum to 1 (the metric's own forms); the
        metric receives it as given.
    y_true : optional, (n,) 0/1 correctness or class labels in [0, K): gives ``observed`` and ``p_value``.
    n_resamples : int ≥ 1, the number of label sets drawn.
    confidence_level : in (0, 1); ``low``/``high`` are the (1 − level)/2 and (1 + level)/2 quantiles of the draws.
    seed : int ≥ 0 or None, for ``np.random.default_rng``.
    metric_kwargs : dict, passed to the metric (e.g. ``{"n_bins": 15}``).
    return_draws : bool, default False. If True, also return the statistic on every draw.

    Returns
    -------
    ConsistencyResult
        ``(observed, null_mean, low, high, p_value)``, floats in the metric's units; ``p_value`` is NaN where the
        metric is undefined on the given labels. With ``return_draws`` the pair ``(result, draws)``, draws a (d,)
        float64 array (d ≤ n_resamples: draws where the metric is undefined are dropped, with a RuntimeWarning
        saying how many).

    Raises
    ------
    ValueError, TypeError
        Invalid ``y_prob``/``y_true`` (as the metrics), a ``metric`` that is not callable, ranks or does not return
        one number, ``metric_kwargs`` not a dict, bad ``n_resamples``/``confidence_level``/``seed``/``return_draws``,
        a metric undefined (non-finite) on every draw.

    Examples
    --------
    >>> import numpy as np
    >>> from hf_calibration.metrics import expected_calibration_error
    >>> r = consistency_resampling(expected_calibration_error, np.full(100, 0.5), n_resamples=200)
    >>> 0.02 < r.null_mean < 0.06 and r.observed is None
    True
    """
    _check_bootstrap_args(n_resamples, confidence_level, seed)
    func, kwargs, name = _checked_metric(metric, metric_kwargs, return_draws)
    prob = _validated_prob(y_prob, y_true)
    observed = None if y_true is None else _value(func, y_true, y_prob, kwargs)
    rng = np.random.default_rng(seed)
    draws = np.array([_value(func, _draw(prob, rng), y_prob, kwargs) for _ in range(n_resamples)])
    finite = draws[np.isfinite(draws)]
    if finite.size == 0:
        raise ParameterError("metric", name, "is undefined (non-finite) on every label set drawn from y_prob")
    if finite.size < draws.size:
        warnings.warn(f"consistency_resampling: {name} is undefined on {draws.size - finite.size} of {draws.size} "
                      "label sets drawn from y_prob; the null distribution is that of the other draws",
                      RuntimeWarning, stacklevel=2)
    alpha = 1.0 - float(confidence_level)
    low, high = np.quantile(finite, [alpha / 2, 1 - alpha / 2])
    p_value = None if observed is None else (
        float((1 + np.count_nonzero(finite >= observed)) / (1 + finite.size)) if np.isfinite(observed) else np.nan)
    result = ConsistencyResult(observed, float(finite.mean()), float(low), float(high), p_value)
    return (result, finite) if return_draws else result
