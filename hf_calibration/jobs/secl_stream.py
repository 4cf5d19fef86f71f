"""``run_secl_stream``: a multi-domain question stream through SECL, with the baselines on the same answers
(``hf-calibration secl``; docs/methods.md, "SECL")."""

from __future__ import annotations

import json
import time
import warnings
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from hf_calibration import modeling
from hf_calibration.data import domain_key
from hf_calibration.errors import ParameterError, ParameterWarning
from hf_calibration.jobs.common import (JobResult, check_choice, check_device, check_int, check_output_dir, check_path,
                                        device_field, balance_gold_field, model_field, n_resamples_field,
                                        on_overflow_field, output_dir_field, overwrite_field, seed_field)
from hf_calibration.modeling.context import OVERFLOW_POLICIES
from hf_calibration.modeling.streams import build_stream, parse_stream
from hf_calibration.reporting.plotting import plot_reliability_diagrams
from hf_calibration.runtime.outputs import AtomicOutputDir, check_result_folder
from hf_calibration.reporting.reports import write_json, write_jsonl
from hf_calibration.secl.config import ADAPTER_SCOPES, SECLConfig
from hf_calibration.modeling.signals import SIGNAL_NAMES
from hf_calibration.evaluation.stream import (FINAL_SUFFIX, baseline_pass, final_adapter_pass, format_stream_summary,
                                        secl_field, secl_key, secl_pass, signal_rows, summarize_stream)
from hf_calibration.jobs.stream_checkpoint import RunLock, StreamCheckpoint, adapter_digest, weights_fingerprint

# The labelled Platt/TS rows are 2-fold cross-fitted over the whole stream: each fold needs a question.
MIN_STREAM_QUESTIONS = 2
# The rows of the per-domain reliability diagrams.
PLOTTED_SIGNALS = ("verbalized", "p_true", "norm_p_true", "dinco", "secl")


@dataclass(kw_only=True)
class SECLStreamConfig:
    """Options of ``run_secl_stream`` / ``hf-calibration secl`` besides SECL's own (``SECLConfig``). Checked at
    construction: ParameterError (a ValueError) naming the field and the value."""

    output_dir: str = output_dir_field(
        "Folder for the outputs (created). While the stream runs, every finished question is kept in the hidden "
        "folder .<name>.secl.partial beside it: run the same command again to resume a run that stopped.")
    model: str = model_field()
    stream: str = field(default="mmlu:stem,mmlu:humanities,halueval_qa", metadata={
        "help": "Comma-separated domains in stream order: mmlu:<category or subject, '+'-joined>, gpqa, halueval_qa, "
                "halueval_dialogue, halueval_summarization (each also _lm: length-matched), gsm8k."})
    limit_per_domain: int = field(default=50, metadata={"help": "Questions per domain."})
    max_new_tokens: int = field(default=8, metadata={"help": "Answer length (8: a letter or a number)."})
    balance_gold: bool = balance_gold_field()
    burst_at_start: bool = field(default=False, metadata={
        "help": "Open a burst at the first question (the entropy gate cannot fire during its warm-up)."})
    compare_adapter_scopes: bool = field(default=False, metadata={
        "help": "Also run the SECL pass with the other adapter scope (--adapter-scope: 'confidence' <-> 'all'), from "
                "the identity adapter on the same stream; its rows are 'secl_<scope>'. The configured scope's pass "
                "runs last, so the saved adapter and the counters are its own."})
    workers: int = field(default=1, metadata={
        "help": "Processes for the stream's passes, which are independent (the baseline pass reads the identity "
                "adapter, each SECL pass starts from it): 1 runs them one after the other; 2 runs the SECL "
                "pass(es) in a second process beside the baseline pass; 3 (with --compare-adapter-scopes) one "
                "process per pass. The same records; CPU threads are shared out among the processes."})
    seed: int = seed_field()
    device: str = device_field()
    on_overflow: str = on_overflow_field()
    n_resamples: int = n_resamples_field()
    overwrite: bool = overwrite_field()

    def __post_init__(self):
        check_path(self.output_dir, "output_dir")
        check_stream(self.stream, self.limit_per_domain)
        check_choice(self.on_overflow, "on_overflow", OVERFLOW_POLICIES)
        for name in ("max_new_tokens", "n_resamples", "workers"):
            check_int(getattr(self, name), name)
        passes = 3 if self.compare_adapter_scopes else 2
        if self.workers > passes:
            raise ParameterError("workers", self.workers, f"must be at most {passes}, the stream's passes (baseline, "
                                 f"SECL{', SECL with the other adapter scope' if passes == 3 else ''}"
                                 f"{'' if passes == 3 else '; 3 with {compare_adapter_scopes}'}), got {self.workers}",
                                 related=("compare_adapter_scopes",))
        check_int(self.seed, "seed", minimum=0)
        self.device = check_device(self.device)


def stream_context(model, tokenizer, secl: SECLConfig, *, max_new_tokens: int, on_overflow: str) -> dict:
    """``build_stream``'s keyword arguments fitting every prompt to the model's context (``modeling.context``):
    the context, the tokens a SECL step adds after the prompt at most (the answer, the follow-up turn restating it
    with the longer template, a second digit, the distractors' beam search) and the policy."""
    from hf_calibration.modeling.context import context_length
    from hf_calibration.secl.confidence import followup_ids

    fmt = modeling.prompts.resolve_prompt_format(tokenizer, secl.prompt_format)
    turn = max(len(followup_ids(tokenizer, t.replace("{answer}", ""), prompt_format=fmt))
               for t in (secl.confidence_template, secl.p_true_template))
    reserve = 2 * max_new_tokens + turn + secl.distractor_max_new_tokens + 2
    return {"context": context_length(model, tokenizer), "reserve": reserve, "on_overflow": on_overflow}


def check_stream(stream: str, limit_per_domain: int) -> list[tuple[str, str | None]]:
    """The stream's domains (``modeling.streams.parse_stream``) and its size, checked before any model loads;
    ParameterError naming ``stream`` or ``limit_per_domain``."""
    domains = parse_stream(stream)
    check_int(limit_per_domain, "limit_per_domain")
    if limit_per_domain * len(domains) < MIN_STREAM_QUESTIONS:
        raise ParameterError("limit_per_domain", limit_per_domain, f"the stream needs at least {MIN_STREAM_QUESTIONS} "
                             f"questions (the labelled Platt/TS baselines are 2-fold cross-fitted over it, one question "
                             f"per fold); got {{limit_per_domain}} {limit_per_domain} for {len(domains)} domain(s)")
    return domains


@dataclass(kw_only=True)
class SECLStreamResult(JobResult):
    """``JobResult`` (``metrics``: ``{"summary": per-domain and overall reports}``) plus the per-question
    ``records`` (as in records.jsonl) and SECL's ``counters``."""

    records: list
    counters: dict


def _warn_short_domains(items, limit: int) -> None:
    """A ParameterWarning per domain that has fewer questions than ``limit_per_domain`` asked for."""
    for domain, n in Counter(item.domain for item in items).items():
        if n < limit:
            warnings.warn(ParameterWarning("limit_per_domain", limit, f"{{limit_per_domain}} {limit} exceeds the {n} "
                                           f"questions of {domain}; using all {n}"), stacklevel=3)


def _warn_unfinished_burst(items, secl: SECLConfig, burst_at_start: bool) -> None:
    """A ParameterWarning when the burst opened at the start outlasts the stream: its consolidation never runs."""
    if burst_at_start and secl.consolidation_epochs and len(items) < secl.burst_size:
        warnings.warn(ParameterWarning(
            "burst_size", secl.burst_size,
            f"{{burst_size}} {secl.burst_size} is longer than the stream's {len(items)} questions: the burst opened "
            "at the start never ends, so its consolidation ({consolidation_epochs}) never runs; set {burst_size} "
            f"≤ {len(items)} or give a longer stream", related=("consolidation_epochs",)), stacklevel=3)


def _plot_domain(records: list, domain: str, title: str, signals: tuple):
    sub = [r for r in records if r["domain"] == domain]
    panels = {SIGNAL_NAMES[s]: (np.array([r[secl_field(s, "correct") if s.startswith("secl") else "correct"]
                                          for r in sub], dtype=int), [r[s] for r in sub]) for s in signals}
    return plot_reliability_diagrams(panels, title=f"{title} · {domain} (n={len(sub)})")


def _exit_with_parent(poll_seconds: float = 1.0) -> None:
    """End this worker process when the process that started it is gone (killed: no one would read its pass, and it
    would keep writing the run's checkpoint beside a rerun)."""
    import os
    import threading

    parent = os.getppid()

    def watch():
        while True:
            time.sleep(poll_seconds)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


class KeptPasses:
    """The stream's passes (``evaluation.stream``) over ``items`` with ``model``, each resuming from ``checkpoint``
    (a ``StreamCheckpoint``) and keeping every question into it as it finishes: the one place the checkpoint meets
    the passes (their ``start`` and ``on_record``). options : ``max_new_tokens``, ``burst_at_start``,
    ``progress``. The process that runs the baseline pass and a worker process running a SECL pass use it alike."""

    def __init__(self, checkpoint: StreamCheckpoint, model, items: list, options: dict):
        self.checkpoint, self.model, self.items, self.options = checkpoint, model, items, options
        self.identity = adapter_digest(model)  # the adapter every pass starts from

    def baseline(self) -> list[dict]:
        """``baseline_pass``'s records, the kept ones taken as they are."""
        return baseline_pass(self.model, self.items, max_new_tokens=self.options["max_new_tokens"],
                             progress=self.options["progress"], start=self.checkpoint.baseline()[: len(self.items)],
                             on_record=lambda i, record: self.checkpoint.add_baseline(record))

    def secl(self, records: list[dict], scope: str) -> dict:
        """``secl_pass`` with adapter scope ``scope`` into ``records``, from the state it kept; → its counters."""
        key = secl_key(scope, self.model.secl_config.adapter_scope)

        def keep(i: int, done: dict) -> None:  # the model holds the pass's state after question i
            self.checkpoint.save_pass(key, done, i + 1, self.model.secl_snapshot())

        return secl_pass(self.model, self.items, records, scope=scope, start=self.checkpoint.resume_pass(key),
                         on_record=keep, **self.options)

    def final(self, records: list[dict]) -> int:
        """``final_adapter_pass`` of the "secl" pass with the adapter the model holds, taking the reads kept for that
        adapter (``adapter_digest``); → how many were taken. Where no step moved the adapter (it is still the one the
        pass started from: no burst opened, or none was accepted), each read is the pass's own verbalized read of the
        answer with that same adapter, taken without a second pass (0 taken)."""
        adapter = adapter_digest(self.model)
        if adapter == self.identity:
            for rec in records:
                rec["secl" + FINAL_SUFFIX] = rec[secl_field("secl", "verbalized")]
            return 0
        kept = self.checkpoint.finals("secl", adapter, len(self.items))
        final_adapter_pass(self.model, self.items, records, progress=self.options["progress"], start=kept,
                           on_record=lambda i, confidence: self.checkpoint.add_final("secl", adapter, i, confidence))
        return len(kept)


def _secl_pass_worker(job: dict) -> tuple[list, dict, dict | None]:
    """One SECL pass in a spawned process (``SECLStreamConfig.workers``): the model loaded and wrapped as in the
    parent, its identity adapter set to the parent's (the same LoRA A), the same stream; the pass itself is
    ``KeptPasses.secl``, as in one process. Returns the pass's record fields (one dict per question, with its
    ``passes`` entry), its counters and, when ``job["keep"]``, the state the pass left (``SECLModel.secl_snapshot``:
    adapter weights and SECL state) for the parent to take over."""
    from hf_calibration.secl.mixin import apply_secl

    torch.set_num_threads(job["threads"])
    _exit_with_parent()
    model, tokenizer = modeling.load_model(job["model"], device=job["device"])
    with warnings.catch_warnings():  # the parent warned about the settings and the prompts cut to fit, if any
        warnings.simplefilter("ignore", ParameterWarning)
        model = apply_secl(model, tokenizer, SECLConfig(**job["secl"]))
        model.secl_set_identity(job["initial"])
        items = build_stream(tokenizer, job["stream"], limit_per_domain=job["limit_per_domain"], seed=job["seed"],
                             balance_gold=job["balance_gold"], prompt_format=model.secl_config.prompt_format,
                             **stream_context(model, tokenizer, model.secl_config, on_overflow=job["on_overflow"],
                                              max_new_tokens=job["options"]["max_new_tokens"]))
    fields = [{"passes": {}} for _ in items]
    passes = KeptPasses(StreamCheckpoint(*job["checkpoint"]), model, items, job["options"])
    counters = passes.secl(fields, job["scope"])
    return fields, counters, model.secl_snapshot() if job["keep"] else None


def _parallel_passes(passes: KeptPasses, config, secl, scopes) -> tuple[list, dict]:
    """The baseline pass here and the SECL passes of ``scopes`` in ``config.workers - 1`` spawned processes (each
    pass independent, module docstring of ``evaluation.stream``), every one through ``KeptPasses``; → (records as
    the sequential run builds them, counters per scope). The model is left as the last scope's pass leaves it in a
    sequential run (adapter, gate, open burst, counters), so it saves the same calibrated adapter. Threads: this
    process's count shared out (at least one each)."""
    import multiprocessing

    model, checkpoint = passes.model, passes.checkpoint
    threads = max(1, torch.get_num_threads() // config.workers)
    initial = {k: v.detach().cpu().clone() for k, v in model.secl_initial_adapter.items()}
    groups = [scopes] if config.workers == 2 else [[s] for s in scopes]
    jobs = [[{"model": config.model, "device": config.device, "secl": secl.to_dict(), "initial": initial,
              "stream": config.stream, "limit_per_domain": config.limit_per_domain, "seed": config.seed,
              "balance_gold": config.balance_gold, "on_overflow": config.on_overflow, "scope": s,
              "options": {**passes.options, "progress": False}, "threads": threads, "keep": s == scopes[-1],
              "checkpoint": (str(checkpoint.folder), checkpoint.key)} for s in group]
            for group in groups]
    own_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with ProcessPoolExecutor(max_workers=len(groups), mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [pool.submit(_run_jobs, group) for group in jobs]
            records = passes.baseline()
            done = [f.result() for f in futures]
    finally:
        torch.set_num_threads(own_threads)
    counters_of = {}
    for group, results in zip(jobs, done):
        for job, (fields, counters, state) in zip(group, results):
            for rec, extra in zip(records, fields):
                extra_passes = extra.pop("passes")
                rec.update(extra)
                rec["passes"].update(extra_passes)
            counters_of[job["scope"]] = counters
            if state is not None:
                model.load_secl_snapshot(state)
    return records, counters_of


def _run_jobs(group: list) -> list:
    return [_secl_pass_worker(job) for job in group]


def _all_passes(passes: KeptPasses, config, secl, scopes) -> tuple[list, dict, int]:
    """The baseline pass, the SECL pass of each of ``scopes`` (the configured one last), here or in workers, then
    the configured scope's final-adapter reads (row "secl_final"), each through ``passes`` (resuming from its
    checkpoint). → (records, counters per scope, final-adapter reads resumed)."""
    if config.workers == 1:
        records = passes.baseline()
        counters_of = {s: passes.secl(records, s) for s in scopes}
    else:
        records, counters_of = _parallel_passes(passes, config, secl, scopes)
    # the model holds the configured scope's adapter as its pass left it: every answer read again with it
    finals = passes.final(records)
    for rec in records:  # what a read with a fixed adapter costs: the verbalized read's passes
        rec["passes"]["secl" + FINAL_SUFFIX] = rec["passes"]["verbalized"]
    return records, counters_of, finals


def _stream_checkpoint(out, config, secl, options, items, keys, weights: str) -> tuple[StreamCheckpoint, dict]:
    """The run's ``StreamCheckpoint`` beside ``out``, started (a rerun of the same command resumes each pass at the
    question it stopped at; ``jobs/stream_checkpoint.py``), and how many questions each pass has kept."""
    identity = {"job": "secl", "model": config.model, "stream": config.stream, "seed": config.seed,
                "limit_per_domain": config.limit_per_domain, "balance_gold": config.balance_gold,
                "on_overflow": config.on_overflow, "options": options | {"progress": None}, "config": secl.to_dict(),
                "weights": weights}
    checkpoint = StreamCheckpoint.for_output(out, identity, [item.prompt_ids for item in items])
    checkpoint.start(overwrite=config.overwrite)
    return checkpoint, checkpoint.kept_counts(keys, hold_passes=config.workers == 1)


def run_secl_stream(config: SECLStreamConfig, secl: SECLConfig | None = None, *,
                    progress: bool = True) -> SECLStreamResult:
    """Two passes over one stream with the same model (``evaluation.stream``): the baselines (verbalized, P(True),
    P(True)Norm, DINCO-style; Platt/TS with labels, 2-fold) and SECL online (``secl``, default ``SECLConfig()``;
    its ``prompt_format`` formats the stream, its ``adapter_scope`` is recorded in ``run``); with
    ``compare_adapter_scopes`` a third pass, SECL with the other adapter scope (rows ``secl_<scope>``); then every
    answer of the configured scope's pass read again with the adapter that pass ended with (row "secl_final",
    ``evaluation.stream.final_adapter_pass``: what the calibrated model says once the stream has trained it). Writes
    ``records.jsonl``, ``metrics.json``, the calibrated adapter ``secl_adapter/`` and ``reliability_<domain>.png``
    per domain into ``output_dir``, atomically. Each pass keeps every question as it finishes in a hidden folder
    beside ``output_dir`` (``jobs.stream_checkpoint``, wired to the passes by ``KeptPasses``): a run that stops is
    resumed by running it again.

    Every input is checked before the model loads; ParameterError naming the field, also naming output_dir when
    another run is writing into the same folder (``jobs.stream_checkpoint.RunLock``). A domain with fewer
    questions than ``limit_per_domain`` is a ParameterWarning; all of its questions are used.

    With ``workers`` > 1 the SECL passes run in processes started by ``multiprocessing``'s "spawn" method, which
    imports the calling script again: call this from a script under ``if __name__ == "__main__":`` (the CLI does).
    The records are the same as with one process; torch is seeded with ``seed`` before the adapter is made.
    """
    secl = SECLConfig() if secl is None else secl
    out = check_output_dir(config.output_dir)
    check_result_folder(out, "secl", ("records.jsonl", "metrics.json", "secl_adapter"), overwrite=config.overwrite)
    modeling.resolve_model_path(config.model)
    lock = RunLock(out)  # before the model loads: a second run into the same folder stops at once
    try:
        return _run_secl_stream(config, secl, out, progress)
    finally:
        lock.release()


def _run_secl_stream(config: SECLStreamConfig, secl: SECLConfig, out: Path, progress: bool) -> SECLStreamResult:
    """``run_secl_stream`` once its inputs are checked and the output folder is locked."""
    start = time.perf_counter()
    model, tokenizer = modeling.load_model(config.model, device=config.device)
    load_s = time.perf_counter() - start
    weights = weights_fingerprint(model)
    from hf_calibration.secl.mixin import apply_secl  # transformers' generation stack: not to read the config

    torch.manual_seed(config.seed)  # PEFT draws the LoRA A of the identity adapter: the same one on every rerun
    model = apply_secl(model, tokenizer, secl)
    items = build_stream(tokenizer, config.stream, limit_per_domain=config.limit_per_domain, seed=config.seed,
                         balance_gold=config.balance_gold, prompt_format=secl.prompt_format,
                         **stream_context(model, tokenizer, secl, max_new_tokens=config.max_new_tokens,
                                          on_overflow=config.on_overflow))
    _warn_short_domains(items, config.limit_per_domain)
    _warn_unfinished_burst(items, secl, config.burst_at_start)
    scope = secl.adapter_scope
    other = next(s for s in ADAPTER_SCOPES if s != scope) if config.compare_adapter_scopes else None
    start = time.perf_counter()
    options = {"max_new_tokens": config.max_new_tokens, "burst_at_start": config.burst_at_start, "progress": progress}
    scopes = ([other] if other is not None else []) + [scope]  # the configured scope last: its adapter is saved
    checkpoint, kept = _stream_checkpoint(out, config, secl, options, items, [secl_key(s, scope) for s in scopes],
                                          weights)
    records, counters_of, kept["secl" + FINAL_SUFFIX] = _all_passes(KeptPasses(checkpoint, model, items, options),
                                                                     config, secl, scopes)
    compared = None
    if other is not None:
        compared = {"adapter_scope": other, "key": secl_key(other, scope), "counters": counters_of[other]}
    counters = counters_of[scope]
    wall = time.perf_counter() - start
    keys = ("secl",) if compared is None else ("secl", compared["key"])
    summary = summarize_stream(records, n_resamples=config.n_resamples, seed=config.seed,
                               signals=signal_rows(keys + ("secl" + FINAL_SUFFIX,)))
    seconds = {"baseline_pass": sum(r["baseline_seconds"] for r in records) / len(records),
               "secl_pass": sum(r["secl_seconds"] for r in records) / len(records)}
    if compared is not None:
        key = compared["key"]
        seconds[f"{key}_pass"] = sum(r[secl_field(key, "seconds")] for r in records) / len(records)
    run = {"model": config.model, "stream": config.stream, "limit_per_domain": config.limit_per_domain,
           "n": len(items), "seed": config.seed, "prompt_format": model.secl_prompt_format,
           "max_new_tokens": config.max_new_tokens, "burst_at_start": config.burst_at_start,
           "balance_gold": config.balance_gold, "adapter_scope": scope, "compared": compared,
           "config": secl.to_dict(), "counters": counters, "workers": config.workers,
           "load_seconds": round(load_s, 1), "wall_seconds": round(wall, 1), "seconds_per_question": seconds,
           "resumed": kept}
    domains = list(dict.fromkeys(r["domain"] for r in records))
    pngs = {d: f"reliability_{domain_key(d)}.png" for d in domains}
    plotted = PLOTTED_SIGNALS + keys[1:]
    with AtomicOutputDir(out, "secl", overwrite=config.overwrite) as tmp:
        write_jsonl(tmp / "records.jsonl", records)
        write_json(tmp / "metrics.json", {"run": run, "summary": summary})
        model.save_pretrained(tmp / "secl_adapter")
        for domain, name in pngs.items():
            _plot_domain(records, domain, config.model.split("/")[-1], plotted).savefig(tmp / name, dpi=100,
                                                                                       bbox_inches="tight")
    checkpoint.remove()
    paths = {name: out / name for name in ("records.jsonl", "metrics.json", "secl_adapter", *pngs.values())}
    return SECLStreamResult(metrics={"summary": summary}, run=run, paths=paths, output_dir=out,
                            table=_stream_table(config, run, summary), records=records, counters=counters)


def _stream_table(config: SECLStreamConfig, run: dict, summary: dict) -> str:
    """The lines ``hf-calibration secl`` prints: the run, the per-domain table, the counters, what was resumed."""
    compared, scope = run["compared"], run["adapter_scope"]
    scopes = scope if compared is None else (f"{scope}, and {compared['adapter_scope']} as the row "
                                             f"{SIGNAL_NAMES[compared['key']]!r}")
    lines = [f"{config.model} · stream {config.stream} · {config.limit_per_domain}/domain · seed {config.seed} · "
             f"prompt {run['prompt_format']} · SECL adapter scope {scopes} · {run['wall_seconds']:.0f} s · "
             "95% bootstrap intervals",
             format_stream_summary(summary), f"counters: {json.dumps(run['counters'])}"]
    if compared is not None:
        lines.append(f"counters ({compared['adapter_scope']}): {json.dumps(compared['counters'])}")
    if any(run["resumed"].values()):
        lines.append("resumed (questions an earlier run of this command had finished, per pass): "
                     + ", ".join(f"{k} {n}" for k, n in run["resumed"].items()))
    return "\n".join(lines)
