"""``run_evaluate``: score MCQA questions with a model and report calibration metrics (``hf-calibration evaluate``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from hf_calibration import modeling, reports
from hf_calibration.data import check_mcqa_arguments
from hf_calibration.errors import ParameterError, renamed_parameters
from hf_calibration.jobs.common import (JobResult, batch_size_field, check_choice, check_device, check_input_file,
                                        check_int, check_output_dir, device_field, load_mcqa_for, model_field, n_resamples_field,
                                        output_dir_field, prompt_format_field, seed_field, subjects_field)
from hf_calibration.modeling.prompts import PROMPT_FORMATS
from hf_calibration.modeling.scoring import MCQAScores


@dataclass(kw_only=True)
class EvaluateConfig:
    """Options of ``run_evaluate`` / ``hf-calibration evaluate``. Checked at construction: ParameterError (a
    ValueError) naming the field and the value."""

    output_dir: str = output_dir_field()
    model: str = model_field()
    dataset: str = field(default="mmlu", metadata={
        "help": "mmlu, gpqa, halueval_qa, halueval_dialogue, halueval_summarization, or any of the three HaluEval "
                "sets with _lm (length-matched: the right answer is the shorter one in half the items)."})
    subjects: str | None = subjects_field()
    limit: int = field(default=500, metadata={"help": "Number of questions, stratified by subject."})
    seed: int = seed_field()
    batch_size: int = batch_size_field("Questions per forward pass.")
    device: str = device_field()
    prompt_format: str = prompt_format_field()
    n_resamples: int = n_resamples_field()
    posthoc: str | None = field(default=None, metadata={
        "help": "A calibrator saved by fit-posthoc; its metrics are reported next to the uncalibrated ones."})

    def __post_init__(self):
        for name in ("limit", "batch_size", "n_resamples"):
            check_int(getattr(self, name), name)
        check_choice(self.prompt_format, "prompt_format", PROMPT_FORMATS)
        with renamed_parameters(name="dataset"):
            check_mcqa_arguments(self.dataset, subjects=self.subjects, limit=self.limit, seed=self.seed)
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


def run_evaluate(config: EvaluateConfig, *, progress: bool = True) -> EvaluateResult:
    """Score ``config.limit`` questions by their option-letter probabilities and write ``predictions.jsonl``,
    ``metrics.json`` (every metric with 95 % bootstrap intervals, the constant references, the position bias;
    with ``posthoc``, the calibrated report too) and ``reliability_diagram.png`` into ``output_dir``, atomically.

    Every input is checked before the model loads: the output folder, the calibrator file (and, for vector
    scaling, its option count against the dataset's), the data and the model path. Raises ParameterError
    naming the config field; a ``limit`` above the questions there are is a ParameterWarning, not an error.
    """
    from hf_calibration.posthoc import VectorScaler

    out = check_output_dir(config.output_dir)
    calibrator = None if config.posthoc is None else _load_posthoc(config.posthoc)
    dataset = load_mcqa_for(config.dataset, subjects=config.subjects, limit=config.limit, seed=config.seed)
    if isinstance(calibrator, VectorScaler):  # one weight per option: the option count must match
        k = max(len(c) for c in dataset["choices"])
        if len(calibrator.coef_) != k:
            raise ParameterError("posthoc", config.posthoc, f"{config.posthoc!r} was fitted on {len(calibrator.coef_)} "
                                 f"options, but {{dataset}} {config.dataset} has {k}", related=("dataset",))
    modeling.resolve_model_path(config.model)  # fails fast on a bad path before the heavy load
    start = time.perf_counter()
    model, tokenizer = modeling.load_model(config.model, device=config.device)
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    scores = modeling.score_mcqa(model, tokenizer, dataset, batch_size=config.batch_size,
                                 prompt_format=config.prompt_format, progress=progress)
    run = {
        "model": config.model, "dataset": config.dataset, "subjects": config.subjects, "n": len(dataset),
        "seed": config.seed, "prompt_format": scores.prompt_format, "load_seconds": round(load_s, 2),
        "scoring_seconds": round(time.perf_counter() - start, 2),
    }
    metrics = reports.mcqa_metrics(scores, n_resamples=config.n_resamples, seed=config.seed, calibrator=calibrator)
    if calibrator is not None:
        run["posthoc"] = str(config.posthoc)
    reports.write_evaluation(out, dataset, scores, metrics, run)
    paths = {name: out / name for name in ("predictions.jsonl", "metrics.json", "reliability_diagram.png")}
    return EvaluateResult(metrics=metrics, run=run, paths=paths, output_dir=out,
                          table=reports.format_mcqa_table(metrics, run), scores=scores, calibrator=calibrator)
