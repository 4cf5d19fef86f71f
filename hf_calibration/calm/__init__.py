"""CALM: training-time calibration by bilevel optimisation with a learned logit adjustment (SPEC §1)."""

from hf_calibration.distributed import quiet_deepspeed_cpu_notice

quiet_deepspeed_cpu_notice()  # before the Trainer imports DeepSpeed (which logs its CPU fallback as a warning)

from hf_calibration.calm.bome import BOMETerms, bome_direction, bome_lambda, bome_terms  # noqa: E402
from hf_calibration.calm.config import CALMConfig  # noqa: E402
from hf_calibration.calm.data import mcqa_to_prompt_completion  # noqa: E402
from hf_calibration.calm.lora import default_lora_config  # noqa: E402
from hf_calibration.calm.logit_adjustment import CALMModel, LogitAdjustment, adjust_logits, temperature_from_rho  # noqa: E402
from hf_calibration.calm.trainer import CALMTrainer  # noqa: E402

__all__ = [
    "BOMETerms",
    "CALMConfig",
    "CALMModel",
    "CALMTrainer",
    "LogitAdjustment",
    "adjust_logits",
    "bome_direction",
    "bome_lambda",
    "bome_terms",
    "default_lora_config",
    "mcqa_to_prompt_completion",
    "temperature_from_rho",
]
