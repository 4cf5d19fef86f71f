"""``SECLState``: everything one SECL stream carries from one question to the next, as one serialisable object
(docs/methods.md, "SECL"; docs/architecture.md, "SECL").

One state per stream: ``SECLModel`` keeps one (``secl_state``), ``SECLService`` one per named stream, a gateway one
per tenant. The per-question step (``secl.step.secl_step``) reads and advances it; nothing else writes its fields.

What it holds: the entropy gate (``drift.EntropyShiftDetector``: EMA and Page-Hinkley state), the questions left in
the open burst, the counters (``COUNTERS``), the replay buffer (``replay.ReplayBuffer``), the adapter version (0: the
identity; a service counts the versions it saved) and the AdamW over the adapter's LoRA weights (made on first use
by ``optimizer``; its state survives ``state_dict`` / ``load_state_dict``). The adapter weights themselves live in
the model (PEFT's adapter) and are saved with it (``SECLModel.secl_snapshot``).

Public API::

    state = SECLState.new(config)          # a fresh stream: identity gate, no burst, zero counters
    state.start_burst()                    # open a burst now (as an alarm does)
    saved = state.state_dict()             # JSON-serialisable except "optimizer" (torch tensors, or None)
    state = SECLState.new(config); state.load_state_dict(saved)   # restore (the optimizer on first use)
    opt = state.optimizer(params)          # the stream's AdamW over these parameters
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from hf_calibration.secl.config import SECLConfig
from hf_calibration.secl.drift import EntropyShiftDetector, gate_state_from_json, gate_state_to_json
from hf_calibration.secl.replay import ReplayBuffer

STATE_NAME = "secl_state.json"
FORMAT_VERSION = 2  # of secl_state.json (2: the replay buffer; 1 is read as an empty one); bump when the layout changes
COUNTERS = ("questions", "alarms", "bursts", "burst_questions", "updates", "skipped_by_bin_gate", "forward_passes")


def new_gate(config: SECLConfig) -> EntropyShiftDetector:
    """The entropy gate ``config`` describes (``ema_rate``, ``ph_delta``, ``ph_threshold``, ``ph_min_instances``,
    ``warmup``), with no value seen."""
    return EntropyShiftDetector(ema_rate=config.ema_rate, delta=config.ph_delta, threshold=config.ph_threshold,
                                min_instances=config.ph_min_instances, warmup=config.warmup)


@dataclass
class SECLState:
    """One stream's SECL state (module docstring). Build with ``SECLState.new(config)``.

    config : the stream's ``SECLConfig`` (not saved by ``state_dict``: the caller keeps it, e.g. in
    ``secl_config.json``). gate, replay, counters, burst_left, version : as the module docstring says.
    """

    config: SECLConfig
    gate: EntropyShiftDetector
    replay: ReplayBuffer
    counters: dict = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    burst_left: int = 0
    version: int = 0
    _adamw: object = field(default=None, repr=False)
    _adamw_state: dict | None = field(default=None, repr=False)

    @classmethod
    def new(cls, config: SECLConfig) -> "SECLState":
        """A fresh stream: the gate with no value seen, no burst, zero counters, an empty replay buffer, no optimizer."""
        return cls(config, new_gate(config), ReplayBuffer(config.replay_size, config.replay_batch_size))

    # -- transitions (called by secl.step, and by a driver that opens a burst at a known shift) ------------------
    def start_burst(self) -> None:
        """Open a calibration burst of ``config.burst_size`` questions now, as an alarm would (e.g. at a known domain
        boundary). An already open burst is extended, not counted again; with ``replay_scope`` "burst" a new burst
        starts with an empty replay buffer."""
        if self.burst_left == 0:
            self.counters["bursts"] += 1
            if self.config.replay_scope == "burst":
                self.replay.clear()  # replay stays within one burst
        self.burst_left = self.config.burst_size

    def reset(self, *, counters: bool = False) -> None:
        """Forget the gate, the open burst, the replay buffer and the optimizer (a new stream on the identity
        adapter); counters : also zero the counters."""
        self.gate.reset()
        self.burst_left = 0
        self.replay.clear()
        self._adamw = self._adamw_state = None
        if counters:
            self.counters = dict.fromkeys(COUNTERS, 0)

    def optimizer(self, params):
        """The stream's AdamW (``config.learning_rate``, no weight decay) over ``params`` (the adapter's LoRA
        weights), made on first use with the state ``load_state_dict`` brought back, if any."""
        if self._adamw is None:
            import torch

            self._adamw = torch.optim.AdamW(list(params), lr=self.config.learning_rate, weight_decay=0.0)
            if self._adamw_state is not None:
                self._adamw.load_state_dict(self._adamw_state)
                self._adamw_state = None
        return self._adamw

    @property
    def has_optimizer(self) -> bool:
        """Whether an AdamW state exists (made, or loaded and not yet made)."""
        return self._adamw is not None or self._adamw_state is not None

    # -- serialisation -------------------------------------------------------------------------------------------
    def state_dict(self, *, optimizer: bool = True) -> dict:
        """{"gate", "burst_left", "counters", "replay", "version"} as JSON can hold them (the gate's infinities as
        None) and, with ``optimizer``, "optimizer": the AdamW's ``state_dict()`` (torch tensors) or None. The
        counters and the gate are copies: the state goes on changing, what was returned does not."""
        out = {"gate": gate_state_to_json(self.gate), "burst_left": self.burst_left, "counters": dict(self.counters),
               "replay": self.replay.state_dict(), "version": self.version}
        if optimizer:
            out["optimizer"] = self._adamw.state_dict() if self._adamw is not None else self._adamw_state
        return out

    def load_state_dict(self, state: dict) -> None:
        """Restore what ``state_dict`` returned (or a ``secl_state.json``: "replay", "version" and "optimizer" may be
        missing, read as empty, 0 and none). The optimizer is rebuilt on its next use (``optimizer``)."""
        self.gate.load_state_dict(gate_state_from_json(state["gate"]))
        self.burst_left = int(state["burst_left"])
        self.counters = {**dict.fromkeys(COUNTERS, 0), **state["counters"]}
        if state.get("replay") is not None:
            self.replay.load_state_dict(state["replay"])
        else:
            self.replay.clear()
        self.version = int(state.get("version", 0))
        self._adamw, self._adamw_state = None, state.get("optimizer")


def write_secl_files(folder, config: SECLConfig, state: SECLState) -> None:
    """Write ``secl_config.json`` (``config``) and ``secl_state.json`` (``state`` without its optimizer: gate, open
    burst, counters, replay buffer without caches, adapter version) into ``folder``: the SECL half of a saved
    adapter folder (``SECLModel.save_pretrained``, a service's adapter versions)."""
    config.save_pretrained(folder)
    saved = {"format_version": FORMAT_VERSION, **state.state_dict(optimizer=False)}
    (Path(folder) / STATE_NAME).write_text(json.dumps(saved, indent=2) + "\n", encoding="utf-8")


def read_secl_state(folder) -> dict:
    """The ``secl_state.json`` that ``save_pretrained`` wrote into ``folder``, checked and ready for the gate.

    Raises FileNotFoundError when it is missing; ValueError when it was written by a newer release
    (``format_version``).
    """
    from hf_calibration.integrations.hub import check_artifact_config

    path = Path(folder) / STATE_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{folder}: no {STATE_NAME} (not a SECL folder)")
    state = json.loads(path.read_text(encoding="utf-8"))
    check_artifact_config(state, kind="SECL state", max_format_version=FORMAT_VERSION, source=str(path))
    state["gate"] = gate_state_from_json(state["gate"])  # JSON has no infinity: save_pretrained writes None
    state.setdefault("replay", ReplayBuffer(0, 0).state_dict())  # format 1 kept no buffer: an empty one
    return state
