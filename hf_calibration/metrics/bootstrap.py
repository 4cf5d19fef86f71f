"""Bootstrap intervals (BCa by default) and the calibration report used by the evaluation jobs.

Method and sources: docs/methods.md, "Bootstrap intervals". Every function takes ``method="BCa"`` (bias-corrected
and accelerated; Efron & Tibshirani 1993, ch. 14.3, Eqs. 14.10 and 14.14–14.15, as ``scipy.stats.bootstrap``) or
``method="percentile"`` (ch. 13.3). Binned statistics (ECE, ACE, MCE) are biased under resampling — duplicated
items fill bins unevenly, so a resampled ECE is on average larger than the sample's — and the percentile interval
then sits above the estimate and can exclude it; BCa's bias correction z0 moves the interval back.
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import numpy as np
from scipy.special import ndtr, ndtri

from hf_calibration.errors import ParameterError, ParameterTypeError, check_choice
from hf_calibration.metrics.validation import prepare
from hf_calibration.metrics.ece import adaptive_calibration_error, classwise_ece, expected_calibration_error
from hf_calibration.metrics.registry import batched_metric
from hf_calibration.metrics.scores import aurc, brier_score, confidence_auroc, negative_log_likelihood
from hf_calibration.metrics.smooth import smooth_ece

# Resamples are evaluated in blocks of at most this many (resample, item) cells, bounding memory.
_BLOCK_CELLS = 1 << 21
#: BCa's acceleration comes from a jackknife; above this many items, items are left out in this many equal
#: groups (the grouped jackknife, Efron & Tibshirani 1993 §11.5) so its cost stays that of ~1000 resamples.
JACKKNIFE_GROUPS = 1000
METHODS = ("BCa", "percentile")
_TIE_RTOL = 1e-12


class BootstrapResult(NamedTuple):
    """Point estimate on the full data and the bootstrap interval (BCa or percentile) around it."""

    estimate: float
    low: float
    high: float


def _check_bootstrap_args(n_resamples, confidence_level, seed, method="BCa") -> None:
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, (int, np.integer)):
        raise ParameterTypeError("n_resamples", n_resamples, f"must be an int, got {n_resamples!r}")
    if n_resamples < 1:
        raise ParameterError("n_resamples", n_resamples, f"must be ≥ 1, got {n_resamples}")
    if not isinstance(confidence_level, (float, int, np.floating)) or not 0 < confidence_level < 1:
        raise ParameterError("confidence_level", confidence_level, f"must be in (0, 1), got {confidence_level!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
        raise ParameterTypeError("seed", seed, f"must be an int or None, got {seed!r}")
    if seed is not None and seed < 0:
        raise ParameterError("seed", seed, f"must be ≥ 0 or None, got {seed}")
    check_choice(method, "method", METHODS)


def resample_counts(n: int, n_resamples: int, seed):
    """Yield blocks of resample counts, (rows, n) float64: row r counts how often item i is drawn.

    The draws are ``np.random.default_rng(seed).integers(0, n, size=(n_resamples, n))`` made block by
    block (the same stream as one call, and the indices ``scipy.stats.bootstrap`` draws with that generator).
    """
    rng = np.random.default_rng(seed)
    rows = max(1, min(n_resamples, _BLOCK_CELLS // n))
    for start in range(0, n_resamples, rows):
        r = min(rows, n_resamples - start)
        idx = rng.integers(0, n, size=(r, n))
        idx += (np.arange(r) * n)[:, None]
        yield np.bincount(idx.ravel(), minlength=r * n).reshape(r, n).astype(np.float64)


def jackknife_groups(n: int) -> np.ndarray:
    """Group (n,) int of each item for the jackknife: item i alone when n <= ``JACKKNIFE_GROUPS``, else one of
    ``JACKKNIFE_GROUPS`` contiguous groups of (nearly) equal size."""
    groups = min(n, JACKKNIFE_GROUPS)
    return np.arange(n) * groups // n


def jackknife_counts(n: int):
    """Yield blocks of leave-one-out counts, (rows, n) float64: row g is 1 except 0 on group g's items
    (:func:`jackknife_groups`); nothing for n < 2 (no jackknife, acceleration 0)."""
    if n < 2:
        return
    group = jackknife_groups(n)
    groups = int(group[-1]) + 1
    rows = max(1, min(groups, _BLOCK_CELLS // n))
    for start in range(0, groups, rows):
        ids = np.arange(start, min(groups, start + rows))
        yield (group[None, :] != ids[:, None]).astype(np.float64)


def _jackknife_indices(n: int):
    if n < 2:
        return []
    group = jackknife_groups(n)
    return [np.flatnonzero(group != g) for g in range(int(group[-1]) + 1)]


def acceleration(jackknife) -> float:
    """BCa's acceleration â from jackknife values, one array per independent sample (stratum), each the
    statistic with one item (group) of that sample left out (Efron & Tibshirani 1993, Eq. 14.15, in
    ``scipy.stats.bootstrap``'s multi-sample form). 0 when every jackknife value is the same (scipy: NaN)."""
    num = den = 0.0
    for values in jackknife:
        values = np.asarray(values, dtype=float)
        values = values[np.isfinite(values)]
        if values.size < 2:
            continue
        g = values.size
        u = (g - 1) * (values.mean() - values)
        num += np.sum(u**3) / g**3
        den += np.sum(u**2) / g**2
    return float(num / (6.0 * den**1.5)) if den > 0 else 0.0


def bootstrap_interval(stats: np.ndarray, estimate: float, confidence_level: float, *, method: str = "BCa",
                       jackknife=()) -> tuple[float, float]:
    """(low, high) of resampled values ``stats`` (NaN ones skipped) around ``estimate``.

    ``method="percentile"``: the (1 ∓ level)/2 percentiles. ``"BCa"``: the percentiles at
    α₁,₂ = Φ(ẑ₀ + (ẑ₀ + z_α)/(1 − â(ẑ₀ + z_α))) with ẑ₀ = Φ⁻¹(share of resamples below the estimate, ties
    counting half, within 1e-12 relative) and â = :func:`acceleration` of ``jackknife`` (Efron & Tibshirani 1993, Eqs. 14.10,
    14.14–14.15; ``scipy.stats.bootstrap(method="BCa")``, equal to it whenever its interval holds the estimate).

    Deviations, so that an interval never excludes the value it is about (docs/methods.md, "Bootstrap
    intervals"): where BCa is undefined (every resample on one side of the estimate; scipy returns NaN) the
    percentile levels are used, and an end that would leave the estimate outside is moved to the estimate
    (BCa can exclude it when more than 97.5 % of the resamples lie on one side).
    """
    finite = stats[~np.isnan(stats)]
    if finite.size == 0:
        return float("nan"), float("nan")
    alpha = (1.0 - confidence_level) / 2.0
    levels = np.array([alpha, 1.0 - alpha])
    if method == "BCa" and np.isfinite(estimate):
        b = finite.size
        # ties count half; a resample within rounding of the estimate (the batched sums run in another order) is one
        tol = _TIE_RTOL * max(1.0, abs(estimate))
        share = (np.count_nonzero(finite < estimate - tol) + np.count_nonzero(finite <= estimate + tol)) / (2.0 * b)
        if 0.0 < share < 1.0:
            z0 = ndtri(share)
            a = acceleration(jackknife)
            z = z0 + ndtri(levels)
            levels = ndtr(z0 + z / (1.0 - a * z))
    low, high = np.percentile(finite, 100.0 * levels)
    if method == "BCa" and np.isfinite(estimate):
        low, high = min(low, estimate), max(high, estimate)
    return float(low), float(high)


def _resolve_metric(metric: Callable, metric_kwargs: dict | None):
    """(function, keyword options, its batched twin or None) of a metric as ``bootstrap`` takes it: a
    ``functools.partial`` without positional arguments is unwrapped, its keywords under ``metric_kwargs``."""
    kwargs = dict(metric_kwargs or {})
    func = metric
    if isinstance(metric, functools.partial) and not metric.args:
        func, kwargs = metric.func, {**metric.keywords, **kwargs}
    return func, kwargs, batched_metric(func)


def _batched_values(impl, inputs, n_resamples, seed, method):
    """(estimate, resampled values, jackknife values) of a bound batched metric."""
    estimate = float(impl(inputs, None)[0])
    stats = np.concatenate([impl(inputs, w) for w in resample_counts(inputs.n, n_resamples, seed)])
    jack = [impl(inputs, w) for w in jackknife_counts(inputs.n)] if method == "BCa" else []
    return estimate, stats, np.concatenate(jack) if jack else np.zeros(0)


def bootstrap(
    metric: Callable,
    y_true,
    y_prob,
    *,
    n_resamples: int = 1000,
    confidence_level: float = 0.95,
    seed: int | None = 0,
    metric_kwargs: dict | None = None,
    method: str = "BCa",
) -> BootstrapResult:
    """Bootstrap confidence interval of a metric, BCa by default (Efron & Tibshirani 1993, ch. 13–14).

    Predictions (rows of ``y_prob`` with their ``y_true``) are resampled with replacement
    ``n_resamples`` times; the interval is :func:`bootstrap_interval` of the resampled values (resamples where
    the metric is undefined, e.g. AUROC with one class, are skipped), with BCa's acceleration from a jackknife
    over the items (grouped above ``JACKKNIFE_GROUPS`` items). The metrics of :mod:`hf_calibration.metrics`
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
    method : {"BCa", "percentile"}, default "BCa"
        As ``scipy.stats.bootstrap``; BCa equals scipy's on the same resamples (but see
        :func:`bootstrap_interval` for a resample distribution entirely on one side).

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
    _check_bootstrap_args(n_resamples, confidence_level, seed, method)
    func, kwargs, batched = _resolve_metric(metric, metric_kwargs)
    if batched is None:
        inputs = prepare(y_true, y_prob)

        def value(idx):
            return float(func(inputs.y_true[idx], inputs.y_prob[idx], **kwargs))

        return _loop(value, inputs.n, n_resamples, confidence_level, seed, method)
    impl = batched.bind(**kwargs)
    inputs = prepare(y_true, y_prob, multiclass=batched.multiclass)
    estimate, stats, jack = _batched_values(impl, inputs, n_resamples, seed, method)
    return BootstrapResult(estimate, *bootstrap_interval(stats, estimate, confidence_level, method=method,
                                                         jackknife=[jack]))


def _loop(value, n, n_resamples, confidence_level, seed, method) -> BootstrapResult:
    """Bootstrap of ``value(idx) -> float`` on item indices, one call per resample (and jackknife row)."""
    estimate = value(np.arange(n))
    rng = np.random.default_rng(seed)
    stats = np.array([value(i) for i in rng.integers(0, n, size=(n_resamples, n))], dtype=float)
    jack = [value(i) for i in _jackknife_indices(n)] if method == "BCa" else ()
    return BootstrapResult(estimate, *bootstrap_interval(stats, estimate, confidence_level, method=method,
                                                         jackknife=[jack]))


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
    method: str = "BCa",
) -> BootstrapResult:
    """Paired bootstrap (BCa by default) of a difference, ``metric(a) − metric(b)``, for two prediction sets on the
    same n items (Efron & Tibshirani 1993, ch. 13; paired as in Koehn 2004): each resample draws the same item
    indices for both, so what the two share (the items, their difficulty) cancels in the difference.

    Parameters
    ----------
    metric : callable, as :func:`bootstrap` takes it (e.g. ``expected_calibration_error``, ``brier_score``,
        ``confidence_auroc``).
    y_true_a, y_prob_a, y_true_b, y_prob_b : the two sets, item i of a and of b being the same question (their
        labels may differ: two methods' answers to it). Shapes as the metric takes them, with equal n.
    n_resamples, confidence_level, seed, metric_kwargs, method : as :func:`bootstrap`; the indices are
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
    _check_bootstrap_args(n_resamples, confidence_level, seed, method)
    func, kwargs, batched = _resolve_metric(metric, metric_kwargs)
    multiclass = batched.multiclass if batched is not None else None
    a, b = prepare(y_true_a, y_prob_a, multiclass=multiclass), prepare(y_true_b, y_prob_b, multiclass=multiclass)
    if a.n != b.n:
        raise ParameterError("y_prob_b", b.n, f"the paired sets need the same number of items, got {a.n} and {b.n}")
    if batched is None:
        def value(idx):
            return (float(func(a.y_true[idx], a.y_prob[idx], **kwargs))
                    - float(func(b.y_true[idx], b.y_prob[idx], **kwargs)))

        return _loop(value, a.n, n_resamples, confidence_level, seed, method)
    impl = batched.bind(**kwargs)
    est_a, stats_a, jack_a = _batched_values(impl, a, n_resamples, seed, method)
    est_b, stats_b, jack_b = _batched_values(impl, b, n_resamples, seed, method)
    estimate, jack = est_a - est_b, jack_a - jack_b
    return BootstrapResult(estimate, *bootstrap_interval(stats_a - stats_b, estimate, confidence_level,
                                                         method=method, jackknife=[jack]))


def stratified_bootstrap(
    statistic: Callable,
    sizes,
    *,
    weights=None,
    n_resamples: int = 1000,
    confidence_level: float = 0.95,
    seed: int | None = 0,
    method: str = "BCa",
) -> BootstrapResult:
    """Bootstrap (BCa by default) of a weighted mean over strata, each stratum resampled on its own (stratified
    bootstrap, Davison & Hinkley 1997, §3.2): e.g. a paired difference averaged over training seeds, or over
    seeds × test domains, where every stratum has its own items.

    Parameters
    ----------
    statistic : callable ``statistic(k, idx) -> float``, the value of stratum k on its items ``idx`` (an int
        array of item indices, with repeats); e.g. ``ece(y_a[k][idx], c_a[k][idx]) − ece(y_b[k][idx], c_b[k][idx])``
        for a paired difference. A non-finite value makes that resample undefined (skipped).
    sizes : sequence of int ≥ 1, the number of items of each stratum.
    weights : sequence of float ≥ 0 with a positive sum, one per stratum (default equal); normalised to sum 1.
    n_resamples, confidence_level, seed, method : as :func:`bootstrap`; BCa's jackknife leaves out one item
        (group) of one stratum at a time, as scipy's multi-sample BCa. The indices of stratum k are
        ``rng.integers(0, sizes[k], size=(n_resamples, sizes[k]))`` with one ``rng = np.random.default_rng(seed)``
        drawing the strata in order, so with one stratum a resample draws what :func:`paired_bootstrap`'s loop
        draws.

    Returns
    -------
    BootstrapResult
        ``(estimate, low, high)``: Σ_k w_k · statistic(k, all items of k), and the interval of the same
        weighted mean over the resamples.

    Raises
    ------
    ValueError, TypeError
        Empty ``sizes``, a size below 1, weights of another length, negative or summing to 0, bad
        ``n_resamples``/``confidence_level``/``seed``; ValueError when no resample is defined.
    """
    _check_bootstrap_args(n_resamples, confidence_level, seed, method)
    sizes = [int(n) for n in sizes]
    if not sizes or min(sizes) < 1:
        raise ParameterError("sizes", sizes, f"must be one or more stratum sizes ≥ 1, got {sizes!r}")
    w = np.ones(len(sizes)) if weights is None else np.asarray(weights, dtype=float)
    if w.shape != (len(sizes),) or not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise ParameterError("weights", weights,
                             f"must be {len(sizes)} finite values ≥ 0 with a positive sum, got {weights!r}")
    w = w / w.sum()
    whole = [float(statistic(k, np.arange(n))) for k, n in enumerate(sizes)]
    estimate = float(sum(wk * v for wk, v in zip(w, whole)))
    rng = np.random.default_rng(seed)
    draws = [rng.integers(0, n, size=(n_resamples, n)) for n in sizes]
    stats = np.array([sum(wk * statistic(k, draws[k][r]) for k, wk in enumerate(w)) for r in range(n_resamples)],
                     dtype=float)
    stats = stats[np.isfinite(stats)]
    if stats.size == 0:
        raise ParameterError("statistic", statistic, "is undefined on every resample (never finite)")
    # leaving an item of stratum k out changes only stratum k's term
    jack = [[estimate + wk * (float(statistic(k, idx)) - whole[k]) for idx in _jackknife_indices(n)]
            for k, (wk, n) in enumerate(zip(w, sizes))] if method == "BCa" else ()
    return BootstrapResult(estimate, *bootstrap_interval(stats, estimate, confidence_level, method=method,
                                                         jackknife=jack))


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
    method: str = "BCa",
) -> dict:
    """All calibration metrics of one prediction set, each with a bootstrap interval (docs/methods.md,
    "Bootstrap intervals").

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
    n_resamples, confidence_level, seed, method
        As :func:`bootstrap` (BCa by default: a binned metric's percentile interval can exclude its own
        value on small samples).

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
    _check_bootstrap_args(n_resamples, confidence_level, seed, method)
    inputs = prepare(y_true, y_prob)
    metrics = _report_metrics(n_bins, binning, norm, multiclass=inputs.n_classes is not None)
    stats: dict = {name: [] for name in metrics}
    for w in resample_counts(inputs.n, n_resamples, seed):
        for name, impl in metrics.items():
            stats[name].append(impl(inputs, w))
    jack: dict = {name: [] for name in metrics}
    for w in jackknife_counts(inputs.n) if method == "BCa" else ():
        for name, impl in metrics.items():
            jack[name].append(impl(inputs, w))
    report: dict = {"n": inputs.n}
    for name, impl in metrics.items():
        value = float(impl(inputs, None)[0])
        low, high = bootstrap_interval(np.concatenate(stats[name]), value, confidence_level, method=method,
                                       jackknife=[np.concatenate(jack[name])] if jack[name] else ())
        report[name] = {"value": value, "low": low, "high": high}
    return report


def _report_metrics(n_bins, binning, norm, *, multiclass: bool) -> dict:
    """Name → bound batched metric of every entry of :func:`calibration_report` (options validated here)."""
    ece = batched_metric(expected_calibration_error)
    metrics = {
        "accuracy": batched_metric("accuracy").bind(),
        "mean_confidence": batched_metric("mean_confidence").bind(),
        "conf_ece": ece.bind(n_bins=n_bins, binning=binning, norm=norm),
        "mce": ece.bind(n_bins=n_bins, binning=binning, norm="max"),
        "ace": batched_metric(adaptive_calibration_error).bind(n_bins=n_bins),
        "smece": batched_metric(smooth_ece).bind(),
        "brier": batched_metric(brier_score).bind(),
        "nll": batched_metric(negative_log_likelihood).bind(),
        "auroc": batched_metric(confidence_auroc).bind(),
        "aurc": batched_metric(aurc).bind(),
    }
    if multiclass:
        metrics["cw_ece"] = batched_metric(classwise_ece).bind(n_bins=n_bins)
    return metrics
