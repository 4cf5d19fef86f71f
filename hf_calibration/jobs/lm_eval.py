"""``run_lm_eval_import``: calibration reports of lm-evaluation-harness runs (``hf-calibration lm-eval-import``).

lm-eval scores each choice of a multiple-choice question by its log-likelihood and logs them with
``--log_samples``; ``hf_calibration.integrations.lm_eval_import`` turns those logs into option probabilities, and this
job writes the same report ``evaluate`` writes, per task and per scoring (``acc``, ``acc_norm``, ...), with
no model loaded: a run scored anywhere (a GPU cluster, vLLM) is reported here on a CPU.
"""

from __future__ import annotations

import re
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hf_calibration.reporting import reports
from hf_calibration.errors import ParameterError, ParameterWarning
from hf_calibration.jobs.common import (JobResult, binning_field, check_ece_options, check_int, check_non_empty,
                                        check_output_dir, check_path, ece_options, n_bins_field, n_resamples_field,
                                        norm_field, output_dir_field, overwrite_field, seed_field)
from hf_calibration.integrations.lm_eval_import import SCORINGS, LMEvalSamples, find_samples, read_samples, to_mcqa_scores
from hf_calibration.runtime.outputs import AtomicOutputDir, check_result_folder
from hf_calibration.modeling.prompts import LETTERS

def _names(value: str | None) -> list[str]:
    return [] if value is None else [v.strip() for v in value.split(",") if v.strip()]


@dataclass(kw_only=True)
class LMEvalImportConfig:
    """Options of ``run_lm_eval_import`` / ``hf-calibration lm-eval-import``. Checked at construction:
    ParameterError (a ValueError) naming the field and the value."""

    samples: str = field(metadata={
        "help": "lm-eval's per-sample log: a samples_<task>_<date>.jsonl file, or the --output_path folder of "
                "`lm_eval ... --log_samples` (searched recursively; the newest file per task)."})
    output_dir: str = output_dir_field("Folder for the reports: <task>/<scoring>/ with metrics.json, "
                                       "predictions.jsonl and reliability_diagram.png (created).")
    tasks: str | None = field(default=None, metadata={
        "help": "Tasks to report, comma-separated (default: every multiple-choice task found)."})
    scorings: str = field(default="acc,acc_norm", metadata={
        "help": "Which log-likelihoods give the option probabilities, comma-separated: acc (as logged), acc_norm "
                "(divided by the choice's length in characters, as lm-eval's acc_norm), acc_bytes (by its "
                "UTF-8 bytes)."})
    min_subject_questions: int = field(default=20, metadata={
        "help": "A task whose documents carry several `subject`s (MMLU rows) gets a report per subject with at "
                "least this many questions; smaller subjects count in the task's report only (their intervals "
                "would span most of [0, 1])."})
    n_resamples: int = n_resamples_field()
    seed: int = seed_field("Bootstrap seed.")
    n_bins: int = n_bins_field()
    binning: str = binning_field()
    norm: str = norm_field()
    overwrite: bool = overwrite_field()

    def __post_init__(self):
        check_path(self.samples, "samples", what="file or folder")
        check_path(self.output_dir, "output_dir")
        for name in ("min_subject_questions", "n_resamples"):
            check_int(getattr(self, name), name)
        check_ece_options(self)
        check_non_empty(self.tasks, "tasks")
        check_non_empty(self.scorings, "scorings")
        for scoring in _names(self.scorings):
            if scoring not in SCORINGS:
                raise ParameterError("scorings", self.scorings, f"{scoring!r} is not one of "
                                                                f"{', '.join(map(repr, SCORINGS))}")


def _report(scores, config: LMEvalImportConfig) -> dict:
    """evaluate's metrics.json blocks (``reports.mcqa_metrics``' keys) for MCQA scores of any option count."""
    k = scores.probs.shape[1]
    kwargs = {"n_resamples": config.n_resamples, "seed": config.seed, **ece_options(config)}
    out = {"signals": {"option_probability": reports.mcqa_report(scores.labels, scores.probs, **kwargs),
                       **reports.references(scores.correct, k, **kwargs)},
           "option_mass_mean": float(np.mean(scores.option_mass))}
    if k <= len(LETTERS):  # position_bias names options by letter
        out["position_bias"] = reports.position_bias(scores.labels, scores.prediction, k)
    return out


def _subset(scores, rows):
    from hf_calibration.modeling.scoring import MCQAScores

    return MCQAScores(option_logits=scores.option_logits[rows], probs=scores.probs[rows],
                      option_mass=scores.option_mass[rows], prediction=scores.prediction[rows],
                      confidence=scores.confidence[rows], labels=scores.labels[rows], correct=scores.correct[rows],
                      prompt_format=scores.prompt_format)


def _task_metrics(samples: LMEvalSamples, scoring: str, config: LMEvalImportConfig):
    """(scores, metrics.json blocks) of one task under one scoring, with lm-eval's own accuracy beside ours."""
    scores = to_mcqa_scores(samples, scoring)
    metrics = _report(scores, config)
    logged = samples.logged.get(scoring)
    metrics["lm_eval"] = {
        "accuracy": None if logged is None else float(logged.mean()),
        "agreement": None if logged is None else float(np.mean(logged == scores.correct)),
        "reported": (samples.results.get("results") or {}).get(samples.task, {}).get(f"{scoring},none"),
    }
    counts = Counter(s for s in samples.subjects if s is not None)
    if len(counts) > 1:
        names = np.array([s or "" for s in samples.subjects])
        metrics["subject_counts"] = dict(sorted(counts.items()))
        metrics["subjects"] = {
            subject: {"n": n, **_report(_subset(scores, np.flatnonzero(names == subject)), config)}
            for subject, n in sorted(counts.items()) if n >= config.min_subject_questions}
    return scores, metrics


def _folder(task: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.\-]+", "_", task)


def run_lm_eval_import(config: LMEvalImportConfig) -> JobResult:
    """Read lm-eval's per-sample logs at ``config.samples`` and write, for every multiple-choice task and every
    scoring, ``<output_dir>/<task>/<scoring>/`` as ``evaluate`` writes its folder: ``metrics.json`` (every
    metric of ``calibration_report`` with 95 % bootstrap intervals, the constant references, the position bias,
    per subject where the docs have several, and ``lm_eval``: lm-eval's own logged accuracy and our agreement
    with it), ``predictions.jsonl`` (``fit-posthoc`` reads it) and ``reliability_diagram.png``; atomically.

    Every file is read and checked before anything is written. Raises ParameterError (or MissingPathError)
    naming ``samples``, ``tasks`` or ``output_dir``. A scoring whose predictions differ from those lm-eval
    logged on some document (e.g. a target delimiter that could not be recovered) is a ParameterWarning; an
    older log of a task that a newer one replaces is a ParameterWarning too.
    """
    out = check_output_dir(config.output_dir)
    found, older = find_samples(config.samples)
    if older:
        warnings.warn(ParameterWarning("samples", config.samples, f"{{samples}}: using the newest log of each task; "
                                       f"left out {', '.join(str(p) for p in older)}"), stacklevel=2)
    wanted = _names(config.tasks)
    missing = [t for t in wanted if t not in found]
    if missing:
        raise ParameterError("tasks", config.tasks, f"no samples of {missing} under {{samples}} {config.samples} "
                                                    f"(found {sorted(found)})", related=("samples",))
    tasks = {t: read_samples(found[t], task=t) for t in (wanted or sorted(found))}
    for samples in tasks.values():  # --n-bins against each task's documents, before anything is scored
        check_ece_options(config, len(samples.labels))
    scorings = _names(config.scorings)
    check_result_folder(out, "lm-eval-import", overwrite=config.overwrite)
    for task in tasks:
        for scoring in scorings:
            check_result_folder(out / _folder(task) / scoring, "lm-eval-import", reports.EVALUATION_FILES,
                                overwrite=config.overwrite)
    written, metrics_all, tables = {}, {}, []
    # each <task>/<scoring>/ is a result folder of its own: another scoring's folder stays as it is
    with AtomicOutputDir(out, "lm-eval-import", depth=2, overwrite=config.overwrite) as tmp:
        for task, samples in tasks.items():
            dataset = [{"subject": s or task, "source": samples.path.name} for s in samples.subjects]
            for scoring in scorings:
                scores, metrics = _task_metrics(samples, scoring, config)
                agreement = metrics["lm_eval"]["agreement"]
                if agreement is not None and agreement < 1:
                    warnings.warn(ParameterWarning("samples", config.samples, f"{{samples}}: {task} {scoring} differs "
                                                   f"from lm-eval's logged {scoring} on {1 - agreement:.1%} of the "
                                                   f"documents (choices read after the target delimiter "
                                                   f"{samples.target_delimiter!r})"), stacklevel=2)
                run = {"model": samples.model, "dataset": f"lm-eval {task}", "task": task, "scoring": scoring,
                       "samples": str(samples.path), "n": len(samples.labels), "seed": config.seed,
                       "n_resamples": config.n_resamples, "prompt_format": "lm-eval",
                       "target_delimiter": samples.target_delimiter,
                       "lm_eval_version": samples.results.get("lm_eval_version"), **ece_options(config)}
                folder = f"{_folder(task)}/{scoring}"
                reports.write_evaluation(tmp / folder, dataset, scores, metrics, run, n_bins=config.n_bins,
                                         binning=config.binning, job="lm-eval-import")
                written[f"{task} {scoring}"] = out / folder
                metrics_all.setdefault(task, {})[scoring] = metrics
                tables.append(f"{Path(samples.model).name} · {task} · {scoring} (softmax of the "
                              f"{SCORINGS[scoring]}): n={run['n']}, lm-eval's own {scoring} "
                              f"{_cell(metrics['lm_eval']['accuracy'])}; {reports.ece_caption(run)}; "
                              "95% bootstrap intervals\n"
                              + reports.format_table(metrics["signals"]))
    run = {"samples": config.samples, "tasks": list(tasks), "scorings": scorings,
           "files": {t: str(s.path) for t, s in tasks.items()}, "seed": config.seed,
           "n_resamples": config.n_resamples, **ece_options(config)}
    return JobResult(metrics=metrics_all, run=run, paths=written, output_dir=out, table="\n\n".join(tables))


def _cell(value) -> str:
    return "not logged" if value is None else f"{value:.3f}"


__all__ = ["LMEvalImportConfig", "run_lm_eval_import"]
