"""``run_fit_posthoc``: fit a post-hoc calibrator on the predictions ``run_evaluate`` wrote
(``hf-calibration fit-posthoc``)."""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from hf_calibration.reporting import reports
from hf_calibration.errors import ParameterError, ParameterWarning, renamed_parameters
from hf_calibration.jobs.common import JobResult, check_choice, check_output_file, check_path

# posthoc.CALIBRATORS' names (posthoc needs torch and scikit-learn: not imported to read the config)
METHODS = ("histogram", "isotonic", "platt", "temperature", "vector")


@dataclass(kw_only=True)
class FitPosthocConfig:
    """Options of ``run_fit_posthoc`` / ``hf-calibration fit-posthoc``."""

    method: str = field(metadata={"help": "Calibrator to fit.", "choices": list(METHODS)})
    predictions: str = field(metadata={"help": "predictions.jsonl written by evaluate."})
    output: str = field(metadata={"help": "JSON file to write the fitted calibrator to."})
    overwrite: bool = field(default=False, metadata={
        "help": "Replace an existing --output file that is not a calibrator saved by fit-posthoc (one that is, "
                "is replaced without asking)."})
    signal: str | None = field(default=None, metadata={
        "help": "Fit on this signal of a file of labelled answers instead (diagnose's signals.jsonl: p_true, "
                "norm_p_true, verbalized, option_probability, dinco; each line 'correct' and the signal's value "
                "under its name; option_probability is also read from 'confidence', where evaluate writes it), "
                "with platt, isotonic or histogram. The output records the signal and the model it was fitted on "
                "('fitted_on'; the calibration gateway checks them). When not given: evaluate's option "
                "probability."})

    def __post_init__(self):
        check_path(self.predictions, "predictions", what="file")
        check_path(self.output, "output", what="file")
        check_choice(self.method, "method", METHODS)
        if self.signal is not None:
            from hf_calibration.modeling.signals import SIGNALS

            check_choice(self.signal, "signal", SIGNALS)
            if self.method in ("temperature", "vector"):
                raise ParameterError("signal", self.signal, f"{{method}} {self.method} scales option logits; a "
                                     "signal is fitted with platt, isotonic or histogram", related=("method",))


@dataclass(kw_only=True)
class FitPosthocResult(JobResult):
    """``JobResult`` (``metrics``: the fitted scalar parameters, e.g. ``temperature_``; ``paths["calibrator"]``:
    the saved file) plus the fitted calibrator."""

    calibrator: object


def _check_replaceable(out: Path, config: FitPosthocConfig) -> None:
    """An existing ``output`` is replaced only when it is a calibrator saved by fit-posthoc, or with ``overwrite``."""
    if config.overwrite or not out.exists():
        return
    try:
        saved = json.loads(out.read_text(encoding="utf-8"))
        ours = isinstance(saved, dict) and {"format_version", "method", "state"} <= set(saved)
    except (OSError, ValueError):
        ours = False
    if not ours:
        raise ParameterError("output", config.output, f"{config.output!r} exists and is not a calibrator saved by "
                             "fit-posthoc; choose another file, or pass {overwrite} to replace it",
                             related=("overwrite",))


def _fit(calibrator, records, config: FitPosthocConfig, correct: list[int]):
    """Fit on the records; the fit's own warnings (a bound reached, no convergence) as one ParameterWarning each,
    and a ParameterError naming ``predictions`` when the fitted calibrator answers ~1/K to every question."""
    import numpy as np

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if calibrator.input_kind == "logits":
            logits = reports.option_logits_of(records)
            calibrator.fit(logits, [r["answer"] for r in records])
        else:
            calibrator.fit([r["confidence"] for r in records], correct)
    if calibrator.input_kind == "logits":
        probs = np.asarray(calibrator.transform(logits), dtype=float)  # (n, K) calibrated probabilities
        k = probs.shape[1]
        if np.max(probs.max(axis=1)) - 1 / k < 1e-3:  # at T's upper bound: the logits carry no information
            raise ParameterError("predictions", config.predictions, f"{config.method} on {config.predictions!r} "
                                 f"gives every question the same confidence 1/K ({1 / k:.3g}): the option logits "
                                 "rank the answers no better than chance on these predictions (fitted "
                                 f"{_summary(calibrator)}); nothing to calibrate, so nothing written")
    for text in dict.fromkeys(str(w.message).splitlines()[0] for w in caught):
        warnings.warn(ParameterWarning("method", config.method, f"{{method}} {config.method}: {text}"), stacklevel=3)


def check_option_counts(calibrator, choices, *, path, dataset) -> None:
    """ParameterError naming ``posthoc`` (and ``dataset``) when ``choices`` (the options of each question) has an
    option count ``calibrator`` was not fitted for (``option_counts()``; unknown for a file saved without them:
    not checked)."""
    fitted = calibrator.option_counts()
    here = sorted({len(c) for c in choices})
    other = [k for k in here if k not in (fitted or here)]
    if other:
        shown = "/".join(map(str, fitted))
        raise ParameterError("posthoc", path, f"{path!r} was fitted on {shown} options, but {{dataset}} {dataset} has "
                             f"{'/'.join(map(str, here))}; fit it on predictions with {'/'.join(map(str, other))} "
                             "options", related=("dataset",))


def _summary(calibrator) -> str:
    fitted = {k: v for k, v in vars(calibrator).items() if k.endswith("_") and not k.startswith("_")}
    return ", ".join(f"{k}={v:.4g}" for k, v in fitted.items() if isinstance(v, float))


def _records(config: FitPosthocConfig) -> list[dict]:
    """evaluate's prediction records, or ``{"confidence", "correct"}`` of each labelled answer for ``signal``."""
    if config.signal is None:
        return reports.read_predictions(config.predictions)
    from hf_calibration.gateway.abstain import read_labelled

    confidence, correct = read_labelled(config.predictions, config.signal, parameter="predictions")
    return [{"confidence": float(c), "correct": bool(y)} for c, y in zip(confidence, correct)]


def _fitted_on(config: FitPosthocConfig, n: int) -> dict:
    """The provenance saved with the calibrator: the signal, the model named by the run file beside the
    predictions (evaluate's metrics.json, diagnose's diagnosis.json; None when neither is there), the file, n."""
    model = None
    for name in ("metrics.json", "diagnosis.json"):
        beside = Path(config.predictions).with_name(name)
        try:
            model = json.loads(beside.read_text(encoding="utf-8"))["run"]["model"]
            break
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return {"signal": config.signal or "option_probability", "model": model,
            "predictions": Path(config.predictions).name, "n": n}


def run_fit_posthoc(config: FitPosthocConfig) -> FitPosthocResult:
    """Fit temperature/vector scaling on the option logits, or Platt/isotonic/histogram binning on the top-label
    confidence, of the records in ``config.predictions``, and save it to ``config.output`` (JSON, for
    ``EvaluateConfig.posthoc``; written to a temporary file first and moved into place).

    The output location and every record are checked before fitting; ParameterError naming ``output`` (a file
    there that is not a calibrator saved by fit-posthoc, unless ``overwrite``) or ``predictions`` (with the file
    and line), also when the predictions are all right or all wrong (every calibrator's fit then runs to a bound)
    and when the fitted logit calibrator gives every question the confidence 1/K. The fit's own warnings are
    ParameterWarnings naming ``method``.
    """
    from hf_calibration.posthoc import CALIBRATORS

    out = check_output_file(config.output)
    _check_replaceable(out, config)
    with renamed_parameters(path="predictions", records="predictions", abstain_calibration="predictions"):
        records = _records(config)
        calibrator = CALIBRATORS[config.method]()
        correct = [int(r["correct"]) for r in records]
        if len(set(correct)) < 2:  # checked here so the error names the file, not the calibrator's parameter
            raise ParameterError("predictions", config.predictions,
                                 f"all {len(correct)} predictions in {config.predictions!r} are "
                                 f"{'right' if correct[0] else 'wrong'}; {config.method} needs right and wrong ones "
                                 f"to fit (on these the fit runs to a bound: no information about the labels)")
        _fit(calibrator, records, config, correct)
    # what evaluate --posthoc checks; a calibrator of another signal (labelled answers, no option logits) has none
    counts = {len(r["option_logits"]) for r in records if "option_logits" in r}
    calibrator.n_options_ = sorted(counts) if counts else None
    out.parent.mkdir(parents=True, exist_ok=True)
    staged = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        calibrator.save(staged, fitted_on=_fitted_on(config, len(records)))
        os.replace(staged, out)
    finally:
        staged.unlink(missing_ok=True)
    fitted = {k: v for k, v in vars(calibrator).items() if k.endswith("_") and not k.startswith("_")}
    scalars = {k: v for k, v in fitted.items() if isinstance(v, float)}
    summary = _summary(calibrator)
    return FitPosthocResult(
        metrics=scalars, run={"method": config.method, "predictions": str(config.predictions), "n": len(records)},
        paths={"calibrator": out}, output_dir=out.parent, calibrator=calibrator,
        table=f"fitted {config.method} on {len(records)} predictions{': ' + summary if summary else ''}")
