"""Confidence signals against hand computations from an uncached full forward pass."""

import math

import numpy as np
import pytest
import torch

from hf_calibration.modeling.prompts import LETTERS, format_mcqa
from hf_calibration.secl.confidence import (
    CONFIDENCE_TEMPLATE,
    P_TRUE_TEMPLATE,
    ConfidenceTokens,
    dinco_score,
    mcqa_answer_text,
    mcqa_signals,
    norm_p_true,
    p_true,
    verbalized_confidence,
    verbalized_from_logprobs,
)
from tests.secl.helpers import tokenizer_from_words

QUESTION = "which option is correct ?"
ROWS = [
    {"question": "which option is correct ?", "choices": ["the", "a of and", "to in", "is"], "answer": 2},
    {"question": "How many eggs ?", "choices": ["the company", "a hotel", "first city"], "answer": 0},
]


def full_conversation_probs(model, tokenizer, question, answer, followup):
    """Next-token probabilities after the whole conversation, rendered and tokenised in one go."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}, {"role": "assistant", "content": answer},
         {"role": "user", "content": followup}], tokenize=False, add_generation_prompt=True,
    )
    ids = torch.tensor([tokenizer.encode(text, add_special_tokens=False)])
    with torch.no_grad():
        return torch.softmax(model(ids).logits[0, -1].double(), dim=-1)


def tid(tokenizer, word):
    (i,) = tokenizer.encode(word, add_special_tokens=False)
    return i


def test_verbalized_equals_hand_expectation(tiny_model, tiny_tokenizer):
    answers = ["A", "B"]
    out = verbalized_confidence(tiny_model, tiny_tokenizer, [QUESTION] * 2, answers)
    for j, a in enumerate(answers):
        probs = full_conversation_probs(tiny_model, tiny_tokenizer, QUESTION, a, CONFIDENCE_TEMPLATE.replace("{answer}", a))
        p = np.array([float(probs[tid(tiny_tokenizer, str(k))]) for k in range(11)])
        assert out.confidence[j] == pytest.approx(float(p @ (np.arange(11) / 10) / p.sum()), abs=1e-5)
        assert out.mass[j] == pytest.approx(p.sum(), rel=1e-4)
    assert out.forward_passes == 2  # "10" is one token in the tiny vocabulary
    assert np.all((out.confidence >= 0) & (out.confidence <= 1))


def test_verbalized_is_differentiable(tiny_model, tiny_tokenizer):
    out = verbalized_confidence(tiny_model, tiny_tokenizer, [QUESTION], ["C"], requires_grad=True)
    assert out.confidence.requires_grad
    out.confidence.sum().backward()
    grads = [p.grad for p in tiny_model.parameters() if p.grad is not None]
    assert grads and any(float(g.abs().sum()) > 0 for g in grads)


def test_two_step_read_of_ten_by_hand():
    # vocabulary of 12: ids 0..9 are the digits, 10 and 11 other tokens; "10" is not a token.
    tokens = ConfidenceTokens(digits=tuple((d,) for d in range(10)), ten=(), zero_after_one=(0,), yes=(10,), no=(11,))
    first = np.full(12, 0.0)
    first[[0, 1, 7, 10]] = [0.1, 0.4, 0.3, 0.2]  # 0.2 of the mass on a non-digit
    second = np.full(12, 1e-12)
    second[[0, 11]] = [0.25, 0.75]  # after "1": "0" with 0.25 → value 10, else value 1
    lp1 = torch.log(torch.tensor(first).clamp_min(1e-12))[None]
    lp2 = torch.log(torch.tensor(second / second.sum()))[None]
    conf, greedy, mass = verbalized_from_logprobs(lp1, tokens, lp2)
    # P(0)=.1, P(1)=.4*.75=.3, P(10)=.4*.25=.1, P(7)=.3 over digit mass .8
    expected = (0.1 * 0 + 0.3 * 0.1 + 0.1 * 1.0 + 0.3 * 0.7) / 0.8
    assert float(conf[0]) == pytest.approx(expected, abs=1e-6)
    assert mass[0] == pytest.approx(0.8, abs=1e-6)
    assert greedy[0] == pytest.approx(0.1)  # argmax "1", then not "0"


def test_p_true_equals_hand_computation(tiny_model, tiny_tokenizer):
    out = p_true(tiny_model, tiny_tokenizer, [QUESTION] * 3, ["A", "B . the", "C"])
    for j, a in enumerate(["A", "B . the", "C"]):
        probs = full_conversation_probs(tiny_model, tiny_tokenizer, QUESTION, a, P_TRUE_TEMPLATE.replace("{answer}", a))
        yes, no = float(probs[tid(tiny_tokenizer, "Yes")]), float(probs[tid(tiny_tokenizer, "No")])
        assert out.confidence[j] == pytest.approx(yes / (yes + no), abs=1e-5)
        assert out.mass[j] == pytest.approx(yes + no, rel=1e-4)
    assert out.forward_passes == 3


def test_norm_p_true_by_hand():
    p = np.array([[0.9, 0.5, 0.5, 0.1], [0.6, 0.6, np.nan, np.nan]])
    out = norm_p_true(p, tau=0.2)
    e = [math.exp(v / 0.2) for v in (0.9, 0.5, 0.5, 0.1)]
    assert out[0] == pytest.approx([v / sum(e) for v in e])
    assert out[1] == pytest.approx([0.5, 0.5, 0, 0])
    assert np.allclose(out.sum(axis=1), 1)


def test_dinco_score_by_hand():
    p = np.array([[0.8, 0.4, 0.2, np.nan]])
    # NVC = 0.4 / (0.8 + 0.4 + 0.2) for the answer at column 1; averaged with consistency 0.3
    assert dinco_score(p, np.array([1]), np.array([0.3]))[0] == pytest.approx(0.5 * (0.4 / 1.4 + 0.3))


def test_mcqa_signals_ranges_and_cache_equivalence(tiny_model, tiny_tokenizer):
    s = mcqa_signals(tiny_model, tiny_tokenizer, ROWS, progress=False, batch_size=2)
    for name, c in s.confidence.items():
        assert c.shape == (2,) and np.all((c >= 0) & (c <= 1)), name
    assert np.allclose(s.norm_p_true_options.sum(axis=1), 1)
    assert s.norm_p_true_options[1, 3] == 0 and np.isnan(s.p_true_options[1, 3])
    assert s.forward_passes["norm_p_true"] == pytest.approx(1 + 3.5)
    # P(True) of every option, read with a shared cache and right padding, equals the uncached pass.
    for i, row in enumerate(ROWS):
        for j, choice in enumerate(row["choices"]):
            followup = P_TRUE_TEMPLATE.replace("{answer}", mcqa_answer_text(LETTERS[j], choice))
            probs = full_conversation_probs(tiny_model, tiny_tokenizer, format_mcqa(row["question"], row["choices"]),
                                            LETTERS[j], followup)
            yes, no = float(probs[tid(tiny_tokenizer, "Yes")]), float(probs[tid(tiny_tokenizer, "No")])
            assert s.p_true_options[i, j] == pytest.approx(yes / (yes + no), abs=1e-5)


def test_tokenizer_without_digits_or_yes_no_is_named():
    tok = tokenizer_from_words("the a of Yes No")
    with pytest.raises(ValueError, match=r"'0'.*'9'"):
        ConfidenceTokens.from_tokenizer(tok)
    tok = tokenizer_from_words("0 1 2 3 4 5 6 7 8 9 maybe")
    with pytest.raises(ValueError, match=r"'Yes', 'No'"):
        ConfidenceTokens.from_tokenizer(tok)


@pytest.mark.parametrize("template", ["How sure are you?", "Is {answer} right for {question}?", 3])
def test_template_needs_answer_slot(tiny_model, tiny_tokenizer, template):
    with pytest.raises(ValueError, match="template"):
        verbalized_confidence(tiny_model, tiny_tokenizer, [QUESTION], ["A"], template=template)


def test_bad_tau_and_lengths(tiny_model, tiny_tokenizer):
    with pytest.raises(ValueError, match="tau"):
        norm_p_true(np.ones((2, 3)), tau=0)
    with pytest.raises(ValueError, match="answers"):
        p_true(tiny_model, tiny_tokenizer, [QUESTION], ["A", "B"])


def test_continuation_then_token_equals_full_passes(tiny_model, tiny_tokenizer):
    from hf_calibration.secl.confidence import continuation_then_token, prefix_pass

    prefix = tiny_tokenizer.encode("Question : which option is correct ?", add_special_tokens=False)
    cont = tiny_tokenizer.encode("A . Confidence :", add_special_tokens=False)
    one = tid(tiny_tokenizer, "1")
    _, cache, n = prefix_pass(tiny_model, prefix)
    first, second = continuation_then_token(tiny_model, cache, n, cont, one)
    with torch.no_grad():
        for ids, got in ((prefix + cont, first), (prefix + cont + [one], second)):
            ref = torch.log_softmax(tiny_model(torch.tensor([ids])).logits[0, -1].float(), dim=-1)
            assert torch.allclose(got[0], ref, atol=1e-5)
    assert cache.get_seq_length() == len(prefix)  # the shared prefix cache is left as it was


def test_mcqa_verbalized_two_step_equals_uncached_passes(tiny_model, tiny_tokenizer, monkeypatch):
    """With "10" split (forced here), mcqa_signals reads both digit steps from one pass; the value equals
    the expectation built from two full uncached passes (the conversation, then it followed by "1")."""
    import dataclasses

    real = ConfidenceTokens.from_tokenizer
    monkeypatch.setattr(ConfidenceTokens, "from_tokenizer",
                        classmethod(lambda cls, tok, **kw: dataclasses.replace(real(tok, **kw), ten=())))
    s = mcqa_signals(tiny_model, tiny_tokenizer, ROWS, progress=False)
    assert s.forward_passes["verbalized"] == 3.0
    for i, row in enumerate(ROWS):
        pred = int(s.prediction[i])
        text = tiny_tokenizer.apply_chat_template(
            [{"role": "user", "content": format_mcqa(row["question"], row["choices"])},
             {"role": "assistant", "content": LETTERS[pred]},
             {"role": "user", "content": CONFIDENCE_TEMPLATE.replace(
                 "{answer}", mcqa_answer_text(LETTERS[pred], row["choices"][pred]))}],
            tokenize=False, add_generation_prompt=True)
        ids = tiny_tokenizer.encode(text, add_special_tokens=False)
        with torch.no_grad():
            first = torch.softmax(tiny_model(torch.tensor([ids])).logits[0, -1].double(), dim=-1)
            after_one = torch.softmax(tiny_model(torch.tensor([ids + [tid(tiny_tokenizer, "1")]])).logits[0, -1].double(),
                                      dim=-1)
        p = [float(first[tid(tiny_tokenizer, str(d))]) for d in range(10)]
        zero = float(after_one[tid(tiny_tokenizer, "0")])
        p = [p[0], p[1] * (1 - zero)] + p[2:] + [p[1] * zero]
        assert s.confidence["verbalized"][i] == pytest.approx(sum(v * k / 10 for k, v in enumerate(p)) / sum(p), abs=1e-5)
