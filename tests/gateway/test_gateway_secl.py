"""SECL live per stream through the gateway (gateway.secl_stepper over secl.service.SECLService), against the
session's real vLLM server: the stream's burst trains in the gateway's worker, the new adapter version is loaded
into the server and named in later responses, and the ``secl`` signal is read through it."""

from __future__ import annotations

import uuid

import pytest
import torch

from tests.gateway.conftest import running_gateway
from tests.serving.conftest import MODEL, PROB_ATOL
from tests.serving.test_secl_service import MAX_NEW, N_ITEMS, SETTINGS

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def rows():
    from hf_calibration.data import load_mcqa

    return list(load_mcqa("mmlu", limit=N_ITEMS + 1))


def test_a_stream_trains_in_the_background_and_its_adapter_is_named_and_read(vllm_server, smollm, rows, tmp_path):
    from hf_calibration.gateway.config import GatewayConfig
    from hf_calibration.gateway.secl_stepper import SECLStepper
    from hf_calibration.modeling import load_model
    from hf_calibration.modeling.backends import OpenAICompatibleBackend
    from hf_calibration.modeling.prompts import format_mcqa
    from hf_calibration.secl import SECLConfig, apply_secl
    from hf_calibration.secl.answer_signals import answer_signal
    from hf_calibration.secl.service import SECLService

    model, tokenizer = load_model(MODEL)
    torch.manual_seed(0)
    upstream = OpenAICompatibleBackend(vllm_server.url, MODEL, tokenizer, max_in_flight=4)
    service = SECLService(upstream, apply_secl(model, tokenizer, SECLConfig(**SETTINGS)), tmp_path / ".secl",
                          max_new_tokens=MAX_NEW)
    config = GatewayConfig(upstream=vllm_server.url, model=MODEL, signal="secl", state_dir=str(tmp_path))
    key = f"live{uuid.uuid4().hex[:8]}"  # the server may outlive this test (its adapter names must be new)

    def ask(client, row):
        content = format_mcqa(row["question"], row["choices"])
        reply = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=MAX_NEW, temperature=0,
            extra_headers={"X-Calibration-Stream": key},
            extra_body={"calibration": {"options": list(row["choices"]), "multiple_choice": True}})
        return content, reply.choices[0]

    with running_gateway(config, tokenizer=smollm[1], stepper=SECLStepper(service, burst_at_start=True)) as (url, gw):
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=600)
        first = [ask(client, row)[1].model_extra["confidence"] for row in rows[:N_ITEMS]]
        assert gw.streams.flush(timeout=900)
        state = gw.streams.state(key)
        assert state["steps"] == N_ITEMS and state["state"]["bursts"] == 1 and state["state"]["questions"] == N_ITEMS
        version = state["version"]
        assert version >= 1 and state["state"]["served_name"] == f"{key}-v{version}"
        assert all(c["adapter_version"] == 0 for c in first[:1])
        assert f"{key}-v{version}" in {m.id for m in client.models.list().data}
        content, choice = ask(client, rows[N_ITEMS])
        conf = choice.model_extra["confidence"]
        assert conf["signal"] == "secl" and conf["adapter_version"] == version
    ids = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                                         add_generation_prompt=True), add_special_tokens=False)
    direct = answer_signal(OpenAICompatibleBackend(vllm_server.url, f"{key}-v{version}", tokenizer, check=False), tokenizer,
                           ids, choice.message.content, "verbalized", prompt_format="chat",
                           options=list(rows[N_ITEMS]["choices"]), multiple_choice=True)
    assert conf["raw"] == pytest.approx(direct.raw, abs=2 * PROB_ATOL)


def test_an_upstream_restarted_under_the_gateway_gets_the_stream_adapter_back(smollm, rows, tmp_path):
    """vLLM restarted on the same port while the gateway runs has lost the stream's adapter: the next request of the
    stream is answered (the gateway reloads the current version upstream on vLLM's 404 and sends the read once more)
    and names the same version; when the reload itself fails, the client gets a 502 in OpenAI's error shape."""
    from hf_calibration.gateway.config import GatewayConfig
    from hf_calibration.gateway.secl_stepper import SECLStepper
    from hf_calibration.modeling import load_model, resolve_model_path
    from hf_calibration.modeling.backends import OpenAICompatibleBackend
    from hf_calibration.modeling.backends.launch import free_port, local_vllm_server
    from hf_calibration.modeling.prompts import format_mcqa
    from hf_calibration.secl import SECLConfig, apply_secl
    from hf_calibration.secl.service import SECLService
    from tests.served_helpers import require_server
    from tests.serving.conftest import MAX_MODEL_LEN, START_TIMEOUT_S, vllm_python

    python = vllm_python()
    require_server(python, "vLLM venv", "make setup-vllm")
    port, folder = free_port(), resolve_model_path(MODEL)

    def vllm(name):  # this test's own server, always on the same port
        return local_vllm_server(python, folder, MODEL, log=tmp_path / f"{name}.log", max_model_len=MAX_MODEL_LEN,
                                 lora_rank=8, timeout_s=START_TIMEOUT_S, port=port)

    model, tokenizer = load_model(MODEL)
    torch.manual_seed(0)
    key = "restart"
    config = GatewayConfig(upstream=f"http://127.0.0.1:{port}/v1", model=MODEL, signal="secl",
                           state_dir=str(tmp_path))

    def ask(client, row):
        return client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": format_mcqa(row["question"], row["choices"])}],
            max_tokens=MAX_NEW, temperature=0, extra_headers={"X-Calibration-Stream": key},
            extra_body={"calibration": {"options": list(row["choices"]), "multiple_choice": True}})

    first = vllm("first")
    url = first.__enter__()
    try:
        upstream = OpenAICompatibleBackend(url, MODEL, tokenizer, max_in_flight=4)
        service = SECLService(upstream, apply_secl(model, tokenizer, SECLConfig(**SETTINGS)), tmp_path / ".secl",
                              max_new_tokens=MAX_NEW)
        stepper = SECLStepper(service, burst_at_start=True)
        with running_gateway(config, tokenizer=smollm[1], stepper=stepper) as (gw_url, gw):
            client = openai.OpenAI(base_url=gw_url, api_key="none", max_retries=0, timeout=600)
            for row in rows[:N_ITEMS]:
                ask(client, row)
            assert gw.streams.flush(timeout=900)
            version = gw.streams.state(key)["version"]
            served = f"{key}-v{version}"
            assert version >= 1 and served in {m.id for m in client.models.list().data}
            first.__exit__(None, None, None)
            first = None
            with vllm("second"):
                assert served not in {m.id for m in client.models.list().data}  # the restart lost it
                conf = ask(client, rows[N_ITEMS]).choices[0].model_extra["confidence"]
                assert conf["signal"] == "secl" and conf["adapter_version"] == version
                assert conf["value"] is not None and 0 <= conf["raw"] <= 1
                assert served in {m.id for m in client.models.list().data}
                assert gw.streams.flush(timeout=900)
                assert gw.streams.state(key)["steps"] == N_ITEMS + 1  # the worker's step read through it too
                # lost again, and its folder gone: the reload fails, the client gets OpenAI's error shape
                assert upstream.post_once("/unload_lora_adapter", {"lora_name": served})[0] == 200
                saved = tmp_path / ".secl" / key / f"v{version:06d}"
                saved.rename(saved.with_name("moved"))
                with pytest.raises(openai.APIStatusError) as err:
                    ask(client, rows[0])
                body = err.value.body.get("error", err.value.body)  # the client may unwrap "error"
                assert err.value.status_code == 502 and body["code"] == "upstream_failed"
                assert set(body) >= {"message", "type", "param", "code"} and "adapter" in body["message"]
                saved.with_name("moved").rename(saved)
    finally:
        if first is not None:
            first.__exit__(None, None, None)
