"""llama.cpp serving the same float32 weights as the in-process model (an F32 GGUF written from the packaged Q4_1
file): every read agrees to the float32 bound of conftest.py (``F32_LOGPROB_ATOL``; option probabilities to
``PROB_ATOL``), through both of llama.cpp's exact read paths (forced reads and the full distribution)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.served_helpers import (ROWS, assert_continuations_agree, assert_next_token_reads_agree, local,
                                  prompts, read_ids)  # noqa: F401  (local, prompts: fixtures)
from tests.serving_llamacpp.conftest import F32_FLAGS, F32_LOGPROB_ATOL, PROB_ATOL, open_backend, start


@pytest.fixture(scope="module")
def served(tmp_path_factory, f32_gguf, smollm):
    with start(tmp_path_factory, f32_gguf, extra=F32_FLAGS) as url:
        backend = open_backend(url, smollm[1], max_in_flight=2)
        yield backend
        backend.close()


def test_probe_finds_llamacpp_and_its_exact_reads(served):
    caps = served.capabilities
    assert caps.engine == "llama.cpp" and caps.tokenizer == "llama.cpp" and caps.max_context == 2048
    assert caps.chosen_ids == "full distribution or forced reads (logit_bias)" and caps.forced_max >= 1
    assert caps.entropy == "exact (full distribution)" and caps.lora.startswith("start-up only")
    assert not caps.model_checked  # llama.cpp ignores the request's model name
    line = caps.line()
    assert "\n" not in line and "llama.cpp" in line and "forced reads" in line and "LoRA: start-up only" in line


@pytest.mark.parametrize("path", ["forced", "full"])
def test_next_token_logprobs_equal_in_process(served, local, prompts, smollm, path, monkeypatch):
    reads = served._engine()
    monkeypatch.setattr(reads, "forced_max", 10 ** 6 if path == "forced" else 0)
    ids = read_ids(smollm[1])
    if path == "forced":  # one request per id: the option letters and the far-down ids suffice
        prompts, ids = prompts[:2], ids[:4] + ids[-4:]
    assert_next_token_reads_agree(served, local, prompts, ids, F32_LOGPROB_ATOL)


def test_continuations_equal_in_process(served, local, prompts, smollm):
    assert_continuations_agree(served, local, prompts, smollm[1], F32_LOGPROB_ATOL)


def test_greedy_generation_with_exact_entropy(served, local, prompts):
    got, ref = served.generate(prompts[:2], max_new_tokens=4), local.generate(prompts[:2], max_new_tokens=4)
    for g, r in zip(got, ref):
        assert g.token_ids == r.token_ids
        np.testing.assert_allclose(g.logprobs, r.logprobs, atol=F32_LOGPROB_ATOL)
        assert np.all(g.entropy_gap == 0)
        # H = −Σ p log p moves by |Σ p δ(log p)(1 + log p)| ≤ δ·(1 + H) for log-probability errors δ
        np.testing.assert_array_less(np.abs(g.entropy - r.entropy), F32_LOGPROB_ATOL * (1 + r.entropy))


def test_mcqa_scores_equal_in_process(served, smollm):
    from hf_calibration.modeling import score_mcqa

    model, tok = smollm
    got, ref = score_mcqa(served, tok, ROWS, progress=False), score_mcqa(model, tok, ROWS, progress=False)
    # one shared normaliser shift per position cancels in the option softmax: PROB_ATOL as for vLLM
    np.testing.assert_allclose(got.probs, ref.probs, atol=PROB_ATOL)
    np.testing.assert_array_equal(got.prediction, ref.prediction)
