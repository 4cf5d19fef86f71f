"""The gateway on 127.0.0.1 for the tests: uvicorn in a thread of the test process (``running_gateway``) or as
``hf-calibration serve`` in a subprocess (``serve_process``), and a TCP relay that plays an upstream that goes away
and comes back (``Relay``). The upstream is the session's real vLLM server (tests/conftest.py)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 120  # imports and the tokenizer on 2 shared cores; a bound, not a measurement


@contextmanager
def running_gateway(config, *, tokenizer=None, stepper=None):
    """``create_app(config)`` served by uvicorn in a thread on a free port of 127.0.0.1 → its base URL (…/v1)."""
    import uvicorn

    from hf_calibration.gateway.app import create_app
    from hf_calibration.modeling.backends.launch import free_port

    app = create_app(config, tokenizer=tokenizer, stepper=stepper)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "the gateway did not start within 30 s"
    try:
        yield f"http://127.0.0.1:{port}/v1", app.state.gateway
    finally:
        server.should_exit = True
        thread.join(30)


@contextmanager
def serve_process(args: list[str], *, log: Path):
    """``hf-calibration serve ARGS --port P`` in its own process group → (base URL, Popen); stopped by SIGKILL to
    the group when the block ends (the test may stop it earlier)."""
    import signal

    from hf_calibration.modeling.backends.launch import free_port

    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "hf_calibration.cli", "serve", *args, "--port", str(port)],
                                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"serve exited with {proc.returncode}: {log.read_text()[-2000:]}"
            try:
                httpx.get(f"{url}/metrics", timeout=2)
                break
            except httpx.TransportError:
                time.sleep(0.5)
        else:
            raise AssertionError(f"serve did not answer within {START_TIMEOUT_S} s")
        yield f"{url}/v1", proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


class Relay:
    """A TCP relay on 127.0.0.1:``port`` to ``target`` (host, port), in its own event-loop thread: ``stop()`` closes
    the listener and every open connection (the upstream as a client sees it when the server dies), ``start()``
    listens again on the same port."""

    def __init__(self, target: tuple[str, int], port: int):
        self.target, self.port = target, port
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self._server, self._writers = None, set()

    async def _pipe(self, reader, writer):
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _handle(self, reader, writer):
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self._writers |= {writer, up_writer}
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    def start(self) -> None:
        async def go():
            self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port, reuse_address=True)
        asyncio.run_coroutine_threadsafe(go(), self.loop).result(10)

    def stop(self) -> None:
        async def go():
            self._server.close()
            for w in list(self._writers):
                w.transport.abort()
            self._writers.clear()
        asyncio.run_coroutine_threadsafe(go(), self.loop).result(10)

    def close(self) -> None:
        self.stop()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
