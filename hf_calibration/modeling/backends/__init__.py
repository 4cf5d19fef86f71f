"""Scoring backends: one interface (``ScoringBackend``) for a model in this process (``TransformersBackend``) and
one behind a vLLM or llama.cpp server (``OpenAICompatibleBackend``, its reads picked by ``engines.probe``); see
docs/serving.md."""

from __future__ import annotations

from hf_calibration.modeling.backends.base import (BACKENDS, Generation, ScoringBackend, TokenLogprobs,
                                                   TransformersBackend, truncated_entropy)
from hf_calibration.modeling.backends.mcqa import score_mcqa_with
from hf_calibration.modeling.backends.server import OpenAICompatibleBackend, ServerError

__all__ = [
    "BACKENDS",
    "Generation",
    "OpenAICompatibleBackend",
    "ScoringBackend",
    "ServerError",
    "TokenLogprobs",
    "TransformersBackend",
    "check_backend_options",
    "load_tokenizer",
    "open_server_backend",
    "score_mcqa_with",
    "truncated_entropy",
]


def load_tokenizer(name_or_path: str):
    """The tokenizer (and chat template) of a Hub id, local folder or packaged model, as ``load_model`` sets it up
    (left padding, ``pad_token = eos_token`` when missing), without loading the weights where it can."""
    from transformers import AutoTokenizer

    from hf_calibration.modeling.loading import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(name_or_path))
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def check_backend_options(backend: str, base_url, served_model) -> None:
    """ParameterError naming ``backend``, ``base_url`` or ``served_model``: a known backend; the server's URL when
    the backend is ``openai`` (and neither option without it)."""
    from hf_calibration.errors import ParameterError

    if backend not in BACKENDS:
        raise ParameterError("backend", backend, f"must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    if backend == "openai":
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ParameterError("base_url", base_url, "the openai backend needs the server's URL, such as "
                                 f"http://127.0.0.1:8000/v1, got {base_url!r}", related=("backend",))
        if served_model is not None and (not isinstance(served_model, str) or not served_model.strip()):
            raise ParameterError("served_model", served_model, f"must name the served model, got {served_model!r}")
    else:
        for name, value in (("base_url", base_url), ("served_model", served_model)):
            if value is not None:
                raise ParameterError(name, value, f"applies to {{backend}} openai only, got {{backend}} {backend}",
                                     related=("backend",))


def open_server_backend(model: str, base_url: str, served_model: str | None, **options):
    """``(tokenizer, OpenAICompatibleBackend)`` for a job: the tokenizer from ``model`` (Hub id, folder or packaged
    copy), the server's served name ``served_model`` (default: ``model``, the name vLLM serves a model under when
    started without ``--served-model-name``). Probes and checks the server before returning, and prints its one
    start-up line (engine and read path: ``OpenAICompatibleBackend.capabilities``)."""
    tokenizer = load_tokenizer(model)
    backend = OpenAICompatibleBackend(base_url, served_model or model, tokenizer, **options)
    print(backend.capabilities.line())
    return tokenizer, backend
