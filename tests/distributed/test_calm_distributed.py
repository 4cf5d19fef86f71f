"""CALMTrainer under ``accelerate launch`` with 2 CPU processes: gloo DDP, DeepSpeed ZeRO-2 and ZeRO-3.

Every run trains the tiny random Llama + LoRA for 3 BOME steps on a global batch of 4 (2 per process, or
4 in the one-process reference). The one-process run is the independent reference: with the inner-step
gradients, ∇f, ∇q and q averaged over processes, the 2-process update is the same computation up to the
order of float32 sums, so the parameters agree to 1e-6 (measured: 1.7e-7 for α and 5e-8 for LoRA,
max |w| = 0.18); across the two ranks of one run they are bitwise identical.
"""

import json

import pytest
import torch
from safetensors.torch import load_file

from hf_calibration.calm import CALMModel
from tests.distributed.conftest import run_worker
from tests.tiny import make_tiny_model, make_tiny_tokenizer

ATOL = 1e-6  # 1 vs 2 processes: float32 summation order only


def _params(folder, rank):
    return load_file(str(folder / f"params_rank{rank}.safetensors"))


def _check_ranks_agree_with_single_process(run, single):
    rank0, rank1, reference = _params(run, 0), _params(run, 1), _params(single, 0)
    assert set(rank0) == set(reference) and any(n.startswith("logit_adjustment.") for n in rank0)
    assert any("lora_B" in n for n in rank0)
    for name in reference:
        assert torch.equal(rank0[name], rank1[name]), name  # α and θ identical across ranks
        torch.testing.assert_close(rank0[name], reference[name], rtol=0, atol=ATOL, msg=name)
    initial_alpha = torch.zeros_like(reference["logit_adjustment.rho"])
    assert not torch.equal(reference["logit_adjustment.rho"], initial_alpha)  # the runs really trained α
    result = json.loads((run / "result.json").read_text())
    assert result["num_processes"] == 2
    single_log = json.loads((single / "result.json").read_text())["log_history"]
    for ours, ref in zip(result["log_history"], single_log, strict=True):
        assert ours["bome_lambda"] == pytest.approx(ref["bome_lambda"], abs=1e-5)
    return result


def _check_saved_artifact(run):
    tok = make_tiny_tokenizer()
    saved = run / "saved"
    for name in ("adapter_model.safetensors", "logit_adjustment.safetensors", "logit_adjustment_config.json"):
        assert (saved / name).is_file(), name
    adapter = load_file(str(saved / "adapter_model.safetensors"))
    assert adapter and all(t.numel() > 0 for t in adapter.values())  # nothing saved from a ZeRO-3 partition
    loaded = CALMModel.from_pretrained(saved, base_model=make_tiny_model(tok)).eval()
    prompt = json.loads((run / "result.json").read_text())["prompt"]
    with torch.no_grad():
        logits = loaded(input_ids=torch.tensor([tok.encode(prompt)])).logits
    # Two paths: the in-memory model ran inside the DeepSpeed engine (ZeRO-3 computes its linear layers with
    # its own matmul on gathered weights), the reloaded one through plain F.linear. In float32 on the tiny
    # model (hidden 32, MLP 64, 2 layers, |logits| < 1) each dot product's rounding is <= 64·eps = 7.6e-6,
    # so 2e-5 leaves room for the layers; a wrong or missing LoRA/α weight moves logits by > 1e-3.
    torch.testing.assert_close(logits, load_file(str(run / "logits.safetensors"))["logits"], rtol=0, atol=2e-5)


def test_ddp_two_processes_match_one_process(tmp_path, single_process_run):
    run = run_worker(tmp_path, "multi_gpu_cpu.yaml", "--per-device-batch-size", "2")
    result = _check_ranks_agree_with_single_process(run, single_process_run)
    assert result["distributed_type"] == "DistributedType.MULTI_CPU"


@pytest.mark.parametrize("config, extra", [
    ("deepspeed_zero2_cpu.yaml", ()),
    # a small persistence threshold, so ZeRO-3 really shards the tiny base model (LoRA and α stay whole)
    ("deepspeed_zero3_cpu.yaml", ("--zero3-persistence-threshold", "200")),
])
def test_deepspeed_runs_save_and_reload(tmp_path, single_process_run, config, extra):
    pytest.importorskip("deepspeed")
    run = run_worker(tmp_path, config, "--per-device-batch-size", "2", "--save", *extra)
    result = _check_ranks_agree_with_single_process(run, single_process_run)
    assert result["distributed_type"] == "DistributedType.DEEPSPEED"
    if "zero3" in config:
        assert result["sharded_parameters"] > 0
    _check_saved_artifact(run)


def test_ddp_cft_bin_accuracies_cover_every_process(tmp_path):
    # CFT's targets are per-bin accuracies from a pass over the training data, and each item is divided by its
    # bin's count there. Each DDP rank scores only its shard; unless the hits and counts are summed across ranks,
    # the two ranks train toward the accuracies (and weights) of different halves and the update differs from
    # the one-process run on the whole data. c = 1 so that the term is not a 1e-3 share of the step.
    cft = ("--method", "cft", "--cft-coefficient", "1")
    single = run_worker(tmp_path / "single", None, "--per-device-batch-size", "4", *cft)
    run = run_worker(tmp_path / "ddp", "multi_gpu_cpu.yaml", "--per-device-batch-size", "2", *cft)
    rank0, rank1, reference = _params(run, 0), _params(run, 1), _params(single, 0)
    assert set(rank0) == set(reference) and any("lora_B" in n for n in reference)
    for name in reference:
        assert torch.equal(rank0[name], rank1[name]), name
        torch.testing.assert_close(rank0[name], reference[name], rtol=0, atol=ATOL, msg=name)
