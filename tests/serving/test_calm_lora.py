"""A CALM artifact through the server: its LoRA hot-loaded into vLLM (/v1/load_lora_adapter), its logit adjustment
applied to the served option log-probabilities, against ``CALMModel`` in process (calm/served.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hf_calibration.errors import ParameterError
from hf_calibration.modeling import option_token_ids, score_mcqa
from hf_calibration.modeling.backends import OpenAICompatibleBackend, ServerError
from tests.serving.conftest import LOGPROB_ATOL, MODEL
from tests.served_helpers import ROWS

RANK = 4


@pytest.fixture(scope="module")
def calm(tmp_path_factory):
    """A LoRA with random non-zero weights (so served LoRA logits differ from the base model's) and a scalar-τ
    logit adjustment with a shift over the option letters, saved as PEFT saves it."""
    from peft import LoraConfig, get_peft_model

    from hf_calibration.calm import CALMModel, LogitAdjustment
    from hf_calibration.modeling import load_model

    model, tok = load_model(MODEL)
    torch.manual_seed(0)
    peft_model = get_peft_model(model, LoraConfig(r=RANK, lora_alpha=2 * RANK, target_modules=["q_proj", "v_proj"],
                                                  init_lora_weights=False))
    folder = tmp_path_factory.mktemp("calm") / "adapter"
    peft_model.save_pretrained(folder)
    ids = [t for v in option_token_ids(tok, 4) for t in v]
    adjustment = LogitAdjustment(len(tok), ids, mode="vector")
    with torch.no_grad():
        adjustment.rho.fill_(math.log(1.7))  # one τ for every covered token (calm/served.py)
        adjustment.shift.copy_(torch.linspace(-0.5, 0.5, len(ids)))
    return CALMModel(peft_model.eval(), adjustment), tok, folder


def test_calm_artifact_through_server(vllm_server, calm):
    from hf_calibration.calm.served import served_adjustment

    calm_model, tok, folder = calm
    backend = OpenAICompatibleBackend(vllm_server.url, vllm_server.model, tok)
    backend.load_lora_adapter("calm-test", str(folder))
    rows = [r for r in ROWS if len(r["choices"]) == 4]
    got = score_mcqa(backend, tok, rows, adjust=served_adjustment(calm_model.logit_adjustment))
    ref = score_mcqa(calm_model, tok, rows, progress=False)
    with calm_model.adjustment_enabled(False):  # the PEFT model alone (the hook sits on its LM head)
        lora_only = score_mcqa(calm_model.model, tok, rows, progress=False)
    served_lora = score_mcqa(backend, tok, rows)
    np.testing.assert_allclose(served_lora.probs, lora_only.probs, atol=2 * LOGPROB_ATOL)  # vLLM's LoRA = PEFT's
    # option softmax of adjusted log-probabilities: each read log-probability within LOGPROB_ATOL (conftest.py),
    # divided by τ = 1.7 (< 1 × that), a softmax moves by at most twice the largest input change
    np.testing.assert_allclose(got.probs, ref.probs, atol=2 * LOGPROB_ATOL)
    assert np.abs(ref.probs - lora_only.probs).max() > 100 * LOGPROB_ATOL  # the adjustment changed something
    backend.close()


def test_per_token_temperatures_are_refused(calm):
    from hf_calibration.calm.served import served_adjustment

    adjustment = calm[0].logit_adjustment
    saved = adjustment.rho.detach().clone()
    with torch.no_grad():
        adjustment.rho.copy_(torch.linspace(0, 0.3, len(saved)))
    try:
        with pytest.raises(ParameterError, match="per-token temperatures") as err:
            served_adjustment(adjustment)
        assert err.value.parameter == "logit_adjustment"
    finally:
        with torch.no_grad():
            adjustment.rho.copy_(saved)


def test_lora_rank_above_the_server_limit(vllm_server, calm, tmp_path):
    """The server was started with --max-lora-rank 8: a rank-16 adapter is refused with the server's reason."""
    from peft import LoraConfig, get_peft_model

    from hf_calibration.modeling import load_model

    model, tok = load_model(MODEL)
    big = get_peft_model(model, LoraConfig(r=16, target_modules=["q_proj"], init_lora_weights=False))
    big.save_pretrained(tmp_path / "r16")
    backend = OpenAICompatibleBackend(vllm_server.url, vllm_server.model, tok)
    with pytest.raises(ServerError) as err:
        backend.load_lora_adapter("too-big", str(tmp_path / "r16"))
    assert err.value.parameter == "base_url" and "16" in str(err.value)
    backend.close()
