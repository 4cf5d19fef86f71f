"""``run_diagnose``: the generation–discrimination gap of a model, and whether SECL can help it
(``hf-calibration diagnose``; docs/methods.md, "SECL: generation–discrimination gap")."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from hf_calibration import modeling
from hf_calibration.reporting import reports
from hf_calibration.data import MCQA_DATASETS, OPEN_QA_DATASETS, check_mcqa_arguments, dataset_kind
from hf_calibration.errors import ParameterError, renamed_parameters
from hf_calibration.jobs.common import (CUSTOM_DATA_FIELDS, JobResult, MCQAScoringConfig,
                                        batch_size_field, check_device, check_ece_options, check_output_dir,
                                        check_positive_number, custom_data_options, dataset_field, ece_options,
                                        fit_mcqa_to_context, load_mcqa_for)
from hf_calibration.modeling.streams import build_stream
from hf_calibration.reporting.plotting import plot_reliability_diagrams
from hf_calibration.runtime.outputs import AtomicOutputDir, check_result_folder, partial_path
from hf_calibration.reporting.reports import write_json, write_jsonl
from hf_calibration.secl.config import SECLConfig
from hf_calibration.modeling.signals import SIGNAL_NAMES
from hf_calibration.secl.confidence import DEFAULT_TAU_N
from hf_calibration.secl.diagnose import diagnose, format_diagnosis, generation_discrimination_gap, plot_diagnosis
from hf_calibration.evaluation.stream import BASELINE_ROWS, run_stream, summarize_stream

DATASETS = {**MCQA_DATASETS, **OPEN_QA_DATASETS}
OPEN_MAX_NEW_TOKENS = 8  # answer length of the open-ended baseline pass (``evaluation.stream.run_stream``'s default)


@dataclass(kw_only=True)
class DiagnoseConfig(MCQAScoringConfig):
    """Options of ``run_diagnose`` / ``hf-calibration diagnose``. Checked at construction: ParameterError (a
    ValueError) naming the field and the value."""

    dataset: str = dataset_field("mmlu", "mmlu, gpqa, halueval_qa, halueval_dialogue, halueval_summarization (each "
                                 "also _lm: length-matched), or gsm8k (open-ended: the baseline pass of a SECL "
                                 "stream)")
    limit: int = field(default=200, metadata={"help": "Number of questions."})
    batch_size: int = batch_size_field("Follow-up prompts per forward pass (multiple choice).")
    tau_n: float = field(default=DEFAULT_TAU_N, metadata={"help": "Temperature τ_n of P(True)Norm."})
    balance_gold: bool = field(default=False, metadata={
        "help": "Move each question's correct option so every letter is gold equally often (multiple choice)."})

    def __post_init__(self):
        self.check_scoring_fields()
        check_positive_number(self.tau_n, "tau_n")
        with renamed_parameters(name="dataset"):
            dataset_kind(self.dataset, DATASETS)  # an unknown name: the message lists gsm8k too
            if self.dataset not in OPEN_QA_DATASETS:
                check_mcqa_arguments(self.dataset, subjects=self.subjects, limit=self.limit, seed=self.seed,
                                     **custom_data_options(self))
        if self.dataset in OPEN_QA_DATASETS:
            if self.backend != "transformers":  # the SECL stream's baseline pass runs the model in process
                raise ParameterError("backend", self.backend, f"open-ended {{dataset}} {self.dataset} runs in process "
                                     "only (--backend transformers)", related=("dataset",))
            for name in ("subjects", "balance_gold", *CUSTOM_DATA_FIELDS):
                if getattr(self, name):
                    raise ParameterError(name, getattr(self, name), f"applies to multiple-choice datasets only, "
                                         f"got {{dataset}} {self.dataset}", related=("dataset",))
        self.device = check_device(self.device)


@dataclass(kw_only=True)
class DiagnoseResult(JobResult):
    """``JobResult`` (``metrics``: the diagnosis, written with ``run`` to ``diagnosis.json``) plus the per-question
    signals: ``MCQASignals`` for a multiple-choice dataset, the stream records (dicts) for an open-ended one."""

    signals: object


def length_only_accuracy(dataset) -> float:
    """Accuracy of "pick the shortest option" (characters) on an MCQA dataset: the HaluEval length control."""
    picks = [int(np.argmin([len(c) for c in row["choices"]])) for row in dataset]
    return float(np.mean([p == row["answer"] for p, row in zip(picks, dataset)]))


def _signal_records(dataset, signals) -> list[dict]:
    """One signals.jsonl record per question."""
    return [{
        "index": i, "subject": row["subject"], "answer": int(signals.labels[i]),
        "prediction": int(signals.prediction[i]), "correct": bool(signals.correct[i]),
        **{name: float(c[i]) for name, c in signals.confidence.items()},
        "verbalized_greedy": None if np.isnan(signals.verbalized_greedy[i]) else float(signals.verbalized_greedy[i]),
        "option_probs": signals.option_probs[i].tolist(),
        "p_true_options": [None if np.isnan(v) else float(v) for v in signals.p_true_options[i]],
    } for i, row in enumerate(dataset)]


def _followup_tokens(tokenizer, choices, fmt: str) -> int:
    """Tokens ``secl.confidence.mcqa_signals`` appends to a question's MCQA prompt at most: an option restated by
    the assistant, then the longer of the P(True) and verbalized follow-up turns, then a second digit."""
    from hf_calibration.secl.confidence import (CONFIDENCE_TEMPLATE, P_TRUE_TEMPLATE, PLAIN_CONFIDENCE_PREFIX,
                                                PLAIN_P_TRUE_PREFIX, assistant_answer_ids, followup_ids,
                                                mcqa_answer_text)

    longest = 0
    for j, choice in enumerate(choices):
        letter = modeling.LETTERS[j]
        answer = mcqa_answer_text(letter, choice)
        for template, prefix in ((P_TRUE_TEMPLATE, PLAIN_P_TRUE_PREFIX), (CONFIDENCE_TEMPLATE, PLAIN_CONFIDENCE_PREFIX)):
            ids = assistant_answer_ids(tokenizer, letter, fmt) + followup_ids(
                tokenizer, template.replace("{answer}", answer), prompt_format=fmt, plain_prefix=prefix)
            longest = max(longest, len(ids))
    return longest + 1


def _served_checkpoint(config: DiagnoseConfig, out):
    """Where a served run keeps each read (``outputs.partial_path``), keyed by the run's identity."""
    from hf_calibration.modeling.backends.checkpoint import ScoreCheckpoint

    run = {"job": "diagnose", "model": config.model, "served_model": config.served_model or config.model,
           "dataset": config.dataset, "subjects": config.subjects, "limit": config.limit, "seed": config.seed,
           "balance_gold": config.balance_gold, "prompt_format": config.prompt_format, **custom_data_options(config)}
    checkpoint = ScoreCheckpoint(partial_path(out, "diagnose"), run)
    checkpoint.claim(overwrite=config.overwrite)
    return checkpoint


def _open(config: DiagnoseConfig, model, tokenizer, run: dict):
    """``(tokenizer, backend)``: the model given (wrapped once, ``as_backend``) or the backend ``config`` names,
    opened (``open_backend``: a model loaded, or a server checked); the load time and a server recorded in ``run``."""
    from hf_calibration.modeling.backends import as_backend, open_backend

    if model is not None:
        return tokenizer, as_backend(model, tokenizer, batch_size=config.batch_size)
    start = time.perf_counter()
    tokenizer, backend = open_backend(config.backend, config.model, batch_size=config.batch_size,
                                      device=config.device, base_url=config.base_url,
                                      served_model=config.served_model)
    if config.backend != "transformers":
        run.update(backend=config.backend, base_url=config.base_url, served_model=config.served_model or config.model)
        if getattr(backend, "capabilities", None) is not None:  # engine and read path (engines.Capabilities)
            run["server"] = backend.capabilities.record()
    run["load_seconds"] = round(time.perf_counter() - start, 1)
    return tokenizer, backend


def _diagnose_mcqa(config: DiagnoseConfig, model, tokenizer, out, run: dict, progress: bool):
    """Multiple choice: the signals of ``secl.diagnose.diagnose`` read through the backend (in process: the model's
    key/value cache shared by each question's follow-ups; served: every read kept as it arrives, resumable)."""
    from hf_calibration.modeling.backends import has_capability

    dataset = load_mcqa_for(config.dataset, subjects=config.subjects, limit=config.limit, seed=config.seed,
                            default_limit=config.default_limit(),
                            balance_gold=config.balance_gold, **custom_data_options(config))
    check_ece_options(config, len(dataset))  # fewer questions than --limit: --n-bins against those there are
    in_process = model is not None or has_capability(config.backend, "in_process")
    checkpoint = None if in_process else _served_checkpoint(config, out)
    tokenizer, backend = _open(config, model, tokenizer, run)
    try:
        if in_process:
            fmt = modeling.prompts.resolve_prompt_format(tokenizer, config.prompt_format)
            dataset = fit_mcqa_to_context(dataset, backend.model, tokenizer, prompt_format=fmt,
                                          on_overflow=config.on_overflow,
                                          reserve=lambda choices: _followup_tokens(tokenizer, choices, fmt))
        start = time.perf_counter()
        with renamed_parameters(prompts="dataset"):  # a question longer than the server's context
            result, signals = diagnose(backend, tokenizer, dataset, tau_n=config.tau_n,
                                       prompt_format=config.prompt_format, **ece_options(config),
                                       n_resamples=config.n_resamples, seed=config.seed, progress=progress,
                                       checkpoint=checkpoint)
    finally:
        backend.close()
    run.update(n=len(dataset), prompt_format=signals.prompt_format, wall_seconds=round(time.perf_counter() - start, 1),
               length_only_accuracy=length_only_accuracy(dataset))
    with AtomicOutputDir(out, "diagnose", overwrite=config.overwrite) as tmp:
        write_json(tmp / "diagnosis.json", {"run": run, **result})
        write_jsonl(tmp / "signals.jsonl", _signal_records(dataset, signals))
        fig = plot_diagnosis(signals, title=f"{config.model.split('/')[-1]} · {config.dataset} (n={len(dataset)})",
                             n_bins=config.n_bins, binning=config.binning)
        fig.savefig(tmp / "reliability_diagrams.png", dpi=110, bbox_inches="tight")
    if checkpoint is not None:  # the results are in place: what was kept is no longer needed
        checkpoint.remove()
    return result, signals, ("diagnosis.json", "signals.jsonl", "reliability_diagrams.png")


def _diagnose_open(config: DiagnoseConfig, model, tokenizer, out, run: dict, progress: bool):
    """Open-ended: the baseline pass of the SECL stream (greedy answer, verbalized, P(True), P(True)Norm over
    beam-search alternatives, DINCO-style) on one domain."""
    from hf_calibration.secl.mixin import SECLGenerationMixin, apply_secl  # not imported to read the config

    if model is None:
        model, tokenizer = _load(config, run)
    if not isinstance(model, SECLGenerationMixin):
        model = apply_secl(model, tokenizer, SECLConfig(tau_n=config.tau_n, prompt_format=config.prompt_format))
    from hf_calibration.jobs.secl_stream import stream_context

    items = build_stream(tokenizer, config.dataset, limit_per_domain=config.limit, seed=config.seed,
                         prompt_format=config.prompt_format,
                         **stream_context(model, tokenizer, model.secl_config, max_new_tokens=OPEN_MAX_NEW_TOKENS,
                                          on_overflow=config.on_overflow))
    start = time.perf_counter()
    records = run_stream(model, items, baseline_only=True, max_new_tokens=OPEN_MAX_NEW_TOKENS, progress=progress)
    run.update(n=len(items), prompt_format=model.secl_prompt_format, wall_seconds=round(time.perf_counter() - start, 1))
    rows = tuple(r for r in BASELINE_ROWS if r not in ("platt", "temperature"))  # the labelled rows are not signals
    ece = ece_options(config)
    summary = summarize_stream(records, n_resamples=config.n_resamples, seed=config.seed, signals=rows,
                               **ece)[config.dataset]
    y = np.array([r["correct"] for r in records], dtype=int)
    result = {
        "signals": summary["signals"], "references": summary["references"],
        "gap": generation_discrimination_gap(y, [r["verbalized"] for r in records], [r["norm_p_true"] for r in records],
                                             **ece, n_resamples=config.n_resamples, seed=config.seed),
    }
    with AtomicOutputDir(out, "diagnose", overwrite=config.overwrite) as tmp:
        write_jsonl(tmp / "records.jsonl", records)
        write_json(tmp / "diagnosis.json", {"run": run, **result})
        fig = plot_reliability_diagrams({SIGNAL_NAMES[s]: (y, [r[s] for r in records]) for s in rows},
                                        n_bins=config.n_bins, binning=config.binning,
                                        title=f"{config.model.split('/')[-1]} · {config.dataset} (n={len(items)})")
        fig.savefig(tmp / "reliability_diagrams.png", dpi=100, bbox_inches="tight")
    return result, records, ("diagnosis.json", "records.jsonl", "reliability_diagrams.png")


def _load(config: DiagnoseConfig, run: dict):
    start = time.perf_counter()
    model, tokenizer = modeling.load_model(config.model, device=config.device)
    run["load_seconds"] = round(time.perf_counter() - start, 1)
    return model, tokenizer


def run_diagnose(config: DiagnoseConfig, *, model=None, tokenizer=None, progress: bool = True) -> DiagnoseResult:
    """Compute the confidence signals (option probability, P(True), P(True)Norm, verbalized, DINCO-style) on
    ``config.dataset``, their calibration reports with the constant references, the position bias, the
    generation–discrimination gap and the verdict (``secl.diagnose.generation_discrimination_gap``); write
    ``diagnosis.json``, the per-question ``signals.jsonl`` (``records.jsonl`` for the open-ended gsm8k) and
    ``reliability_diagrams.png`` into ``output_dir``, atomically.

    model, tokenizer : a model already loaded (an experiment diagnoses several datasets with one); by default
        ``config.model`` is loaded after every input is checked. For gsm8k SECL is added to it in place
        (``apply_secl``), so diagnose the multiple-choice datasets first.

    ``dataset`` may be your own multiple-choice file or Hub dataset (the ``*_column`` fields map it, as in
    ``run_evaluate``). ``n_bins``, ``binning`` and ``norm`` set the binned metrics of every signal and reference
    (conf-ECE and its interval, MCE, ACE), the diagrams' bins and the verdict's ΔECE
    (``generation_discrimination_gap``), and are recorded in ``run``.

    Raises ParameterError naming the config field before any model loads.
    """
    out = check_output_dir(config.output_dir)
    check_result_folder(out, "diagnose", ("diagnosis.json", "signals.jsonl", "records.jsonl",
                                          "reliability_diagrams.png"), overwrite=config.overwrite)
    if model is None:
        modeling.resolve_model_path(config.model)
    run = {"model": config.model, "dataset": config.dataset, "subjects": config.subjects,
           **{name: value for name, value in custom_data_options(config).items() if value is not None},
           "seed": config.seed, "balance_gold": config.balance_gold, "tau_n": config.tau_n, **ece_options(config)}
    job = _diagnose_open if config.dataset in OPEN_QA_DATASETS else _diagnose_mcqa
    result, signals, names = job(config, model, tokenizer, out, run, progress)
    title = (f"{config.model} on {config.dataset}" + (f" ({config.subjects})" if config.subjects else "")
             + f": n={run['n']}, seed={config.seed}, prompt={run['prompt_format']}, τ_n={config.tau_n}, "
             f"{run['wall_seconds']:.0f} s; {reports.ece_caption(run)}; 95% bootstrap intervals")
    return DiagnoseResult(metrics=result, run=run, paths={name: out / name for name in names}, output_dir=out,
                          table=format_diagnosis(result, title), signals=signals)
