"""SECL's per-question step, once: gate → burst → pseudo-label → bin gate → update (docs/methods.md, "SECL";
Hedna et al. 2026, arXiv 2604.09624; docs/architecture.md, "SECL").

``secl_step(state, reads, question)`` advances one stream's ``SECLState`` by one answered question and returns its
``SECLRecord``. What it decides (the gate, the burst, the bin gate, the replay buffer, the counters) is here; what it
reads from a model or trains is asked of ``reads``, an ``SECLReads``:

- ``reads.ModelReads``: in process, on a ``SECLModel``. Every read is a ``TransformersBackend`` cached read
  (``SECLGenerationMixin.secl_reads``: ``CachedPrefixReads`` starting from ``generate``'s key/value cache of the
  prompt and the answer), and the update steps train the model's adapter.
- ``service.ServedReads``: the reads through an ``OpenAICompatibleBackend`` (``ScoringBackend``), the update steps
  on the service's local trainer, the adapter hot-swapped into the server.

A gateway drives it the same way: one ``SECLState`` per tenant, ``secl_step`` per answered question.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Sequence

from hf_calibration.secl.burst import bin_gate_passes
from hf_calibration.secl.replay import ReplayItem, directional_target
from hf_calibration.secl.state import SECLState


def answer_length(token_ids: Sequence[int], stop_ids) -> int:
    """How many of ``token_ids`` form the answer: up to (not including) the first token in ``stop_ids`` (end of
    sequence or padding), else all of them."""
    return next((j for j, t in enumerate(token_ids) if t in stop_ids), len(token_ids))


@dataclass
class SECLQuestion:
    """One answered question of a stream. prompt, answer_ids : token ids (the answer without its end-of-turn token);
    entropy : the answer's mean next-token entropy (nats), the gate's input; choices : the MCQA option texts in
    letter order, or None; distractors : alternative answers (str), or None (neither: beam-search alternatives,
    in process only)."""

    prompt: list
    answer_ids: list
    entropy: float
    choices: list | None = None
    distractors: list | None = None


@dataclass
class SECLRecord:
    """What one step did. ``to_dict()`` gives the JSON record (the keys ``SECLModel.secl_records`` and the service's
    ``stream.json`` have always had).

    confidence : the confidence returned for the answer, in [0, 1] (the verbalized read, or c* in a burst with
    ``burst_confidence`` "teacher"); verbalized, verbalized_greedy : the verbalized read (mean, greedy); entropy :
    the gate's input (nats); alarm : the gate fired; in_burst : a burst question; p_true, norm_p_true : P(True) of
    the answer and c* (burst questions, else None); n_distractors; skipped_by_bin_gate, updated; target : ĉ of the
    update (else None); confidence_after : the read after the update (else ``confidence``'s read); replayed : the
    stream indices replayed per update step; consolidation : {questions, steps, forward_passes} when the burst
    ended with consolidation epochs, else None; forward_passes : the step's logical forward passes.
    answer_ids, entropy_gap, adapter : set by a served step (the answer, how far the served top-k entropy can lie
    below the exact one, the served adapter name it was read with or None for the base model); None in process.
    """

    confidence: float
    verbalized: float
    verbalized_greedy: float
    entropy: float
    alarm: bool = False
    in_burst: bool = False
    p_true: float | None = None
    norm_p_true: float | None = None
    skipped_by_bin_gate: bool = False
    updated: bool = False
    target: float | None = None
    confidence_after: float | None = None
    n_distractors: int = 0
    replayed: list = field(default_factory=list)
    consolidation: dict | None = None
    forward_passes: int = 0
    answer_ids: list | None = None
    entropy_gap: float | None = None
    adapter: str | None = None

    def __post_init__(self):
        if self.confidence_after is None:
            self.confidence_after = self.confidence

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in ("confidence", "verbalized", "verbalized_greedy", "entropy", "alarm",
                                             "in_burst", "p_true", "norm_p_true", "skipped_by_bin_gate", "updated",
                                             "target", "confidence_after", "n_distractors", "replayed")}
        if self.answer_ids is not None:  # a served record
            out.update(answer_ids=self.answer_ids, entropy_gap=self.entropy_gap, adapter=self.adapter)
        if self.consolidation is not None:
            out["consolidation"] = self.consolidation
        out["forward_passes"] = self.forward_passes
        return out


class SECLReads(ABC):
    """The model reads and training one SECL step asks for (module docstring). ``passes``: logical forward passes,
    counted as ``confidence.py`` counts them."""

    @abstractmethod
    def verbalized(self, question: SECLQuestion) -> tuple[float, float, int]:
        """(c, greedy, passes): the verbalized confidence of the answer with the stream's current adapter."""

    @abstractmethod
    def restated(self, question: SECLQuestion) -> str:
        """The answer as the confidence turn restates it (``SECLConfig.restate``)."""

    @abstractmethod
    def pseudo_label(self, question: SECLQuestion) -> tuple[float, float, int, int]:
        """(P(True) of the answer, c* = P(True)Norm, distractors, passes), read as the teacher reads."""

    def replay_context(self, question: SECLQuestion):
        """What a replay item keeps to read the question again cheaply (in process: the cache of prompt and answer;
        None: read from the token ids)."""
        return None

    @abstractmethod
    def update(self, state: SECLState, item: ReplayItem) -> tuple[int, list]:
        """The ``steps_per_update`` update steps on ``item`` (its target set) with minibatches from
        ``state.replay`` and ``state``'s optimizer; ``item`` then joins the buffer. → (passes, replayed indices)."""

    @abstractmethod
    def confidence_after(self, state: SECLState, item: ReplayItem) -> float:
        """The verbalized confidence of ``item`` with the adapter just updated (for the record)."""

    @abstractmethod
    def consolidate(self, state: SECLState) -> dict:
        """The consolidation epochs over ``state.replay`` at the end of a burst → {questions, steps, forward_passes}."""


def secl_step(state: SECLState, reads: SECLReads, question: SECLQuestion, *, update: bool = True) -> SECLRecord:
    """One question of a stream through SECL (module docstring): the verbalized read; with ``update``, the gate,
    and inside a burst the pseudo-label, the bin gate and the update steps, and the consolidation when the burst
    ends. ``state`` is advanced in place (with ``update`` False it is not touched: a read only). Returns the record."""
    c, greedy, passes = reads.verbalized(question)
    passes += 1  # the generation
    record = SECLRecord(confidence=c, verbalized=c, verbalized_greedy=greedy, entropy=question.entropy)
    if update:
        counters = state.counters
        counters["questions"] += 1
        record.alarm = state.gate.update(question.entropy)
        if record.alarm:
            counters["alarms"] += 1
            if state.burst_left == 0:
                state.start_burst()
        if state.burst_left > 0:
            state.burst_left -= 1
            counters["burst_questions"] += 1
            record.in_burst = True
            passes += _burst_item(state, reads, question, c, record)
            if state.burst_left == 0 and state.config.consolidation_epochs:
                record.consolidation = reads.consolidate(state)
                passes += record.consolidation["forward_passes"]
        counters["forward_passes"] += passes
    record.forward_passes = passes
    return record


def _burst_item(state: SECLState, reads: SECLReads, question: SECLQuestion, c: float, record: SECLRecord) -> int:
    """The pseudo-label and, past the bin gate, the update steps; every burst question joins the replay buffer."""
    cfg = state.config
    p_true, c_star, n_distractors, passes = reads.pseudo_label(question)
    record.p_true, record.norm_p_true, record.n_distractors = p_true, c_star, n_distractors
    if cfg.burst_confidence == "teacher":  # docs/methods.md, "SECL: the confidence returned in a burst"
        record.confidence = c_star
    item = ReplayItem(list(question.prompt), list(question.answer_ids), reads.restated(question), c_star,
                      reads.replay_context(question), state.counters["questions"] - 1)
    if not bin_gate_passes(c, c_star, n_bins=cfg.n_bins, width=cfg.bin_gate_width):
        record.skipped_by_bin_gate = True
        state.counters["skipped_by_bin_gate"] += 1
        state.replay.add(item)
        return passes
    item.target = record.target = directional_target(c, c_star, alpha_step=cfg.alpha_step, delta=cfg.delta)
    steps, record.replayed = reads.update(state, item)
    state.counters["updates"] += 1
    record.updated = True
    record.confidence_after = reads.confidence_after(state, item)
    return passes + steps
