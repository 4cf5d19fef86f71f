"""Launch ``calm_worker.py`` in subprocesses (``accelerate launch``), once per configuration per test session."""

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "examples" / "accelerate_configs"
WORKER = Path(__file__).with_name("calm_worker.py")
# The DeepSpeed JIT extension (~65 s to build on 2 cores) is cached inside the checkout (.gitignore'd),
# so a CI run builds it once; TORCH_EXTENSIONS_DIR from the environment wins.
EXTENSIONS = REPO / ".cache" / "torch_extensions"


_KILLED_BY_SIGNAL = re.compile(r"\((SIGABRT|SIGSEGV|SIGBUS)\)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    # ATEN_CPU_CAPABILITY: the portable-kernel rerun (.ci/run) must reach the workers too
    keep = ("PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "HF_HOME", "TORCH_EXTENSIONS_DIR", "ATEN_CPU_CAPABILITY")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="", ACCELERATE_DISABLE_RICH="1")
    env.setdefault("TORCH_EXTENSIONS_DIR", str(EXTENSIONS))
    return env


def run_worker(out: Path, config: str | None, *args: str, timeout: int = 420) -> Path:
    """Run the worker (one plain process when ``config`` is None) and return ``out``; fails with its output."""
    out.mkdir(parents=True, exist_ok=True)
    if config is None:
        cmd = [sys.executable, str(WORKER)]
    else:
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIGS / config),
               "--main_process_port", str(_free_port()), str(WORKER)]
    cmd += ["--output-dir", str(out), *args]
    for attempt in (1, 2):
        proc = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=timeout)
        if proc.returncode == 0:
            return out
        # A worker killed by a native abort (seen once in ~10 CI runs: rank 1 "terminate called without an active
        # exception", SIGABRT, while preparing datasets, before any step) is relaunched once; a Python error in
        # the worker (an assertion, a wrong number) exits with a code, not a signal, and fails at once.
        if attempt == 1 and _KILLED_BY_SIGNAL.search(proc.stdout + proc.stderr):
            print(f"run_worker: a worker died by a signal; relaunching once:\n{proc.stderr[-2000:]}", file=sys.stderr)
            continue
        pytest.fail(f"{' '.join(cmd)} exited with {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}")
    return out


@pytest.fixture(scope="session")
def single_process_run(tmp_path_factory):
    """The reference: one process with the whole global batch of 4."""
    return run_worker(tmp_path_factory.mktemp("single"), None, "--per-device-batch-size", "4")
