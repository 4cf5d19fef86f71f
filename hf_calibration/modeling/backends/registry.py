"""The scoring backends by name: the one list the CLI's ``--backend`` choices, the option checks and the jobs read.

Each entry says which ``ScoringBackend`` class a name stands for, the job options it takes besides ``--model`` and
``--batch-size`` (and which of them it needs), what it can read exactly (``CAPABILITIES``), and how a job opens it
(a function ``(model, *, batch_size, device, **options) → (tokenizer, backend)``). Adding a backend is its module
(a ``ScoringBackend`` subclass) plus one ``BackendEntry`` line in ``REGISTRY`` (docs/serving.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from hf_calibration.errors import ParameterError

# What a backend can read, as an entry declares it (a job or signal that needs one checks it).
CAPABILITIES = {
    "in_process": "the model runs in this process: a job may also train or generate with it (SECL, open-ended "
                  "diagnose)",
    "exact_chosen_token_reads": "the log-probability of any chosen next token, whatever its rank (option letters, "
                                "digits, Yes/No)",
    "exact_entropy": "the entropy of each generation step over the full vocabulary (otherwise the top-k bound of "
                     "base.truncated_entropy)",
    "runtime_lora_loading": "a LoRA adapter loaded while running (load_lora_adapter)",
    "shared_prefix_cache": "follow-up reads reuse the prefix's key/value cache in this process (prefix_reads)",
}
# The backend options a job config has; an entry lists those it takes.
OPTIONS = {
    "base_url": "the server's URL, such as http://127.0.0.1:8000/v1",
    "served_model": "the name the server serves the model (or a LoRA adapter) under",
}


@dataclass(frozen=True)
class BackendEntry:
    """One backend: ``cls`` ("module:Class" of its ``ScoringBackend``), ``open`` (how a job opens it), ``help`` (one
    phrase for ``--backend``'s help), ``options`` / ``required`` (names in ``OPTIONS``), ``capabilities`` (names in
    ``CAPABILITIES``)."""

    cls: str
    open: object
    help: str
    options: tuple[str, ...] = ()
    required: tuple[str, ...] = ()
    capabilities: frozenset = frozenset()

    def backend_class(self):
        """The ``ScoringBackend`` subclass (imported now)."""
        import importlib

        module, name = self.cls.split(":")
        return getattr(importlib.import_module(module), name)


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


def open_in_process(model: str, *, batch_size: int = 8, device: str = "auto"):
    """``(tokenizer, TransformersBackend)`` for a job: ``model`` (Hub id, folder or packaged copy) loaded on
    ``device`` (``modeling.load_model``), ``batch_size`` prompts per forward pass. The model is ``backend.model``."""
    from hf_calibration.modeling.backends.base import TransformersBackend
    from hf_calibration.modeling.loading import load_model

    lm, tokenizer = load_model(model, device=device)
    return tokenizer, TransformersBackend(lm, batch_size=batch_size, pad_id=tokenizer.pad_token_id or 0)


def open_server_backend(model: str, base_url: str, served_model: str | None, **options):
    """``(tokenizer, OpenAICompatibleBackend)`` for a job: the tokenizer from ``model`` (Hub id, folder or packaged
    copy), the server's served name ``served_model`` (default: ``model``, the name vLLM serves a model under when
    started without ``--served-model-name``). Probes and checks the server before returning, and prints its one
    start-up line (engine and read path: ``OpenAICompatibleBackend.capabilities``)."""
    from hf_calibration.modeling.backends.server import OpenAICompatibleBackend

    tokenizer = load_tokenizer(model)
    backend = OpenAICompatibleBackend(base_url, served_model or model, tokenizer, **options)
    print(backend.capabilities.line())
    return tokenizer, backend


def _open_openai(model: str, *, batch_size: int = 8, device: str = "auto", base_url=None, served_model=None):
    return open_server_backend(model, base_url, served_model, max_in_flight=batch_size)


REGISTRY = {
    "transformers": BackendEntry(
        "hf_calibration.modeling.backends.base:TransformersBackend", open_in_process, "loaded in this process",
        capabilities=frozenset({"in_process", "exact_chosen_token_reads", "exact_entropy", "shared_prefix_cache"})),
    "openai": BackendEntry(
        "hf_calibration.modeling.backends.server:OpenAICompatibleBackend", _open_openai,
        "an OpenAI-compatible server such as vLLM at --base-url", options=("base_url", "served_model"),
        required=("base_url",), capabilities=frozenset({"exact_chosen_token_reads", "runtime_lora_loading"})),
}
BACKENDS = tuple(REGISTRY)


def backend_entry(name: str) -> BackendEntry:
    """The entry of backend ``name``; ParameterError naming ``backend`` for an unknown one."""
    if name not in REGISTRY:
        raise ParameterError("backend", name, f"must be one of {', '.join(map(repr, REGISTRY))}, got {name!r}")
    return REGISTRY[name]


def has_capability(name: str, capability: str) -> bool:
    """Whether backend ``name`` declares ``capability`` (a key of ``CAPABILITIES``)."""
    if capability not in CAPABILITIES:
        raise ParameterError("capability", capability, f"must be one of {', '.join(map(repr, CAPABILITIES))}")
    return capability in backend_entry(name).capabilities


def check_backend_options(backend: str, base_url=None, served_model=None) -> None:
    """ParameterError naming ``backend``, ``base_url`` or ``served_model``: a backend of ``REGISTRY``; the options
    its entry requires given and well formed (a URL; a non-empty name); no option its entry does not take."""
    entry = backend_entry(backend)
    given = {"base_url": base_url, "served_model": served_model}
    for name, value in given.items():
        if name not in entry.options and value is not None:
            takers = " or ".join(b for b, e in REGISTRY.items() if name in e.options)
            raise ParameterError(name, value, f"applies to {{backend}} {takers} only, got {{backend}} {backend}",
                                 related=("backend",))
    if "base_url" in entry.options and ("base_url" in entry.required or base_url is not None):
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ParameterError("base_url", base_url, f"the {backend} backend needs the server's URL, such as "
                                 f"http://127.0.0.1:8000/v1, got {base_url!r}", related=("backend",))
    if served_model is not None and (not isinstance(served_model, str) or not served_model.strip()):
        raise ParameterError("served_model", served_model, f"must name the served model, got {served_model!r}")


def open_backend(name: str, model: str, *, batch_size: int = 8, device: str = "auto", **options):
    """``(tokenizer, backend)`` of backend ``name`` for ``model``, its ``options`` (those its entry takes; None
    values dropped) checked first (``check_backend_options``)."""
    entry = backend_entry(name)
    check_backend_options(name, options.get("base_url"), options.get("served_model"))
    taken = {k: v for k, v in options.items() if k in entry.options}
    return entry.open(model, batch_size=batch_size, device=device, **taken)
