"""Gradient accumulation: one optimizer step over micro-batches equals one step over the whole batch.

3 examples with completions of 2, 12 and 6 tokens, in micro-batches of 2 (sizes 2 and 1) with accumulation 2,
against one batch of 4 (all 3): a per-micro-batch mean weights the items differently in both entropy domains
(tokens in 'vocab', examples in 'options'). See tests/calm/same_step.py for the unit of averaging and the
tolerance.
"""

import pytest
import torch
from transformers import TrainerCallback

from hf_calibration.calm import CALMConfig, CALMTrainer
from tests.calm.same_step import CASES, SGD, assert_same_step, options_data, positions, vocab_data
from tests.tiny import make_tiny_model


class RecordBefore(TrainerCallback):
    def __init__(self, trainer):
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        self.before = params(self.trainer)


def params(trainer):
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


def train(tmp_path, tok, data, **kw):
    """Train the tiny model (all weights, no LoRA) with SGD; return (parameters before, after, the trainer)."""
    train_data, calibration = data
    config = CALMConfig(output_dir=str(tmp_path / "out"), bf16=False, activation_checkpointing=False,
                        report_to="none", save_strategy="no", use_cpu=True, disable_tqdm=True, seed=0, logging_steps=1,
                        **{**SGD, **kw})
    trainer = CALMTrainer(make_tiny_model(tok), args=config, train_dataset=train_data,
                          calibration_dataset=calibration, processing_class=tok)
    record = RecordBefore(trainer)
    trainer.add_callback(record)
    trainer.train()
    return record.before, params(trainer), trainer


@pytest.mark.parametrize("domain", ["vocab", "options"])
@pytest.mark.parametrize("case, method, extra, steps", CASES, ids=[c[0] for c in CASES])
def test_accumulation_equals_one_large_batch(tmp_path, tiny_tokenizer, domain, case, method, extra, steps):
    data = vocab_data() if domain == "vocab" else options_data(tiny_tokenizer)
    kw = dict(method=method, entropy_domain=domain, max_steps=steps, **extra)
    before, accumulated, trainer = train(tmp_path / "a", tiny_tokenizer, data, per_device_train_batch_size=2,
                                         gradient_accumulation_steps=2, **kw)
    before_ref, whole, reference = train(tmp_path / "b", tiny_tokenizer, data, per_device_train_batch_size=4,
                                         gradient_accumulation_steps=1, **kw)
    assert all(torch.equal(before[k], before_ref[k]) for k in before)
    lr = max(trainer.args.learning_rate, trainer.args.alpha_learning_rate)
    # tolerance: float32 reordering of the same sums, derived in same_step.assert_same_step
    assert_same_step(before, accumulated, whole, lr, positions(trainer))
    # one logged L_tr per optimizer step, that of the whole batch (float32 sums of ≤ 20 items: 1e-5 relative)
    logged = [[e["lower_loss"] for e in t.state.log_history if "lower_loss" in e] for t in (trainer, reference)]
    assert len(logged[0]) == steps
    assert logged[0] == pytest.approx(logged[1], rel=1e-5)


@pytest.mark.parametrize("domain", ["vocab", "options"])
def test_sft_step_is_the_gradient_of_the_item_mean(tmp_path, tiny_tokenizer, domain):
    """The unit of averaging, against plain torch: vocab → mean over all completion tokens of the batch;
    options → mean over examples of the answer letter's cross-entropy over the K letters.

    Batch 1 × accumulation 3 on the 2-, 12- and 6-token completions; the reference differentiates
    Σ_items loss / (number of items) of a fresh copy of the same model.
    """
    data = vocab_data() if domain == "vocab" else options_data(tiny_tokenizer)
    before, after, trainer = train(tmp_path, tiny_tokenizer, data, method="sft", entropy_domain=domain, max_steps=1,
                                   per_device_train_batch_size=1, gradient_accumulation_steps=3)
    model = make_tiny_model(tiny_tokenizer)
    total, items = 0.0, 0
    for i in range(len(trainer.train_dataset)):
        batch = trainer.data_collator([trainer.train_dataset[i]])
        logits = model(input_ids=batch["input_ids"]).logits[0, :-1].float()
        labels = batch["labels"][0, 1:]
        if domain == "vocab":
            total = total + torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100, reduction="sum")
            items += int((labels != -100).sum())
        else:  # the first labelled position is the answer letter; a letter's logit sums its single-token variants
            pos = int((labels != -100).nonzero()[0])
            z = logits[pos, trainer.letter_token_ids]
            per_letter = torch.stack([torch.logsumexp(z[trainer.letter_of_variant == k], 0) for k in range(4)])
            total = total - torch.log_softmax(per_letter, 0)[int(trainer.letter_of_token[labels[pos]])]
            items += 1
    assert items == (20 if domain == "vocab" else 3)
    (total / items).backward()
    grads = {"model." + n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert grads and set(grads) <= set(before)
    # lr = 1, so w − w' is the gradient; tolerance as in assert_same_step (another grouping of the same sums)
    reference = {k: before[k] - g for k, g in grads.items()}
    assert_same_step({k: before[k] for k in grads}, {k: after[k] for k in grads}, reference, 1.0, positions(trainer))
    logged = [e["lower_loss"] for e in trainer.state.log_history if "lower_loss" in e]
    assert logged == [pytest.approx(float(total.detach()) / items, rel=1e-5)]
