"""Model loading (Hub, local, packaged offline GGUF) and MCQA scoring through a backend (``modeling.backends``)."""

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
from hf_calibration.runtime.lazy import lazy_getattr

# scoring needs torch: imported on first use, so that reading a config (the command line's --help) stays fast
_LAZY = {name: "hf_calibration.modeling.scoring" for name in ("MCQAScores", "score_mcqa")}
_LAZY.update({name: "hf_calibration.modeling.backends" for name in ("OpenAICompatibleBackend", "ScoringBackend",
                                                                    "TransformersBackend")})

__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = [
    "LETTERS",
    "MCQAScores",
    "OpenAICompatibleBackend",
    "PACKAGED_MODELS",
    "PROMPT_FORMATS",
    "build_mcqa_prompt",
    "build_prompt",
    "cache_dir",
    "first_option_letter",
    "format_mcqa",
    "load_model",
    "option_token_ids",
    "packaged_model_available",
    "resolve_device",
    "resolve_model_path",
    "ScoringBackend",
    "TransformersBackend",
    "score_mcqa",
    "single_token_ids",
]
