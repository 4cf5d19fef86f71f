"""Top-label reduction, bin assignment and per-bin sums: the shared core of every binned metric.

Bin conventions (docs/methods.md, 'Binned ECE family')
-------------------------
``uniform``: bin k of B holds confidences c with ``k/B <= c < (k+1)/B``, where each edge k/B is the
float64 nearest to the fraction (``np.arange(B + 1) / B``); c = 0.0 is in the first bin and c = 1.0
in the last. So a verbalised confidence 0.7 with 10 bins lands in [0.7, 0.8). :func:`uniform_bin_index`
implements the rule, and every equal-width binning of the library (metrics, streaming state, histogram
binning, the SECL bin gate, CFT) goes through it; ``int(c * B)`` and ``np.linspace`` edges do not
follow it (0.57 * 100 is 56.99999999999999; ``np.linspace(0, 1, 11)[3]`` is 0.30000000000000004).
Peers differ at the edges: scikit-learn uses ``np.linspace`` edges and right-closed bins (e_k, e_k+1], putting 0.7 in
(0.6, 0.7]; torchmetrics uses ``torch.linspace`` edges (its 4th of 11 is 0.30000000000000004, so 0.3
lands in [0.2, 0.3)) and gives c = 1.0 a bin of its own.

``quantile``: equal-mass bins whose inner edges are numpy's default ("linear") quantiles of the
confidences at levels k/B, k = 1..B-1, with outer edges 0 and 1, as netcal's ``equal_intervals=False``;
bins are half-open ``[e_k, e_{k+1})`` like the uniform ones and the last is closed. (netcal takes the
levels from ``np.linspace``, scikit-learn from ``np.percentile(100 * linspace)``; the rounding of a level
only matters when it puts an edge exactly on a sample.) Tied confidences can make edges coincide;
such bins are empty and carry no weight (netcal raises on them).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from hf_calibration.errors import ParameterError, ParameterTypeError
from hf_calibration.metrics.validation import (
    Inputs,
    check_choice,
    check_n_bins,
    check_prob_values,
    chunk_rows,
    prepare,
)

BINNINGS = ("uniform", "quantile")


# ---------------------------------------------------------------------------------------------
# top-label reduction


def _argmax_tournament(p: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row max and ``argmax == y`` of a small-K (n, K) array by pairwise merges of whole columns.

    numpy's ``max``/``argmax`` along a short last axis run a per-row inner loop; merging columns
    as vectors is several times faster. The argmax is carried as its binary digits (bool arrays), so
    a merge is two comparisons and a few bool operations. Ties go to the lower index, as ``np.argmax``.
    """
    # each entry: (max of the group, binary digits of its argmax, least significant first)
    groups = [(p[:, k], []) for k in range(p.shape[1])]
    while len(groups) > 1:
        merged = []
        for a in range(0, len(groups), 2):
            if a + 1 == len(groups):  # odd one out: its index gains a 0 digit
                value, bits = groups[a]
                merged.append((value, bits + [np.zeros(len(value), bool)]))
                continue
            (lv, lbits), (rv, rbits) = groups[a], groups[a + 1]
            right = rv > lv
            bits = [lb ^ (right & (lb ^ rb)) for lb, rb in zip(lbits, rbits)] + [right]
            merged.append((np.maximum(lv, rv), bits))
        groups = merged
    conf, bits = groups[0]
    arg = bits[0].view(np.int8).copy()
    for b, bit in enumerate(bits[1:], start=1):
        arg += bit.view(np.int8) << b
    return conf, arg == y


def top_label_chunk(p: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(confidence, correct) of one (rows, K) chunk: the row max and ``argmax == y``."""
    if p.shape[1] <= 16:
        return _argmax_tournament(p, y)
    arg = p.argmax(axis=1)
    return np.take_along_axis(p, arg[:, None], axis=1)[:, 0], arg == y


def top_label(y_true, y_prob) -> tuple[np.ndarray, np.ndarray]:
    """Top-label ("conf") view of a prediction.

    Parameters
    ----------
    y_true : array-like of shape (n,)
        Integer labels in [0, K) for (n, K) probabilities, or 0/1 correctness for (n,) confidences.
    y_prob : array-like of shape (n, K) or (n,)
        Probability rows (each summing to 1) or confidences in [0, 1].

    Returns
    -------
    confidence : ndarray of shape (n,), float64
        ``max_k y_prob[i, k]``, or ``y_prob`` itself for (n,) input.
    correct : ndarray of shape (n,), bool
        ``argmax_k y_prob[i, k] == y_true[i]`` (ties go to the lowest index, as ``np.argmax``), or
        ``y_true == 1`` for (n,) input.

    Raises
    ------
    ValueError, TypeError
        As :func:`hf_calibration.metrics.expected_calibration_error`.

    Examples
    --------
    >>> conf, correct = top_label([0, 1, 1], [[0.7, 0.3], [0.6, 0.4], [0.2, 0.8]])
    >>> conf.tolist(), correct.tolist()
    ([0.7, 0.6, 0.8], [True, False, True])
    """
    return prepared_top_label(prepare(y_true, y_prob))


def prepared_top_label(inputs: Inputs) -> tuple[np.ndarray, np.ndarray]:
    """``top_label`` of inputs already checked by ``prepare`` (the metrics call it after their own checks)."""
    y, p = inputs.y_true, inputs.y_prob
    if p.ndim == 1:
        return p, y == 1
    conf = np.empty(len(p), np.float64)
    correct = np.empty(len(p), bool)
    step = chunk_rows(p.shape[1])
    for s in range(0, len(p), step):
        c, ok = top_label_chunk(p[s : s + step], y[s : s + step])
        conf[s : s + step] = c
        correct[s : s + step] = ok
    return conf, correct


# ---------------------------------------------------------------------------------------------
# bin assignment


@lru_cache(maxsize=32)
def _uniform_tables(n_bins: int) -> tuple[np.ndarray, int, np.ndarray]:
    """Lookup table from a fine grid of sub-bins to bins; sub-bins touching an edge map to -1.

    ``trunc(c * M)`` is off by at most one sub-bin from the exact position of c, so any sub-bin not
    adjacent to an edge lies inside one bin; the rest are resolved by comparing with the edges.
    """
    sub = max(2, (1 << 15) // n_bins)
    m = n_bins * sub
    lut = np.minimum(np.arange(m + 1) // sub, n_bins - 1).astype(np.intp)
    for k in range(1, n_bins):
        lut[k * sub - 1 : k * sub + 1] = -1
    inner_edges = np.arange(1, n_bins) / n_bins
    return lut, m, inner_edges


def uniform_bin_index(conf, n_bins: int):
    """Equal-width bin of each confidence: the one bin rule of the library (module docstring).

    Bin k of ``n_bins`` holds the c with ``e_k <= c < e_(k+1)``, e_k the float64 nearest to k/n_bins;
    c = 0.0 is in bin 0 and c = 1.0 in bin ``n_bins - 1``. Every equal-width binning in
    hf_calibration (ECE, the streaming state, reliability diagrams, histogram binning, the SECL bin
    gate, CFT) calls this function, so they agree exactly, also at the edges.

    Parameters
    ----------
    conf : float or array-like of any shape
        Confidences in [0, 1]: a Python or numpy scalar, a list or a numpy array of any real dtype
        (float16 to long double, integers, bool). The comparison with the edges is exact in the
        input's own precision: a float32 value is not rounded to float64 first (that is exact anyway)
        nor a long double to float64.
    n_bins : int
        Number of bins, 1 to ``MAX_STATE_BINS`` (2**20: its lookup table is built before any confidence is binned,
        as a streaming state's sums are; docs/methods.md, "Binned ECE family").

    Returns
    -------
    ndarray of intp, the shape of ``conf``
        Values in [0, n_bins). A 0-d result (numpy intp scalar) for scalar input.

    Raises
    ------
    ParameterTypeError
        (also a TypeError) Non-numeric ``conf`` (or complex), non-integer ``n_bins``.
    ParameterError
        (a ValueError) A value of ``conf`` outside [0, 1] or NaN (the message names its value and position),
        ``n_bins <= 0`` or above ``MAX_STATE_BINS``, naming ``n_bins``.

    Examples
    --------
    >>> uniform_bin_index([0.0, 0.3, 0.7, 0.99, 1.0], 10).tolist()
    [0, 3, 7, 9, 9]
    >>> int(uniform_bin_index(0.57, 100))  # int(0.57 * 100) would give 56
    57
    """
    n_bins = check_n_bins(n_bins, up_front="the bin rule's lookup table")
    c = np.asarray(conf)
    if c.dtype.kind not in "biuf":
        raise ParameterTypeError("conf", conf, f"must hold real numbers, got dtype {c.dtype} "
                                 f"(value {_short_repr(conf)})")
    if c.size:
        lo, hi = c.min(), c.max()
        if not (lo >= 0 and hi <= 1):  # also catches NaN
            flat = c.ravel()
            pos = int(np.argmax(~((flat >= 0) & (flat <= 1))))
            where = "" if c.ndim == 0 else f"[{', '.join(str(int(i)) for i in np.unravel_index(pos, c.shape))}]"
            raise ParameterError("conf", flat[pos], f"must hold confidences in [0, 1], got {flat[pos]}"
                                 + (f" at {{conf}}{where}" if where else ""))
    if c.dtype == np.float64 or c.dtype == np.float32:
        idx = _uniform_index_fast(c, n_bins)
    else:  # exact comparison in the common dtype (float64 for small ints and float16, long double stays)
        idx = np.searchsorted(np.arange(1, n_bins) / n_bins, c.ravel(), side="right").reshape(c.shape)
    return idx[()] if idx.ndim == 0 else idx


def _short_repr(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _uniform_index_fast(conf: np.ndarray, n_bins: int) -> np.ndarray:
    """:func:`uniform_bin_index` of a validated float32/float64 array by table lookup.

    ``trunc(c * M)`` is computed in the input's precision: its rounding error is below one sub-bin as
    long as ``M * eps(dtype) < 1`` (M <= max(2^15, 2 n_bins)); wider tables get float64.
    """
    lut, m, inner = _uniform_tables(n_bins)
    c = np.atleast_1d(conf)
    scaled = c * float(m) if m * np.finfo(c.dtype).eps < 0.5 else c.astype(np.float64) * float(m)
    idx = lut[scaled.astype(np.intp)]
    if idx.size and idx.min() < 0:
        amb = np.nonzero(idx < 0)
        idx[amb] = np.searchsorted(inner, c[amb], side="right")
    return idx.reshape(conf.shape)


def _lerp(a, b, t):
    """numpy's linear-quantile interpolation, reproduced so weighted quantiles match ``np.quantile``."""
    diff = b - a
    out = a + diff * t
    return np.where(t >= 0.5, b - diff * (1 - t), out)


def quantile_inner_edges(conf: np.ndarray, n_bins: int, weights: np.ndarray | None = None) -> np.ndarray:
    """Inner edges of equal-mass bins: numpy "linear" quantiles at k / n_bins, k = 1..n_bins-1.

    ``conf`` (n,). With ``weights`` of shape (R, n) holding integer resample counts, the quantiles
    are those of each resample (the sample repeating item i ``weights[r, i]`` times); returns
    (n_bins - 1,) or (R, n_bins - 1).
    """
    q = np.arange(1, n_bins) / n_bins
    if weights is None:
        return np.quantile(conf, q)
    order = np.argsort(conf, kind="stable")
    sorted_conf = conf[order]
    cum = np.cumsum(weights[:, order], axis=1)  # (R, n): expanded positions end at cum - 1
    m = cum[:, -1:]
    virtual = (m - 1) * q  # (R, B-1)
    lo = np.floor(virtual)
    gamma = virtual - lo
    hi = np.minimum(lo + 1, m - 1)

    def value_at(pos):  # sorted value at expanded position ``pos`` of each row
        item = np.empty(pos.shape, np.intp)
        for r in range(pos.shape[0]):
            item[r] = np.searchsorted(cum[r], pos[r], side="right")
        return sorted_conf[item]

    return _lerp(value_at(lo), value_at(hi), gamma)


def quantile_bin_index(conf: np.ndarray, inner_edges: np.ndarray) -> np.ndarray:
    """Bin index of each confidence given inner edges (n_bins-1,) or per-resample edges (R, n_bins-1)."""
    if inner_edges.ndim == 1:
        return np.searchsorted(inner_edges, conf, side="right")
    return np.stack([np.searchsorted(e, conf, side="right") for e in inner_edges])


def bin_index(conf: np.ndarray, n_bins: int, binning: str, weights: np.ndarray | None = None) -> np.ndarray:
    """Bin index of each confidence: (n,) for uniform bins or unweighted quantile bins, (R, n) for
    quantile bins of R weighted resamples."""
    if binning == "uniform":
        return uniform_bin_index(conf, n_bins)
    return quantile_bin_index(conf, quantile_inner_edges(conf, n_bins, weights))


def bin_edges(conf: np.ndarray, n_bins: int, binning: str) -> np.ndarray:
    """All n_bins + 1 edges, outer edges 0 and 1."""
    inner = np.arange(1, n_bins) / n_bins if binning == "uniform" else quantile_inner_edges(conf, n_bins)
    return np.concatenate([[0.0], inner, [1.0]])


# ---------------------------------------------------------------------------------------------
# per-bin sums


def bin_sums(idx, conf, target, n_bins: int, weights: np.ndarray | None = None) -> np.ndarray:
    """Per-bin (count, sum of confidence, sum of target), stacked on the first axis.

    Parameters
    ----------
    idx, conf, target : arrays broadcastable to one shape S
        Bin index (int), confidence or class probability (float) and correctness or class indicator
        1[label = k] (bool) of each item. Without ``weights``, S is (n,) or (n, G) for G independent
        groups (e.g. the K classes of cw-ECE); with ``weights``, S is (R, n, G).
    weights : float array (R, n), optional
        Resample counts: the sums of R weighted resamples are computed at once (bootstrap).

    Returns
    -------
    ndarray of shape (3, [R,] [G,] n_bins), float64.
    """
    target = np.asarray(target, dtype=bool)
    if weights is None:
        idx, conf, target = np.broadcast_arrays(idx, conf, target)
        cells_shape = cell_axes = idx.shape[1:]
    else:
        weights = weights.reshape(weights.shape + (1,) * (np.ndim(idx) - 2))
        idx, conf, target, weights = np.broadcast_arrays(idx, conf, target, weights)
        cells_shape = (idx.shape[0],) + idx.shape[2:]
        cell_axes = (idx.shape[0], 1) + idx.shape[2:]
    n_cells = int(np.prod(cells_shape, dtype=np.int64))
    # The 0/1 target is folded into the key, so two bincounts give all three sums.
    key = idx * 2 + target
    if n_cells > 1:
        key = key + (2 * n_bins) * np.arange(n_cells).reshape(cell_axes)
    key = key.ravel()
    size = 2 * n_bins * n_cells
    counts = np.bincount(key, weights=None if weights is None else weights.ravel(), minlength=size)
    sums = np.bincount(key, weights=(conf if weights is None else conf * weights).ravel(), minlength=size)
    return fold_keyed(counts, sums, cells_shape, n_bins)


def fold_keyed(counts: np.ndarray, sums: np.ndarray, cells_shape: tuple, n_bins: int) -> np.ndarray:
    """(3, *cells_shape, n_bins) sums from bincounts over keys ``(cell * n_bins + bin) * 2 + target``."""
    shape = tuple(cells_shape) + (n_bins, 2)
    counts = counts.reshape(shape).astype(np.float64)
    sums = sums.reshape(shape)
    return np.stack([counts.sum(-1), sums.sum(-1), counts[..., 1]])


# ---------------------------------------------------------------------------------------------
# reliability table


@dataclass(frozen=True)
class ReliabilityTable:
    """Per-bin statistics of a reliability diagram (top-label view).

    Attributes
    ----------
    bin_edges : ndarray (n_bins + 1,)
        Edges in [0, 1]; bin k is ``[bin_edges[k], bin_edges[k + 1])``, the last bin closed.
    counts : ndarray (n_bins,), int64
        Predictions per bin.
    mean_confidence : ndarray (n_bins,)
        Mean confidence per bin; NaN for empty bins.
    accuracy : ndarray (n_bins,)
        Fraction correct per bin; NaN for empty bins.
    """

    bin_edges: np.ndarray
    counts: np.ndarray
    mean_confidence: np.ndarray
    accuracy: np.ndarray

    @property
    def ece(self) -> float:
        """Expected calibration error of the table: ``sum_b (n_b / n) |accuracy_b - mean_confidence_b|``."""
        keep = self.counts > 0
        gap = np.abs(self.accuracy[keep] - self.mean_confidence[keep])
        return float(np.sum(self.counts[keep] / self.counts.sum() * gap))

    def to_dict(self) -> dict:
        """Plain lists (JSON-serialisable; empty bins as None)."""

        def clean(a):
            return [None if np.isnan(v) else float(v) for v in a]

        return {
            "bin_edges": self.bin_edges.tolist(),
            "counts": self.counts.tolist(),
            "mean_confidence": clean(self.mean_confidence),
            "accuracy": clean(self.accuracy),
        }


def table_from_sums(sums: np.ndarray, edges: np.ndarray) -> ReliabilityTable:
    counts, conf_sum, correct_sum = sums
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_conf = np.where(counts > 0, conf_sum / counts, np.nan)
        acc = np.where(counts > 0, correct_sum / counts, np.nan)
    return ReliabilityTable(edges, counts.astype(np.int64), mean_conf, acc)


def reliability_diagram(y_true, y_prob, *, n_bins: int = 15, binning: str = "uniform") -> ReliabilityTable:
    """Bin table of a reliability diagram (Guo et al. 2017, Fig. 1; Naeini et al. 2015).

    Parameters
    ----------
    y_true : array-like of shape (n,)
        Integer labels in [0, K) for (n, K) probabilities, or 0/1 correctness for (n,) confidences.
    y_prob : array-like of shape (n, K) or (n,)
        Probability rows (top-label confidence is used) or confidences in [0, 1].
    n_bins : int, default 15
        Number of bins (> 0).
    binning : {"uniform", "quantile"}, default "uniform"
        Equal-width or equal-mass bins (conventions in :mod:`hf_calibration.metrics.binning`).

    Returns
    -------
    ReliabilityTable
        ``bin_edges``, ``counts``, ``mean_confidence`` and ``accuracy`` per bin (NaN where empty).

    Raises
    ------
    ValueError, TypeError
        As :func:`hf_calibration.metrics.expected_calibration_error`.

    Examples
    --------
    >>> t = reliability_diagram([1, 0, 1, 1], [0.9, 0.8, 0.3, 1.0], n_bins=2)
    >>> t.counts.tolist(), t.accuracy.tolist(), t.mean_confidence.tolist()
    ([1, 3], [1.0, 0.6666666666666666], [0.3, 0.9])
    """
    n_bins = check_n_bins(n_bins)
    check_choice(binning, "binning", BINNINGS)
    conf, correct = prepared_top_label(prepare(y_true, y_prob))
    check_n_bins(n_bins, conf.shape[0])
    idx = bin_index(conf, n_bins, binning)
    return table_from_sums(bin_sums(idx, conf, correct, n_bins), bin_edges(conf, n_bins, binning))


def validate_chunk(p: np.ndarray, conf: np.ndarray, offset: int, atol: float) -> None:
    """Fast value check of a chunk whose top-label confidence is already known (raises with details)."""
    if p.ndim == 1:
        ok = p.min() >= 0.0 and p.max() <= 1.0
    else:
        ok = p.min() >= 0.0 and conf.max() <= 1.0
        if ok:
            sums = p @ np.ones(p.shape[1], dtype=p.dtype)
            ok = np.abs(sums - 1.0).max() <= atol
    if not ok:
        check_prob_values(p, offset=offset, atol=atol)


def accumulate_bin_sums(inputs, n_bins: int, classwise: bool) -> np.ndarray:
    """Validate and bin ``inputs`` chunk by chunk; returns the (3, [K,] n_bins) sums of the batch.

    Working memory is O(chunk), so a float32 (n, K) array is never copied to float64 as a whole.
    """
    y, p, atol = inputs.y_true, inputs.y_prob, inputs.row_sum_atol
    k = inputs.n_classes
    cells = k if classwise else 1
    counts, sums = np.zeros(2 * n_bins * cells), np.zeros(2 * n_bins * cells)
    step = chunk_rows(1 if k is None else k)
    if classwise:
        classes = np.arange(k)
        offsets = 2 * n_bins * classes
    for s in range(0, len(p), step):
        pc, yc = p[s : s + step], y[s : s + step]
        if classwise:
            validate_chunk(pc, pc.reshape(-1), s, atol)
            conf = pc.astype(np.float64)
            target = yc[:, None] == classes
        elif k is None:
            validate_chunk(pc, pc, s, atol)
            conf, target = pc, yc == 1
        else:
            conf, target = top_label_chunk(pc, yc)
            validate_chunk(pc, conf, s, atol)
            conf = conf.astype(np.float64)
        # key = (cell * n_bins + bin) * 2 + target, as in bin_sums
        key = uniform_bin_index(conf, n_bins)
        key *= 2
        key += target
        if classwise:
            key += offsets
        key = key.ravel()
        counts += np.bincount(key, minlength=counts.size)
        sums += np.bincount(key, weights=conf.ravel(), minlength=sums.size)
    return fold_keyed(counts, sums, (k,) if classwise else (), n_bins)
