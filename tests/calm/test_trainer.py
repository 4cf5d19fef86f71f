import warnings
from pathlib import Path

import pytest
import torch
from peft import LoraConfig
from transformers import TrainerCallback

from hf_calibration.calm import CALMConfig, CALMModel, CALMTrainer
from tests.tiny import make_tiny_model

LORA = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)


class StopAfter(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            control.should_training_stop = True


def make_config(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=4, bf16=False,
                activation_checkpointing=False, report_to="none", logging_steps=1, learning_rate=1e-2,
                alpha_learning_rate=5e-2, save_strategy="no", use_cpu=True, disable_tqdm=True, seed=0)
    base.update(kw)
    return CALMConfig(**base)


def make_trainer(tmp_path, tok, data, *, peft=True, config=None, **kw):
    train, calibration = data
    return CALMTrainer(make_tiny_model(tok), args=config or make_config(tmp_path, **kw), train_dataset=train,
                       calibration_dataset=calibration, processing_class=tok,
                       peft_config=LoraConfig(**LORA) if peft else None)


def trainable(trainer):
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("peft", [True, False])
def test_bome_trains_and_parameters_change(tmp_path, tiny_tokenizer, mcqa_data, peft):
    trainer = make_trainer(tmp_path, tiny_tokenizer, mcqa_data, peft=peft)
    assert isinstance(trainer.model, CALMModel)
    before = trainable(trainer)
    trainer.train()
    after = trainable(trainer)
    assert any(n.startswith("logit_adjustment.") for n in after)
    assert all(not torch.equal(before[n], after[n]) for n in after if "lora_A" not in n)
    logged = trainer.state.log_history[0]
    for key in ("lower_loss", "residual_q", "bome_lambda", "calibration_entropy", "mean_temperature"):
        assert key in logged


def test_methods_differ_and_baselines_keep_alpha_fixed(tmp_path, tiny_tokenizer, mcqa_data):
    alphas = {}
    for method in ("bome", "iterate", "regularization", "sft", "cft"):
        trainer = make_trainer(tmp_path, tiny_tokenizer, mcqa_data, method=method)
        trainer.train()
        adj = trainer.model.logit_adjustment
        alphas[method] = torch.cat([adj.rho.detach(), adj.shift.detach()])
        assert adj.rho.requires_grad == (method in ("bome", "iterate", "regularization"))
    assert torch.count_nonzero(alphas["sft"]) == 0 and torch.count_nonzero(alphas["cft"]) == 0
    assert not torch.allclose(alphas["bome"], alphas["iterate"])
    assert not torch.allclose(alphas["bome"], alphas["regularization"])


class RecordParameters(TrainerCallback):
    def __init__(self, trainer):
        self.trainer, self.seen = trainer, []

    def on_train_begin(self, args, state, control, **kwargs):
        self.seen.append(trainable(self.trainer))

    def on_step_end(self, args, state, control, **kwargs):
        self.seen.append(trainable(self.trainer))


def test_iterate_alternates_theta_and_alpha_steps(tmp_path, tiny_tokenizer, mcqa_data):
    """'iterate' (SPEC §1): optimizer steps 0, 2 move only θ (on L_tr), steps 1, 3 only α (on −H)."""
    trainer = make_trainer(tmp_path, tiny_tokenizer, mcqa_data, method="iterate", max_steps=4,
                           per_device_train_batch_size=2, weight_decay=0.1, alpha_weight_decay=0.1)
    record = RecordParameters(trainer)
    trainer.add_callback(record)
    trainer.train()
    assert len(record.seen) == 5
    for step, (before, after) in enumerate(zip(record.seen, record.seen[1:])):
        moved = {n for n in before if not torch.equal(before[n], after[n])}
        alpha = {n for n in before if n.startswith("logit_adjustment.")}
        # the resting group does not move at all: no momentum, no weight decay (its .grad is None)
        expected = (set(before) - alpha) if step % 2 == 0 else alpha
        assert moved - {n for n in expected if "lora_A" in n} == {n for n in expected if "lora_A" not in n}, step
        assert not moved - expected, step
    logs = [e for e in trainer.state.log_history if "lower_loss" in e]
    assert ["calibration_entropy" in e for e in logs] == [False, True, False, True]


def test_iterate_alpha_gradient_is_the_entropy_gradient_only(tmp_path, tiny_tokenizer, mcqa_data):
    """'iterate' α step: α's gradient is ∇_α(−H) on the calibration batch, recomputed here from raw logits."""
    trainer = make_trainer(tmp_path, tiny_tokenizer, mcqa_data, method="iterate")
    trainer.create_optimizer()
    trainer.state.global_step = 1  # odd steps are the α steps
    calibration = trainer.calibration_batch()  # the batch step 1 uses (a pure function of the step)
    adj = trainer.model.logit_adjustment
    train_batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
    trainer.training_step(trainer.model, train_batch)
    assert all(p.grad is None for n, p in trainer.model.named_parameters() if not n.startswith("logit_adjustment."))
    written = adj.rho.grad.clone()
    # independent recomputation: last-prompt-token logits → LogitAdjustment → option softmax → −H
    with torch.no_grad():
        lengths = (calibration["labels"] != -100).int().argmax(1)
        raw = trainer.model(input_ids=calibration["input_ids"], attention_mask=calibration["attention_mask"],
                            adjust_logits=False).logits
        raw = raw[torch.arange(len(lengths)), lengths - 1]
    rho = adj.rho.detach().clone().requires_grad_(True)
    z = raw[:, trainer.letter_token_ids] / torch.exp(rho[trainer.alpha_index[trainer.letter_token_ids]]) \
        + adj.shift.detach()[trainer.alpha_index[trainer.letter_token_ids]]
    letters = torch.stack([torch.logsumexp(z[:, trainer.letter_of_variant == k], 1) for k in range(4)], 1)
    logp = torch.log_softmax(letters, 1)
    (-(-(logp.exp() * logp).sum(1)).mean()).backward()
    torch.testing.assert_close(written, rho.grad, rtol=1e-4, atol=1e-7)


def test_save_load_round_trip(tmp_path, tiny_tokenizer, mcqa_data):
    trainer = make_trainer(tmp_path, tiny_tokenizer, mcqa_data)
    trainer.train()
    trainer.save_model(str(tmp_path / "saved"))
    saved = tmp_path / "saved"
    for name in ("adapter_model.safetensors", "logit_adjustment.safetensors", "logit_adjustment_config.json",
                 "README.md"):
        assert (saved / name).is_file(), name
    assert "CALM" in (saved / "README.md").read_text()
    loaded = CALMModel.from_pretrained(saved, base_model=make_tiny_model(tiny_tokenizer))
    ids = torch.tensor([tiny_tokenizer.encode("which option is correct ? A. B.")])
    trainer.model.eval()
    torch.testing.assert_close(loaded(input_ids=ids).logits, trainer.model(input_ids=ids).logits)


@pytest.mark.parametrize("method, extra", [
    ("bome", {}), ("scalar", {}), ("iterate", {}), ("regularization", {}), ("sft", {}),
    # CFT's bin accuracies come from step 0 and are not refreshed before step 4: the resumed run must read
    # them from the checkpoint, not recompute them from the step-2 model. The tiny model's confidences sit
    # near 1/4, so fine bins and a larger lr are needed for the step-2 accuracies to differ from step 0's;
    # c = 1 (the default is 1e-3) so that the term, and with it the bin state, moves the parameters.
    ("cft", {"cft_num_bins": 100, "learning_rate": 5e-2, "cft_coefficient": 1.0}),
    # and a refresh after the resume (step 3) happens at the same step as in the uninterrupted run
    ("cft", {"cft_num_bins": 100, "learning_rate": 5e-2, "cft_coefficient": 1.0, "cft_refresh_steps": 3}),
])
def test_resume_equals_uninterrupted(tmp_path, tiny_tokenizer, mcqa_data, method, extra):
    kw = dict(max_steps=4, save_strategy="steps", save_steps=2, per_device_train_batch_size=2,
              gradient_accumulation_steps=2, logging_steps=1, method=method, **extra)
    full = make_trainer(tmp_path / "a", tiny_tokenizer, mcqa_data, **kw)
    full.train()
    first = make_trainer(tmp_path / "b", tiny_tokenizer, mcqa_data, **kw)
    first.add_callback(StopAfter(2))  # same schedule, interrupted after the checkpoint at step 2
    first.train()
    checkpoint = tmp_path / "b" / "out" / "checkpoint-2"
    assert (checkpoint / "cft_state.safetensors").is_file() == (method == "cft")
    resumed = make_trainer(tmp_path / "b", tiny_tokenizer, mcqa_data, **kw)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    a, b = trainable(full), trainable(resumed)
    for n in a:
        torch.testing.assert_close(a[n], b[n], rtol=0, atol=1e-6)


def test_cft_state_is_written_before_the_checkpoint_counts_as_finished(tmp_path, tiny_tokenizer, mcqa_data,
                                                                       monkeypatch):
    """Resume tools (transformers' checkpoint rotation, experiments.calm.last_checkpoint) take a checkpoint with a
    trainer_state.json as finished: a kill between that file and CFT's bin state would leave a checkpoint that
    looks whole and cannot be resumed. So at the moment trainer_state.json is written, the state must be there."""
    from transformers import TrainerState

    seen = []
    original = TrainerState.save_to_json

    def save_to_json(self, json_path):
        seen.append((Path(json_path).parent / "cft_state.safetensors").is_file())
        return original(self, json_path)

    monkeypatch.setattr(TrainerState, "save_to_json", save_to_json)
    trainer = make_trainer(tmp_path, tiny_tokenizer, mcqa_data, method="cft", max_steps=4, save_strategy="steps",
                           save_steps=2, per_device_train_batch_size=2)
    trainer.train()
    assert seen == [True, True]  # checkpoints 2 and 4


def test_bad_input_fails_at_construction(tmp_path, tiny_tokenizer, mcqa_data):
    train, _ = mcqa_data
    with pytest.raises(ValueError, match="calibration_dataset"):
        CALMTrainer(make_tiny_model(tiny_tokenizer), args=make_config(tmp_path), train_dataset=train,
                    processing_class=tiny_tokenizer)
    with pytest.raises(ValueError, match="inner_steps"):
        make_config(tmp_path, inner_steps=-1)
    for eta in (0.0, 1.5):
        with pytest.raises(ValueError, match="eta"):
            make_config(tmp_path, eta=eta)
    with pytest.raises(ValueError, match="adjustment_token_ids"):
        make_trainer(tmp_path, tiny_tokenizer, mcqa_data, adjustment_token_ids=[1, 10**6])
    bad = train.map(lambda r: {"completion": "the"})
    with pytest.raises(ValueError, match="option letter"):
        make_trainer(tmp_path, tiny_tokenizer, (bad, mcqa_data[1]))


def test_sft_method_needs_no_calibration_data(tmp_path, tiny_tokenizer, mcqa_data):
    train, _ = mcqa_data
    trainer = CALMTrainer(make_tiny_model(tiny_tokenizer), args=make_config(tmp_path, method="sft",
                          label_smoothing_factor=0.1), train_dataset=train, processing_class=tiny_tokenizer)
    trainer.train()


def test_evaluate_logs_accuracy_and_ece(tmp_path, tiny_tokenizer, mcqa_data):
    from hf_calibration.metrics import expected_calibration_error

    train, calibration = mcqa_data
    trainer = CALMTrainer(make_tiny_model(tiny_tokenizer), args=make_config(tmp_path), train_dataset=train,
                          calibration_dataset=calibration, eval_dataset=train, processing_class=tiny_tokenizer)
    metrics = trainer.evaluate()
    for key in ("eval_loss", "eval_accuracy", "eval_conf_ece", "eval_cw_ece"):
        assert key in metrics
    # the same numbers from the wrapped model's own option probabilities
    from hf_calibration.modeling import score_mcqa

    rows = [{"question": q, "choices": c, "answer": a} for q, c, a in
            zip(train["question"], train["choices"], train["answer"])]
    scores = score_mcqa(trainer.model.eval(), tiny_tokenizer, rows, progress=False)
    assert metrics["eval_accuracy"] == scores.correct.mean()
    assert metrics["eval_conf_ece"] == __import__("pytest").approx(
        expected_calibration_error(scores.labels, scores.probs, n_bins=15), abs=1e-5)


def test_no_spurious_future_warnings(tmp_path, tiny_tokenizer, mcqa_data):
    """Building a config and a LoRA trainer with label smoothing warns about nothing the caller wrote."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        default = CALMConfig(output_dir=str(tmp_path / "d"), use_cpu=True, report_to="none")
        make_trainer(tmp_path, tiny_tokenizer, mcqa_data, method="sft", label_smoothing_factor=0.1)
    assert [str(w.message) for w in caught if issubclass(w.category, FutureWarning)] == []
    assert default.activation_checkpointing is True and default.gradient_checkpointing is True  # TRL's default
    # the deprecated name still works and still warns, since the caller wrote it
    with pytest.warns(FutureWarning, match="gradient_checkpointing"):
        old = make_config(tmp_path, activation_checkpointing=None, gradient_checkpointing=False)
    assert old.activation_checkpointing is False


def test_num_options_above_the_data_option_count_warns(tmp_path, tiny_tokenizer):
    from datasets import Dataset

    from hf_calibration.calm import mcqa_to_prompt_completion

    def data(k):  # 16 questions with k options, gold cycling through all k letters
        rows = [{"question": f"which one ? {i}", "choices": ["the", "a", "of", "and"][:k], "answer": i % k,
                 "subject": "x", "source": "tiny"} for i in range(16)]
        d = mcqa_to_prompt_completion(Dataset.from_list(rows), tiny_tokenizer)
        return d, d.remove_columns("completion")

    # K = 4 on 2-option data: 16 targets all in A–B has probability (2/4)^16 ≈ 1.5e-5 under K letters
    with pytest.warns(UserWarning, match=r"all 16 targets are among the letters A–B, but num_options=4"):
        make_trainer(tmp_path, tiny_tokenizer, data(2))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*num_options.*")
        make_trainer(tmp_path, tiny_tokenizer, data(2), num_options=2)
        make_trainer(tmp_path, tiny_tokenizer, data(4))
