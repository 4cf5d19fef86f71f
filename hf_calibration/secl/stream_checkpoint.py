"""What a SECL stream run (``jobs.secl_stream.run_secl_stream``) keeps while it runs, so that a run that stops
(killed, out of time, Ctrl-C) resumes at the question it stopped at instead of starting over.

``StreamCheckpoint`` is one hidden folder beside the result folder (``outputs.partial_path(output_dir, "secl")``
without the ``.jsonl``; a run that stops leaves the result folder as it was):

- ``run.json``: the run's fingerprint (``modeling.backends.checkpoint.fingerprint`` of the model, stream, sizes,
  seed, SECL config, … and the exact token-id prompts). A folder with another fingerprint is emptied when a run
  starts: nothing from another run is ever mixed in.
- ``baseline.jsonl``: one baseline-pass record per finished question, appended as it finishes.
- ``<key>.jsonl`` and ``<key>.pt`` per SECL pass (``secl_key``): the fields the pass added to each finished question
  (appended), and after each question the pass's state: the adapter's weights, AdamW's state, the entropy gate, the
  open burst, the counters, the replay buffer (``ReplayBuffer.state_dict``) and how many questions it covers,
  written to a temporary file and renamed (atomic). Lines past that count (a question finished after the last
  state was written) are dropped on resume.

Floats are written as JSON writes Python floats (``repr``, NaN as ``NaN``), so records read back bit-for-bit. A
resumed SECL pass continues with the saved adapter and optimizer; the replayed questions' caches of prompt and answer
are recomputed with the adapter off (``SECLGenerationMixin._secl_answer_context``) instead of taken from
``generate``'s cache, which changes the confidence a replayed question reads by float rounding only.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import torch

from hf_calibration.modeling.backends.checkpoint import fingerprint
from hf_calibration.outputs import partial_path
from hf_calibration.secl.drift import gate_state_from_json, gate_state_to_json

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


def _kept_lines(path: Path, n: int | None = None) -> list:
    """The JSON lines of ``path`` up to the first one that does not parse (a torn last line of a killed run), at
    most ``n``; the file is rewritten to hold exactly those, so the lines appended next follow them."""
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    out = []
    for line in lines[:n]:
        try:
            out.append(json.loads(line))
        except ValueError:
            break
    if len(out) < len(lines):
        path.write_text("".join(line + "\n" for line in lines[: len(out)]), encoding="utf-8")
    return out


def _append(path: Path, obj) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(_dumps(obj) + "\n")


class StreamCheckpoint:
    """The kept questions of one stream run (module docstring) in ``folder``.

    key : the run's fingerprint (``for_output`` computes it). The process that starts the run calls ``start``; a
    worker process running one of its passes builds the same checkpoint from ``folder`` and ``key``.
    """

    def __init__(self, folder, key: str):
        self.folder, self.key = Path(folder), key

    @classmethod
    def for_output(cls, output_dir, run: dict, prompts) -> "StreamCheckpoint":
        """The checkpoint of a run writing into ``output_dir`` (``.<name>.secl.partial`` beside it); run : the run's
        identity (JSON-serialisable); prompts : the stream's token-id prompts, in order."""
        return cls(partial_path(output_dir, "secl").with_suffix(""), fingerprint(run, [list(p) for p in prompts], []))

    def start(self) -> None:
        """Keep the folder if it is this run's, else empty it and mark it as this run's."""
        path = self.folder / RUN_FILE
        try:
            ours = json.loads(path.read_text(encoding="utf-8")).get("fingerprint") == self.key
        except (OSError, ValueError, AttributeError):
            ours = False
        if not ours:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"fingerprint": self.key}) + "\n", encoding="utf-8")

    def remove(self) -> None:
        """Drop the folder (the run's results are in place)."""
        shutil.rmtree(self.folder, ignore_errors=True)

    # -- the baseline pass ----------------------------------------------------------------------------------------
    def baseline(self) -> list[dict]:
        """The baseline records kept, in stream order."""
        return _kept_lines(self.folder / BASELINE_FILE)

    def add_baseline(self, record: dict) -> None:
        _append(self.folder / BASELINE_FILE, record)

    # -- a SECL pass ------------------------------------------------------------------------------------------------
    def resume_pass(self, model, key: str) -> list[dict]:
        """Put the state the SECL pass ``key`` saved into ``model`` (adapter, optimizer, gate, open burst, counters,
        replay buffer) and return the fields it kept per question ({"fields": …, "passes": …}); [] (model untouched)
        when the pass has kept nothing."""
        from peft import set_peft_model_state_dict

        from hf_calibration.secl.mixin import ADAPTER_NAME

        path, lines = self.folder / f"{key}.pt", self.folder / f"{key}.jsonl"
        saved = torch.load(path, weights_only=True) if path.is_file() else None
        state = json.loads(saved["state"]) if saved is not None else {"n": 0}
        done = _kept_lines(lines, state["n"])
        if len(done) < state["n"] or not done:  # the lines are written before the state: fewer cannot resume
            path.unlink(missing_ok=True)
            lines.unlink(missing_ok=True)
            return []
        set_peft_model_state_dict(model.peft_model, saved["adapter"], adapter_name=ADAPTER_NAME)
        model.secl_adamw = None
        if saved["optimizer"] is not None:
            model.secl_optimizer().load_state_dict(saved["optimizer"])
        model.secl_gate.load_state_dict(gate_state_from_json(state["gate"]))
        model.secl_burst_left, model.secl_counters = state["burst_left"], state["counters"]
        model.secl_replay.load_state_dict(state["replay"])
        return done

    def kept(self, key: str) -> int:
        """How many questions the SECL pass ``key`` has kept (0: none; ``resume_pass`` may still find its lines
        torn and start over)."""
        path = self.folder / f"{key}.pt"
        return json.loads(torch.load(path, weights_only=True)["state"])["n"] if path.is_file() else 0

    def save_pass(self, model, key: str, done: dict, n: int) -> None:
        """Keep one more question of the SECL pass ``key``: its fields ``done`` (appended) and the pass's state after
        it, covering the first ``n`` questions (written atomically)."""
        _append(self.folder / f"{key}.jsonl", done)
        state = {"n": n, "gate": gate_state_to_json(model.secl_gate), "burst_left": model.secl_burst_left,
                 "counters": model.secl_counters, "replay": model.secl_replay.state_dict()}
        saved = {"adapter": {k: v.detach().cpu().clone() for k, v in model.secl_adapter_state().items()},
                 "optimizer": None if model.secl_adamw is None else model.secl_adamw.state_dict(),
                 "state": _dumps(state)}
        path = self.folder / f"{key}.pt"
        tmp = path.with_name(path.name + ".tmp")
        torch.save(saved, tmp)
        os.replace(tmp, path)
