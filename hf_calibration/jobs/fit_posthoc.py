"""``run_fit_posthoc``: fit a post-hoc calibrator on the predictions ``run_evaluate`` wrote
(``hf-calibration fit-posthoc``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hf_calibration import reports
from hf_calibration.errors import ParameterError, renamed_parameters
from hf_calibration.jobs.common import JobResult, check_choice, check_output_file

# posthoc.CALIBRATORS' names (posthoc needs torch and scikit-learn: not imported to read the config)
METHODS = ("histogram", "isotonic", "platt", "temperature", "vector")


@dataclass(kw_only=True)
class FitPosthocConfig:
    """Options of ``run_fit_posthoc`` / ``hf-calibration fit-posthoc``."""

    method: str = field(metadata={"help": "Calibrator to fit.", "choices": list(METHODS)})
    predictions: str = field(metadata={"help": "predictions.jsonl written by evaluate."})
    output: str = field(metadata={"help": "JSON file to write the fitted calibrator to."})

    def __post_init__(self):
        check_choice(self.method, "method", METHODS)


@dataclass(kw_only=True)
class FitPosthocResult(JobResult):
    """``JobResult`` (``metrics``: the fitted scalar parameters, e.g. ``temperature_``; ``paths["calibrator"]``:
    the saved file) plus the fitted calibrator."""

    calibrator: object


def run_fit_posthoc(config: FitPosthocConfig) -> FitPosthocResult:
    """Fit temperature/vector scaling on the option logits, or Platt/isotonic/histogram binning on the top-label
    confidence, of the records in ``config.predictions``, and save it to ``config.output`` (JSON, for
    ``EvaluateConfig.posthoc``).

    The output location and every record are checked before fitting; ParameterError naming ``output`` or
    ``predictions`` (with the file and line), also when the predictions are all right or all wrong (every
    calibrator's fit then runs to a bound).
    """
    from hf_calibration.posthoc import CALIBRATORS

    out = check_output_file(config.output)
    with renamed_parameters(path="predictions", records="predictions"):
        records = reports.read_predictions(config.predictions)
        calibrator = CALIBRATORS[config.method]()
        correct = [int(r["correct"]) for r in records]
        if len(set(correct)) < 2:  # checked here so the error names the file, not the calibrator's parameter
            raise ParameterError("predictions", config.predictions,
                                 f"all {len(correct)} predictions in {config.predictions!r} are "
                                 f"{'right' if correct[0] else 'wrong'}; {config.method} needs right and wrong ones "
                                 f"to fit (on these the fit runs to a bound: no information about the labels)")
        if calibrator.input_kind == "logits":
            calibrator.fit(reports.option_logits_of(records), [r["answer"] for r in records])
        else:
            calibrator.fit([r["confidence"] for r in records], correct)
    out.parent.mkdir(parents=True, exist_ok=True)
    calibrator.save(out)
    fitted = {k: v for k, v in vars(calibrator).items() if k.endswith("_") and not k.startswith("_")}
    scalars = {k: v for k, v in fitted.items() if isinstance(v, float)}
    summary = ", ".join(f"{k}={v:.4g}" for k, v in scalars.items())
    return FitPosthocResult(
        metrics=scalars, run={"method": config.method, "predictions": str(config.predictions), "n": len(records)},
        paths={"calibrator": out}, output_dir=out.parent, calibrator=calibrator,
        table=f"fitted {config.method} on {len(records)} predictions{': ' + summary if summary else ''}")
