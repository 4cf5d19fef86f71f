"""SECL as a service beside a server: one LoRA adapter per stream, trained locally, hot-swapped into the server.

``SECLService(backend, trainer, state_dir)`` runs SECL (``mixin.py``, Hedna et al. 2026) for any number of named
streams against one OpenAI-compatible server (vLLM started with ``--enable-lora --max-lora-rank R`` and
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``; docs/serving.md). Per question of a stream:

- served (``OpenAICompatibleBackend``): the greedy answer and the entropy the gate reads; the verbalized
  confidence, read with the stream's current adapter (its served name, or the base model while it is the
  identity); in a burst, the P(True) teacher reads (with the adapter off in the "confidence" scope, with it in
  the "all" scope, as ``SECLConfig.adapter_scope`` says);
- local (the "trainer": a ``SECLModel``, a transformers + PEFT copy of the base model): the update steps of
  an accepted burst question, the mixin's own ``secl_verbalized`` under MSE(c, ĉ) with AdamW
  (``secl.replay.update_steps``: with ``SECLConfig.replay_size`` > 0 on minibatches with earlier burst questions
  from the stream's own replay buffer), and when a burst ends the consolidation epochs over that buffer
  (``SECLConfig.consolidation_epochs``; docs/methods.md, "SECL: consolidation").

Every read restates the answer as ``SECLConfig.restate`` says (the trainer's ``secl_restated``: the decoded
answer, or for multiple choice "A. <option text>"), as the in-process ``SECLModel`` does.

The server applies a request's LoRA to every token of it, so the served verbalized read is the adapter over
the whole conversation: the mixin's "all"-scope read. The trainer therefore computes that read (its config is
set to the "all" scope; ``SECLService.adapter_scope`` keeps the stream's own scope, which decides only what the
answers and the teacher are read with). In the "all" scope every read equals the in-process ``SECLModel``'s;
in the "confidence" scope the answers and pseudo-labels do (both the base model's), the confidences after the
first update do not (the in-process read runs the adapter over the follow-up turn only, on the base model's
cache, which no server request can express; docs/serving.md).

After each accepted update (``swap="update"``) or at the end of each burst with updates (``swap="burst"``) the
adapter is written with ``save_pretrained`` (PEFT's folder plus ``secl_config.json`` / ``secl_state.json``, and the
AdamW state ``optimizer.pt``) into a temporary folder, renamed to ``<state_dir>/<stream>/v<N>`` (atomic), loaded
by the server as ``<stream>-v<N>`` (``/v1/load_lora_adapter``), and only then used; the previous name is unloaded
(``/v1/unload_lora_adapter``). No request names a version before the server has loaded it whole, and every
version stays on disk. ``<state_dir>/<stream>/stream.json`` (written atomically after every question whose
adapter is saved) holds the gate, counters, open burst, replay buffer, records and the current version: a service
started on the same ``state_dir`` resumes every stream there and has the server load its current adapter.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from hf_calibration.errors import ParameterError
from hf_calibration.secl.confidence import (PLAIN_CONFIDENCE_PREFIX, PLAIN_P_TRUE_PREFIX, norm_p_true,
                                            p_true_from_logprobs, verbalized_from_logprobs)
from hf_calibration.secl.mixin import SECLGenerationMixin, write_secl_files
from hf_calibration.secl.replay import item_confidence
from hf_calibration.secl.state import SECLState
from hf_calibration.secl.step import SECLQuestion, SECLReads, SECLRecord, answer_length, secl_step

SWAP_MODES = ("update", "burst")
STATE_FILE = "stream.json"
OPTIMIZER_FILE = "optimizer.pt"
STATE_FORMAT = 2  # of stream.json (2: the replay buffer; 1 is read as an empty one)


@dataclass
class StreamState:
    """One named stream of the service: its SECL state (``secl``: gate, open burst, counters, replay buffer, adapter
    version, AdamW), its records (``SECLRecord``), the served name of its current adapter version (None: the base
    model, version 0), ``adapter``: its LoRA weights while another stream holds the trainer (None: the identity or
    in the trainer), ``pending``: updated since the last swap."""

    name: str
    secl: SECLState
    records: list = field(default_factory=list)
    served_name: str | None = None
    adapter: dict | None = None
    pending: bool = False

    # read-only views of the state
    @property
    def counters(self) -> dict:
        return self.secl.counters

    @property
    def gate(self):
        return self.secl.gate

    @property
    def replay(self):
        return self.secl.replay

    @property
    def burst_left(self) -> int:
        return self.secl.burst_left

    @property
    def version(self) -> int:
        return self.secl.version


class LoRAAdmin:
    """The server's runtime LoRA endpoints (vLLM), each refusal turned into one line naming the cause, decided from the
    HTTP status and the error's structure (``OpenAICompatibleBackend.post_lora_adapter``, ``lora_refusal``)."""

    def __init__(self, backend):
        self.backend = backend

    def served(self) -> set:
        return {m.get("id") for m in self.backend.request("GET", "/models").get("data") or []}

    def load(self, name: str, folder: Path, *, rank: int) -> None:
        """``/v1/load_lora_adapter``. ParameterError naming ``base_url`` (no runtime LoRA loading: the probe found
        none, or the endpoint is missing) or ``lora_r`` (the server failed to load the adapter: a rank above its
        ``--max-lora-rank``, LoRA not enabled); ServerError naming ``base_url`` for the other refusals."""
        self.backend.post_lora_adapter(name, folder, rank=rank, what="SECL's adapter hot-swap")

    def unload(self, name: str) -> None:
        """``/v1/unload_lora_adapter``, sent once (``OpenAICompatibleBackend.post_once``; vLLM answers success in plain
        text, errors as JSON); HTTP 404 is no error (the server does not hold the name: already gone, or restarted
        since). Other refusals raise ``lora_refusal``'s error."""
        from hf_calibration.modeling.backends.server import lora_refusal

        status, text, error = self.backend.post_once("/unload_lora_adapter", {"lora_name": name})
        if status >= 400 and status != 404:
            raise lora_refusal(self.backend.base_url, status, error, text, folder=None, rank=None)


def _view(backend, served_model: str, *, on_missing_model=None):
    """The backend reading through ``served_model`` (the base model or a LoRA name); shares its connection
    (``OpenAICompatibleBackend.with_served_model``; an in-process backend in tests has one name only)."""
    rebind = getattr(backend, "with_served_model", None)
    if rebind is None or served_model == backend.served_model:
        return backend
    return rebind(served_model, on_missing_model=on_missing_model)


class SECLService:
    """SECL for named streams against one server (module docstring).

    backend : an ``OpenAICompatibleBackend`` serving the base model. trainer : a ``SECLModel`` (``apply_secl`` on a
    local copy of the same base model) whose config is the streams' SECL config. state_dir : folder of the
    streams' versions and state. swap : "update" or "burst". max_new_tokens : answer length.

    Raises ParameterError naming ``swap``, ``max_new_tokens`` or ``trainer``; the server's refusals
    (``LoRAAdmin``) when a stream's adapter is first loaded.
    """

    def __init__(self, backend, trainer, state_dir, *, swap: str = "update", max_new_tokens: int = 8):
        if not isinstance(trainer, SECLGenerationMixin):
            raise ParameterError("trainer", type(trainer).__name__, "must be a SECLModel (apply_secl)")
        if swap not in SWAP_MODES:
            raise ParameterError("swap", swap, f"must be 'update' or 'burst', got {swap!r}")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ParameterError("max_new_tokens", max_new_tokens, f"must be a positive integer, got {max_new_tokens!r}")
        self.backend, self.trainer, self.swap, self.max_new_tokens = backend, trainer, swap, max_new_tokens
        self.config = trainer.secl_config
        self.adapter_scope = self.config.adapter_scope
        self.state_dir = Path(state_dir)
        self.lora = LoRAAdmin(backend)
        self.streams: dict[str, StreamState] = {}
        self._identity = {k: v.detach().clone() for k, v in trainer.secl_initial_adapter.items()}
        self._active: StreamState | None = None
        self._lock = threading.Lock()  # the trainer holds one stream's adapter at a time
        self._load_lock = threading.Lock()  # one reload of a lost adapter at a time (concurrent reads may all miss it)
        tok = trainer.secl_tokens
        self._verbal_ids = list(dict.fromkeys([t for v in tok.digits for t in v] + list(tok.ten)
                                              + list(tok.zero_after_one)))
        self._yes_no = list(dict.fromkeys(list(tok.yes) + list(tok.no)))

    # -- streams ------------------------------------------------------------------------------
    def open_stream(self, name: str) -> StreamState:
        """The stream ``name``: resumed from ``state_dir/name/stream.json`` when there is one (its current adapter
        loaded into the server if the server lacks it), else new with the identity adapter."""
        if not isinstance(name, str) or not name or not name.replace("-", "").replace("_", "").isalnum():
            raise ParameterError("stream", name, f"must be a non-empty name of letters, digits, '-' and '_', got {name!r}")
        if name in self.streams:
            return self.streams[name]
        stream = StreamState(name, SECLState.new(self.config))
        path = self.state_dir / name / STATE_FILE
        if path.is_file():
            self._resume(stream, json.loads(path.read_text(encoding="utf-8")))
        self.streams[name] = stream
        return stream

    def _resume(self, stream: StreamState, state: dict) -> None:
        from hf_calibration.integrations.hub import check_artifact_config, load_artifact_weights

        check_artifact_config(state, kind="SECL service state", max_format_version=STATE_FORMAT,
                              source=str(self.state_dir / stream.name / STATE_FILE))
        folder = self._version_folder(stream.name, state["version"])
        optimizer = None
        if state["version"] and (folder / OPTIMIZER_FILE).is_file():
            optimizer = torch.load(folder / OPTIMIZER_FILE, weights_only=True)
        stream.secl.load_state_dict({**state, "optimizer": optimizer})  # format 1 had no replay buffer: empty
        stream.records = [SECLRecord(**r) for r in state["records"]]
        if stream.version == 0:
            return
        with self._lock:
            self._activate(stream)
            load_artifact_weights(self.trainer.peft_model, folder)
        self._serve_current(stream)

    def _serve_current(self, stream: StreamState) -> None:
        """Have the server load ``stream``'s current version (``LoRAAdmin.load``, as a new version is loaded) unless
        it already serves it (a killed service's load stands), and read the stream through it."""
        served = f"{stream.name}-v{stream.version}"
        with self._load_lock:
            if served not in self.lora.served():
                self.lora.load(served, self._version_folder(stream.name, stream.version), rank=self.config.lora_r)
        stream.served_name = served

    def reload_adapter(self, served_name: str) -> bool:
        """Load again into the server the adapter of the stream whose current version is served as ``served_name``
        (the server answered that it does not serve it: restarted since it was loaded); True when there is such a
        stream (the server's refusals raise as ``LoRAAdmin.load``'s), False otherwise (nothing is sent). The
        ``on_missing_model`` of every read this service sends through a stream's adapter."""
        stream = next((s for s in list(self.streams.values()) if s.served_name == served_name), None)
        if stream is None or stream.version == 0:
            return False
        self._serve_current(stream)
        return True

    def _reader(self, served_model: str):
        """The backend reading through ``served_model``, its lost adapter reloaded once (``reload_adapter``)."""
        return _view(self.backend, served_model, on_missing_model=self.reload_adapter)

    def _activate(self, stream: StreamState) -> None:
        """Put ``stream``'s adapter weights into the trainer (the other stream's kept aside). Each stream's AdamW is
        its own state's (``SECLState.optimizer``, over the trainer's LoRA parameters)."""
        tr = self.trainer
        if self._active is stream:
            return
        if self._active is not None:
            self._active.adapter = {k: v.detach().clone() for k, v in tr.secl_adapter_state().items()}
        tr.secl_set_adapter(stream.adapter if stream.adapter is not None else self._identity)
        self._active = stream

    def start_burst(self, name: str) -> None:
        """Open a burst in stream ``name`` now, as an alarm would (``SECLModel.start_burst``)."""
        self.open_stream(name).secl.start_burst()

    # -- one question -------------------------------------------------------------------------
    def step(self, name: str, prompt_ids, *, choices=None, distractors=None, update: bool = True) -> SECLRecord:
        """SECL on one question of stream ``name`` (``secl.step.secl_step`` with ``ServedReads``): the record
        ``SECLModel.generate`` keeps for it, plus ``answer_ids``, ``entropy_gap`` (how far the served entropy, a
        top-k bound, can lie below the exact one) and ``adapter`` (the served name it was read with; None: the base
        model). ``record.to_dict()`` is what ``stream.json`` keeps.

        prompt_ids : the prompt's token ids. choices / distractors : as ``SECLModel.generate``'s
        ``secl_choices`` / ``secl_distractors`` for this prompt; a burst needs one of them (the beam search for
        open-ended alternatives is not a served read). update : False reads only (the state is not touched).
        Raises ParameterError naming ``choices`` for a burst question without either; the backend's errors.
        """
        stream = self.open_stream(name)
        prompt = [int(t) for t in prompt_ids]
        reader = self._reader(stream.served_name or self.backend.served_model)
        answerer = reader if self.adapter_scope == "all" else self.backend
        gen = answerer.generate([prompt], max_new_tokens=self.max_new_tokens)[0]
        length = answer_length(gen.token_ids, self.trainer.secl_stop_ids())
        steps = slice(0, max(length, 1))
        entropy = float(np.mean(gen.entropy[steps])) if len(gen.entropy) else 0.0
        question = SECLQuestion(prompt, list(gen.token_ids[:length]), entropy, choices, distractors)
        read_with = stream.served_name
        record = secl_step(stream.secl, ServedReads(self, stream, reader), question, update=update)
        record.answer_ids, record.adapter = question.answer_ids, read_with
        record.entropy_gap = float(np.mean(gen.entropy_gap[steps])) if len(gen.entropy_gap) else 0.0
        stream.records.append(record)
        if stream.pending and (self.swap == "update" or stream.burst_left == 0):
            self._swap(stream)
        if not stream.pending:
            self._write_state(stream)
        return record

    def _verbalized(self, reader, prompt, answer, restated) -> tuple[float, float, int]:
        """(c, greedy, reads): the verbalized confidence of ``answer`` (its turn restating ``restated``) read
        through ``reader``, over the ids the trainer's ``secl_verbalized`` reads (the second read of a two-token
        "10" after its "1")."""
        tr, tokens = self.trainer, self.trainer.secl_tokens
        cont = tr.secl_followup(answer, restated, self.config.confidence_template, PLAIN_CONFIDENCE_PREFIX)
        rows = [prompt + cont] + ([prompt + cont + [tokens.digits[1][0]]] if tokens.two_step else [])
        lp = reader.next_token_logprobs(rows, self._verbal_ids).dense(self._verbal_ids, reader.vocab_size)
        conf, greedy, _ = verbalized_from_logprobs(lp[:1], tokens, lp[1:] if tokens.two_step else None)
        return float(conf[0]), float(greedy[0]), len(rows)

    # -- versions and state -------------------------------------------------------------------
    def _version_folder(self, name: str, version: int) -> Path:
        return self.state_dir / name / f"v{version:06d}"

    def _swap(self, stream: StreamState) -> None:
        """Write the stream's adapter as a new version (temporary folder, then rename), have the server load it,
        switch the stream's reads to it, unload the previous name. A refusal leaves the version on disk and the
        stream on its previous one (``pending`` stays set)."""
        root = self.state_dir / stream.name
        root.mkdir(parents=True, exist_ok=True)
        taken = [int(p.name[1:]) for p in root.glob("v[0-9]*") if p.name[1:].isdigit()]
        version = max(taken + [stream.version]) + 1
        final = self._version_folder(stream.name, version)
        tmp = root / f".v{version:06d}.tmp-{os.getpid()}"
        from hf_calibration.integrations.hub import save_artifact

        with self._lock:
            self._activate(stream)
            # the stream's own config (its scope) and state beside PEFT's adapter folder
            save_artifact(self.trainer.peft_model, tmp, lambda folder: write_secl_files(folder, self.config,
                                                                                         stream.secl))
            optimizer = stream.secl.state_dict()["optimizer"]
            if optimizer is not None:
                torch.save(optimizer, tmp / OPTIMIZER_FILE)
        os.replace(tmp, final)
        served = f"{stream.name}-v{version}"
        self.lora.load(served, final, rank=self.config.lora_r)
        old, stream.served_name, stream.secl.version, stream.pending = stream.served_name, served, version, False
        if old is not None:
            self.lora.unload(old)

    def _write_state(self, stream: StreamState) -> None:
        root = self.state_dir / stream.name
        root.mkdir(parents=True, exist_ok=True)
        state = {"format_version": STATE_FORMAT, **stream.secl.state_dict(optimizer=False),
                 "records": [r.to_dict() for r in stream.records], "adapter_scope": self.adapter_scope}
        tmp = root / f".{STATE_FILE}.tmp-{os.getpid()}"
        tmp.write_text(json.dumps(state, indent=1, default=_json_default) + "\n", encoding="utf-8")
        os.replace(tmp, root / STATE_FILE)

    def close(self) -> None:
        """Swap in every stream's pending updates (``swap="burst"`` with a burst still open) and save its state."""
        for stream in self.streams.values():
            if stream.pending:
                self._swap(stream)
                self._write_state(stream)


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")


class ServedReads(SECLReads):
    """``secl.step.SECLReads`` for one question of a ``SECLService`` stream: the reads through the server
    (``OpenAICompatibleBackend``: the verbalized read with the stream's served adapter, the P(True) teacher with the
    adapter off in the "confidence" scope), the update steps and consolidation on the service's local trainer (in the
    "all" scope: the read the server computes; module docstring), the adapter hot-swapped after an update."""

    def __init__(self, service: SECLService, stream: StreamState, reader):
        self.service, self.stream, self.reader = service, stream, reader

    def verbalized(self, question):
        return self.service._verbalized(self.reader, question.prompt, question.answer_ids, self.restated(question))

    def restated(self, question):
        return self.service.trainer.secl_restated(question.answer_ids, question.choices)

    def pseudo_label(self, question):
        svc, cfg, tr = self.service, self.service.config, self.service.trainer
        if question.choices is None and question.distractors is None:
            raise ParameterError("choices", None, "a served SECL burst needs the MCQA options (choices) or "
                                 "alternative answers (distractors) for P(True)Norm")
        prompt = question.prompt
        candidates, passes = tr.secl_candidates(prompt, question.answer_ids, question.distractors, question.choices)
        conts = [tr.secl_followup(ids, text, cfg.p_true_template, PLAIN_P_TRUE_PREFIX) for ids, text in candidates]
        teacher = svc.backend if svc.adapter_scope == "confidence" else self.reader
        lp = teacher.next_token_logprobs([prompt + x for x in conts], svc._yes_no).dense(svc._yes_no,
                                                                                        teacher.vocab_size)
        pt = p_true_from_logprobs(lp, tr.secl_tokens)[0].numpy().astype(np.float64)
        c_star = float(norm_p_true(pt[None], tau=cfg.tau_n)[0, 0])
        return float(pt[0]), c_star, len(candidates) - 1, passes + len(conts)

    def update(self, state, item):
        svc = self.service
        with svc._lock, svc.trainer.secl_scope("all"):  # c read as the server reads it
            svc._activate(self.stream)
            out = svc.trainer.secl_update(item, state.replay, state=state)
            self.stream.pending = True
        return out

    def confidence_after(self, state, item):
        svc = self.service
        if svc.swap == "update":
            svc._swap(self.stream)
            return svc._verbalized(svc._reader(self.stream.served_name), item.prompt, item.answer_ids,
                                   item.restated)[0]
        with svc._lock, svc.trainer.secl_scope("all"), torch.no_grad():
            # read locally: the server keeps the old version until the burst ends
            svc._activate(self.stream)
            return float(item_confidence(svc.trainer, item)[0][0])

    def consolidate(self, state):
        svc = self.service
        with svc._lock, svc.trainer.secl_scope("all"):
            svc._activate(self.stream)
            out = svc.trainer.secl_consolidation(state.replay, burst=state.counters["bursts"], state=state)
            self.stream.pending = self.stream.pending or out["steps"] > 0
        return out
