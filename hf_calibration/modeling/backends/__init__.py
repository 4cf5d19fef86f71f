"""Scoring backends: one interface (``ScoringBackend``, base.py) for a model in this process (``TransformersBackend``)
and one behind a vLLM or llama.cpp server (``OpenAICompatibleBackend``, server.py, its reads picked by
``engines.probe``); the names a job or the CLI chooses from, with their options and capabilities, in
``registry.REGISTRY``; see docs/serving.md."""

from __future__ import annotations

from hf_calibration.modeling.backends.base import (CachedPrefixReads, Generation, PrefixReads,
                                                   ScoringBackend, TokenLogprobs, TransformersBackend, as_backend,
                                                   read_next_tokens, truncated_entropy)
from hf_calibration.modeling.backends.registry import (BACKENDS, REGISTRY, BackendEntry, backend_entry,
                                                       check_backend_options, has_capability, load_tokenizer,
                                                       open_backend, open_in_process, open_server_backend)
from hf_calibration.modeling.backends.server import OpenAICompatibleBackend, ServerError, ServerUnreachable

__all__ = [
    "BACKENDS",
    "BackendEntry",
    "CachedPrefixReads",
    "Generation",
    "OpenAICompatibleBackend",
    "PrefixReads",
    "REGISTRY",
    "ScoringBackend",
    "ServerError",
    "ServerUnreachable",
    "TokenLogprobs",
    "TransformersBackend",
    "as_backend",
    "backend_entry",
    "check_backend_options",
    "has_capability",
    "load_tokenizer",
    "open_backend",
    "open_in_process",
    "open_server_backend",
    "read_next_tokens",
    "truncated_entropy",
]
