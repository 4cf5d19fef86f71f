"""CALM: training-time calibration by bilevel optimisation with a learned logit adjustment (docs/methods.md, "CALM")."""

from hf_calibration.calm.bome import BOMETerms, bome_direction, bome_lambda, bome_terms
from hf_calibration.calm.config import CALMConfig
from hf_calibration.calm.data import mcqa_to_prompt_completion
from hf_calibration.calm.lora import default_lora_config
from hf_calibration.calm.logit_adjustment import CALMModel, LogitAdjustment, adjust_logits, temperature_from_rho
from hf_calibration.calm.strategies import STRATEGIES, CALMStrategy
from hf_calibration.calm.trainer import CALMTrainer

__all__ = [
    "BOMETerms",
    "CALMConfig",
    "CALMModel",
    "CALMStrategy",
    "CALMTrainer",
    "LogitAdjustment",
    "STRATEGIES",
    "adjust_logits",
    "bome_direction",
    "bome_lambda",
    "bome_terms",
    "default_lora_config",
    "mcqa_to_prompt_completion",
    "temperature_from_rho",
]
