"""BinnedCalibrationState: batches, merges and sum-reductions give the one-shot values."""

import numpy as np
import pytest
import torch
import torch.distributed as dist

from hf_calibration.errors import ParameterError
from hf_calibration.metrics import (
    BinnedCalibrationState,
    classwise_ece,
    expected_calibration_error,
    reliability_diagram,
)
from tests.metrics.data import make_binary, make_multiclass


def _batches(n, sizes=(1, 7, 128, 1000)):
    start, i = 0, 0
    while start < n:
        stop = min(n, start + sizes[i % len(sizes)])
        yield slice(start, stop)
        start, i = stop, i + 1


@pytest.mark.parametrize("norm, debiased", [("l1", False), ("l2", False), ("max", False), ("l2", True), ("l1", True)])
def test_batches_equal_one_shot(multiclass, binary, norm, debiased):
    for labels, probs in (multiclass, binary):
        state = BinnedCalibrationState(n_bins=15)
        for part in _batches(len(labels)):
            state.update(labels[part], probs[part])
        expected = expected_calibration_error(labels, probs, norm=norm, debiased=debiased)
        assert state.compute(norm=norm, debiased=debiased) == pytest.approx(expected, abs=1e-12)
        assert state.n == len(labels)


def test_classwise_state_equals_classwise_ece(multiclass):
    labels, probs = multiclass
    state = BinnedCalibrationState(n_bins=10, classwise=True)
    for part in _batches(len(labels)):
        state.update(labels[part], probs[part])
    assert state.compute() == pytest.approx(classwise_ece(labels, probs, n_bins=10), abs=1e-12)


def test_merge_equals_concatenation():
    labels, probs = make_multiclass(5000, 3, seed=2)
    shards = [BinnedCalibrationState().update(labels[s::3], probs[s::3]) for s in range(3)]
    merged = BinnedCalibrationState()
    for shard in shards:
        merged.merge(shard)
    assert merged.compute() == pytest.approx(expected_calibration_error(labels, probs), abs=1e-12)
    one_shot = BinnedCalibrationState().update(labels, probs)
    np.testing.assert_allclose(merged.sums, one_shot.sums, rtol=0, atol=1e-9)
    assert merged.reliability().counts.tolist() == reliability_diagram(labels, probs).counts.tolist()


def test_tensor_sum_reduction_round_trip():
    labels, probs = make_multiclass(4000, 4, seed=3)
    ranks = [BinnedCalibrationState().update(labels[r::2], probs[r::2]) for r in range(2)]
    tensors = [s.to_tensor() for s in ranks]
    assert tensors[0].dtype == torch.float64 and tuple(tensors[0].shape) == (3, 15)
    reduced = BinnedCalibrationState.from_tensor(tensors[0] + tensors[1])  # what all_reduce(SUM) computes
    assert reduced.compute() == pytest.approx(expected_calibration_error(labels, probs), abs=1e-12)
    cw = [BinnedCalibrationState(classwise=True).update(labels[r::2], probs[r::2]).to_tensor() for r in range(2)]
    assert tuple(cw[0].shape) == (3, 4, 15)
    cw_state = BinnedCalibrationState.from_tensor(cw[0] + cw[1])
    assert cw_state.classwise and cw_state.compute() == pytest.approx(classwise_ece(labels, probs), abs=1e-12)


def test_all_reduce_with_gloo(tmp_path):
    labels, probs = make_binary(500, seed=5)
    state = BinnedCalibrationState().update(labels, probs)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        tensor = state.to_tensor()
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    finally:
        dist.destroy_process_group()
    assert BinnedCalibrationState.from_tensor(tensor).compute() == pytest.approx(
        expected_calibration_error(labels, probs), abs=1e-12
    )


def test_failed_update_leaves_state_unchanged():
    labels, probs = make_multiclass(300, 3, seed=4)
    state = BinnedCalibrationState().update(labels[:100], probs[:100])
    before = state.sums.copy()
    bad = probs[100:].copy()
    bad[150] = [0.5, 0.5, 0.5]
    with pytest.raises(ParameterError, match="^y_prob: row 150 sums to 1.5"):
        state.update(labels[100:], bad)
    np.testing.assert_array_equal(state.sums, before)


def test_state_errors():
    with pytest.raises(ValueError, match="no predictions"):
        BinnedCalibrationState().compute()
    with pytest.raises(ValueError, match="cannot merge a state with n_bins=10"):
        BinnedCalibrationState(15).merge(BinnedCalibrationState(10))
    with pytest.raises(TypeError, match="other must be a BinnedCalibrationState, got dict"):
        BinnedCalibrationState().merge({})
    state = BinnedCalibrationState(classwise=True).update([0, 1], [[0.5, 0.5], [0.2, 0.8]])
    with pytest.raises(ParameterError, match="^y_prob: has K=3 classes but this classwise state holds 2"):
        state.update([0], [[0.2, 0.3, 0.5]])
    with pytest.raises(ValueError, match=r"tensor must have shape \(3, n_bins\)"):
        BinnedCalibrationState.from_tensor(torch.zeros(2, 15))
    with pytest.raises(ValueError, match="reliability\\(\\) needs a top-label state"):
        state.reliability()


def test_reset():
    state = BinnedCalibrationState().update([1], [0.3])
    assert state.reset().n == 0


# -- a process with nothing to add (issue 14) --------------------------------------------------------


@pytest.mark.parametrize("classwise", [False, True])
def test_empty_batches_are_no_ops(classwise):
    labels, probs = make_multiclass(200, 3, seed=6)
    state = BinnedCalibrationState(n_bins=10, **(dict(classwise=True, n_classes=3) if classwise else {}))
    state.update(labels[:0], probs[:0]).update([], [])
    assert state.n == 0
    np.testing.assert_array_equal(state.sums, np.zeros((3, 3, 10) if classwise else (3, 10)))
    state.update(labels, probs).update(np.empty(0, int), np.empty((0, 3)))
    metric = classwise_ece if classwise else expected_calibration_error
    expected = metric(labels, probs, n_bins=10)
    assert state.compute() == pytest.approx(expected, abs=1e-12)
    assert state.n == 200


def test_empty_batch_is_still_checked():
    with pytest.raises(ParameterError, match="^y_true: has 1 entries but y_prob has 0 rows"):
        BinnedCalibrationState().update([1], np.empty(0))
    with pytest.raises(ParameterError, match=r"^y_prob: must have shape \(n,\) or \(n, K\), got shape \(0, 2, 2\)"):
        BinnedCalibrationState().update([], np.empty((0, 2, 2)))
    with pytest.raises(ParameterError, match=r"^y_prob: has K=4 classes but this classwise state holds 3 \(n_classes=3\)"):
        BinnedCalibrationState(classwise=True, n_classes=3).update([], np.empty((0, 4)))
    with pytest.raises(ValueError, match="no predictions"):
        BinnedCalibrationState().update([], []).compute()


def test_classwise_state_told_k_up_front():
    state = BinnedCalibrationState(n_bins=15, classwise=True, n_classes=4)
    assert state.n_classes == 4 and state.n == 0
    tensor = state.to_tensor()
    assert tensor.dtype == torch.float64 and tuple(tensor.shape) == (3, 4, 15) and not tensor.any()
    labels, probs = make_multiclass(1000, 4, seed=7)
    other = BinnedCalibrationState(n_bins=15, classwise=True, n_classes=4).update(labels, probs)
    reduced = BinnedCalibrationState.from_tensor(tensor + other.to_tensor())
    assert reduced.n_classes == 4 and reduced.compute() == pytest.approx(classwise_ece(labels, probs), abs=1e-12)
    assert state.merge(other).compute() == pytest.approx(classwise_ece(labels, probs), abs=1e-12)
    assert state.reset().n_classes == 4 and tuple(state.sums.shape) == (3, 4, 15)
    with pytest.raises(ParameterError, match=r"^y_prob: has K=3 classes but this classwise state holds 4 \(n_classes=4\)"):
        state.update([0, 1, 2], [[0.2, 0.3, 0.5]] * 3)
    with pytest.raises(ValueError, match=r"cannot merge sums of shape \(3, 2, 15\) into \(3, 4, 15\)"):
        state.merge(BinnedCalibrationState(classwise=True, n_classes=2))


def test_classwise_state_without_k_explains_how_to_get_a_tensor():
    with pytest.raises(ValueError, match="pass n_classes=K"):
        BinnedCalibrationState(classwise=True).to_tensor()


@pytest.mark.parametrize(
    "kwargs, exc, message",
    [
        (dict(classwise=True, n_classes=1), ValueError, "^n_classes: must be an integer ≥ 2, got 1$"),
        (dict(classwise=True, n_classes=2.0), TypeError, r"^n_classes: must be an int, got 2.0 \(float\)$"),
        (dict(classwise=True, n_classes=True), TypeError, r"^n_classes: must be an int, got True \(bool\)$"),
        (dict(n_classes=3), ValueError, "^n_classes: is only meaningful with classwise=True, got 3$"),
    ],
)
def test_n_classes_is_validated(kwargs, exc, message):
    with pytest.raises(ParameterError, match=message) as err:
        BinnedCalibrationState(**kwargs)
    assert isinstance(err.value, exc) and err.value.parameter == "n_classes"
