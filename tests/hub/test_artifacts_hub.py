"""CALM and SECL artifacts through the fake Hub: push_artifact_to_hub, then load by repo id; outputs compared exactly."""

import pytest
import torch
from peft import LoraConfig, get_peft_model

from hf_calibration.hub import download_folder, push_artifact_to_hub, push_folder_to_hub
from tests.tiny import make_tiny_model

calm = pytest.importorskip("hf_calibration.calm.logit_adjustment")
PAPER = "https://arxiv.org/abs/2410.00000"
IDS = torch.tensor([[5, 9, 13, 2, 7, 11]])


def _randomize(model, seed=1):
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.normal_(0.0, 0.5)


def _calm_model(tiny_model, tiny_tokenizer):
    peft_model = get_peft_model(tiny_model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    _randomize(peft_model)
    letters = tiny_tokenizer.convert_tokens_to_ids(["A", "B", "C", "D"])
    adjustment = calm.LogitAdjustment(len(tiny_tokenizer), letters)
    with torch.no_grad():
        adjustment.rho.copy_(torch.tensor([0.3, -0.2, 0.1, 0.5]))
        adjustment.shift.copy_(torch.tensor([1.0, -0.5, 0.25, 0.0]))
    return calm.CALMModel(peft_model, adjustment).eval()


def test_calm_push_then_from_pretrained_by_repo_id(fake_hub, tiny_model, tiny_tokenizer):
    model = _calm_model(tiny_model, tiny_tokenizer)
    repo_id = f"{fake_hub.user}/tiny-calm"
    push_artifact_to_hub(model, repo_id, base_model="HuggingFaceTB/SmolLM2-135M-Instruct", method="CALM",
                         paper_url=PAPER, config=model.logit_adjustment.config_dict(), metrics={"ece": 0.04},
                         token=fake_hub.token)
    stored = fake_hub.hub.stored_files(repo_id)
    assert {"README.md", "adapter_config.json", "adapter_model.safetensors", calm.ADJUSTMENT_WEIGHTS_NAME,
            calm.ADJUSTMENT_CONFIG_NAME} <= set(stored)
    assert b"library_name: hf-calibration" in stored["README.md"]

    loaded = calm.CALMModel.from_pretrained(repo_id, base_model=make_tiny_model(tiny_tokenizer)).eval()
    with torch.no_grad():
        expected = model(IDS).logits
        assert torch.equal(loaded(IDS).logits, expected)
        assert not torch.equal(loaded(IDS, adjust_logits=False).logits, expected)  # α really was applied


def test_calm_repo_without_logit_adjustment_names_the_missing_file(fake_hub, tiny_model, tiny_tokenizer, tmp_path):
    model = _calm_model(tiny_model, tiny_tokenizer)
    model.model.save_pretrained(tmp_path)  # the PEFT adapter only
    repo_id = f"{fake_hub.user}/adapter-only"
    push_folder_to_hub(tmp_path, repo_id, token=fake_hub.token)
    with pytest.raises(FileNotFoundError, match="logit_adjustment"):
        calm.CALMModel.from_pretrained(repo_id, base_model=make_tiny_model(tiny_tokenizer))


def test_calm_weights_for_another_vocabulary_are_refused(fake_hub, tiny_model, tiny_tokenizer):
    model = _calm_model(tiny_model, tiny_tokenizer)
    repo_id = f"{fake_hub.user}/tiny-calm-vocab"
    push_artifact_to_hub(model, repo_id, base_model="m/x", method="CALM", paper_url=PAPER, config={},
                         token=fake_hub.token)
    bigger = make_tiny_model(tiny_tokenizer)
    bigger.resize_token_embeddings(len(tiny_tokenizer) + 8)
    with pytest.raises(ValueError, match="vocab_size"):
        calm.CALMModel.from_pretrained(repo_id, base_model=bigger)


def test_secl_push_then_load_from_the_hub(fake_hub, tiny_model, tiny_tokenizer):
    mixin = pytest.importorskip("hf_calibration.secl.mixin")
    model = mixin.SECLModel.wrap(tiny_model, tiny_tokenizer)
    _randomize(model)
    for entropy in [0.1, 0.9, 0.2, 0.8] * 5:  # give the gate a non-initial state
        model.secl_gate.update(entropy)
    model.secl_counters["questions"] = 20
    repo_id = f"{fake_hub.user}/tiny-secl"
    push_artifact_to_hub(model, repo_id, base_model="HuggingFaceTB/SmolLM2-135M-Instruct", method="SECL",
                         paper_url=PAPER, config=model.secl_config.to_dict(), token=fake_hub.token)

    folder = download_folder(repo_id, required_files=["adapter_model.safetensors", mixin.STATE_NAME])
    loaded = mixin.SECLModel.from_pretrained(make_tiny_model(tiny_tokenizer), tiny_tokenizer, folder)
    assert loaded.secl_counters == model.secl_counters
    assert loaded.secl_gate.state_dict() == model.secl_gate.state_dict()
    with torch.no_grad():
        assert torch.equal(loaded(IDS).logits, model(IDS).logits)
