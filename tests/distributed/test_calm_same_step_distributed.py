"""2 processes (gloo DDP on CPU) × micro-batches of 1 × accumulation 2 = 1 process × one batch of 4.

Every method, both entropy domains (the cases of tests/calm/same_step.py), one SGD step each on 4 examples with
completions of 2, 12, 6 and 4 tokens. Each loss is a sum over the items of a micro-batch divided by the item
count of the whole optimizer step over all processes, so ranks holding 2 and 10 (or 12 and 8) tokens weigh every
token alike; BOME's inner step, q, ∇f, ∇q and λ are those of the global batch. The two ranks of one run are
bitwise identical (the reduced pieces are identical on every rank); against the one-process run the parameters
agree to float32 reordering error (tolerance derived in same_step.assert_same_step).
"""

import json

import pytest
import torch
from safetensors.torch import load_file

from tests.calm.same_step import CASES, assert_same_step
from tests.distributed.conftest import run_worker


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    single = run_worker(tmp_path_factory.mktemp("single"), None, "--same-step-cases", "--per-device-batch-size", "4")
    ddp = run_worker(tmp_path_factory.mktemp("ddp"), "multi_gpu_cpu.yaml", "--same-step-cases",
                     "--per-device-batch-size", "1", "--gradient-accumulation-steps", "2", timeout=900)
    return single, ddp


def _split(tensors):
    return ({k[len("before."):]: v for k, v in tensors.items() if k.startswith("before.")},
            {k[len("after."):]: v for k, v in tensors.items() if k.startswith("after.")})


@pytest.mark.parametrize("domain", ["vocab", "options"])
@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_two_processes_with_accumulation_match_one_process(runs, domain, case):
    single, ddp = runs
    assert json.loads((ddp / "positions.json").read_text())["num_processes"] == 2
    before, reference = _split(load_file(str(single / f"{domain}-{case}-rank0.safetensors")))
    _, rank0 = _split(load_file(str(ddp / f"{domain}-{case}-rank0.safetensors")))
    _, rank1 = _split(load_file(str(ddp / f"{domain}-{case}-rank1.safetensors")))
    assert set(rank0) == set(reference)
    for name in reference:
        assert torch.equal(rank0[name], rank1[name]), name  # every rank steps with the same reduced direction
    lr = 1.0  # same_step.SGD: learning_rate = alpha_learning_rate = 1 (0 for θ in iterate_alpha_step)
    n = json.loads((single / "positions.json").read_text())[domain]
    assert_same_step(before, rank0, reference, lr, n)
