"""The runtime-LoRA probe and the LoRA load/unload refusals against real vLLM servers, decided from HTTP status codes
and the error's structure (``engines._vllm_lora``, ``backends.server.lora_refusal``), never from message text: the
session's server (runtime loading on, ``--max-lora-rank 8``) and one started here without
``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` (its load endpoint absent)."""

from __future__ import annotations

import pytest

from tests.served_helpers import require_server
from tests.serving.conftest import MAX_MODEL_LEN, MODEL, START_TIMEOUT_S, vllm_python


def test_runtime_loading_server_probes_runtime_and_refuses_a_missing_folder(served, tmp_path, monkeypatch):
    """Runtime loading on: the probe says so; a folder the server cannot find (its 404 of type NotFoundError) is a
    ServerError naming the folder, the same from SECL's ``LoRAAdmin`` and from ``backend.load_lora_adapter`` (one
    sender, ``post_lora_adapter``; a relative folder sent absolute); unloading a name it never held (404) is no
    error."""
    import copy

    from hf_calibration.modeling.backends import ServerError
    from hf_calibration.secl.service import LoRAAdmin

    assert served.capabilities.lora == "runtime"
    admin = LoRAAdmin(served)
    monkeypatch.chdir(tmp_path)
    backend = copy.copy(served)  # load_lora_adapter would rename the session backend's model on success
    for load in (lambda: admin.load("absent-folder", "absent", rank=8),
                 lambda: backend.load_lora_adapter("absent-folder", "absent")):
        with pytest.raises(ServerError) as err:
            load()
        assert err.value.parameter == "base_url" and "found no adapter" in str(err.value)
        assert str(tmp_path / "absent") in str(err.value)  # the absolute path is what the server was sent
    assert backend.served_model == served.served_model
    admin.unload("never-loaded-here")  # no error
    assert "absent-folder" not in admin.served()


def test_a_server_without_runtime_loading_is_probed_and_refused_naming_base_url(smollm, tmp_path):
    """vLLM started without VLLM_ALLOW_RUNTIME_LORA_UPDATING has no /v1/load_lora_adapter: the probe says "none",
    a probed backend refuses before sending, and an unprobed one reads the endpoint's 404 (no vLLM NotFoundError
    type) as the same refusal naming base_url."""
    from hf_calibration.errors import ParameterError
    from hf_calibration.modeling import resolve_model_path
    from hf_calibration.modeling.backends import OpenAICompatibleBackend
    from hf_calibration.modeling.backends.launch import local_vllm_server
    from hf_calibration.secl.service import LoRAAdmin

    python = vllm_python()
    require_server(python, "vLLM venv", "make setup-vllm")
    with local_vllm_server(python, resolve_model_path(MODEL), MODEL, log=tmp_path / "vllm.log",
                           max_model_len=MAX_MODEL_LEN, lora_rank=8, timeout_s=START_TIMEOUT_S,
                           runtime_lora=False) as url:
        probed = OpenAICompatibleBackend(url, MODEL, smollm[1], max_in_flight=2)
        assert probed.capabilities.lora == "none" and "LoRA: none" in probed.capabilities.line()
        status, _, error = probed.post_once("/load_lora_adapter", {"lora_name": "x", "lora_path": str(tmp_path)})
        assert status == 404 and (error or {}).get("type") != "NotFoundError"  # the route itself is absent
        for backend in (probed, OpenAICompatibleBackend(url, MODEL, smollm[1], check=False)):
            for load in (lambda: LoRAAdmin(backend).load("x", tmp_path, rank=8),
                         lambda: backend.load_lora_adapter("x", str(tmp_path))):
                with pytest.raises(ParameterError) as err:
                    load()
                assert err.value.parameter == "base_url" and "runtime LoRA loading" in str(err.value)
            backend.close()
