"""What a SECL stream run (``jobs.secl_stream.run_secl_stream``) keeps while it runs, so that a run that stops
(killed, out of time, Ctrl-C) resumes at the question it stopped at instead of starting over.

The file format and the run lock of the stream job; the evaluation passes (``evaluation.stream``) know nothing of
it: each takes a resume point (``start``) and a per-question callback (``on_record``), and
``jobs.secl_stream`` connects them to this checkpoint in one place (``KeptPasses``).

``StreamCheckpoint`` is one hidden folder beside the result folder (``outputs.partial_path(output_dir, "secl")``
without the ``.jsonl``; a run that stops leaves the result folder as it was):

- ``run.json``: the run's fingerprint (``modeling.backends.checkpoint.fingerprint`` of the model, stream, sizes,
  seed, SECL config, … and the exact token-id prompts). Nothing from another run is ever mixed in: a folder with
  another fingerprint is emptied when a run starts, and if it keeps finished questions the run is refused unless
  ``overwrite`` (``StreamCheckpoint.start``).
- ``baseline.jsonl``: one baseline-pass record per finished question, appended as it finishes.
- ``<key>.jsonl`` and ``<key>.pt`` per SECL pass (``secl_key``): the fields the pass added to each finished question
  (appended), and after each question the pass's state: the adapter's weights, AdamW's state, the entropy gate, the
  open burst, the counters, the replay buffer (``ReplayBuffer.state_dict``) and how many questions it covers,
  written to a temporary file and renamed (atomic). Lines past that count (a question finished after the last
  state was written) are dropped on resume.
- ``<key>_final.jsonl``: the final-adapter reads (``evaluation.stream.final_adapter_pass``) after the passes, one
  line per question, each with the digest of the adapter it was read with (``adapter_digest``); lines read with
  another adapter (the pass was run again) are dropped.

Each line holds its JSON text and that text's sha256: a line cut or changed after it was written ends what is kept
there. A state file that cannot be read makes its pass start over. Floats are written as JSON writes Python floats
(``repr``, NaN as ``NaN``), so records read back bit-for-bit. A resumed SECL pass continues with the saved adapter
and optimizer; the replayed questions' caches of prompt and answer are recomputed with the adapter off
(``SECLGenerationMixin.secl_answer_context``) instead of taken from ``generate``'s cache. That is a float rounding
difference in each replayed read, which later update steps carry on: without replay a resumed run is bit-identical
to one that never stopped; with replay (tiny test model, learning rate 0.1) its confidences differed by up to 5e-5.
The fingerprint covers the model's weights (``weights_fingerprint``), so a different model under the same name or
path starts over. ``RunLock`` keeps two runs from writing into one output folder at once (``.<name>.secl.lock``
beside it, a ``filelock.FileLock`` held while the run lives, on POSIX and Windows alike).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import torch

from hf_calibration.errors import ParameterError
from hf_calibration.evaluation.stream import SECLResume
from hf_calibration.modeling.backends.checkpoint import fingerprint
from hf_calibration.runtime.outputs import partial_path

RUN_FILE = "run.json"
BASELINE_FILE = "baseline.jsonl"


def _default(value):
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)  # NaN stays NaN (json writes it as NaN and reads it back)
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _dumps(obj) -> str:
    return json.dumps(obj, default=_default)


def _line(obj) -> str:
    """One kept line: the object's JSON and its sha256, so a line changed or cut after it was written is seen."""
    text = _dumps(obj)
    return _dumps({"sha256": hashlib.sha256(text.encode()).hexdigest(), "value": text})


def _parsed(line: str):
    """The object of a line ``_line`` wrote; ValueError when it does not parse or its hash does not match."""
    wrapped = json.loads(line)
    if not isinstance(wrapped, dict) or not isinstance(wrapped.get("value"), str) or hashlib.sha256(
            wrapped["value"].encode()).hexdigest() != wrapped.get("sha256"):
        raise ValueError("not a kept line")
    return json.loads(wrapped["value"])


def _kept_lines(path: Path, n: int | None = None, *, trim: bool = True) -> list:
    """The lines of ``path`` up to the first one that does not parse or whose hash does not match (a torn last line
    of a killed run, a line changed by hand), at most ``n``; with ``trim`` the file is rewritten to hold exactly
    those, so the lines appended next follow them (without: read only, to count another run's lines)."""
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    out = []
    for line in lines[:n]:
        try:
            out.append(_parsed(line))
        except ValueError:
            break
    if trim and len(out) < len(lines):
        path.write_text("".join(line + "\n" for line in lines[: len(out)]), encoding="utf-8")
    return out


def _append(path: Path, obj) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(_line(obj) + "\n")


def _load_state(path: Path):
    """(tensors, state) of a pass's state file, or None when it is missing or cannot be read (cut, overwritten)."""
    if not path.is_file():
        return None
    try:
        saved = torch.load(path, weights_only=True)
        return saved, json.loads(saved["state"])
    except Exception:  # noqa: BLE001  (any unreadable file: the pass starts over, as with none)
        return None


class RunLock:
    """An exclusive, non-blocking file lock (``filelock.FileLock``: ``flock`` on POSIX, ``msvcrt.locking`` on
    Windows) on ``<parent>/.<name>.secl.lock`` for a run writing into ``output_dir``, held until ``release`` or
    until the process ends (the operating system drops it then, also on a kill). The holder's process id is kept
    beside it in ``.<name>.secl.pid``. ParameterError naming output_dir (with the holder's process id) when another
    run holds it."""

    def __init__(self, output_dir):
        import filelock

        self.path = partial_path(output_dir, "secl").with_suffix("").with_suffix(".lock")
        self.pid_path = self.path.with_suffix(".pid")
        self._lock = filelock.FileLock(self.path, timeout=0)
        try:
            self._lock.acquire()
        except filelock.Timeout:
            try:
                holder = self.pid_path.read_text(encoding="utf-8").strip() or "?"
            except OSError:  # the holder has not written it yet, or has just released
                holder = "?"
            raise ParameterError("output_dir", str(output_dir), f"another run (process {holder}) is writing into "
                                 f"{{output_dir}} {str(output_dir)!r} (lock {str(self.path)!r}); wait for it to end "
                                 "or choose another folder") from None
        except OSError:  # an unwritable parent: StreamCheckpoint.start names it
            self._lock = None
            return
        self.pid_path.write_text(f"{os.getpid()}\n", encoding="utf-8")

    def release(self) -> None:
        """Drop the lock and its files (the run is over)."""
        if self._lock is not None:
            self.pid_path.unlink(missing_ok=True)
            self._lock.release()
            self.path.unlink(missing_ok=True)
            self._lock = None


class StreamCheckpoint:
    """The kept questions of one stream run (module docstring) in ``folder``.

    key : the run's fingerprint (``for_output`` computes it). The process that starts the run calls ``start``; a
    worker process running one of its passes builds the same checkpoint from ``folder`` and ``key``.
    """

    def __init__(self, folder, key: str):
        self.folder, self.key = Path(folder), key
        self._held: dict = {}  # what ``kept_counts`` read, for the first ``baseline``/``resume_pass`` to take

    @classmethod
    def for_output(cls, output_dir, run: dict, prompts) -> "StreamCheckpoint":
        """The checkpoint of a run writing into ``output_dir`` (``.<name>.secl.partial`` beside it); run : the run's
        identity (JSON-serialisable); prompts : the stream's token-id prompts, in order."""
        return cls(partial_path(output_dir, "secl").with_suffix(""), fingerprint(run, [list(p) for p in prompts], []))

    def start(self, overwrite: bool = False) -> None:
        """Keep the folder if it is this run's, else empty it and mark it as this run's.

        Raises ParameterError (naming ``output_dir`` and ``overwrite``) instead of emptying it when it keeps
        finished questions of another run (another model, stream or setting) and ``overwrite`` is False: a rerun
        with one option changed would otherwise drop hours of another run's progress without a word."""
        path = self.folder / RUN_FILE
        try:
            ours = json.loads(path.read_text(encoding="utf-8")).get("fingerprint") == self.key
        except (OSError, ValueError, AttributeError):
            ours = False
        if ours:
            return
        kept = len(_kept_lines(self.folder / BASELINE_FILE, trim=False)) if self.folder.is_dir() else 0
        if kept and not overwrite:
            raise ParameterError("output_dir", str(self.folder.parent), f"{str(self.folder)!r} beside {{output_dir}} "
                                 f"keeps {kept} finished questions of another run (another model, stream or "
                                 "setting): rerun that run's command to resume it, or pass {overwrite} to drop them",
                                 related=("overwrite",))
        try:
            if self.folder.is_file() or self.folder.is_symlink():
                self.folder.unlink()
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"fingerprint": self.key}) + "\n", encoding="utf-8")
        except OSError as err:
            raise ParameterError("output_dir", str(self.folder.parent), f"cannot keep the run's progress in "
                                 f"{str(self.folder)!r} beside {{output_dir}} ({err.strerror or err}); choose a "
                                 "folder whose parent is writable") from err

    def remove(self) -> None:
        """Drop the folder (the run's results are in place)."""
        shutil.rmtree(self.folder, ignore_errors=True)

    def kept_counts(self, keys, *, hold_passes: bool = True) -> dict:
        """How many questions the baseline pass and each SECL pass of ``keys`` will resume from ({"baseline": n,
        key: n, …}), each file read once: what is read here is held for this object's first ``baseline`` and
        ``resume_pass(key)`` to take instead of reading the files again (the run's start-up). hold_passes : False
        where the SECL passes run in other processes (they read their own), so their states are not held here."""
        self._held = {"baseline": _kept_lines(self.folder / BASELINE_FILE)}
        counts = {"baseline": len(self._held["baseline"])}
        for key in keys:
            done, loaded = self._pass(key)
            counts[key] = len(done)
            if hold_passes:
                self._held[key] = (done, loaded)
        return counts

    # -- the baseline pass ----------------------------------------------------------------------------------------
    def baseline(self) -> list[dict]:
        """The baseline records kept, in stream order."""
        if "baseline" in self._held:
            return self._held.pop("baseline")
        return _kept_lines(self.folder / BASELINE_FILE)

    def add_baseline(self, record: dict) -> None:
        _append(self.folder / BASELINE_FILE, record)

    # -- a SECL pass ------------------------------------------------------------------------------------------------
    def resume_pass(self, key: str) -> SECLResume | None:
        """Where the SECL pass ``key`` resumes (``evaluation.stream.secl_pass(start=...)``): the fields it kept per
        question ({"fields": …, "passes": …}) and the model's ``secl_snapshot()`` after the last of them (adapter,
        optimizer, gate, open burst, counters, replay buffer); None (the pass's files removed) when the pass has kept
        nothing it can resume from: no state, a state file that cannot be read, or fewer intact lines than the state
        covers."""
        done, loaded = self._held.pop(key) if key in self._held else self._pass(key)
        if not done:
            return None
        saved, state = loaded
        state = {name: value for name, value in state.items() if name != "n"}
        return SECLResume(done=done, snapshot={"adapter": saved["adapter"],
                                               "state": {**state, "optimizer": saved["optimizer"]}})

    def _pass(self, key: str) -> tuple[list, tuple | None]:
        """(kept fields, (tensors, state)) of the SECL pass ``key``; ([], None), its files removed, when it cannot
        resume."""
        path, lines = self.folder / f"{key}.pt", self.folder / f"{key}.jsonl"
        loaded = _load_state(path)
        done = _kept_lines(lines, loaded[1]["n"]) if loaded is not None else []
        if loaded is None or not done or len(done) < loaded[1]["n"]:  # the lines are written before the state
            path.unlink(missing_ok=True)
            lines.unlink(missing_ok=True)
            return [], None
        return done, loaded

    def kept(self, key: str) -> int:
        """How many questions the SECL pass ``key`` will resume from (0: it starts over)."""
        return len(self._pass(key)[0])

    # -- the final-adapter reads ---------------------------------------------------------------------------------
    def finals(self, key: str, adapter: str, n: int) -> list[float]:
        """The final-adapter reads of the SECL pass ``key`` kept for the adapter whose ``adapter_digest`` is
        ``adapter``, in stream order, at most ``n`` (the stream's length); [] (the file removed) when they were read
        with another adapter. A line that is not the next question's read (its index) or whose confidence is not a
        number in [0, 1] ends what is kept, as a torn line does (the file is cut there)."""
        path = self.folder / f"{key}_final.jsonl"
        kept = _kept_lines(path, n)
        if any(not isinstance(line, dict) or line.get("adapter") != adapter for line in kept):
            path.unlink(missing_ok=True)
            return []
        out = []
        for i, line in enumerate(kept):
            c = line.get("confidence")
            if line.get("index") != i or isinstance(c, bool) or not isinstance(c, (int, float)) or not 0 <= c <= 1:
                break
            out.append(float(c))
        if len(out) < len(kept):
            path.write_text("".join(_line(line) + "\n" for line in kept[: len(out)]), encoding="utf-8")
        return out

    def add_final(self, key: str, adapter: str, index: int, confidence: float) -> None:
        _append(self.folder / f"{key}_final.jsonl", {"adapter": adapter, "index": index, "confidence": confidence})

    def save_pass(self, key: str, done: dict, n: int, snapshot: dict) -> None:
        """Keep one more question of the SECL pass ``key``: its fields ``done`` (appended) and the pass's state after
        it, ``snapshot`` (``SECLModel.secl_snapshot()``: adapter and SECL state), covering the first ``n`` questions
        (written atomically)."""
        _append(self.folder / f"{key}.jsonl", done)
        state = dict(snapshot["state"])
        optimizer = state.pop("optimizer")
        saved = {"adapter": snapshot["adapter"], "optimizer": optimizer, "state": _dumps({"n": n, **state})}
        path = self.folder / f"{key}.pt"
        tmp = path.with_name(path.name + ".tmp")
        torch.save(saved, tmp)
        os.replace(tmp, path)


def adapter_digest(model) -> str:
    """sha256 of the SECL adapter's exact weights (names, shapes, bytes): the final-adapter reads kept for one adapter
    are never taken for another's."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.secl_adapter_state().items()):
        value = tensor.detach().cpu().contiguous()
        digest.update(f"{name}|{tuple(value.shape)}|{value.dtype};".encode())
        digest.update(value.numpy().tobytes())
    return digest.hexdigest()


def weights_fingerprint(model) -> str:
    """sha256 over every parameter's name, shape, sum and sum of absolute values (float64): a model whose weights
    differ (another checkpoint under the same name or path) gets another fingerprint. One pass over the weights."""
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, p in model.named_parameters():
            v = p.detach().double()
            digest.update(f"{name}|{tuple(p.shape)}|{float(v.sum())!r}|{float(v.abs().sum())!r};".encode())
    return digest.hexdigest()
