"""The calibration gateway's cost: latency p50/p95 and throughput at 1, 8 and 32 requests in flight, for

- the upstream called directly (chat completions);
- the gateway with no confidence (``signal: none``): the pass-through's own cost, target ≤ 1.05× direct at p50;
- the gateway with each signal, against a client that makes the same requests itself (the chat completion, then
  the signal's reads through its own ``OpenAICompatibleBackend`` and ``secl.answer_signals``): target ≤ 1.05×.

Ratios come from one run, on the same machine, with the load average printed beside them. Start vLLM as
docs/serving.md does, then::

    python benchmarks/bench_gateway.py --upstream http://127.0.0.1:8000/v1 --requests 64

The gateway runs as ``hf-calibration serve`` in its own process on 127.0.0.1, so it does not share this
process's interpreter with the load generator.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
QUESTIONS = ["What is the capital of France?", "Name a prime number above 10.", "Who wrote Hamlet?",
             "What colour is the sky on a clear day?", "How many legs has a spider?", "What is 7 times 8?",
             "Which ocean is the largest?", "What gas do plants take in?"]
ROW = {"question": "Which planet is known as the Red Planet?", "choices": ["Venus", "Mars", "Jupiter", "Saturn"]}
SIGNALS = ("p_true", "verbalized", "norm_p_true", "option_probability")


def _body(i: int, signal: str | None) -> dict:
    from hf_calibration.modeling.prompts import format_mcqa

    mc = signal in ("norm_p_true", "option_probability")
    content = format_mcqa(ROW["question"], ROW["choices"]) if mc else QUESTIONS[i % len(QUESTIONS)]
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 8, "temperature": 0}
    if signal is not None:
        body["calibration"] = {"signal": signal, **({"options": ROW["choices"], "multiple_choice": True} if mc
                                                    else {})}
    return body


async def _load(send, n: int, in_flight: int) -> dict:
    gate, latencies = asyncio.Semaphore(in_flight), []

    async def one(i):
        async with gate:
            start = time.perf_counter()
            await send(i)
            latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    wall = time.perf_counter() - start
    q = statistics.quantiles(latencies, n=20)
    return {"p50": statistics.median(latencies), "p95": q[18], "rps": n / wall}


def _client_reads(upstream: str, tokenizer, signal: str):
    """The client doing the signal's reads itself: chat completion, then ``answer_signal`` in a worker thread."""
    from hf_calibration.modeling.backends import OpenAICompatibleBackend
    from hf_calibration.secl.answer_signals import answer_signal

    backend = OpenAICompatibleBackend(upstream, MODEL, tokenizer, max_in_flight=4, retries=0, check=False)

    async def send(client, i):
        body = _body(i, signal)
        body.pop("calibration")
        r = (await client.post("/chat/completions", json=body)).json()
        text = tokenizer.apply_chat_template(body["messages"], tokenize=False, add_generation_prompt=True)
        ids = tokenizer.encode(text, add_special_tokens=False)
        mc = signal in ("norm_p_true", "option_probability")
        await asyncio.to_thread(answer_signal, backend, tokenizer, ids, r["choices"][0]["message"]["content"],
                                signal, prompt_format="chat", options=ROW["choices"] if mc else None,
                                multiple_choice=mc)
    return send


async def _measure(args, gateway: str, tokenizer) -> list[tuple]:
    rows = []
    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(base_url=args.upstream, timeout=600, limits=limits) as up, \
            httpx.AsyncClient(base_url=gateway, timeout=600, limits=limits) as gw:
        async def direct(i):
            (await up.post("/chat/completions", json=_body(i, None))).raise_for_status()

        def via_gateway(signal):
            async def send(i):
                (await gw.post("/chat/completions", json=_body(i, signal))).raise_for_status()
            return send

        for c in args.in_flight:
            await _load(direct, min(8, args.requests), c)  # warm the prefix cache and the connections
            base = await _load(direct, args.requests, c)
            rows.append(("direct", c, base, None))
            rows.append(("gateway, no confidence", c, await _load(via_gateway("none"), args.requests, c), base))
            for signal in args.signals:
                own = _client_reads(args.upstream, tokenizer, signal)
                client = await _load(lambda i: own(up, i), args.requests, c)
                rows.append((f"client + {signal} reads", c, client, None))
                rows.append((f"gateway, {signal}", c, await _load(via_gateway(signal), args.requests, c), client))
    return rows


def main(argv=None) -> int:
    from hf_calibration.cli import script_parser
    from hf_calibration.modeling.backends import load_tokenizer
    from hf_calibration.modeling.backends.launch import free_port

    parser = script_parser("bench_gateway.py", __doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="the vLLM server's URL, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--requests", type=int, default=64, help="requests per measurement")
    parser.add_argument("--in-flight", type=int, nargs="+", default=[1, 8, 32], help="concurrency levels")
    parser.add_argument("--signals", nargs="+", default=list(SIGNALS), choices=SIGNALS, help="signals to measure")
    args = parser.parse_args(argv)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-m", "hf_calibration.cli", "serve", "--upstream", args.upstream,
                             "--model", MODEL, "--port", str(port), "--max-in-flight", "64"], env=env)
    gateway = f"http://127.0.0.1:{port}/v1"
    try:
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
                break
            except httpx.TransportError:
                if proc.poll() is not None:
                    raise SystemExit("the gateway exited before serving")
                time.sleep(0.5)
        rows = asyncio.run(_measure(args, gateway, load_tokenizer(MODEL)))
    finally:
        proc.terminate()
        proc.wait(30)
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
    print(f"{'path':28s} {'in flight':>9s} {'p50 s':>8s} {'p95 s':>8s} {'req/s':>7s} {'p50 ratio':>9s} {'rps ratio':>9s}")
    for name, c, m, ref in rows:
        ratio = f"{m['p50'] / ref['p50']:9.3f} {ref['rps'] / m['rps']:9.3f}" if ref else f"{'':9s} {'':9s}"
        print(f"{name:28s} {c:9d} {m['p50']:8.3f} {m['p95']:8.3f} {m['rps']:7.2f} {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
