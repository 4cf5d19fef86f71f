"""Scores kept while a server scores, so a server that dies mid-run loses no scored question.

``ScoreCheckpoint`` is one JSON-lines file: a header line with the run's fingerprint, then one line per finished
prompt (its pass's fingerprint, its read log-probabilities, the most likely next token and its log-probability,
floats written as ``repr`` writes them, so they read back bit-for-bit). ``base.read_next_tokens`` (the read loop of
every backend, in process or served) sends only the prompts the file does not hold, appends each call's reads as
soon as they arrive, and when the server stops answering (``ServerError`` after the backend's retries) re-raises
it saying how many prompts are kept and that the same run resumes (``ScoreCheckpoint.interrupted``).

The fingerprints cover the run's identity the job records (model, served model, dataset, subjects, limit, seed,
prompt format, …) and, per pass, a hash of the exact token-id prompts and read ids, so a file from any other run, or from
the same options over other data or another tokenizer, is never mixed in. ``claim`` refuses to start over a file
that keeps another run's scores unless told to drop them (``overwrite``).
"""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import Sequence

from hf_calibration.errors import ParameterError
from hf_calibration.modeling.backends.base import ServerError, ServerUnreachable


def fingerprint(run: dict, prompts: Sequence[Sequence[int]], token_ids: Sequence[int]) -> str:
    """sha256 hex of ``run`` (JSON, sorted keys) and the exact prompts and read ids."""
    digest = hashlib.sha256(json.dumps(run, sort_keys=True, default=str).encode())
    for row in prompts:
        digest.update(b"|" + ",".join(map(str, row)).encode())
    digest.update(b"#" + ",".join(map(str, token_ids)).encode())
    return digest.hexdigest()


class ScoreCheckpoint:
    """The kept scores of one run at ``path`` (a JSON-lines file; its folder is created on the first write).

    run : the run's identity (JSON-serialisable). The header line holds its fingerprint; a file with another
    run's header is replaced at the first write. Each record carries the fingerprint of its pass (the run and
    that pass's exact prompts and read ids), so a job reading several passes keeps each one apart.
    """

    def __init__(self, path, run: dict):
        self.path, self.run = Path(path), dict(run)
        self.key = fingerprint(self.run, [], [])
        self._lock, self._started = threading.Lock(), False

    def _lines(self) -> list[str]:
        """The file's lines when its header is this run's, else none."""
        if not self.path.is_file():
            return []
        lines = self.path.read_text(encoding="utf-8").splitlines()
        return lines if self._is_ours(lines) else []

    def _is_ours(self, lines: list[str]) -> bool:
        """Whether ``lines`` (a file's) start with this run's header."""
        try:
            return json.loads(lines[0]).get("fingerprint") == self.key
        except (ValueError, IndexError, AttributeError):
            return False

    def claim(self, *, overwrite: bool = False) -> None:
        """Check, before any prompt is sent, that the file at ``path`` is this run's or holds nothing.

        Raises ParameterError naming ``output_dir`` and ``overwrite`` when it keeps scored prompts of another run
        (another model, data or setting) and ``overwrite`` is False: a rerun with one option changed would
        otherwise drop the other run's server time without a word. With ``overwrite`` that file is deleted.
        """
        if not self.path.is_file():
            return
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError):
            lines = []
        if self._is_ours(lines):
            return
        kept = sum(1 for line in lines[1:] if line.strip())
        if kept and not overwrite:
            raise ParameterError("output_dir", str(self.path.parent), f"{str(self.path)!r} beside {{output_dir}} "
                                 f"keeps {kept} scored prompts of another run (another model, data or setting): "
                                 "rerun that run's command to resume it, or pass {overwrite} to drop them",
                                 related=("overwrite",))
        self.path.unlink(missing_ok=True)

    def kept(self, key: str) -> dict[int, tuple[list[float], int, float]]:
        """Prompt index → (log-probabilities, top id, top log-probability) kept for the pass fingerprinted ``key``;
        empty when the file is missing or holds another run (a torn last line, from a killed process, is
        skipped)."""
        out = {}
        for line in self._lines()[1:]:
            try:
                rec = json.loads(line)
                if rec["k"] == key:
                    out[int(rec["i"])] = ([float(v) for v in rec["lp"]], int(rec["top"]), float(rec["top_lp"]))
            except (ValueError, KeyError, TypeError):
                continue
        return out

    def append(self, key: str, index: int, logprobs, top_id: int, top_logprob: float) -> None:
        """Keep prompt ``index`` of pass ``key``; the first write of this object replaces another run's file."""
        line = json.dumps({"k": key, "i": int(index), "lp": [float(v) for v in logprobs], "top": int(top_id),
                           "top_lp": float(top_logprob)})
        with self._lock:
            if not self._started and not self._lines():
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self.path.write_text(json.dumps({"fingerprint": self.key, "run": self.run}, default=str) + "\n",
                                     encoding="utf-8")
            self._started = True
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(line + "\n")
                f.flush()

    def pass_key(self, prompts: Sequence[Sequence[int]], token_ids: Sequence[int]) -> str:
        """The fingerprint of one pass of this run: the run, the exact prompts and the read ids."""
        return fingerprint(self.run, prompts, token_ids)

    def append_many(self, key: str, reads) -> None:
        """``append`` each ``(index, (logprobs, top_id, top_logprob))`` of ``reads`` (one call's prompts)."""
        for index, (logprobs, top_id, top_logprob) in reads:
            self.append(key, index, logprobs, top_id, top_logprob)

    def interrupted(self, error: Exception, kept: int, total: int, what: str) -> Exception:
        """The exception to raise for ``error`` after ``kept`` of ``total`` prompts (``what`` they are) were kept: a
        ServerError says so and that the same command resumes; any other error is returned as it is."""
        if not isinstance(error, ServerError):
            return error
        kind = ServerUnreachable if isinstance(error, ServerUnreachable) else ServerError
        return kind(error.parameter, error.value,
                           f"{error.reason}; the {kept} of {total} {what} scored so far are kept in "
                           f"{str(self.path)!r}: run the same command again to resume", related=error.related)

    def remove(self) -> None:
        """Delete the file (the run finished and its results are written)."""
        self.path.unlink(missing_ok=True)
