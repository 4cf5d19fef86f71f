"""Served (vLLM) against in-process (transformers) numbers on the packaged SmolLM2; tolerances: conftest.py."""

from __future__ import annotations

import numpy as np
import pytest

from hf_calibration.modeling import build_mcqa_prompt, option_token_ids
from tests.served_helpers import (QUESTIONS, ROWS, assert_continuations_agree, assert_next_token_reads_agree,
                                  local, prompts, read_ids)  # noqa: F401  (local, prompts: fixtures)
from tests.serving.conftest import LOGPROB_ATOL, PROB_ATOL


def test_next_token_logprobs_of_chosen_ids(served, local, prompts, smollm):
    assert_next_token_reads_agree(served, local, prompts, read_ids(smollm[1]), LOGPROB_ATOL)


def test_continuation_logprobs(served, local, prompts, smollm):
    assert_continuations_agree(served, local, prompts, smollm[1], LOGPROB_ATOL)


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
