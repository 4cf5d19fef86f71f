"""``run_evaluate``: score MCQA questions with a model and report calibration metrics (``hf-calibration evaluate``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hf_calibration import modeling
from hf_calibration.reporting import reports
from hf_calibration.data import check_mcqa_arguments
from hf_calibration.errors import ParameterError, renamed_parameters
from hf_calibration.runtime.outputs import check_result_folder, partial_path, read_manifest
from hf_calibration.jobs.common import (CUSTOM_DATA_FIELDS, JobResult, MCQAScoringConfig, batch_size_field, check_device,
                                        check_ece_options, check_input_file,
                                        check_output_dir, custom_data_options, dataset_field, ece_options,
                                        fit_mcqa_to_context, load_mcqa_for)

if TYPE_CHECKING:  # scoring needs torch: not imported to read the config
    from hf_calibration.modeling.scoring import MCQAScores


@dataclass(kw_only=True)
class EvaluateConfig(MCQAScoringConfig):
    """Options of ``run_evaluate`` / ``hf-calibration evaluate``. Checked at construction: ParameterError (a
    ValueError) naming the field and the value."""

    dataset: str = dataset_field("mmlu", "mmlu, gpqa, halueval_qa, halueval_dialogue, halueval_summarization, or any "
                                 "of the three HaluEval sets with _lm (length-matched: the right answer is the "
                                 "shorter one in half the items)")
    limit: int = field(default=500, metadata={"help": "Number of questions, stratified by subject."})
    batch_size: int = batch_size_field("Questions per forward pass.")
    posthoc: str | None = field(default=None, metadata={
        "help": "A calibrator saved by fit-posthoc; its metrics are reported next to the uncalibrated ones."})

    def __post_init__(self):
        self.check_scoring_fields()
        with renamed_parameters(name="dataset"):
            check_mcqa_arguments(self.dataset, subjects=self.subjects, limit=self.limit, seed=self.seed,
                                 **custom_data_options(self))
        self.device = check_device(self.device)


@dataclass(kw_only=True)
class EvaluateResult(JobResult):
    """``JobResult`` plus the scores (``MCQAScores``) and the post-hoc calibrator used (or None)."""

    scores: MCQAScores
    calibrator: object = None


def _load_posthoc(path: str):
    """The calibrator saved at ``path``; ParameterError naming ``posthoc`` for a file that is not one."""
    from hf_calibration.posthoc import load_calibrator

    file = check_input_file(path, "posthoc")
    try:
        return load_calibrator(file)
    except (ValueError, TypeError, KeyError, UnicodeDecodeError) as err:
        raise ParameterError("posthoc", path, f"{path!r} is not a calibrator saved by fit-posthoc ({err})") from None


# What makes two evaluate runs the same run (the data scored, by which model): a rerun of it into its folder replaces
# its results (other ECE options, another --posthoc), another run's folder is refused without --overwrite.
IDENTITY = ("model", "dataset", "subjects", *CUSTOM_DATA_FIELDS, "limit", "seed")


def _check_same_run(config: EvaluateConfig, out) -> None:
    """ParameterError naming ``output_dir`` when ``out`` holds the results of an evaluate run of other data or
    another model (``IDENTITY``, read from its ``metrics.json``) and ``overwrite`` is False."""
    import json

    if config.overwrite or (read_manifest(out) or {}).get("job") != "evaluate":
        return
    try:
        earlier = json.loads((out / "metrics.json").read_text(encoding="utf-8"))["run"]
    except (OSError, ValueError, KeyError, TypeError):
        return
    for name in IDENTITY:
        if name == "limit" and name not in earlier:  # written before the limit was recorded
            continue
        was, now = earlier.get(name), getattr(config, name)  # a data option not given is not recorded: None
        if was != now:
            raise ParameterError("output_dir", str(out), f"{str(out)!r} holds the evaluate results of another run "
                                 f"({name} {was!r}, now {now!r}); choose another {{output_dir}}, or pass {{overwrite}} "
                                 "to replace them", related=("overwrite",))


def _checkpoint(config: EvaluateConfig, out):
    """Where the run keeps each scored batch of questions while it runs (``outputs.partial_path``), keyed by the
    run's identity, in process or served alike: a rerun of the same command after a stop reads only the rest."""
    from hf_calibration.modeling.backends.checkpoint import ScoreCheckpoint

    run = {"job": "evaluate", "backend": config.backend, "model": config.model,
           "served_model": config.served_model or config.model, "dataset": config.dataset, "subjects": config.subjects,
           "limit": config.limit, "seed": config.seed, "prompt_format": config.prompt_format,
           "on_overflow": config.on_overflow, **custom_data_options(config)}
    checkpoint = ScoreCheckpoint(partial_path(out, "evaluate"), run)
    checkpoint.claim(overwrite=config.overwrite)
    return checkpoint


def _score(config: EvaluateConfig, dataset, checkpoint, progress: bool):
    """``(dataset, scores, load seconds, scoring start, server record)`` through the backend ``config`` names
    (``modeling.backends.open_backend``; a server is checked before any question), each batch kept in
    ``checkpoint``. In process the questions are first fitted to the model's context (``on_overflow``)."""
    from hf_calibration.modeling.backends import has_capability, open_backend

    start = time.perf_counter()
    tokenizer, backend = open_backend(config.backend, config.model, batch_size=config.batch_size,
                                      device=config.device, base_url=config.base_url,
                                      served_model=config.served_model)
    load_s = time.perf_counter() - start
    try:
        if has_capability(config.backend, "in_process"):
            dataset = fit_mcqa_to_context(dataset, backend.model, tokenizer, prompt_format=config.prompt_format,
                                          on_overflow=config.on_overflow)
        start = time.perf_counter()
        with renamed_parameters(prompts="dataset"):  # a question longer than the server's context
            scores = modeling.score_mcqa(backend, tokenizer, dataset, prompt_format=config.prompt_format,
                                         progress=progress, checkpoint=checkpoint)
    finally:
        backend.close()
    caps = getattr(backend, "capabilities", None)  # a server's engine and read path (engines.Capabilities)
    return dataset, scores, load_s, start, (caps.record() if caps is not None else None)


def run_evaluate(config: EvaluateConfig, *, progress: bool = True) -> EvaluateResult:
    """Score ``config.limit`` questions by their option-letter probabilities and write ``predictions.jsonl``,
    ``metrics.json`` (every metric with 95 % bootstrap intervals, the constant references, the position bias;
    with ``posthoc``, the calibrated report too) and ``reliability_diagram.png`` into ``output_dir``, atomically.

    ``dataset`` may be your own file or Hub dataset, its columns mapped by the ``*_column`` fields
    (``data.load_mcqa``); ``n_bins``, ``binning`` and ``norm`` set every binned metric (conf-ECE and its
    interval, MCE, ACE, cw-ECE) and the diagram's bins, and are recorded in ``metrics.json``'s ``run``.

    Every input is checked before the model loads: the output folder, the calibrator file (and, for vector
    scaling, its option count against the dataset's), the data (a file's columns and every row) and the model
    path. Raises ParameterError naming the config field; a ``limit`` above the questions there are is a
    ParameterWarning, not an error.
    """
    from hf_calibration.jobs.fit_posthoc import check_option_counts

    out = check_output_dir(config.output_dir)
    check_result_folder(out, "evaluate", reports.EVALUATION_FILES, overwrite=config.overwrite)
    _check_same_run(config, out)
    calibrator = None if config.posthoc is None else _load_posthoc(config.posthoc)
    dataset = load_mcqa_for(config.dataset, subjects=config.subjects, limit=config.limit, seed=config.seed,
                            default_limit=config.default_limit(),
                            **custom_data_options(config))
    check_ece_options(config, len(dataset))  # fewer questions than --limit: --n-bins against those there are
    if calibrator is not None:  # fitted for other option counts: refused
        check_option_counts(calibrator, dataset["choices"], path=config.posthoc, dataset=config.dataset)
    modeling.resolve_model_path(config.model)  # fails fast on a bad path before the heavy load
    checkpoint = _checkpoint(config, out)
    dataset, scores, load_s, start, server = _score(config, dataset, checkpoint, progress)
    run = {
        "model": config.model, "dataset": config.dataset, "subjects": config.subjects,
        **{name: value for name, value in custom_data_options(config).items() if value is not None},
        "n": len(dataset), "limit": config.limit, "seed": config.seed, "prompt_format": scores.prompt_format,
        "on_overflow": config.on_overflow,
        **ece_options(config),
        "load_seconds": round(load_s, 2), "scoring_seconds": round(time.perf_counter() - start, 2),
    }
    metrics = reports.mcqa_metrics(scores, n_resamples=config.n_resamples, seed=config.seed, calibrator=calibrator,
                                   **ece_options(config))
    if config.backend != "transformers":
        run.update(backend=config.backend, base_url=config.base_url, served_model=config.served_model or config.model)
        if server is not None:
            run["server"] = server
    if calibrator is not None:
        run["posthoc"] = str(config.posthoc)
    reports.write_evaluation(out, dataset, scores, metrics, run, n_bins=config.n_bins, binning=config.binning,
                             overwrite=config.overwrite, calibrator=calibrator)
    checkpoint.remove()  # the results are in place: what was kept is no longer needed
    paths = {name: out / name for name in reports.EVALUATION_FILES}
    return EvaluateResult(metrics=metrics, run=run, paths=paths, output_dir=out,
                          table=reports.format_mcqa_table(metrics, run), scores=scores, calibrator=calibrator)
