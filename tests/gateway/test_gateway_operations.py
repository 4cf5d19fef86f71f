"""The gateway's operations against the session's real vLLM server: a restarted gateway resumes its streams, an
upstream that goes away gives OpenAI-shaped errors and the gateway recovers when it is back, a bounded load test
(loopback only) with no failed request and flat memory, and /metrics and /healthz."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from urllib.parse import urlparse

import httpx
import pytest

from tests.gateway.conftest import Relay, running_gateway, serve_process
from tests.serving.conftest import MODEL

openai = pytest.importorskip("openai")
psutil = pytest.importorskip("psutil")

LOAD_REQUESTS, LOAD_IN_FLIGHT, WARM_UP = 1000, 16, 100
# A leak of one response body (~1 KiB) per request would add ~1 MiB over the 900 measured requests, one of the
# request's objects graphs (~32 KiB: body, headers, the httpx response) ~28 MiB: the bound catches the latter.
RSS_GROWTH_BOUND = 24 * 2**20


def _ask(client, content="What is the capital of France?", **kw):
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}],
                                          max_tokens=8, temperature=0, **kw)


def test_a_restarted_gateway_resumes_its_streams(vllm_server, tmp_path):
    state = tmp_path / "state"
    args = ["--upstream", vllm_server.url, "--model", MODEL, "--state-dir", str(state), "--check-upstream", "false"]
    with serve_process(args, log=tmp_path / "serve.log") as (url, proc):
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=300)
        first = [_ask(client, user="carol") for _ in range(2)]
        saved = state / "carol" / "state.json"
        for _ in range(200):  # the worker saves after the response; wait for it (at most 20 s)
            if saved.exists() and json.loads(saved.read_text())["steps"] == 2:
                break
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGKILL)  # no shutdown hook runs: only what was saved counts
        proc.wait()
    before = json.loads(saved.read_text())
    assert before["steps"] == 2 and before["state"]["answers"] == 2
    with serve_process(args, log=tmp_path / "serve.log") as (url, proc):
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=300)
        again = _ask(client, user="carol")
        assert again.choices[0].message.content == first[0].choices[0].message.content
        for _ in range(200):
            if json.loads(saved.read_text())["steps"] == 3:
                break
            time.sleep(0.1)
    after = json.loads(saved.read_text())
    assert after["steps"] == 3 and after["state"]["answers"] == 3
    mean = (2 * before["state"]["mean_confidence"] + again.choices[0].model_extra["confidence"]["value"]) / 3
    assert after["state"]["mean_confidence"] == pytest.approx(mean, rel=1e-12)
    assert len((state / "carol" / "records.jsonl").read_text().splitlines()) == 3


def test_upstream_gone_gives_openai_errors_and_the_gateway_recovers(vllm_server, smollm):
    from hf_calibration.gateway.config import GatewayConfig
    from hf_calibration.modeling.backends.launch import free_port

    target = urlparse(vllm_server.url)
    relay = Relay((target.hostname, target.port), free_port())
    relay.start()
    config = GatewayConfig(upstream=f"http://127.0.0.1:{relay.port}/v1", model=MODEL, timeout=60)
    try:
        with running_gateway(config, tokenizer=smollm[1]) as (url, gw):
            client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=120)
            ok = _ask(client)
            relay.stop()
            with pytest.raises(openai.APIStatusError) as err:
                _ask(client)
            assert err.value.status_code in (502, 503)
            assert err.value.body["code"] in ("upstream_unreachable", "upstream_failed")
            health = httpx.get(url.replace("/v1", "/healthz"))
            assert health.status_code == 503 and health.json()["status"] == "upstream_unavailable"
            relay.start()
            again = _ask(client)
            assert again.choices[0].message.content == ok.choices[0].message.content
            assert httpx.get(url.replace("/v1", "/healthz")).status_code == 200
            metrics = httpx.get(url.replace("/v1", "/metrics")).text
            assert 'gateway_upstream_errors_total{kind="unreachable"}' in metrics
    finally:
        relay.close()


def test_bounded_load_has_no_failure_and_flat_memory(vllm_server, smollm):
    """1,000 pass-through completions (one token each, no confidence read) with 16 in flight, on loopback."""
    from hf_calibration.gateway.config import GatewayConfig

    config = GatewayConfig(upstream=vllm_server.url, model=MODEL, signal="none", max_in_flight=LOAD_IN_FLIGHT)
    process = psutil.Process()

    async def run(url, n):
        failures = 0
        gate = asyncio.Semaphore(LOAD_IN_FLIGHT)
        async with openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0, timeout=120) as client:
            async def one(i):
                nonlocal failures
                async with gate:
                    try:
                        await client.completions.create(model=MODEL, prompt=f"Count: {i % 50}", max_tokens=1,
                                                        temperature=0)
                    except openai.OpenAIError:
                        failures += 1
            await asyncio.gather(*(one(i) for i in range(n)))
        return failures

    with running_gateway(config, tokenizer=smollm[1]) as (url, gw):
        assert asyncio.run(run(url, WARM_UP)) == 0
        rss = process.memory_info().rss
        assert asyncio.run(run(url, LOAD_REQUESTS - WARM_UP)) == 0
        growth = process.memory_info().rss - rss
        metrics = httpx.get(url.replace("/v1", "/metrics")).text
    assert growth < RSS_GROWTH_BOUND, f"RSS grew by {growth / 2**20:.1f} MiB over {LOAD_REQUESTS - WARM_UP} requests"
    assert f'gateway_requests_total{{endpoint="/v1/completions",status="200"}} {float(LOAD_REQUESTS)}' in metrics
