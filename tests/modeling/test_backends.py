"""The scoring backends without a server: the in-process backend against direct forward passes on the tiny model,
the entropy bounds by hand, the option checks. (Against a real vLLM server: tests/serving/.)"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hf_calibration.errors import ParameterError
from hf_calibration.modeling.backends import (TokenLogprobs, TransformersBackend, check_backend_options,
                                              truncated_entropy)


def _full(model, ids):
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)


def test_next_token_logprobs_equal_unbatched_passes(tiny_model):
    prompts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]
    ids = [3, 4, 20]
    got = TransformersBackend(tiny_model, batch_size=2).next_token_logprobs(prompts, ids)
    for i, p in enumerate(prompts):
        ref = _full(tiny_model, p)[-1]
        # batched with left padding vs alone: float32 sums in another order; the tiny model's logits are O(1)
        # over a hidden size of 32 and 2 layers, so 64·eps·|z| ≈ 1e-5 bounds the difference
        np.testing.assert_allclose(got.logprobs[i], ref[ids].numpy(), atol=1e-5)
        assert got.top_ids[i] == int(ref.argmax())


def test_continuation_logprobs_equal_unbatched_passes(tiny_model):
    prompts, conts = [[5, 6, 7], [8, 9, 10, 11, 12]], [[13, 14, 15], [16]]
    got = TransformersBackend(tiny_model, batch_size=2).continuation_logprobs(prompts, conts)
    for p, c, g in zip(prompts, conts, got):
        full = _full(tiny_model, p + c)
        ref = [float(full[len(p) - 1 + j, t]) for j, t in enumerate(c)]
        np.testing.assert_allclose(g, ref, atol=1e-5)  # as above


def test_generation_entropy_is_exact_in_process(tiny_model):
    gen = TransformersBackend(tiny_model).generate([[5, 6, 7]], max_new_tokens=3)[0]
    seq = [5, 6, 7] + gen.token_ids
    full = _full(tiny_model, seq)
    for j, tok in enumerate(gen.token_ids):
        row = full[2 + j]
        assert tok == int(row.argmax())
        np.testing.assert_allclose(gen.logprobs[j], float(row[tok]), atol=1e-5)
        np.testing.assert_allclose(gen.entropy[j], float(-(row.exp() * row).sum()), atol=1e-5)
    assert np.all(gen.entropy_gap == 0)


def test_truncated_entropy_by_hand():
    # p = (0.5, 0.25) read of V = 10 tokens: r = 0.25; low = 0.5 ln 2 + 0.25 ln 4 + 0.25 ln 4 = 1.5 ln 2,
    # gap = 0.25 ln 8
    low, gap = truncated_entropy([math.log(0.5), math.log(0.25)], 10)
    assert low == pytest.approx(1.5 * math.log(2), abs=1e-12)
    assert gap == pytest.approx(0.25 * math.log(8), abs=1e-12)
    # the bounds hold for a distribution with those two top probabilities: the rest spread unevenly over 8
    rest = np.array([0.1, 0.05, 0.05, 0.02, 0.01, 0.01, 0.005, 0.005])
    p = np.concatenate([[0.5, 0.25], rest])
    h = float(-(p * np.log(p)).sum())
    assert low <= h <= low + gap
    assert truncated_entropy([0.0], 5) == (0.0, 0.0)  # all the mass read


def test_dense_row_keeps_read_ids_and_argmax():
    lp = TokenLogprobs(np.array([[-1.0, -3.0]]), np.array([7]), np.array([-0.5]))
    row = lp.dense([2, 4], 10)[0]
    assert row[2] == -1.0 and row[4] == -3.0 and row[7] == -0.5 and int(row.argmax()) == 7
    assert torch.isinf(row[[0, 1, 3, 5, 6, 8, 9]]).all()


def test_backend_options():
    check_backend_options("transformers", None, None)
    check_backend_options("openai", "http://127.0.0.1:8000/v1", None)
    with pytest.raises(ParameterError, match="backend") as err:
        check_backend_options("vllm", None, None)
    assert err.value.parameter == "backend"
    with pytest.raises(ParameterError) as err:
        check_backend_options("openai", None, None)
    assert err.value.parameter == "base_url"
    with pytest.raises(ParameterError) as err:
        check_backend_options("transformers", None, "name")
    assert err.value.parameter == "served_model"


def test_prompt_longer_than_context_is_refused_before_scoring(tiny_model):
    backend = TransformersBackend(tiny_model)
    backend.max_context = 4
    with pytest.raises(ParameterError, match="context of 4") as err:
        backend.check_lengths([[1, 2], [1, 2, 3, 4]], extra=1)
    assert err.value.parameter == "prompts"
