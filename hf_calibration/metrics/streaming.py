"""Streaming accumulator for the uniform-bin metrics: O(bins) memory, mergeable across processes."""

from __future__ import annotations

import numpy as np

from hf_calibration.errors import ParameterError, ParameterTypeError
from hf_calibration.metrics.validation import check_n_bins, prepare
from hf_calibration.metrics.binning import ReliabilityTable, accumulate_bin_sums, table_from_sums
from hf_calibration.metrics.ece import calibration_error_from_sums, check_norm


class BinnedCalibrationState:
    """Per-bin counts and sums of equal-width bins, updated batch by batch.

    Holds, for each of ``n_bins`` equal-width bins (conventions in :mod:`hf_calibration.metrics.binning`),
    the number of predictions, the sum of their confidences and the sum of their correctness. Any
    split of the data into batches, and any merge or sum-reduction of states across processes, gives
    exactly the counts of the one-shot computation, hence the same ECE / RMSCE / MCE (up to the order
    of floating-point additions, ~1e-15).

    Parameters
    ----------
    n_bins : int, default 15
        Number of equal-width bins, 1 to ``MAX_STATE_BINS`` (2**20: the sums are allocated up front, before the
        number of predictions, which bounds the metric functions' bins, is known).
    classwise : bool, default False
        False: top-label bins (conf-ECE). True: one row of bins per class, class k binning
        ``y_prob[:, k]`` against 1[label = k] (cw-ECE; needs (n, K) probabilities).
    n_classes : int, optional
        K of a classwise state (≥ 2), known up front: the state then has its (zero) sums, and a
        :meth:`to_tensor` for the all-reduce, before any data arrives, so a process whose shard is
        empty still takes part. Without it K is taken from the first non-empty batch. Only valid with
        ``classwise=True``.

    Attributes
    ----------
    sums : ndarray of shape (3, n_bins), or (3, K, n_bins) when classwise
        Rows: count, sum of confidence, sum of correctness (class indicator when classwise).
        None for a classwise state built without ``n_classes`` until its first non-empty batch.
    n_classes : int or None
        K of a classwise state once known; None for a top-label state.

    Raises
    ------
    ParameterTypeError
        (also a TypeError) Non-integer ``n_bins`` or ``n_classes``.
    ParameterError
        (a ValueError) ``n_bins`` outside [1, ``MAX_STATE_BINS``], ``n_classes < 2``, or ``n_classes`` without
        ``classwise=True``; it names the parameter and the value.

    Examples
    --------
    >>> import numpy as np
    >>> from hf_calibration.metrics import BinnedCalibrationState, expected_calibration_error
    >>> rng = np.random.default_rng(0)
    >>> p = rng.dirichlet(np.ones(4), size=1000); y = rng.integers(0, 4, size=1000)
    >>> state = BinnedCalibrationState(n_bins=15)
    >>> for s in range(0, 1000, 128):
    ...     _ = state.update(y[s:s + 128], p[s:s + 128])
    >>> bool(np.isclose(state.compute(), expected_calibration_error(y, p), rtol=0, atol=1e-12))
    True

    Across processes (torch.distributed, any backend that sums float64). Every process must call
    ``all_reduce``, also one with no data: its state (built with ``n_classes`` when classwise) gives
    zero sums.

    >>> # t = state.to_tensor(device); torch.distributed.all_reduce(t)
    >>> # state = BinnedCalibrationState.from_tensor(t)
    """

    def __init__(self, n_bins: int = 15, *, classwise: bool = False, n_classes: int | None = None):
        self.n_bins = check_n_bins(n_bins, up_front="a streaming state's per-bin sums")
        self.classwise = bool(classwise)
        self.n_classes = _check_n_classes(n_classes, self.classwise)
        self.reset()

    # -- accumulation ------------------------------------------------------------------------

    def update(self, y_true, y_prob) -> "BinnedCalibrationState":
        """Add a batch; same inputs as :func:`~hf_calibration.metrics.expected_calibration_error`.

        An empty batch (``y_prob`` of shape (0,) or (0, K), ``y_true`` of shape (0,)) adds nothing: a
        process whose shard is empty can call ``update`` like the others. Its shapes are still
        checked (and K against the state's). The batch is validated completely before anything is
        added, so a ValueError leaves the state unchanged. Returns ``self``.

        Raises
        ------
        ValueError, TypeError
            As :func:`~hf_calibration.metrics.expected_calibration_error` (classwise:
            :func:`~hf_calibration.metrics.classwise_ece`); ValueError also for a batch with another K
            than the state's ``n_classes``.
        """
        inputs = prepare(y_true, y_prob, check_values=False, multiclass=True if self.classwise else None,
                         allow_empty=True)
        k = inputs.n_classes
        if self.classwise and self.n_classes is not None and k is not None and k != self.n_classes:
            raise ParameterError("y_prob", y_prob, f"has K={k} classes but this classwise state holds {self.n_classes} "
                                 f"(n_classes={self.n_classes})")
        if inputs.n == 0:
            return self
        batch = accumulate_bin_sums(inputs, self.n_bins, self.classwise)
        self.sums = batch if self.sums is None else self.sums + batch
        if self.classwise:
            self.n_classes = k
        return self

    def merge(self, other: "BinnedCalibrationState") -> "BinnedCalibrationState":
        """Add another state's sums into this one (in place); returns ``self``."""
        if not isinstance(other, BinnedCalibrationState):
            raise TypeError(f"other must be a BinnedCalibrationState, got {type(other).__name__}")
        if (other.n_bins, other.classwise) != (self.n_bins, self.classwise):
            raise ValueError(
                f"cannot merge a state with n_bins={other.n_bins}, classwise={other.classwise} into one with "
                f"n_bins={self.n_bins}, classwise={self.classwise}"
            )
        if other.sums is None:
            return self
        if self.sums is not None and self.sums.shape != other.sums.shape:
            raise ValueError(f"cannot merge sums of shape {other.sums.shape} into {self.sums.shape}")
        self.sums = other.sums.copy() if self.sums is None else self.sums + other.sums
        self.n_classes = other.n_classes
        return self

    def reset(self) -> "BinnedCalibrationState":
        """Drop the accumulated data (keeps ``n_bins`` and a known K); returns ``self``."""
        if not self.classwise:
            self.sums = np.zeros((3, self.n_bins))
        else:
            self.sums = None if self.n_classes is None else np.zeros((3, self.n_classes, self.n_bins))
        return self

    @property
    def n(self) -> int:
        """Number of predictions accumulated."""
        if self.sums is None:
            return 0
        counts = self.sums[0] if not self.classwise else self.sums[0, 0]
        return int(round(counts.sum()))

    # -- results -----------------------------------------------------------------------------

    def compute(self, *, norm: str = "l1", debiased: bool = False) -> float:
        """ECE of the accumulated data (``norm``/``debiased`` as in
        :func:`~hf_calibration.metrics.expected_calibration_error`); the mean over classes when
        classwise (cw-ECE)."""
        check_norm(norm, debiased)
        if self.n == 0:
            raise ValueError("the state holds no predictions; call update() first")
        err = calibration_error_from_sums(self.sums, norm=norm, debiased=debiased)
        return float(np.mean(err))

    def reliability(self) -> ReliabilityTable:
        """Reliability table of the accumulated top-label data."""
        if self.classwise:
            raise ValueError("reliability() needs a top-label state (classwise=False)")
        return table_from_sums(self.sums, np.arange(self.n_bins + 1) / self.n_bins)

    # -- distributed -------------------------------------------------------------------------

    def to_tensor(self, device=None):
        """The sums as a float64 torch tensor of shape (3, [K,] n_bins), ready for ``all_reduce(SUM)``.

        A state with no data gives zeros. Raises ValueError for a classwise state that has seen no
        data and was built without ``n_classes`` (its shape is unknown).
        """
        import torch

        if self.sums is None:
            raise ValueError(
                "this classwise state has seen no data, so K is unknown; pass n_classes=K to "
                "BinnedCalibrationState so that a process without data can still all-reduce"
            )
        return torch.as_tensor(self.sums, dtype=torch.float64, device=device).clone()

    @classmethod
    def from_tensor(cls, tensor) -> "BinnedCalibrationState":
        """Rebuild a state from :meth:`to_tensor` output (possibly sum-reduced across processes)."""
        sums = np.asarray(tensor.detach().cpu().numpy() if hasattr(tensor, "detach") else tensor, dtype=np.float64)
        if sums.ndim not in (2, 3) or sums.shape[0] != 3:
            raise ValueError(f"tensor must have shape (3, n_bins) or (3, K, n_bins), got {tuple(sums.shape)}")
        state = cls(sums.shape[-1], classwise=sums.ndim == 3, n_classes=sums.shape[1] if sums.ndim == 3 else None)
        state.sums = sums.copy()
        return state

    def __repr__(self) -> str:
        k = f", n_classes={self.n_classes}" if self.classwise else ""
        return f"BinnedCalibrationState(n_bins={self.n_bins}, classwise={self.classwise}{k}, n={self.n})"


def _check_n_classes(n_classes, classwise: bool) -> int | None:
    if n_classes is None:
        return None
    if isinstance(n_classes, bool) or not isinstance(n_classes, (int, np.integer)):
        raise ParameterTypeError("n_classes", n_classes, f"must be an int, got {n_classes!r} "
                                 f"({type(n_classes).__name__})")
    if n_classes < 2:
        raise ParameterError("n_classes", n_classes, f"must be an integer ≥ 2, got {n_classes}")
    if not classwise:
        raise ParameterError("n_classes", n_classes, f"is only meaningful with {{classwise}}=True, got {n_classes}",
                             related=("classwise",))
    return int(n_classes)
