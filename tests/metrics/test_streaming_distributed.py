"""BinnedCalibrationState over 2 real processes (torch.distributed, gloo on CPU) where rank 1 has no data.

The documented recipe (``to_tensor`` → ``all_reduce(SUM)`` → ``from_tensor``) must work on every rank,
including one whose shard is empty, and give the one-process result over all the data, which is also
the batch metric on the concatenation.
"""

import datetime
import json

import numpy as np
import pytest
import torch.multiprocessing as mp

from hf_calibration.metrics import BinnedCalibrationState, classwise_ece, expected_calibration_error
from tests.metrics.data import make_multiclass

N, K, WORLD = 700, 4, 2


def _shard(rank):
    """Rank 0 holds every prediction, rank 1 none (an (0,) label and an (0, K) probability array)."""
    labels, probs = make_multiclass(N, K, seed=11)
    return (labels, probs) if rank == 0 else (labels[:0], probs[:0])


def _worker(rank, init_file, out_dir):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=120))
    try:
        labels, probs = _shard(rank)
        states = {
            "top_label": BinnedCalibrationState(n_bins=15).update(labels, probs),
            "classwise": BinnedCalibrationState(n_bins=10, classwise=True, n_classes=K).update(labels, probs),
        }
        if rank == 1:  # a process that never called update at all
            states["classwise_no_update"] = BinnedCalibrationState(n_bins=10, classwise=True, n_classes=K)
        else:
            states["classwise_no_update"] = BinnedCalibrationState(n_bins=10, classwise=True, n_classes=K).update(
                labels, probs
            )
        result = {}
        for name, state in states.items():
            tensor = state.to_tensor()
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
            reduced = BinnedCalibrationState.from_tensor(tensor)
            result[name] = {"ece": reduced.compute(), "n": reduced.n, "sums": reduced.sums.tolist()}
    finally:
        dist.destroy_process_group()
    with open(f"{out_dir}/rank{rank}.json", "w") as fh:
        json.dump(result, fh)


def test_all_reduce_with_an_empty_rank(tmp_path):
    mp.spawn(_worker, args=(str(tmp_path / "rendezvous"), str(tmp_path)), nprocs=WORLD, join=True)
    labels, probs = make_multiclass(N, K, seed=11)
    one_process = {
        "top_label": BinnedCalibrationState(n_bins=15).update(labels, probs),
        "classwise": BinnedCalibrationState(n_bins=10, classwise=True).update(labels, probs),
    }
    batch = {
        "top_label": expected_calibration_error(labels, probs),
        "classwise": classwise_ece(labels, probs, n_bins=10),
    }
    for rank in range(WORLD):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for name in ("top_label", "classwise", "classwise_no_update"):
            ref = "top_label" if name == "top_label" else "classwise"
            assert result[name]["n"] == N
            np.testing.assert_array_equal(result[name]["sums"], one_process[ref].sums)
            assert result[name]["ece"] == pytest.approx(one_process[ref].compute(), abs=1e-12)
            assert result[name]["ece"] == pytest.approx(batch[ref], abs=1e-12)
