"""CALM and SECL artifacts through the fake Hub: ``push_to_hub``, then ``from_pretrained(repo id)``; outputs compared exactly."""

import json

import pytest
import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import load as safetensors_load
from safetensors.torch import save_file

from hf_calibration.integrations.hub import push_folder_to_hub
from tests.tiny import make_tiny_model

calm = pytest.importorskip("hf_calibration.calm.logit_adjustment")
mixin = pytest.importorskip("hf_calibration.secl.mixin")
BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
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
    model.push_to_hub(repo_id, metrics={"conf_ece": 0.04}, token=fake_hub.token, base_model=BASE)
    stored = fake_hub.hub.stored_files(repo_id)
    assert {"README.md", "adapter_config.json", "adapter_model.safetensors", calm.ADJUSTMENT_WEIGHTS_NAME,
            calm.ADJUSTMENT_CONFIG_NAME} <= set(stored)
    card = stored["README.md"].decode()
    for text in ("library_name: hf-calibration", f"base_model: {BASE}", "CALM", "https://arxiv.org/abs/2608.07419",
                 "| conf_ece | 0.0400 |", '"format_version": 1'):
        assert text in card, text
    assert json.loads(stored[calm.ADJUSTMENT_CONFIG_NAME])["format_version"] == 1
    assert torch.equal(safetensors_load(stored[calm.ADJUSTMENT_WEIGHTS_NAME])["rho"], model.logit_adjustment.rho.detach())

    loaded = calm.CALMModel.from_pretrained(repo_id, base_model=make_tiny_model(tiny_tokenizer)).eval()
    with torch.no_grad():
        expected = model(IDS).logits
        assert torch.equal(loaded(IDS).logits, expected)
        assert not torch.equal(loaded(IDS, adjust_logits=False).logits, expected)  # α really was applied


def test_calm_push_needs_a_token_and_a_valid_repo_id(fake_hub, tiny_model, tiny_tokenizer):
    model = _calm_model(tiny_model, tiny_tokenizer)
    with pytest.raises(ValueError, match="token"):
        model.push_to_hub(f"{fake_hub.user}/no-token", base_model=BASE)
    with pytest.raises(ValueError, match="repo_id"):
        model.push_to_hub(f"{fake_hub.user}/bad name!", token=fake_hub.token, base_model=BASE)
    assert not fake_hub.hub.repos  # refused before any request: no repo was created


def test_calm_repo_without_logit_adjustment_names_the_missing_file(fake_hub, tiny_model, tiny_tokenizer, tmp_path):
    model = _calm_model(tiny_model, tiny_tokenizer)
    model.model.save_pretrained(tmp_path)  # the PEFT adapter only
    repo_id = f"{fake_hub.user}/adapter-only"
    push_folder_to_hub(tmp_path, repo_id, token=fake_hub.token)
    with pytest.raises(FileNotFoundError, match="logit_adjustment"):
        calm.CALMModel.from_pretrained(repo_id, base_model=make_tiny_model(tiny_tokenizer))


def test_calm_config_from_a_newer_release_is_refused(fake_hub, tiny_model, tiny_tokenizer, tmp_path):
    model = _calm_model(tiny_model, tiny_tokenizer)
    model.save_pretrained(tmp_path)
    path = tmp_path / calm.ADJUSTMENT_CONFIG_NAME
    path.write_text(json.dumps({**json.loads(path.read_text()), "format_version": 2}))
    repo_id = f"{fake_hub.user}/from-the-future"
    push_folder_to_hub(tmp_path, repo_id, token=fake_hub.token)
    with pytest.raises(ValueError, match="format_version 2.*newer release"):
        calm.CALMModel.from_pretrained(repo_id, base_model=make_tiny_model(tiny_tokenizer))


def test_calm_weights_for_another_vocabulary_are_refused(fake_hub, tiny_model, tiny_tokenizer, tmp_path):
    model = _calm_model(tiny_model, tiny_tokenizer)
    repo_id = f"{fake_hub.user}/tiny-calm-vocab"
    model.push_to_hub(repo_id, token=fake_hub.token, base_model=BASE)
    bigger = make_tiny_model(tiny_tokenizer)
    bigger.resize_token_embeddings(len(tiny_tokenizer) + 8)
    with pytest.raises(ValueError, match="vocab_size"):
        calm.CALMModel.from_pretrained(repo_id, base_model=bigger)
    # weights whose shape disagrees with their own config (e.g. a full-vocabulary rho for option tokens)
    model.save_pretrained(tmp_path)
    save_file({"rho": torch.zeros(len(tiny_tokenizer)), "shift": torch.zeros(len(tiny_tokenizer))},
              str(tmp_path / calm.ADJUSTMENT_WEIGHTS_NAME))
    push_folder_to_hub(tmp_path, f"{fake_hub.user}/bad-shape", token=fake_hub.token)
    with pytest.raises(ValueError, match="rho has shape"):
        calm.CALMModel.from_pretrained(f"{fake_hub.user}/bad-shape", base_model=make_tiny_model(tiny_tokenizer))


def _secl_model(tiny_model, tiny_tokenizer):
    model = mixin.SECLModel.wrap(tiny_model, tiny_tokenizer)
    _randomize(model)
    for entropy in [0.1, 0.9, 0.2, 0.8] * 5:  # give the gate a non-initial state
        model.secl_gate.update(entropy)
    model.secl_counters["questions"] = 20
    return model


def test_secl_push_then_load_from_the_hub(fake_hub, tiny_model, tiny_tokenizer):
    model = _secl_model(tiny_model, tiny_tokenizer)
    repo_id = f"{fake_hub.user}/tiny-secl"
    model.push_to_hub(repo_id, metrics={"conf_ece": 0.1}, token=fake_hub.token, base_model=BASE)
    stored = fake_hub.hub.stored_files(repo_id)
    assert {"README.md", "adapter_config.json", "adapter_model.safetensors", "secl_config.json",
            mixin.STATE_NAME} <= set(stored)
    card = stored["README.md"].decode()
    for text in ("library_name: hf-calibration", f"base_model: {BASE}", "SECL", "https://arxiv.org/abs/2604.09624",
                 "| conf_ece | 0.1000 |"):
        assert text in card, text
    assert json.loads(stored[mixin.STATE_NAME])["format_version"] == mixin.FORMAT_VERSION

    loaded = mixin.SECLModel.from_pretrained(make_tiny_model(tiny_tokenizer), tiny_tokenizer, repo_id)
    assert loaded.secl_counters == model.secl_counters
    assert loaded.secl_gate.state_dict() == model.secl_gate.state_dict()
    with torch.no_grad():
        assert torch.equal(loaded(IDS).logits, model(IDS).logits)


def test_secl_folder_of_the_earlier_layout_loads(tiny_model, tiny_tokenizer, tmp_path):
    """A folder written by SECL before PEFT wrote it (hf-calibration up to commit c104bd1): the LoRA adapter was
    injected with ``inject_adapter_in_model`` under the name "secl", its state dict prefixed by hand with PEFT's
    "base_model.model.", and its ``LoraConfig`` saved on its own (inference_mode false). The same lines here."""
    import math

    from peft import LoraConfig, get_peft_model_state_dict, inject_adapter_in_model

    from hf_calibration.secl.config import SECLConfig
    from hf_calibration.secl.drift import EntropyShiftDetector

    config = SECLConfig()
    lora = LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=0.0,
                      target_modules=list(config.target_modules), layers_to_transform=[1], bias="none",
                      task_type="CAUSAL_LM")
    inject_adapter_in_model(lora, tiny_model, adapter_name="secl")
    _randomize(tiny_model)
    state = {"base_model.model." + k: v.contiguous()
             for k, v in get_peft_model_state_dict(tiny_model, adapter_name="secl", save_embedding_layers=False).items()}
    save_file(state, str(tmp_path / "adapter_model.safetensors"))
    lora.base_model_name_or_path = BASE
    lora.save_pretrained(tmp_path)
    config.save_pretrained(tmp_path)
    gate = EntropyShiftDetector(ema_rate=config.ema_rate, delta=config.ph_delta, threshold=config.ph_threshold,
                                min_instances=config.ph_min_instances, warmup=config.warmup)
    for entropy in [0.1, 0.9, 0.2, 0.8] * 5:
        gate.update(entropy)
    saved_gate = gate.state_dict()
    saved_gate["ph"] = {k: None if isinstance(v, float) and math.isinf(v) else v for k, v in saved_gate["ph"].items()}
    counters = dict.fromkeys(mixin.COUNTERS, 0) | {"questions": 20}
    (tmp_path / mixin.STATE_NAME).write_text(json.dumps(
        {"format_version": 1, "gate": saved_gate, "burst_left": 3, "counters": counters}))

    loaded = mixin.SECLModel.from_pretrained(make_tiny_model(tiny_tokenizer), tiny_tokenizer, tmp_path)
    assert loaded.secl_counters == counters and loaded.secl_burst_left == 3
    assert loaded.secl_gate.state_dict() == gate.state_dict()
    with torch.no_grad():
        assert torch.equal(loaded(IDS).logits, tiny_model(IDS).logits)  # same weights and kernels, one process


def test_secl_bad_input(fake_hub, tiny_model, tiny_tokenizer, tmp_path):
    model = _secl_model(tiny_model, tiny_tokenizer)
    with pytest.raises(ValueError, match="token"):
        model.push_to_hub(f"{fake_hub.user}/secl-no-token", base_model=BASE)
    with pytest.raises(ValueError, match="repo_id"):
        model.push_to_hub("bad//id", token=fake_hub.token, base_model=BASE)
    model.save_pretrained(tmp_path)
    state = tmp_path / mixin.STATE_NAME
    future = mixin.FORMAT_VERSION + 1  # written by a newer release
    state.write_text(json.dumps({**json.loads(state.read_text()), "format_version": future}))
    push_folder_to_hub(tmp_path, f"{fake_hub.user}/secl-future", token=fake_hub.token)
    with pytest.raises(ValueError, match=f"format_version {future}"):
        mixin.SECLModel.from_pretrained(make_tiny_model(tiny_tokenizer), tiny_tokenizer, f"{fake_hub.user}/secl-future")
    state.unlink()
    push_folder_to_hub(tmp_path, f"{fake_hub.user}/secl-no-state", token=fake_hub.token)
    with pytest.raises(FileNotFoundError, match=mixin.STATE_NAME):
        mixin.SECLModel.from_pretrained(make_tiny_model(tiny_tokenizer), tiny_tokenizer, f"{fake_hub.user}/secl-no-state")
