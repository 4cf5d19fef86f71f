"""The LoRA adapter CALM trains by default: rank r on the attention projections, scaling 2r, no dropout."""

from __future__ import annotations

from hf_calibration.errors import ParameterError

# Llama / Qwen2 / SmolLM2 names of the attention projections
ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")


def default_lora_config(r: int = 8):
    """``peft.LoraConfig`` of CALM's LoRA: rank ``r`` (int ≥ 1) on ``ATTENTION_PROJECTIONS``, ``lora_alpha = 2r``,
    no dropout, ``task_type="CAUSAL_LM"``; used by ``hf-calibration calm``, the CALM experiments, the examples and
    the benchmarks. ParameterError naming ``r`` for another value; other architectures need their own
    ``target_modules``."""
    from peft import LoraConfig

    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise ParameterError("r", r, f"must be an integer ≥ 1, got {r!r}")
    return LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0, target_modules=list(ATTENTION_PROJECTIONS),
                      task_type="CAUSAL_LM")
