"""Served (vLLM) against in-process (transformers) numbers on the packaged SmolLM2; tolerances: conftest.py."""

from __future__ import annotations

import numpy as np
import pytest

from hf_calibration.modeling import build_mcqa_prompt, option_token_ids
from hf_calibration.modeling.backends import TransformersBackend
from tests.serving.conftest import LOGPROB_ATOL, PROB_ATOL

QUESTIONS = [
    ("What is 2 + 2?", ["3", "4", "5", "22"], 1),
    ("Which is the capital of France?", ["Rome", "Berlin", "Paris", "Madrid"], 2),
    ("Water boils at sea level at", ["50 °C", "100 °C", "150 °C", "200 °C"], 1),
    ("Which planet is closest to the Sun?", ["Venus", "Mars", "Mercury", "Earth"], 2),
]
ROWS = [{"question": q, "choices": c, "answer": a, "subject": "toy"} for q, c, a in QUESTIONS]


@pytest.fixture(scope="module")
def local(smollm):
    model, tokenizer = smollm
    return TransformersBackend(model, batch_size=4, pad_id=tokenizer.pad_token_id)


@pytest.fixture(scope="module")
def prompts(smollm):
    tok = smollm[1]
    return [tok.encode(build_mcqa_prompt(tok, q, c), add_special_tokens=False) for q, c, _ in QUESTIONS]


def _read_ids(tok):
    """Option letters, Yes/No and digits, with and without a leading space: tokens far down the ranking too, which
    a top-k list would miss."""
    ids = [t for v in option_token_ids(tok, 4) for t in v]
    for text in ("Yes", " No", "7", " 7", " Paris", "zebra"):
        ids.append(tok.encode(text, add_special_tokens=False)[0])
    return ids


def test_next_token_logprobs_of_chosen_ids(served, local, prompts, smollm):
    ids = _read_ids(smollm[1])
    got, ref = served.next_token_logprobs(prompts, ids), local.next_token_logprobs(prompts, ids)
    assert got.logprobs.min() < -10  # some ids lie far outside any top-k list: read exactly all the same
    np.testing.assert_allclose(got.logprobs, ref.logprobs, atol=LOGPROB_ATOL)
    np.testing.assert_array_equal(got.top_ids, ref.top_ids)
    np.testing.assert_allclose(got.top_logprobs, ref.top_logprobs, atol=LOGPROB_ATOL)


def test_continuation_logprobs(served, local, prompts, smollm):
    tok = smollm[1]
    conts = [tok.encode(text, add_special_tokens=False) for text in ("B. 4", "C", "B. 100 degrees", "Mercury!")]
    got, ref = served.continuation_logprobs(prompts, conts), local.continuation_logprobs(prompts, conts)
    for g, r, c in zip(got, ref, conts):
        assert g.shape == r.shape == (len(c),)
        np.testing.assert_allclose(g, r, atol=LOGPROB_ATOL)


def test_greedy_generation_and_entropy(served, local, prompts):
    got, ref = served.generate(prompts, max_new_tokens=6), local.generate(prompts, max_new_tokens=6)
    for g, r in zip(got, ref):
        assert g.token_ids == r.token_ids
        np.testing.assert_allclose(g.logprobs, r.logprobs, atol=LOGPROB_ATOL)
        # the served entropy is the top-k bound (base.truncated_entropy): low ≤ H ≤ low + gap. H moves by at
        # most Σ|d(p log p)/d log p|·δ ≤ (k + 1)·δ for log-probability errors δ, with k = 20 read tokens.
        tol = 21 * LOGPROB_ATOL
        assert np.all(g.entropy <= r.entropy + tol)
        assert np.all(r.entropy <= g.entropy + g.entropy_gap + tol)


def test_mcqa_scores_match_one_forward_pass(served, smollm):
    """``score_mcqa`` through the server against the option letters' probabilities of one unpadded transformers
    forward pass per question: each letter's log-probability the logsumexp over its token variants."""
    import torch

    from hf_calibration.modeling import score_mcqa

    model, tok = smollm
    got = score_mcqa(served, tok, ROWS)
    variants = option_token_ids(tok, 4)
    for i, (q, c, _) in enumerate(QUESTIONS):
        ids = tok.encode(build_mcqa_prompt(tok, q, c), add_special_tokens=False)
        with torch.no_grad():
            full = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, -1].double(), -1)
        lp = np.array([float(torch.logsumexp(full[list(v)], 0)) for v in variants])
        np.testing.assert_allclose(got.option_logits[i], lp, atol=LOGPROB_ATOL)
        ref = np.exp(lp - lp.max()) / np.exp(lp - lp.max()).sum()
        # a softmax over log-probabilities each within LOGPROB_ATOL moves by at most twice that
        np.testing.assert_allclose(got.probs[i], ref, atol=2 * LOGPROB_ATOL)
    assert got.prompts == [build_mcqa_prompt(tok, q, c) for q, c, _ in QUESTIONS]
