"""Model loading (Hub, local, packaged offline GGUF), next-token / MCQA scoring, and the scoring backends (a model
in process or behind an OpenAI-compatible server: ``modeling.backends``, docs/serving.md)."""

from hf_calibration.modeling.loading import (
    PACKAGED_MODELS,
    cache_dir,
    load_model,
    packaged_model_available,
    resolve_device,
    resolve_model_path,
)
from hf_calibration.modeling.prompts import (
    LETTERS,
    PROMPT_FORMATS,
    build_mcqa_prompt,
    build_prompt,
    first_option_letter,
    format_mcqa,
    option_token_ids,
    single_token_ids,
)
from hf_calibration.modeling.scoring import MCQAScores, NextTokenScores, next_token_scores, score_mcqa
from hf_calibration.modeling.backends import (  # noqa: E402  (after scoring: backends.mcqa reads MCQAScores)
    OpenAICompatibleBackend,
    ScoringBackend,
    TransformersBackend,
    score_mcqa_with,
)

__all__ = [
    "LETTERS",
    "MCQAScores",
    "NextTokenScores",
    "OpenAICompatibleBackend",
    "PACKAGED_MODELS",
    "PROMPT_FORMATS",
    "build_mcqa_prompt",
    "build_prompt",
    "cache_dir",
    "first_option_letter",
    "format_mcqa",
    "load_model",
    "next_token_scores",
    "option_token_ids",
    "packaged_model_available",
    "resolve_device",
    "resolve_model_path",
    "ScoringBackend",
    "TransformersBackend",
    "score_mcqa",
    "score_mcqa_with",
    "single_token_ids",
]
