"""n_bins is bounded by max(n, 15) (docs/methods.md, "Binned ECE family"): a larger value is refused with an error
naming n_bins and the value, before any per-bin array is allocated."""

import tracemalloc

import numpy as np
import pytest

from hf_calibration import metrics as lib
from hf_calibration.errors import ParameterError
from hf_calibration.metrics import BinnedCalibrationState
from hf_calibration.metrics.binning import reliability_diagram
from hf_calibration.metrics.validation import MAX_STATE_BINS
from tests.metrics.data import make_binary, make_multiclass


@pytest.mark.parametrize("func", [lib.expected_calibration_error, lib.classwise_ece, lib.adaptive_calibration_error,
                                  reliability_diagram])
def test_a_billion_bins_is_refused_without_allocating(func):
    labels, probs = make_multiclass(100, 4, seed=1)
    tracemalloc.start()
    try:
        with pytest.raises(ParameterError) as err:
            func(labels, probs, n_bins=10**9)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert err.value.parameter == "n_bins" and err.value.value == 10**9
    assert "1000000000" in str(err.value) and "100" in str(err.value) and "\n" not in str(err.value)
    # one float64 array of 10^9 bins is 8 GB; the inputs are 100 x 4 floats
    assert peak < 1 << 20


def test_the_bound_is_one_bin_per_prediction_or_15():
    y, conf = make_binary(40, seed=2)
    # n_bins = n: every prediction may have a bin of its own; the uniform bins of width 1/40 are computed as usual
    by_hand_edges = np.arange(41) / 40
    idx = np.clip(np.searchsorted(by_hand_edges, conf, side="right") - 1, 0, 39)
    gaps = [abs(np.mean(y[idx == b]) - np.mean(conf[idx == b])) * np.sum(idx == b) for b in range(40) if np.any(idx == b)]
    assert lib.expected_calibration_error(y, conf, n_bins=40) == pytest.approx(sum(gaps) / 40, abs=1e-12)
    with pytest.raises(ParameterError, match=r"n_bins: must be ≤ 40 for 40 predictions.*got 41"):
        lib.expected_calibration_error(y, conf, n_bins=41)
    # the default 15 bins always work, also on 4 predictions (the docstring's examples)
    assert lib.expected_calibration_error([1, 0, 1, 1], [0.9, 0.8, 0.3, 1.0], n_bins=15) >= 0
    with pytest.raises(ParameterError, match="must be ≤ 15 for 4 predictions"):
        lib.expected_calibration_error([1, 0, 1, 1], [0.9, 0.8, 0.3, 1.0], n_bins=16)


def test_calibration_report_refuses_before_the_bootstrap():
    labels, probs = make_multiclass(50, 4, seed=3)
    with pytest.raises(ParameterError, match="n_bins: must be ≤ 50 for 50 predictions"):
        lib.calibration_report(labels, probs, n_bins=10**6, n_resamples=1000)


@pytest.mark.parametrize("classwise", [False, True])
def test_a_streaming_state_refuses_a_billion_bins_without_allocating(classwise):
    """Before: BinnedCalibrationState(n_bins=10**9) allocated 3 × 10^9 float64 sums (24 GB) before any data. Its sums
    exist before the predictions are counted, so the bound is MAX_STATE_BINS, max(n, 15) of a million predictions."""
    assert MAX_STATE_BINS == 2**20  # max_bins(n) of n = 1,048,576 predictions (docs/methods.md)
    tracemalloc.start()
    try:
        with pytest.raises(ParameterError) as err:
            BinnedCalibrationState(n_bins=10**9, classwise=classwise, **({"n_classes": 4} if classwise else {}))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert err.value.parameter == "n_bins" and err.value.value == 10**9
    assert str(err.value).startswith(f"n_bins: must be ≤ {MAX_STATE_BINS} for a streaming state")
    assert "1000000000" in str(err.value) and "\n" not in str(err.value)
    assert peak < 1 << 20
    with pytest.raises(ParameterError) as err:
        BinnedCalibrationState(MAX_STATE_BINS + 1)
    assert err.value.parameter == "n_bins" and err.value.value == MAX_STATE_BINS + 1


def test_a_streaming_state_takes_the_bound_and_agrees_with_the_function():
    """At the bound the state still works; its ECE is the one-shot function's on data with as many predictions."""
    state = BinnedCalibrationState(MAX_STATE_BINS)
    assert state.sums.shape == (3, MAX_STATE_BINS)
    y, conf = make_binary(40, seed=5)
    state = BinnedCalibrationState(40).update(y[:25], conf[:25]).update(y[25:], conf[25:])
    assert state.compute() == pytest.approx(lib.expected_calibration_error(y, conf, n_bins=40), abs=1e-12)


def test_the_bin_rule_takes_the_state_bound():
    """Before: ``uniform_bin_index`` took any n_bins and built its lookup table of about 2·n_bins entries first
    (10^9 bins: 16 GB). It takes the streaming state's bound, MAX_STATE_BINS, with the same error naming n_bins;
    at the bound it bins as the exact comparison with the edges k / n_bins does."""
    from hf_calibration.metrics.binning import uniform_bin_index

    for n_bins in (MAX_STATE_BINS + 1, 10**9):
        tracemalloc.start()
        try:
            with pytest.raises(ParameterError) as err:
                uniform_bin_index([0.0, 0.5, 1.0], n_bins)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert err.value.parameter == "n_bins" and err.value.value == n_bins
        assert str(err.value).startswith(f"n_bins: must be ≤ {MAX_STATE_BINS} for ") and str(n_bins) in str(err.value)
        assert peak < 1 << 20
    conf = np.array([0.0, 1 / 3, 0.5, 0.999999, 1.0])
    exact = np.minimum(np.searchsorted(np.arange(1, MAX_STATE_BINS) / MAX_STATE_BINS, conf, side="right"),
                       MAX_STATE_BINS - 1)
    assert uniform_bin_index(conf, MAX_STATE_BINS).tolist() == exact.tolist()
