"""Per-stream state of the gateway: a stream key per request, each stream's answer records, a background worker
that steps each stream's state with them, atomic saves and resume (docs/gateway.md, "Streams").

The key is the ``X-Calibration-Stream`` header, else the request's ``user`` field, else ``default``. Each answer
with a confidence becomes a record (time, model, signal, raw, calibrated, abstain, calibrator version); the
request handler only appends it to a queue, so a request never waits for a step. One worker thread takes the
records in arrival order and calls the ``StreamStepper``'s one step function,
``step(state, record) -> (state, events)``, on the stream's explicit JSON-serialisable state, then appends the
record to ``<state_dir>/<key>/records.jsonl`` and writes ``state.json`` atomically (temporary file, fsync,
``os.replace``). A restarted gateway reads every ``state.json`` back and continues each stream from it.

``CountingStepper`` (the default) keeps counts and the running mean confidence. A stateful method (SECL's
per-stream state and step, its burst training and LoRA versions) plugs in as another ``StreamStepper``: its state
is stored and resumed here, its ``events`` (a new adapter version, a burst) are returned to the gateway, which
names the stream's adapter in later responses.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import re
import threading
import time
from pathlib import Path
from typing import Protocol

from hf_calibration.errors import ParameterError

HEADER = "X-Calibration-Stream"
DEFAULT_STREAM = "default"
_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def stream_key(header: str | None, user) -> str:
    """The stream a request belongs to: the header's value (1-64 characters: letters, digits, ``.``, ``_``,
    ``-``, not starting with a dot or dash; ParameterError naming the header otherwise), else ``user`` (kept when
    it is such a name, else ``user-`` and 16 hex digits of its SHA-256, so any string maps to one stream), else
    ``default``."""
    if header is not None:
        if not _KEY.match(header):
            raise ParameterError(HEADER, header, f"must be 1-64 letters, digits, '.', '_' or '-' (not starting "
                                 f"with '.' or '-'), got {header[:80]!r}")
        return header
    if isinstance(user, str) and user:
        return user if _KEY.match(user) else "user-" + hashlib.sha256(user.encode()).hexdigest()[:16]
    return DEFAULT_STREAM


class StreamStepper(Protocol):
    """A stateful per-stream method: ``initial_state(key)`` → a JSON-serialisable dict; ``step(state, record)`` →
    (the new state, a dict of events: e.g. ``{"adapter_version": 3, "burst": True}``, empty when none). ``step``
    may take long (a training burst): it runs in the worker thread, never in a request."""

    name: str

    def initial_state(self, key: str) -> dict: ...

    def step(self, state: dict, record: dict) -> tuple[dict, dict]: ...


class CountingStepper:
    """The default stepper: answers, abstentions and the running mean of the calibrated confidence."""

    name = "counting"

    def initial_state(self, key: str) -> dict:
        return {"answers": 0, "abstained": 0, "mean_confidence": None}

    def step(self, state: dict, record: dict) -> tuple[dict, dict]:
        n = state["answers"] + 1
        mean = state["mean_confidence"] or 0.0
        return {"answers": n, "abstained": state["abstained"] + int(bool(record.get("abstain"))),
                "mean_confidence": mean + (record["confidence"] - mean) / n}, {}


def write_json_atomic(path: Path, payload) -> None:
    """``payload`` as JSON at ``path``: a temporary file beside it, flushed to disk, then renamed over it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(payload, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class StreamStore:
    """Every stream's state under ``state_dir`` (None: in memory only), stepped by one worker thread.

    ``submit(key, record)`` queues a record (returns at once); ``state(key)`` is the stream's current state
    with its ``steps`` and ``version`` (the stepper's ``adapter_version`` event, 0 before any);
    ``flush(timeout)`` waits until the queue is empty; ``close()`` stops the worker after the queued records.
    ``on_event(key, state, events)`` is called after each step (metrics)."""

    def __init__(self, state_dir=None, stepper: StreamStepper | None = None, *, on_event=None):
        self.dir = None if state_dir is None else Path(state_dir)
        self.stepper = stepper or CountingStepper()
        self.on_event = on_event
        self._states: dict[str, dict] = {}
        self._lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue()
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._resume()
        self._worker = threading.Thread(target=self._run, name="gateway-streams", daemon=True)
        self._worker.start()

    def _resume(self) -> None:
        for path in sorted(self.dir.glob("*/state.json")):
            try:
                saved = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as err:
                raise ParameterError("state_dir", str(self.dir), f"{str(path)!r} cannot be read back ({err}); "
                                     "move it away to start that stream afresh") from None
            if saved.get("stepper") != self.stepper.name:
                raise ParameterError("state_dir", str(self.dir), f"{str(path)!r} holds {saved.get('stepper')!r} "
                                     f"state, this gateway steps {self.stepper.name!r}")
            self._states[path.parent.name] = saved

    def streams(self) -> list[str]:
        with self._lock:
            return sorted(self._states)

    def state(self, key: str) -> dict:
        with self._lock:
            saved = self._states.get(key)
        if saved is None:
            return {"stream": key, "steps": 0, "version": 0, "state": self.stepper.initial_state(key)}
        return saved

    def submit(self, key: str, record: dict) -> None:
        self._queue.put((key, record))

    def flush(self, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self._queue.unfinished_tasks

    def close(self, timeout: float = 30.0) -> None:
        self._queue.put(None)
        self._worker.join(timeout)
        if hasattr(self.stepper, "close"):
            self.stepper.close()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._step(*item)
            except Exception as err:  # a failed step must not stop the worker: logged, the record kept
                import logging

                logging.getLogger(__name__).exception("stream %s: step failed: %s", item[0], err)
            finally:
                self._queue.task_done()

    def _step(self, key: str, record: dict) -> None:
        current = self.state(key)
        state, events = self.stepper.step(current["state"], record)
        saved = {"stream": key, "stepper": self.stepper.name, "steps": current["steps"] + 1,
                 "version": int(events.get("adapter_version", current["version"])), "state": state}
        if self.dir is not None:
            folder = self.dir / key
            folder.mkdir(exist_ok=True)
            with open(folder / "records.jsonl", "a", encoding="utf-8") as fh:
                fh.write(json.dumps(record) + "\n")
            write_json_atomic(folder / "state.json", saved)
        with self._lock:
            self._states[key] = saved
        if self.on_event is not None:
            self.on_event(key, saved, events)
