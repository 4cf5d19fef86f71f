"""Input conversion and validation shared by every metric.

Two input forms exist (docs/methods.md, notation):

* the "conf" view: ``y_prob`` of shape (n,) holds confidences in [0, 1] and ``y_true`` of shape (n,)
  holds 0/1 correctness;
* the multiclass view: ``y_prob`` of shape (n, K), K ≥ 2, holds probability rows and ``y_true`` holds
  integer labels in [0, K). An (n, 2) array is multiclass with K = 2, never a binary positive-class
  column.

Accepted containers: numpy arrays, (nested) Python lists and torch tensors (converted without
importing torch here: the type is recognised by its module name). float16 / bfloat16 tensors and
arrays are widened exactly (to float32 for (n, K), to float64 otherwise); float32 (n, K) arrays are
kept as they are and reduced in float64 chunk by chunk, so no float64 copy of the whole array is made.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from hf_calibration.errors import ParameterError, ParameterTypeError, check_choice

__all__ = ["Inputs", "MAX_STATE_BINS", "check_choice", "check_labels", "check_n_bins", "check_prob_values", "max_bins",
           "prepare", "to_numpy"]

#: Rows of a probability array must sum to 1 within ``max(ROW_SUM_ATOL, K * eps(dtype))``; the second
#: term only matters for half-precision input, whose rounding alone moves a softmax row by ~K·eps.
ROW_SUM_ATOL = 1e-4

# Rows processed per step by the chunked (n, K) reductions: keeps the working set in L2 cache.
CHUNK_ELEMENTS = 1 << 16


class Inputs(NamedTuple):
    """Validated inputs: ``y_true`` (n,) integers, ``y_prob`` (n,) float64 or (n, K) float32/float64."""

    y_true: np.ndarray
    y_prob: np.ndarray
    row_sum_atol: float

    @property
    def n(self) -> int:
        return self.y_prob.shape[0]

    @property
    def n_classes(self) -> int | None:
        """K for the multiclass view, None for the conf view."""
        return self.y_prob.shape[1] if self.y_prob.ndim == 2 else None


def _from_torch(x):
    """A torch tensor as a numpy array; half precision widened to float32 (exact)."""
    x = x.detach()
    if x.device.type != "cpu":
        x = x.cpu()
    if str(x.dtype) in ("torch.float16", "torch.bfloat16"):
        x = x.float()
    return x.numpy()


def to_numpy(x, name: str) -> np.ndarray:
    """Convert a numpy array, Python list or torch tensor to a numeric numpy array (no copy if possible).

    ParameterError naming ``name`` for a ragged sequence, ParameterTypeError (also a TypeError) for
    values that are not numbers (bool counts as a number).
    """
    if type(x).__module__.split(".")[0] == "torch":
        x = _from_torch(x)
    try:
        arr = np.asarray(x)
    except ValueError as err:  # ragged nested lists
        raise ParameterError(name, x, f"must be a rectangular array, got a ragged sequence: {err}") from None
    if arr.dtype == np.float16:
        arr = arr.astype(np.float32)
    if arr.dtype.kind not in "biuf":
        raise ParameterTypeError(name, x, f"must hold numbers, got dtype {arr.dtype} (first value {_first(arr)!r})")
    return arr


def _first(arr: np.ndarray):
    return arr.ravel()[0] if arr.size else None


#: The bins a binned metric always accepts, whatever n: the default 15 (Guo et al. 2017), so small examples work.
MIN_BIN_LIMIT = 15


def max_bins(n: int) -> int:
    """The most bins a binned metric takes for ``n`` predictions: ``max(n, MIN_BIN_LIMIT)``.

    Beyond one bin per prediction every further bin is necessarily empty: it adds nothing to the estimate, while
    its memory (and the bootstrap's R × n_bins sums) would exceed that of the data (docs/methods.md, "Binned ECE
    family")."""
    return max(int(n), MIN_BIN_LIMIT)


#: The most bins a streaming state (``BinnedCalibrationState``) or the bin rule (``binning.uniform_bin_index``) takes.
#: The state's per-bin sums and the rule's lookup table exist before the predictions are counted, so ``max_bins(n)``
#: cannot bound them up front; 2**20 is ``max_bins(n)`` for a million predictions
#: (24 MiB of top-label sums) (docs/methods.md, "Binned ECE family").
MAX_STATE_BINS = 1 << 20


def check_n_bins(n_bins, n: int | None = None, *, of: str = "predictions", up_front: str | None = None) -> int:
    """``n_bins`` as a positive int, at most ``max_bins(n)`` when ``n`` (the number of predictions) is given, at
    most ``MAX_STATE_BINS`` when ``up_front`` names what is allocated per bin before ``n`` is known (a streaming
    state's per-bin sums, the bin rule's lookup table); ParameterTypeError for non-integers, ParameterError naming
    ``n_bins`` for values <= 0 or above the bound (``of`` names what ``n`` counts in the message)."""
    if isinstance(n_bins, bool) or not isinstance(n_bins, (int, np.integer)):
        raise ParameterTypeError("n_bins", n_bins, f"must be an int, got {n_bins!r} ({type(n_bins).__name__})")
    if n_bins <= 0:
        raise ParameterError("n_bins", n_bins, f"must be a positive integer, got {n_bins}")
    if n is not None and n_bins > max_bins(n):
        raise ParameterError("n_bins", n_bins, f"must be ≤ {max_bins(n)} for {n} {of} (at most one bin per "
                             f"prediction, or {MIN_BIN_LIMIT}: more bins are necessarily empty), got {n_bins}")
    if up_front is not None and n_bins > MAX_STATE_BINS:
        raise ParameterError("n_bins", n_bins, f"must be ≤ {MAX_STATE_BINS} for {up_front} (allocated before any "
                             f"prediction arrives; {MAX_STATE_BINS} bins serve a million predictions), got {n_bins}")
    return int(n_bins)


def _index(flat_position: int, shape: tuple) -> str:
    pos = np.unravel_index(flat_position, shape)
    return ", ".join(str(int(i)) for i in pos)


def check_prob_values(y_prob: np.ndarray, offset: int = 0, atol: float = ROW_SUM_ATOL) -> None:
    """ParameterError naming ``y_prob`` and the first NaN/inf, value outside [0, 1] or row not summing to 1
    (its value and index in the message).

    ``offset`` is the row index of ``y_prob[0]`` in the caller's full array (for chunked checks).
    Cheap on valid input: a min, a max and (for 2-D) one matrix-vector product of row sums.
    """
    lo, hi = y_prob.min(), y_prob.max()
    if not (lo >= 0.0 and hi <= 1.0):  # also False for NaN
        bad = ~np.isfinite(y_prob)
        what = "finite numbers in [0, 1]" if bad.any() else "probabilities in [0, 1]"
        if not bad.any():
            bad = (y_prob < 0) | (y_prob > 1)
        pos = int(np.argmax(bad.ravel()))
        value = y_prob.ravel()[pos]
        where = _shift(_index(pos, y_prob.shape), offset)
        raise ParameterError("y_prob", value, f"must hold {what}, got {value} at {{y_prob}}[{where}]")
    if y_prob.ndim == 2:
        sums = y_prob @ np.ones(y_prob.shape[1], dtype=y_prob.dtype)
        dev = np.abs(sums - 1.0)
        if dev.max() > atol:
            row = int(np.argmax(dev > atol))
            raise ParameterError("y_prob", y_prob[row], f"row {row + offset} sums to {float(sums[row]):.6g}, "
                                 f"expected 1 within atol={atol:g}")


def _shift(where: str, offset: int) -> str:
    first, _, rest = where.partition(", ")
    return str(int(first) + offset) + (", " + rest if rest else "")


def _eps_of(x) -> float:
    """Machine epsilon of the floating type the caller passed ``y_prob`` in (0 for integer input)."""
    if type(x).__module__.split(".")[0] == "torch":
        name = str(x.dtype)
        if name == "torch.bfloat16":
            return 2.0**-7
        if name == "torch.float16":
            return 2.0**-10
        if name == "torch.float32":
            return 2.0**-23
        return 2.0**-52
    dtype = getattr(x, "dtype", None)
    if isinstance(dtype, np.dtype) and dtype.kind == "f":
        return float(np.finfo(dtype).eps)
    return 2.0**-52


def prepare(
    y_true, y_prob, *, check_values: bool = True, multiclass: bool | None = None, allow_empty: bool = False
) -> Inputs:
    """Convert and validate ``(y_true, y_prob)``; see the module docstring for the accepted forms.

    ``multiclass=True`` requires (n, K) probabilities, ``False`` requires (n,) confidences, ``None``
    accepts both. ``check_values=False`` skips the O(n K) value checks (NaN/inf, range, row sums) for
    callers that run :func:`check_prob_values` chunk by chunk themselves. ``allow_empty=True`` (the
    streaming state) accepts n = 0, as (0,) or (0, K) whatever ``multiclass`` says.

    Raises
    ------
    ParameterTypeError
        Non-numeric input (also a TypeError), naming ``y_prob`` or ``y_true``.
    ParameterError
        A ValueError naming ``y_prob`` or ``y_true`` and the value: wrong shapes, empty input, length mismatch,
        non-integer or out-of-range labels, NaN/inf, values outside [0, 1], rows not summing to 1 (see
        ``ROW_SUM_ATOL``); the first offending entry's index is in the message.
    """
    eps = _eps_of(y_prob)
    prob = to_numpy(y_prob, "y_prob")
    if prob.ndim not in (1, 2):
        raise ParameterError("y_prob", y_prob, f"must have shape (n,) or (n, K), got shape {prob.shape}")
    if prob.ndim == 2 and prob.shape[1] < 2:
        raise ParameterError("y_prob", y_prob, f"must be confidences of shape (n,) or probabilities of shape (n, K) "
                             f"with K ≥ 2, got shape {prob.shape}")
    if prob.shape[0] == 0:
        if not allow_empty:
            raise ParameterError("y_prob", y_prob, f"must hold at least one prediction, got shape {prob.shape}")
    elif multiclass is True and prob.ndim != 2:
        raise ParameterError("y_prob", y_prob, f"must be probabilities of shape (n, K) with K ≥ 2, got shape "
                             f"{prob.shape}")
    elif multiclass is False and prob.ndim != 1:
        raise ParameterError("y_prob", y_prob, f"must be confidences of shape (n,), got shape {prob.shape}")
    if prob.dtype.kind != "f" or (prob.ndim == 1 and prob.dtype != np.float64):
        prob = prob.astype(np.float64)
    atol = max(ROW_SUM_ATOL, prob.shape[1] * eps) if prob.ndim == 2 else ROW_SUM_ATOL
    if check_values and prob.size:
        check_prob_values(prob, atol=atol)
    labels = check_labels(y_true, prob.shape[0], prob.shape[1] if prob.ndim == 2 else None)
    return Inputs(labels, prob, atol)


def check_labels(y_true, n_rows: int, n_classes: int | None, *, name: str = "y_true",
                 rows: str = "y_prob") -> np.ndarray:
    """``y_true`` as an integer array of shape (``n_rows``,): 0/1 correctness when ``n_classes`` is None,
    class indices in [0, ``n_classes``) otherwise. Integral floats are accepted; bool becomes int8.

    ``name`` is the argument checked, ``rows`` the one it must match in length (both named in the message).
    Raises ParameterError naming ``name`` (wrong shape or length, a non-integral or out-of-range label, with
    its index), ParameterTypeError for non-numbers.
    """
    labels = to_numpy(y_true, name)
    if labels.ndim != 1:
        raise ParameterError(name, y_true, f"must have shape (n,), got shape {labels.shape}")
    if labels.shape[0] != n_rows:
        raise ParameterError(name, y_true, f"has {labels.shape[0]} entries but {{{rows}}} has {n_rows} rows",
                             related=(rows,))
    if labels.dtype.kind == "f":
        bad = ~np.isfinite(labels) | (labels != np.floor(labels))
        if bad.any():
            i = int(np.argmax(bad))
            raise ParameterError(name, labels[i], f"must hold integer labels, got {labels[i]} at index {i}")
        labels = labels.astype(np.int64)
    elif labels.dtype.kind == "b":
        labels = labels.astype(np.int8)
    if labels.size == 0:
        return labels
    high = 1 if n_classes is None else n_classes - 1
    if labels.min() < 0 or labels.max() > high:
        i = int(np.argmax((labels < 0) | (labels > high)))
        if n_classes is None:
            raise ParameterError(name, labels[i], f"must be 0 or 1 (correctness) when {{{rows}}} holds confidences "
                                 f"of shape (n,), got {labels[i]} at index {i}", related=(rows,))
        raise ParameterError(name, labels[i], f"must lie in [0, {high}] (K={n_classes} classes), got {labels[i]} "
                             f"at index {i}")
    return labels


def chunk_rows(n_columns: int) -> int:
    """Rows per chunk for an array with ``n_columns`` columns."""
    return max(256, CHUNK_ELEMENTS // max(1, n_columns))
