"""Option-letter scoring on a tiny random Llama, checked against direct per-prompt forward passes (the in-process
backend and a bare model, which ``score_mcqa`` wraps in it)."""

import numpy as np
import pytest
import torch

from hf_calibration.errors import ParameterError
from hf_calibration.modeling import (
    TransformersBackend,
    build_mcqa_prompt,
    option_token_ids,
    score_mcqa,
)
from hf_calibration.modeling.prompts import format_mcqa, resolve_prompt_format

ROWS = [
    {"question": "which option is correct ?", "choices": ["the", "a", "of", "and"], "answer": 2},
    {"question": "Is the proposed answer correct ? the a of and to in is was", "choices": ["yes", "no", "true", "false"], "answer": 0},
    {"question": "How many eggs ?", "choices": ["42", "10"], "answer": 1},
]


def _direct_option_probs(model, tokenizer, row):
    """Reference: one unpadded forward pass, softmax over the letter tokens (this tokenizer has one id per letter)."""
    prompt = build_mcqa_prompt(tokenizer, row["question"], row["choices"])
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, -1]
    letters = [tokenizer.convert_tokens_to_ids(c) for c in "ABCD"[: len(row["choices"])]]
    return torch.softmax(logits[letters].double(), -1).numpy(), torch.softmax(logits.double(), -1)[letters].sum().item()


def test_probs_match_unbatched_forward(tiny_model, tiny_tokenizer):
    scores = score_mcqa(tiny_model, tiny_tokenizer, ROWS, batch_size=2, progress=False)
    for i, row in enumerate(ROWS):
        ref, mass = _direct_option_probs(tiny_model, tiny_tokenizer, row)
        k = len(row["choices"])
        np.testing.assert_allclose(scores.probs[i, :k], ref, atol=1e-5)
        np.testing.assert_allclose(scores.option_mass[i], mass, atol=1e-5)
        assert np.all(scores.probs[i, k:] == 0)  # the 2-option question has no C, D
    np.testing.assert_array_equal(scores.prediction, scores.probs.argmax(1))
    np.testing.assert_allclose(scores.confidence, scores.probs.max(1))
    np.testing.assert_array_equal(scores.correct, scores.prediction == np.array([r["answer"] for r in ROWS]))


def test_batch_size_does_not_change_results(tiny_model, tiny_tokenizer):
    a = score_mcqa(tiny_model, tiny_tokenizer, ROWS, batch_size=1, progress=False)
    b = score_mcqa(tiny_model, tiny_tokenizer, ROWS, batch_size=3, progress=False)
    np.testing.assert_allclose(a.probs, b.probs, atol=1e-5)


def test_letter_variants_are_summed():
    """A tokenizer where "A" and " A" are different tokens: the option probability is their sum."""

    class TwoVariantTokenizer:
        def encode(self, text, add_special_tokens=False):
            return [{"A": 1, " A": 2, "B": 3, " B": 4}[text]]

    assert option_token_ids(TwoVariantTokenizer(), 2) == [[1, 2], [3, 4]]


def test_option_tokens_missing_is_an_error(tiny_tokenizer):
    class NoLetters:
        def encode(self, text, add_special_tokens=False):
            return [5, 6]

    with pytest.raises(ValueError, match="'A'"):
        option_token_ids(NoLetters(), 2)


def test_option_logits_are_full_vocabulary_log_probabilities(tiny_model, tiny_tokenizer):
    """option_logits are log P(letter) over the whole vocabulary, from one unpadded forward pass each (the tiny
    tokenizer has one id per letter): the same quantity a server returns."""
    scores = score_mcqa(TransformersBackend(tiny_model, batch_size=3), tiny_tokenizer, ROWS, progress=False)
    for i, row in enumerate(ROWS):
        prompt = build_mcqa_prompt(tiny_tokenizer, row["question"], row["choices"])
        enc = tiny_tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            full = torch.log_softmax(tiny_model(input_ids=enc).logits[0, -1].double(), -1)
        k = len(row["choices"])
        letters = [tiny_tokenizer.convert_tokens_to_ids(c) for c in "ABCD"[:k]]
        # batched with left padding vs alone: float32 sums in another order, the tiny model's logits O(1) over a
        # hidden size of 32 and 2 layers: 64·eps·|z| ≈ 1e-5 (as tests/modeling/test_backends.py)
        np.testing.assert_allclose(scores.option_logits[i, :k], full[letters].numpy(), atol=1e-5)
        assert np.all(np.isneginf(scores.option_logits[i, k:]))


def test_batch_size_belongs_to_a_bare_model(tiny_model, tiny_tokenizer):
    with pytest.raises(ParameterError) as err:
        score_mcqa(TransformersBackend(tiny_model), tiny_tokenizer, ROWS, batch_size=2, progress=False)
    assert err.value.parameter == "batch_size"


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_batch_size(tiny_model, tiny_tokenizer, bad):
    with pytest.raises(ValueError, match="batch_size"):
        score_mcqa(tiny_model, tiny_tokenizer, ROWS, batch_size=bad, progress=False)


def test_empty_dataset(tiny_model, tiny_tokenizer):
    with pytest.raises(ValueError, match="dataset"):
        score_mcqa(tiny_model, tiny_tokenizer, [], progress=False)


def test_prompt_formats(tiny_tokenizer):
    body = format_mcqa("q ?", ["x", "y"])
    assert body.splitlines()[1:3] == ["A. x", "B. y"]
    chat = build_mcqa_prompt(tiny_tokenizer, "q ?", ["x", "y"])
    assert chat.startswith("<|im_start|>user\n") and chat.endswith("<|im_start|>assistant\n")
    plain = build_mcqa_prompt(tiny_tokenizer, "q ?", ["x", "y"], prompt_format="plain")
    assert plain.endswith("\nAnswer:")
    with pytest.raises(ValueError, match="prompt_format"):
        resolve_prompt_format(tiny_tokenizer, "markdown")
    with pytest.raises(ValueError, match="choices"):
        format_mcqa("q", ["only one"])


def test_unknown_token_is_not_an_option_letter(tiny_tokenizer):
    # the word-level tokenizer maps " F" (not in its vocabulary) to <unk>: that is no letter token
    assert tiny_tokenizer.encode("F", add_special_tokens=False) == [tiny_tokenizer.unk_token_id]
    with pytest.raises(ValueError, match="'F'"):
        option_token_ids(tiny_tokenizer, 6)
