"""Issue 16 items 1-3 on the tiny random Llama: where SECL's adapter acts (``adapter_scope``), P(True) about the
option's text, and forward passes counted by hand.

Every test traces the adapted model's forward calls: (tokens, batch, adapter on, gradients on) per call, so the
arrangement (answer with the adapter off, confidence read with it on, teacher off) is checked call by call.
"""

import dataclasses

import numpy as np
import pytest
import torch

from hf_calibration.modeling.prompts import LETTERS
from hf_calibration.secl.config import SECLConfig
from hf_calibration.secl.mixin import apply_secl
from tests.tiny import make_tiny_model

PROMPTS = ["which option is correct ? A. the B. a", "How many eggs ? A. first B. city",
           "Knowledge : magazine started first ? A. hotel B. company", "which number is the answer ? A. 42 B. 7"]
QUESTION = "which option is correct ?"
CHOICES = ["the company", "a hotel", "first city", "magazine"]
N_NEW = 3


def encode(tokenizer, texts):
    chats = [tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True)
             for t in texts]
    return tokenizer(chats, return_tensors="pt", padding=True, add_special_tokens=False)


def generate(model, tokenizer, texts, **kwargs):
    # min_new_tokens: every answer is N_NEW tokens long, none ends at end-of-turn (the cases below depend on it)
    return model.generate(**encode(tokenizer, texts), max_new_tokens=N_NEW, min_new_tokens=N_NEW, do_sample=False,
                          return_dict_in_generate=True, **kwargs)


def adapter(model):
    return {k: v.detach().clone() for k, v in model.secl_adapter_state().items()}


def trace(model):
    """Forward calls of the adapted model as (tokens, batch, adapter on, gradients on); remove the handle after."""
    from peft.tuners.lora import LoraLayer

    lora = [m for m in model.peft_model.modules() if isinstance(m, LoraLayer)]
    calls = []

    def hook(module, args, kwargs):
        ids = kwargs["input_ids"] if kwargs.get("input_ids") is not None else args[0]
        on = {not m.disable_adapters for m in lora}
        assert len(on) == 1, "some LoRA layers on, others off"
        calls.append((ids.shape[1], ids.shape[0], on.pop(), torch.is_grad_enabled()))

    return calls, model.peft_model.get_base_model().register_forward_pre_hook(hook, with_kwargs=True)


@pytest.fixture()
def always_update(monkeypatch):
    """Every burst question passes the bin gate, so each takes exactly steps_per_update steps."""
    import hf_calibration.secl.burst

    monkeypatch.setattr(hf_calibration.secl.burst, "bin_gate_passes", lambda *args, **kwargs: True)


def trained(tiny_tokenizer, **config):
    """A SECL model after a burst of updates over PROMPTS; its adapter is no longer the identity."""
    model = apply_secl(make_tiny_model(tiny_tokenizer), tiny_tokenizer,
                       SECLConfig(burst_size=8, learning_rate=0.1, bin_gate_width=0, steps_per_update=2, **config))
    initial = adapter(model)
    model.start_burst()
    for text in PROMPTS:
        generate(model, tiny_tokenizer, [text], secl_distractors=[["A", "B"]])
    assert model.secl_counters["updates"] >= 2
    assert any(not torch.equal(v, adapter(model)[k]) for k, v in initial.items())
    return model


# -- item 1: answers are never changed by calibration ----------------------------------------------------------
def test_answers_equal_the_base_model_across_a_burst_with_updates(tiny_tokenizer, always_update):
    base = make_tiny_model(tiny_tokenizer)
    expected = [generate(base, tiny_tokenizer, [t]).sequences for t in PROMPTS]
    model = apply_secl(make_tiny_model(tiny_tokenizer), tiny_tokenizer,
                       SECLConfig(burst_size=8, learning_rate=0.1, steps_per_update=2))
    model.start_burst()
    got = []
    for text in PROMPTS:
        got.append(generate(model, tiny_tokenizer, [text], secl_distractors=[["A", "B"]]).sequences)
        assert model.secl_records[0].updated
    assert model.secl_counters["updates"] == len(PROMPTS)
    # the trained adapter does change what the model would answer with it on ...
    with_adapter = [model.peft_model.generate(**encode(tiny_tokenizer, [t]), max_new_tokens=N_NEW,
                                              min_new_tokens=N_NEW, do_sample=False) for t in PROMPTS]
    assert any(not torch.equal(a, b) for a, b in zip(with_adapter, expected))
    # ... but SECL's answers are the base model's, token for token, before and after every update
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    # a batched call too (left padding): each row as the base model answers it in the same batch
    batch = generate(model, tiny_tokenizer, PROMPTS[:2], secl_distractors=[["A"], ["B"]]).sequences
    assert torch.equal(batch, generate(base, tiny_tokenizer, PROMPTS[:2]).sequences)


def test_teacher_is_read_with_the_adapter_off(tiny_tokenizer):
    model = apply_secl(make_tiny_model(tiny_tokenizer), tiny_tokenizer, SECLConfig())
    prompt = encode(tiny_tokenizer, PROMPTS[:1])["input_ids"][0].tolist()
    answer = tiny_tokenizer.encode("A", add_special_tokens=False)
    before = model.secl_pseudo_label(prompt, answer, ["B", "C"])
    trained_model = trained(tiny_tokenizer)
    after = trained_model.secl_pseudo_label(prompt, answer, ["B", "C"])
    # the same weights with the adapter off, the same computation: equal bit for bit
    assert np.array_equal(before["p_true"], after["p_true"]) and before["norm_p_true"] == after["norm_p_true"]
    # read through the trained adapter (the paper's variant), the teacher has moved
    trained_model.secl_config = dataclasses.replace(trained_model.secl_config, adapter_scope="all")
    moved = trained_model.secl_pseudo_label(prompt, answer, ["B", "C"])
    assert not np.array_equal(moved["p_true"], before["p_true"])


def test_confidence_read_runs_the_adapter_on_the_follow_up_only(tiny_tokenizer):
    """The read from generate's cache equals a hand computation: prompt and answer run with the adapter off,
    then the follow-up turn with it on over that cache (with a trained, non-zero adapter)."""
    from hf_calibration.secl.confidence import CONFIDENCE_TEMPLATE, followup_ids

    model = trained(tiny_tokenizer)
    enc = encode(tiny_tokenizer, PROMPTS[1:3])  # two lengths: left padding in generate's cache
    out = model.generate(**enc, max_new_tokens=N_NEW, min_new_tokens=N_NEW, do_sample=False,
                         return_dict_in_generate=True, secl_update=False)
    for i in range(2):
        prompt = enc["input_ids"][i][enc["attention_mask"][i].bool()].tolist()
        answer = out.sequences[i, enc["input_ids"].shape[1]:].tolist()
        text = tiny_tokenizer.decode(answer, skip_special_tokens=True).strip()
        follow = followup_ids(tiny_tokenizer, CONFIDENCE_TEMPLATE.replace("{answer}", text))
        net = model.peft_model.get_base_model()
        with torch.no_grad():
            with model.peft_model.disable_adapter():
                past = net(torch.tensor([prompt + answer]), use_cache=True).cache
            probs = torch.softmax(net(torch.tensor([follow]), cache=past).logits[0, -1].double(), dim=-1)
        p = [float(probs[tiny_tokenizer.convert_tokens_to_ids(str(k))]) for k in range(11)]
        expected = sum(v * k / 10 for k, v in enumerate(p)) / sum(p)
        # two computation paths through a 2-layer float32 model (|logits| < 1): rounding ~1e-7; a read with the
        # adapter on the answer, or off on the follow-up, moves c by far more than 1e-5 here (checked below)
        assert float(out.confidences[i]) == pytest.approx(expected, abs=1e-5)
    with torch.no_grad():
        past = net(torch.tensor([prompt + answer]), use_cache=True).cache  # adapter on the answer too
        probs = torch.softmax(net(torch.tensor([follow]), cache=past).logits[0, -1].double(), dim=-1)
    p = [float(probs[tiny_tokenizer.convert_tokens_to_ids(str(k))]) for k in range(11)]
    assert abs(float(out.confidences[1]) - sum(v * k / 10 for k, v in enumerate(p)) / sum(p)) > 1e-5


def test_scope_all_generates_and_reads_the_teacher_with_the_adapter(tiny_tokenizer, always_update):
    model = trained(tiny_tokenizer, adapter_scope="all")
    enc = encode(tiny_tokenizer, PROMPTS[:1])
    calls, handle = trace(model)
    model.start_burst()
    out = generate(model, tiny_tokenizer, PROMPTS[:1], secl_distractors=[["A", "B"]])
    handle.remove()
    n_prompt = enc["input_ids"].shape[1]
    # the answer's N_NEW - 1 forward calls (prefill, then one per token) run with the adapter on, and so
    # does everything else: the paper's variant
    assert calls[:N_NEW] == [(n_prompt, 1, True, False)] + [(1, 1, True, False)] * (N_NEW - 1)
    assert all(on for _, _, on, _ in calls)
    # the answers are the adapted model's own
    expected = model.peft_model.generate(**enc, max_new_tokens=N_NEW, min_new_tokens=N_NEW, do_sample=False)
    assert torch.equal(out.sequences, expected)
    assert model.secl_config.to_dict()["adapter_scope"] == "all"


def test_adapter_scope_is_checked():
    with pytest.raises(ValueError, match="adapter_scope"):
        SECLConfig(adapter_scope="answers")


# -- item 2: P(True) about the content -------------------------------------------------------------------------
def test_p_true_prompt_shows_the_option_text(tiny_tokenizer, tiny_model, monkeypatch):
    """MCQA candidates are shown to P(True) as "<letter>. <option text>", for the answer and each distractor."""
    import hf_calibration.modeling.cache

    model = apply_secl(tiny_model, tiny_tokenizer, SECLConfig())
    scored = []
    # SECL reads through TransformersBackend's cached reads, which batch the candidates with this function
    real = hf_calibration.modeling.cache.continuation_logprobs
    monkeypatch.setattr(hf_calibration.modeling.cache, "continuation_logprobs",
                        lambda m, c, n, conts, **kw: scored.extend(conts) or real(m, c, n, conts, **kw))
    prompt = tiny_tokenizer.encode(
        tiny_tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}], tokenize=False,
                                           add_generation_prompt=True), add_special_tokens=False)
    answer = tiny_tokenizer.encode("C", add_special_tokens=False)
    label = model.secl_pseudo_label(prompt, answer, choices=CHOICES)
    assert label["n_distractors"] == 3 and len(scored) == 4

    def contains(seq, part):
        return any(seq[i:i + len(part)] == part for i in range(len(seq) - len(part) + 1))

    # the answer (C) first, then the other options in order; each restated with its text
    for cont, shown in zip(scored, ["C. first city", "A. the company", "B. a hotel", "D. magazine"]):
        assert contains(cont, tiny_tokenizer.encode(shown, add_special_tokens=False)), shown


def test_p_true_of_options_equals_diagnose(tiny_tokenizer, tiny_model):
    """SECL's teacher and diagnose (``mcqa_signals``) ask P(True) about the same text: the same values."""
    from hf_calibration.modeling.prompts import build_mcqa_prompt
    from hf_calibration.secl.confidence import mcqa_signals

    rows = [{"question": QUESTION, "choices": CHOICES, "answer": 2}]
    signals = mcqa_signals(tiny_model, tiny_tokenizer, rows, progress=False)
    model = apply_secl(tiny_model, tiny_tokenizer, SECLConfig())
    prompt = tiny_tokenizer.encode(build_mcqa_prompt(tiny_tokenizer, QUESTION, CHOICES), add_special_tokens=False)
    for letter in "ABCD":
        k = LETTERS.index(letter)
        answer = tiny_tokenizer.encode(letter, add_special_tokens=False)
        label = model.secl_pseudo_label(prompt, answer, choices=CHOICES)
        order = [k] + [j for j in range(4) if j != k]
        # two paths (batch shapes differ), 2-layer float32 model with |logits| < 1: rounding ~1e-7
        assert label["p_true"] == pytest.approx(signals.p_true_options[0, order], abs=1e-5)


def test_pseudo_label_continues_a_prompt_cache(tiny_tokenizer, tiny_model):
    """The baseline pass's path (``stream.baseline_pass``): P(True) reads continue generate's prompt cache, the
    same values as running the prompt again, and the prompt is not run a second time."""
    model = apply_secl(tiny_model, tiny_tokenizer, SECLConfig())
    prompt = tiny_tokenizer.encode(
        tiny_tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}], tokenize=False,
                                           add_generation_prompt=True), add_special_tokens=False)
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=N_NEW, min_new_tokens=N_NEW,
                         do_sample=False, return_dict_in_generate=True, secl_update=False)
    answer = out.sequences[0, len(prompt):].tolist()
    calls, handle = trace(model)
    try:
        plain = model.secl_pseudo_label(prompt, answer, choices=CHOICES)
        plain_calls = list(calls)
        cached = model.secl_pseudo_label(prompt, answer, choices=CHOICES, prompt_cache=out.cache)
    finally:
        handle.remove()
    cached_calls = calls[len(plain_calls):]
    assert cached["p_true"] == pytest.approx(plain["p_true"], abs=1e-6)
    assert cached["norm_p_true"] == pytest.approx(plain["norm_p_true"], abs=1e-6)
    # the random answer names no option, so all four options are its distractors: five reads, counted as before
    assert cached["forward_passes"] == plain["forward_passes"] == 5
    # without the cache: the prompt (batch 1), then one batched read; with it: the same read alone, adapter off
    assert plain_calls[0] == (len(prompt), 1, False, False) and cached_calls == plain_calls[1:]
    assert cached_calls[0][1:] == (5, False, False)
    assert out.cache.get_seq_length() == len(prompt) + N_NEW - 1  # not modified
    with pytest.raises(ValueError, match="prompt_cache: holds 2 positions"):
        from hf_calibration.secl.confidence import cache_row
        model.secl_pseudo_label(prompt, answer, choices=CHOICES, prompt_cache=cache_row(out.cache, 0, 2))


def test_choices_and_distractors_are_exclusive(tiny_tokenizer, tiny_model):
    model = apply_secl(tiny_model, tiny_tokenizer, SECLConfig())
    with pytest.raises(ValueError, match=r"^secl_choices: "):
        generate(model, tiny_tokenizer, PROMPTS[:1], secl_choices=[CHOICES], secl_distractors=[["A"]])
    with pytest.raises(ValueError, match=r"^secl_choices: "):
        generate(model, tiny_tokenizer, PROMPTS[:1], secl_choices=[CHOICES, CHOICES])


# -- item 3: forward passes, counted by hand -------------------------------------------------------------------
def _answer_calls(n_prompt, batch=1):
    """generate's calls for an N_NEW-token answer, adapter off, then the answer's last token (generated, never
    run), adapter off: generate's cache then holds the whole answer."""
    return [(n_prompt, batch, False, False)] + [(1, batch, False, False)] * (N_NEW - 1) + [(1, batch, False, False)]


def test_passes_outside_a_burst(tiny_tokenizer, tiny_model):
    model = apply_secl(tiny_model, tiny_tokenizer, SECLConfig())
    n_prompt = encode(tiny_tokenizer, PROMPTS[:1])["input_ids"].shape[1]
    calls, handle = trace(model)
    generate(model, tiny_tokenizer, PROMPTS[:1])
    handle.remove()
    # by hand: 1 generation + 1 verbalized read ("10" is one token in the tiny vocabulary)
    assert model.secl_records[0].forward_passes == 2 and model.secl_counters["forward_passes"] == 2
    assert calls[:-1] == _answer_calls(n_prompt)
    n_follow, batch, on, grad = calls[-1]  # the follow-up turn, on generate's cache, adapter on
    assert (batch, on, grad) == (1, True, False) and n_follow > 1


# the paper's update: one step on the current question, no replay (the counts below are by hand for it)
PAPER_STEP = {"replay_size": 0, "consolidation_epochs": 0, "steps_per_update": 1}


def test_passes_of_a_burst_question_multiple_choice(tiny_tokenizer, tiny_model, always_update):
    model = apply_secl(tiny_model, tiny_tokenizer, SECLConfig(num_distractors=2, **PAPER_STEP))
    n_prompt = encode(tiny_tokenizer, PROMPTS[:1])["input_ids"].shape[1]
    model.start_burst()
    calls, handle = trace(model)
    generate(model, tiny_tokenizer, PROMPTS[:1], secl_choices=[CHOICES])
    handle.remove()
    r = model.secl_records[0].to_dict()
    assert r["updated"] and r["n_distractors"] == 2  # 4 options, K = 2: two of the others either way
    # by hand: 1 generation + 1 verbalized read + P(True) of the answer and 2 distractors + 1 update step
    assert r["forward_passes"] == 1 + 1 + 3 + 1 == model.secl_counters["forward_passes"]
    read, p_true, step, after = calls[len(_answer_calls(n_prompt)):]
    assert calls[: len(_answer_calls(n_prompt))] == _answer_calls(n_prompt)
    assert read[1:] == (1, True, False)
    assert p_true[1:] == (3, False, False)  # the 3 candidates in one batched call on generate's prompt cache
    assert step == (read[0], 1, True, True)  # training: the same follow-up on the same cache, with gradients
    assert after == read  # confidence_after, for the record (not counted)


def test_passes_of_a_burst_question_open_ended(tiny_tokenizer, tiny_model, always_update):
    model = apply_secl(tiny_model, tiny_tokenizer, SECLConfig(num_distractors=2, distractor_max_new_tokens=2, **PAPER_STEP))
    n_prompt = encode(tiny_tokenizer, PROMPTS[:1])["input_ids"].shape[1]
    model.start_burst()
    calls, handle = trace(model)
    generate(model, tiny_tokenizer, PROMPTS[:1])
    handle.remove()
    r = model.secl_records[0].to_dict()
    k = r["n_distractors"]
    assert r["updated"] and 1 <= k <= 2
    # by hand: 1 generation + 1 verbalized read + 3 beams (K + 1) + P(True) of the answer and k alternatives
    # + 1 update step
    assert r["forward_passes"] == 1 + 1 + 3 + (1 + k) + 1 == model.secl_counters["forward_passes"]
    rest = calls[len(_answer_calls(n_prompt)):]
    read, beams, (p_true, step, after) = rest[0], rest[1:-3], rest[-3:]
    assert read[1:] == (1, True, False)
    # the beam search (3 beams, at most 2 tokens), adapter off, then all candidates in one batched call
    assert beams[0] == (n_prompt, 3, False, False) and all(c[1:] == (3, False, False) for c in beams)
    assert len(beams) <= 2 and p_true[1:] == (1 + k, False, False)
    assert step == (read[0], 1, True, True) and after == read


# -- the config field ------------------------------------------------------------------------------------------
def test_config_written_before_adapter_scope_loads_as_all(tmp_path):
    """A secl_config.json without adapter_scope was trained with the adapter on everything: it stays so."""
    import json

    from hf_calibration.secl.config import CONFIG_NAME

    SECLConfig().save_pretrained(tmp_path)
    fields = json.loads((tmp_path / CONFIG_NAME).read_text())
    assert fields.pop("adapter_scope") == "confidence"  # the new default is written out
    (tmp_path / CONFIG_NAME).write_text(json.dumps(fields))
    assert SECLConfig.from_pretrained(tmp_path).adapter_scope == "all"


def test_cli_options(tmp_path, capsys):
    from hf_calibration.cli import main, parse_command

    _, (job, secl) = parse_command(["secl", "--output-dir", "o", "--adapter-scope", "all", "--compare-adapter-scopes"])
    assert secl.adapter_scope == "all" and job.compare_adapter_scopes
    _, (job, secl) = parse_command(["secl", "--output-dir", "o"])
    assert secl.adapter_scope == "confidence" and not job.compare_adapter_scopes
    try:
        code = main(["secl", "--adapter-scope", "answers", "--output-dir", str(tmp_path / "o")])
    except SystemExit as exit_:  # argparse rejects a value outside the choices
        code = exit_.code
    assert code == 2 and "--adapter-scope" in capsys.readouterr().err
