"""Checkpoint selection in the calm experiment: every trained method keeps the checkpoint with the
lowest validation value of one rule among steps k, 2k, … and the last, and that checkpoint is what gets scored.

The tiny model is trained on 8 questions whose validation copies have a different gold letter, so fitting the
training letters works against the validation letters: for 'sft' the validation NLL is lowest at step 1 (1.3880,
then 1.3887, 1.3925, 1.3913; not monotone, Adam's steps on 8 questions are noisy), so the rule must restore step 1,
not the last step. The gaps (≥ 7e-4) are far above the float32 rounding that could reorder them (~1e-6)."""

import pytest
import torch
from datasets import Dataset
from transformers import TrainerCallback

from hf_calibration import modeling
from experiments.calm import train_method
from experiments.calm_config import CALMExperimentConfig
from hf_calibration.metrics import negative_log_likelihood

WORDS = "the a of and to in is was".split()


def splits():
    def rows(shift):
        return Dataset.from_list([{"question": f"which option is correct ? {w}", "choices": ["the", "a", "of", "and"],
                                   "answer": (i + shift) % 4, "subject": "x", "source": "tiny"}
                                  for i, w in enumerate(WORDS)])
    return {"train": rows(0), "calibration": rows(0), "validation": rows(1)}


class SnapshotAtSave(TrainerCallback):
    """The trainable parameters (LoRA + α) right after each checkpoint is written."""

    def __init__(self):
        self.saved = {}

    def on_save(self, args, state, control, model=None, **kwargs):
        self.saved[state.global_step] = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("method,entropy_domain", [("sft", "options"), ("cft", "options"), ("bome", "options"),
                                                    ("bome", "vocab")])
def test_restored_parameters_are_those_saved_at_the_selected_step(tmp_path, tiny_model_dir, method, entropy_domain):
    """With entropy_domain 'vocab' (α over every token id) the evaluation's letter NLL is read from the adjusted
    vocabulary distribution at the answer position; the library's scorer below reads the same model's letters."""
    config = CALMExperimentConfig(max_steps=4, train_batch_size=4, learning_rate=1e-2, select_by="nll",
                                  select_every=1, entropy_domain=entropy_domain)
    _, tokenizer = modeling.load_model(str(tiny_model_dir))
    snapshots = SnapshotAtSave()
    data = splits()
    model, info = train_method(method, data, config, model_name=str(tiny_model_dir), out=tmp_path, seed=0,
                                device="cpu", tokenizer=tokenizer, callbacks=[snapshots])
    selection = info["selection"]
    steps = [step for step, _ in selection["evaluated"]]
    assert steps == [1, 2, 3, 4] and sorted(snapshots.saved) == steps
    values = [value for _, value in selection["evaluated"]]
    best = steps[values.index(min(values))]  # the first of equal values, as the Trainer's strict "<"
    assert selection["selected_step"] == best
    if method == "sft":  # the rule undoes steps 2–4 (module docstring)
        assert best == 1 and min(values[1:]) - values[0] > 1e-4
    restored = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    assert set(restored) == set(snapshots.saved[best]) and any("lora_B" in n for n in restored)
    assert any(n.startswith("logit_adjustment.") for n in restored) == (method == "bome")  # α trained by bome only
    letters = sum(len(v) for v in modeling.option_token_ids(tokenizer, 4))  # the token ids of 'A'…'D' (' A'…)
    expected = model.config.vocab_size if entropy_domain == "vocab" else letters
    assert model.logit_adjustment.temperature.numel() == expected  # the tokens α covers
    for name, value in restored.items():  # safetensors round trip of float32: bit for bit
        assert torch.equal(value, snapshots.saved[best][name]), name
    if best != 4:
        assert any(not torch.equal(restored[n], snapshots.saved[4][n]) for n in restored)
    assert (tmp_path / "runs" / method / f"checkpoint-{best}").is_dir()
    # the restored model scores the validation split as the selected evaluation did: the same NLL, from the
    # library's scorer (another batching and padding of the same forward passes: float32 rounding of the
    # logits, ≤ 1e-5 on an NLL of order 1 for the 2-layer, 32-wide model)
    scores = modeling.score_mcqa(model, tokenizer, data["validation"], progress=False)
    assert negative_log_likelihood(scores.labels, scores.probs) == pytest.approx(min(values), abs=1e-5)


def test_select_by_last_keeps_the_last_step(tmp_path, tiny_model_dir):
    config = CALMExperimentConfig(max_steps=2, train_batch_size=4, select_by="last")
    _, tokenizer = modeling.load_model(str(tiny_model_dir))
    _, info = train_method("sft", splits(), config, model_name=str(tiny_model_dir), out=tmp_path, seed=0,
                            device="cpu", tokenizer=tokenizer)
    assert info["selection"] == {"rule": "last", "selected_step": 2}
    assert not list((tmp_path / "runs" / "sft").glob("checkpoint-*"))


def test_selection_fields_are_checked():
    with pytest.raises(ValueError, match="select_by"):
        CALMExperimentConfig(select_by="accuracy")
    with pytest.raises(ValueError, match="select_every"):
        CALMExperimentConfig(select_every=0)
