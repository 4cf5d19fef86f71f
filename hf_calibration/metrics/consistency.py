"""Consistency resampling: the distribution a calibration statistic has when the confidences are calibrated.

Method and source: docs/methods.md, "Consistency resampling" (Bröcker & Smith 2007, "Increasing the reliability of
reliability diagrams", Weather and Forecasting 22(3), §3). A binned ECE of n items is positive even for perfectly
calibrated confidences, and how positive depends on n, the bins and how spread the confidences are: at n = 100 a
calibrated read spread over several bins shows an ECE near 0.1, a constant one near 0. Drawing the labels from the
confidences themselves gives that floor for the very confidences at hand, so an observed ECE (or a cut in it) can be
read against it.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

from hf_calibration.errors import ParameterError
from hf_calibration.metrics._validation import prepare
from hf_calibration.metrics.bootstrap import _check_bootstrap_args, _resolve_metric


class ConsistencyResult(NamedTuple):
    """``observed``: the statistic on the given labels (None without them); ``null_mean``, ``low``, ``high``: the
    mean and the central ``confidence_level`` range of the statistic over labels drawn from the confidences;
    ``p_value``: (1 + #{draws ≥ observed}) / (1 + draws), None without labels."""

    observed: float | None
    null_mean: float
    low: float
    high: float
    p_value: float | None


def draw_calibrated_labels(y_prob: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Labels drawn so that ``y_prob`` is calibrated for them: (n,) confidences give 0/1 correctness
    ``u < y_prob`` (u uniform on [0, 1)); (n, K) probabilities give a class per row drawn from that row
    (inverse CDF). Returns (n,) int64."""
    u = rng.random(y_prob.shape[0])
    if y_prob.ndim == 1:
        return (u < y_prob).astype(np.int64)
    cdf = np.cumsum(y_prob, axis=1)
    return np.minimum((u[:, None] >= cdf).sum(axis=1), y_prob.shape[1] - 1).astype(np.int64)


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
        accepted as :func:`bootstrap` takes it.
    y_prob : (n,) confidences in [0, 1] or (n, K) probabilities whose rows sum to 1 (the metric's own forms).
    y_true : optional, (n,) 0/1 correctness or class labels in [0, K): gives ``observed`` and ``p_value``.
    n_resamples : int ≥ 1, the number of label sets drawn.
    confidence_level : in (0, 1); ``low``/``high`` are the (1 − level)/2 and (1 + level)/2 quantiles of the draws.
    seed : int or None, for ``np.random.default_rng``.
    metric_kwargs : dict, passed to the metric (e.g. ``{"n_bins": 15}``).
    return_draws : bool, default False. If True, also return the statistic on every draw.

    Returns
    -------
    ConsistencyResult
        ``(observed, null_mean, low, high, p_value)``, floats in the metric's units; with ``return_draws`` the pair
        ``(result, draws)``, draws a (d,) float64 array (d ≤ n_resamples: non-finite values dropped).

    Raises
    ------
    ValueError, TypeError
        Invalid ``y_prob``/``y_true`` (as the metrics), bad ``n_resamples``/``confidence_level``/``seed``, a metric
        undefined (non-finite) on every draw.

    Examples
    --------
    >>> import numpy as np
    >>> from hf_calibration.metrics import expected_calibration_error
    >>> r = consistency_resampling(expected_calibration_error, np.full(100, 0.5), n_resamples=200)
    >>> 0.02 < r.null_mean < 0.06 and r.observed is None
    True
    """
    _check_bootstrap_args(n_resamples, confidence_level, seed)
    func, kwargs, _ = _resolve_metric(metric, metric_kwargs)
    labels_given = y_true is not None
    probe = prepare(y_true if labels_given else np.zeros(np.shape(y_prob)[0], dtype=np.int64), y_prob)
    prob = probe.y_prob
    observed = float(func(probe.y_true, prob, **kwargs)) if labels_given else None
    rng = np.random.default_rng(seed)
    draws = np.array([float(func(draw_calibrated_labels(prob, rng), prob, **kwargs)) for _ in range(n_resamples)])
    draws = draws[np.isfinite(draws)]
    if draws.size == 0:
        raise ParameterError("metric", getattr(func, "__name__", func),
                             "is undefined (non-finite) on every label set drawn from y_prob")
    alpha = 1.0 - float(confidence_level)
    low, high = np.quantile(draws, [alpha / 2, 1 - alpha / 2])
    p_value = None
    if observed is not None:
        p_value = float((1 + np.count_nonzero(draws >= observed)) / (1 + draws.size))
    result = ConsistencyResult(observed, float(draws.mean()), float(low), float(high), p_value)
    return (result, draws) if return_draws else result
