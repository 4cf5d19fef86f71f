"""Percentile bootstrap intervals and the calibration report used by the evaluation jobs (SPEC §5)."""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import numpy as np

from hf_calibration.metrics import ece as _ece
from hf_calibration.metrics import scores as _scores
from hf_calibration.metrics import smooth as _smooth
from hf_calibration.metrics._registry import lookup
from hf_calibration.metrics._validation import prepare

# Resamples are evaluated in blocks of at most this many (resample, item) cells, bounding memory.
_BLOCK_CELLS = 1 << 21


class BootstrapResult(NamedTuple):
    """Point estimate on the full data and the percentile interval of the resampled estimates."""

    estimate: float
    low: float
    high: float


def _check_bootstrap_args(n_resamples, confidence_level, seed) -> None:
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, (int, np.integer)):
        raise TypeError(f"n_resamples must be an int, got {n_resamples!r}")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    if not isinstance(confidence_level, (float, int, np.floating)) or not 0 < confidence_level < 1:
        raise ValueError(f"confidence_level must be in (0, 1), got {confidence_level!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
        raise TypeError(f"seed must be an int or None, got {seed!r}")


def resample_counts(n: int, n_resamples: int, seed):
    """Yield blocks of resample counts, (rows, n) float64: row r counts how often item i is drawn.

    The draws are ``np.random.default_rng(seed).integers(0, n, size=(n_resamples, n))`` made block by
    block (the same stream as one call).
    """
    rng = np.random.default_rng(seed)
    rows = max(1, min(n_resamples, _BLOCK_CELLS // n))
    for start in range(0, n_resamples, rows):
        r = min(rows, n_resamples - start)
        idx = rng.integers(0, n, size=(r, n))
        idx += (np.arange(r) * n)[:, None]
        yield np.bincount(idx.ravel(), minlength=r * n).reshape(r, n).astype(np.float64)


def _resolve_metric(metric: Callable, metric_kwargs: dict | None):
    """(function, keyword options, its batched implementation or None) of a metric as ``bootstrap`` takes it: a
    ``functools.partial`` without positional arguments is unwrapped, its keywords under ``metric_kwargs``."""
    kwargs = dict(metric_kwargs or {})
    func = metric
    if isinstance(metric, functools.partial) and not metric.args:
        func, kwargs = metric.func, {**metric.keywords, **kwargs}
    return func, kwargs, lookup(func)


def _interval(stats: np.ndarray, confidence_level: float) -> tuple[float, float]:
    alpha = (1.0 - confidence_level) / 2.0
    finite = stats[~np.isnan(stats)]
    if finite.size == 0:
        return float("nan"), float("nan")
    low, high = np.percentile(finite, [100 * alpha, 100 * (1 - alpha)])
    return float(low), float(high)


def bootstrap(
    metric: Callable,
    y_true,
    y_prob,
    *,
    n_resamples: int = 1000,
    confidence_level: float = 0.95,
    seed: int | None = 0,
    metric_kwargs: dict | None = None,
) -> BootstrapResult:
    """Percentile bootstrap confidence interval of a metric (Efron & Tibshirani 1993, ch. 13).

    Predictions (rows of ``y_prob`` with their ``y_true``) are resampled with replacement
    ``n_resamples`` times; the interval is the ``(1 - confidence_level) / 2`` and
    ``(1 + confidence_level) / 2`` percentiles of the resampled values (resamples where the metric is
    undefined, e.g. AUROC with one class, are skipped). The metrics of :mod:`hf_calibration.metrics`
    (also wrapped in ``functools.partial``) are evaluated on all resamples at once, vectorised over
    resample counts; any other ``metric(y_true, y_prob, **metric_kwargs) -> float`` is called once
    per resample.

    Parameters
    ----------
    metric : callable
        E.g. :func:`~hf_calibration.metrics.expected_calibration_error`.
    y_true, y_prob
        As the metric expects; validated once.
    n_resamples : int, default 1000
    confidence_level : float in (0, 1), default 0.95
    seed : int or None, default 0
        Seed of ``np.random.default_rng``; the resample indices are
        ``default_rng(seed).integers(0, n, size=(n_resamples, n))``.
    metric_kwargs : dict, optional
        Keyword options of the metric (e.g. ``{"n_bins": 10}``).

    Returns
    -------
    BootstrapResult
        ``(estimate, low, high)``; the estimate is the metric on the full data.

    Raises
    ------
    ValueError, TypeError
        Invalid inputs (as the metric), ``n_resamples < 1``, ``confidence_level`` outside (0, 1).

    Examples
    --------
    >>> import numpy as np
    >>> from hf_calibration.metrics import bootstrap, expected_calibration_error
    >>> rng = np.random.default_rng(0)
    >>> p = rng.dirichlet(np.ones(4), size=500); y = rng.integers(0, 4, size=500)
    >>> est, low, high = bootstrap(expected_calibration_error, y, p, n_resamples=200)
    >>> bool(low <= est <= high)
    True
    """
    _check_bootstrap_args(n_resamples, confidence_level, seed)
    func, kwargs, batched = _resolve_metric(metric, metric_kwargs)
    if batched is None:
        return _bootstrap_loop(func, y_true, y_prob, kwargs, n_resamples, confidence_level, seed)
    options = batched.options(**kwargs)
    inputs = prepare(y_true, y_prob, multiclass=batched.multiclass)
    estimate = float(batched.impl(inputs, None, **options)[0])
    stats = np.concatenate(
        [batched.impl(inputs, w, **options) for w in resample_counts(inputs.n, n_resamples, seed)]
    )
    return BootstrapResult(estimate, *_interval(stats, confidence_level))


def paired_bootstrap(
    metric: Callable,
    y_true_a,
    y_prob_a,
    y_true_b,
    y_prob_b,
    *,
    n_resamples: int = 1000,
    confidence_level: float = 0.95,
    seed: int | None = 0,
    metric_kwargs: dict | None = None,
) -> BootstrapResult:
    """Paired percentile bootstrap of a difference, ``metric(a) − metric(b)``, for two prediction sets on the
    same n items (Efron & Tibshirani 1993, ch. 13; paired as in Koehn 2004): each resample draws the same item
    indices for both, so what the two share (the items, their difficulty) cancels in the difference.

    Parameters
    ----------
    metric : callable, as :func:`bootstrap` takes it (e.g. ``expected_calibration_error``, ``brier_score``,
        ``confidence_auroc``).
    y_true_a, y_prob_a, y_true_b, y_prob_b : the two sets, item i of a and of b being the same question (their
        labels may differ: two methods' answers to it). Shapes as the metric takes them, with equal n.
    n_resamples, confidence_level, seed, metric_kwargs : as :func:`bootstrap`; the indices are
        ``np.random.default_rng(seed).integers(0, n, size=(n_resamples, n))``, shared by a and b.

    Returns
    -------
    BootstrapResult
        ``(estimate, low, high)`` of the difference a − b; resamples where either value is undefined (AUROC with
        one class) are skipped.

    Raises
    ------
    ValueError, TypeError
        Invalid inputs (as the metric), a and b of different n, bad ``n_resamples``/``confidence_level``/``seed``.
    """
    _check_bootstrap_args(n_resamples, confidence_level, seed)
    func, kwargs, batched = _resolve_metric(metric, metric_kwargs)
    multiclass = batched.multiclass if batched is not None else None
    a, b = prepare(y_true_a, y_prob_a, multiclass=multiclass), prepare(y_true_b, y_prob_b, multiclass=multiclass)
    if a.n != b.n:
        raise ValueError(f"y_prob_b: the paired sets need the same number of items, got {a.n} and {b.n}")
    if batched is None:
        def value(inputs, idx):
            return float(func(inputs.y_true[idx], inputs.y_prob[idx], **kwargs))

        every = np.arange(a.n)
        estimate = value(a, every) - value(b, every)
        rng = np.random.default_rng(seed)
        stats = np.array([value(a, i) - value(b, i) for i in rng.integers(0, a.n, size=(n_resamples, a.n))])
        return BootstrapResult(estimate, *_interval(stats, confidence_level))
    options = batched.options(**kwargs)
    estimate = float(batched.impl(a, None, **options)[0] - batched.impl(b, None, **options)[0])
    stats = np.concatenate([batched.impl(a, w, **options) - batched.impl(b, w, **options)
                            for w in resample_counts(a.n, n_resamples, seed)])
    return BootstrapResult(estimate, *_interval(stats, confidence_level))


def stratified_bootstrap(
    statistic: Callable,
    sizes,
    *,
    weights=None,
    n_resamples: int = 1000,
    confidence_level: float = 0.95,
    seed: int | None = 0,
) -> BootstrapResult:
    """Percentile bootstrap of a weighted mean over strata, each stratum resampled on its own (stratified
    bootstrap, Davison & Hinkley 1997, §3.2): e.g. a paired difference averaged over training seeds, or over
    seeds × test domains, where every stratum has its own items.

    Parameters
    ----------
    statistic : callable ``statistic(k, idx) -> float``, the value of stratum k on its items ``idx`` (an int
        array of item indices, with repeats); e.g. ``ece(y_a[k][idx], c_a[k][idx]) − ece(y_b[k][idx], c_b[k][idx])``
        for a paired difference. A non-finite value makes that resample undefined (skipped).
    sizes : sequence of int ≥ 1, the number of items of each stratum.
    weights : sequence of float ≥ 0 with a positive sum, one per stratum (default equal); normalised to sum 1.
    n_resamples, confidence_level, seed : as :func:`bootstrap`. The indices of stratum k are
        ``rng.integers(0, sizes[k], size=(n_resamples, sizes[k]))`` with one ``rng = np.random.default_rng(seed)``
        drawing the strata in order, so with one stratum a resample draws what :func:`paired_bootstrap`'s loop
        draws.

    Returns
    -------
    BootstrapResult
        ``(estimate, low, high)``: Σ_k w_k · statistic(k, all items of k), and the percentile interval of the same
        weighted mean over the resamples.

    Raises
    ------
    ValueError, TypeError
        Empty ``sizes``, a size below 1, weights of another length, negative or summing to 0, bad
        ``n_resamples``/``confidence_level``/``seed``; ValueError when no resample is defined.
    """
    _check_bootstrap_args(n_resamples, confidence_level, seed)
    sizes = [int(n) for n in sizes]
    if not sizes or min(sizes) < 1:
        raise ValueError(f"sizes must be one or more stratum sizes >= 1, got {sizes!r}")
    w = np.ones(len(sizes)) if weights is None else np.asarray(weights, dtype=float)
    if w.shape != (len(sizes),) or not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise ValueError(f"weights must be {len(sizes)} finite values >= 0 with a positive sum, got {weights!r}")
    w = w / w.sum()
    estimate = float(sum(wk * statistic(k, np.arange(n)) for k, (wk, n) in enumerate(zip(w, sizes))))
    rng = np.random.default_rng(seed)
    draws = [rng.integers(0, n, size=(n_resamples, n)) for n in sizes]
    stats = np.array([sum(wk * statistic(k, draws[k][r]) for k, wk in enumerate(w)) for r in range(n_resamples)],
                     dtype=float)
    stats = stats[np.isfinite(stats)]
    if stats.size == 0:
        raise ValueError("stratified_bootstrap: the statistic is undefined on every resample")
    return BootstrapResult(estimate, *_interval(stats, confidence_level))


def _bootstrap_loop(metric, y_true, y_prob, kwargs, n_resamples, confidence_level, seed) -> BootstrapResult:
    inputs = prepare(y_true, y_prob)
    y, p = inputs.y_true, inputs.y_prob
    estimate = float(metric(y, p, **kwargs))
    rng = np.random.default_rng(seed)
    stats = np.array([float(metric(y[i], p[i], **kwargs)) for i in rng.integers(0, len(y), size=(n_resamples, len(y)))])
    return BootstrapResult(estimate, *_interval(stats, confidence_level))


def calibration_report(
    y_true,
    y_prob,
    *,
    n_bins: int = 15,
    binning: str = "uniform",
    norm: str = "l1",
    n_resamples: int = 1000,
    confidence_level: float = 0.95,
    seed: int | None = 0,
) -> dict:
    """All calibration metrics of one prediction set, each with a bootstrap interval (SPEC §5).

    Every metric is evaluated on the same ``n_resamples`` resamples (drawn as in :func:`bootstrap`).

    Parameters
    ----------
    y_true : array-like of shape (n,)
        Labels in [0, K) for (n, K) probabilities; 0/1 correctness for (n,) confidences.
    y_prob : array-like of shape (n, K) or (n,)
        Probability rows or confidences in [0, 1] (forms as in
        :func:`~hf_calibration.metrics.expected_calibration_error`).
    n_bins : int, default 15
        Bins of the binned metrics (conf-ECE and MCE as ``binning`` says; cw-ECE equal width; ACE equal
        mass, its definition).
    binning : {"uniform", "quantile"}, default "uniform"
        conf-ECE's and MCE's bins: equal width, or equal mass (as
        :func:`~hf_calibration.metrics.expected_calibration_error`).
    norm : {"l1", "l2", "max"}, default "l1"
        conf-ECE's norm (MCE is always the max norm over the same bins).
    n_resamples, confidence_level, seed
        As :func:`bootstrap`.

    Returns
    -------
    dict
        ``"n"`` (int) and, for each metric, ``{"value", "low", "high"}`` (floats; NaN where undefined):
        ``accuracy``, ``mean_confidence``, ``conf_ece``, ``mce``, ``ace``, ``smece``, ``brier``,
        ``nll``, ``auroc``, ``aurc``, plus ``cw_ece`` for (n, K) probabilities. For (n,) confidences
        ``brier`` and ``nll`` are the binary scores of the confidence against correctness.

    Raises
    ------
    ValueError, TypeError
        As :func:`~hf_calibration.metrics.expected_calibration_error` and :func:`bootstrap`.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> p = rng.dirichlet(np.ones(4), size=200); y = rng.integers(0, 4, size=200)
    >>> report = calibration_report(y, p, n_resamples=100)
    >>> sorted(report)  # doctest: +NORMALIZE_WHITESPACE
    ['accuracy', 'ace', 'aurc', 'auroc', 'brier', 'conf_ece', 'cw_ece', 'mce', 'mean_confidence', 'n',
     'nll', 'smece']
    >>> set(report["conf_ece"]) == {"value", "low", "high"}
    True
    """
    n_bins = _ece._ece_options(n_bins, binning, norm)["n_bins"]
    _check_bootstrap_args(n_resamples, confidence_level, seed)
    inputs = prepare(y_true, y_prob)
    bins = dict(n_bins=n_bins, binning=binning, debiased=False)
    metrics: dict[str, Callable] = {
        "accuracy": _scores._accuracy_impl,
        "mean_confidence": _scores._mean_confidence_impl,
        "conf_ece": functools.partial(_ece._ece_impl, norm=norm, **bins),
        "mce": functools.partial(_ece._ece_impl, norm="max", **bins),
        "ace": functools.partial(_ece._ace_impl, n_bins=n_bins),
        "smece": functools.partial(_smooth._smece_impl, sigma=None),
        "brier": _scores._brier_impl,
        "nll": _scores._nll_impl,
        "auroc": _scores._auroc_impl,
        "aurc": _scores._aurc_impl,
    }
    if inputs.n_classes is not None:
        metrics["cw_ece"] = functools.partial(_ece._cw_impl, n_bins=n_bins)
    stats = {name: [] for name in metrics}
    for w in resample_counts(inputs.n, n_resamples, seed):
        for name, impl in metrics.items():
            stats[name].append(impl(inputs, w))
    report: dict = {"n": inputs.n}
    for name, impl in metrics.items():
        low, high = _interval(np.concatenate(stats[name]), confidence_level)
        report[name] = {"value": float(impl(inputs, None)[0]), "low": low, "high": high}
    return report
