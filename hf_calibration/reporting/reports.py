"""Metrics tables and output files shared by the CLI jobs (docs/methods.md, "AUROC and AURC", says why the
constant references).

Every table carries two trivial references next to the model's numbers: a constant
confidence equal to the measured accuracy and a constant 1/K. On a model near chance these constants
are already well calibrated, so an ECE that does not beat them, or that comes with AUROC ≈ 0.5, shows a
shift in confidence level rather than information about correctness.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from hf_calibration.errors import MissingPathError, ParameterError
from hf_calibration.metrics import calibration_report
from hf_calibration.runtime.outputs import AtomicOutputDir

# (key in calibration_report, column title) in table order.
# Brier and NLL are of the top-label confidence (comparable across all rows, references included);
# cw-ECE, Brier_K and NLL_K need probability vectors and are blank for confidence-only signals.
TABLE_COLUMNS = (
    ("accuracy", "acc"),
    ("mean_confidence", "conf"),
    ("conf_ece", "conf-ECE"),
    ("smece", "smECE"),
    ("brier", "Brier"),
    ("auroc", "AUROC"),
    ("cw_ece", "cw-ECE"),
    ("brier_multiclass", "Brier_K"),
    ("nll_multiclass", "NLL_K"),
)


def references(correct: np.ndarray, n_options: int, *, accuracy: float | None = None, **kwargs) -> dict:
    """Reports of the two constant confidences (docs/methods.md, "AUROC and AURC"): ``accuracy`` (default: measured on ``correct``;
    pass the validation split's) and 1/K, as binary confidences against ``correct``. ``kwargs``: those of
    ``calibration_report`` (bootstrap and ECE options)."""
    acc = float(np.mean(correct)) if accuracy is None else accuracy
    correct = np.asarray(correct).astype(int)
    return {
        "constant_accuracy": calibration_report(correct, np.full(len(correct), acc), **kwargs),
        "constant_1/K": calibration_report(correct, np.full(len(correct), 1.0 / n_options), **kwargs),
    }


def mcqa_report(labels, probs, *, binning: str = "uniform", norm: str = "l1", **kwargs) -> dict:
    """Report of MCQA probability vectors in the top-label view, plus the multiclass-only metrics.

    The top-label confidence against correctness gives every metric a constant reference also has
    (conf-ECE, smECE, Brier and NLL of the confidence, AUROC …), so the rows of one table compare;
    ``cw_ece``, ``brier_multiclass`` and ``nll_multiclass`` come from the full (n, K) vectors.
    ``binning`` and ``norm`` are conf-ECE's (``calibration_report`` takes them); ``kwargs`` are
    ``calibration_report``'s.
    """
    probs = np.asarray(probs, dtype=np.float64)
    labels = np.asarray(labels)
    correct = (probs.argmax(axis=1) == labels).astype(int)
    report = calibration_report(correct, probs.max(axis=1), binning=binning, norm=norm, **kwargs)
    multiclass = calibration_report(labels, probs, **kwargs)
    report.update(cw_ece=multiclass["cw_ece"], brier_multiclass=multiclass["brier"], nll_multiclass=multiclass["nll"])
    return report


def position_bias(labels: np.ndarray, prediction: np.ndarray, n_options: int) -> dict:
    """Per gold letter: its share of the questions, accuracy on them, and how often the model predicts it."""
    from hf_calibration.modeling.prompts import LETTERS

    out = {}
    for k in range(n_options):
        gold = labels == k
        out[LETTERS[k]] = {
            "gold_share": float(gold.mean()),
            "accuracy_when_gold": float((prediction[gold] == k).mean()) if gold.any() else None,
            "prediction_share": float((prediction == k).mean()),
        }
    return out


def posthoc_report(calibrator, scores, **kwargs) -> dict:
    """Report of the scores after a fitted post-hoc calibrator.

    Logit calibrators (temperature, vector) give full probability vectors, hence every multiclass
    metric; confidence calibrators (Platt, isotonic, histogram) map the top-label confidence to a
    probability of being correct, so only the top-label ("conf") metrics exist for them.
    """
    y_true, y_prob = posthoc_inputs(calibrator, scores)
    if calibrator.input_kind == "logits":
        return mcqa_report(y_true, y_prob, **kwargs)
    return calibration_report(y_true, y_prob, **kwargs)


def posthoc_inputs(calibrator, scores) -> tuple[np.ndarray, np.ndarray]:
    """``(y_true, y_prob)`` of the scores after ``calibrator``: labels and (n, K) probabilities for a logit
    calibrator, 0/1 correctness and the calibrated (n,) confidence for a confidence calibrator (what
    ``posthoc_report`` scores and the reliability diagram draws)."""
    if calibrator.input_kind == "logits":
        return np.asarray(scores.labels), calibrator.transform(scores.option_logits)
    return scores.correct.astype(int), calibrator.transform(_top_confidence_as(scores, calibrator.input_format))


def _top_confidence_as(scores, input_format: str) -> np.ndarray:
    """The top-label confidence in a confidence calibrator's ``input_format``, from the option logits.

    The log formats are computed from the logits, not from the rounded probability, so a calibrator
    fitted on log-probabilities or log-odds sees the resolution it was fitted for near 0 and 1.
    """
    from scipy.special import log_softmax

    from hf_calibration.posthoc import log_odds

    if input_format == "probability":
        return scores.confidence
    top = log_softmax(np.asarray(scores.option_logits, dtype=np.float64), axis=1).max(axis=1)
    return top if input_format == "log_probability" else log_odds(top, input_format="log_probability")


def mcqa_metrics(scores, *, n_resamples: int = 1000, seed: int = 0, calibrator=None, n_bins: int = 15,
                 binning: str = "uniform", norm: str = "l1") -> dict:
    """metrics.json content for MCQA scores: the model's top-label report, optionally the report after a
    post-hoc ``calibrator``, the constant references, and the position bias; every binned metric with the
    ECE options ``n_bins``, ``binning`` and ``norm`` (``calibration_report`` takes them)."""
    kwargs = dict(n_resamples=n_resamples, seed=seed, n_bins=n_bins, binning=binning, norm=norm)
    k = scores.probs.shape[1]
    signals = {"option_probability": mcqa_report(scores.labels, scores.probs, **kwargs)}
    if calibrator is not None:
        signals[f"posthoc_{calibrator.method}"] = posthoc_report(calibrator, scores, **kwargs)
    return {
        "signals": {**signals, **references(scores.correct, k, **kwargs)},
        "option_mass_mean": float(np.mean(scores.option_mass)),
        "position_bias": position_bias(scores.labels, scores.prediction, k),
    }


def format_cell(entry) -> str:
    """One table cell: "value [low,high]" (3 decimals) of a report entry or a bare number; "—" when missing."""
    if entry is None:
        return "—"
    value = entry["value"] if isinstance(entry, dict) else entry
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(entry, dict) and entry.get("low") is not None:
        return f"{value:.3f} [{entry['low']:.3f},{entry['high']:.3f}]"
    return f"{value:.3f}"


def format_table(signals: dict, columns=TABLE_COLUMNS, *, markdown: bool = False) -> str:
    """Table with one row per signal, each cell "value [95 % low, high]"; plain text or Markdown."""
    header = ["signal"] + [title for _, title in columns]
    rows = [[name] + [format_cell(report.get(key)) for key, _ in columns] for name, report in signals.items()]
    if markdown:
        lines = ["| " + " | ".join(r) + " |" for r in [header] + rows]
        lines.insert(1, "|" + "---|" * len(header))
        return "\n".join(lines)
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in [header] + rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_mcqa_table(metrics: dict, run: dict) -> str:
    title = (
        f"{run['model']} on {run['dataset']}"
        + (f" ({run['subjects']})" if run.get("subjects") else "")
        + f": n={run['n']}, seed={run['seed']}, prompt={run['prompt_format']}, "
        f"scoring {run['scoring_seconds']:.0f} s; {ece_caption(run)}; 95% bootstrap intervals"
    )
    return title + "\n" + format_table(metrics["signals"])


def ece_caption(run: dict) -> str:
    """How a run's conf-ECE was binned, for a table's title: "conf-ECE: 15 uniform bins, l1"."""
    return f"conf-ECE: {run['n_bins']} {run['binning']} bins, {run['norm']}"


def _json_default(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return None if not np.isfinite(value) else float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def prediction_records(dataset, scores) -> list[dict]:
    """One JSON-ready record per question (the ``predictions.jsonl`` schema ``fit-posthoc`` reads)."""
    records = []
    for i, row in enumerate(dataset):
        records.append(
            {
                "index": i,
                "subject": row["subject"],
                "source": row["source"],
                "answer": int(scores.labels[i]),
                "prediction": int(scores.prediction[i]),
                "correct": bool(scores.correct[i]),
                "confidence": float(scores.confidence[i]),
                "probs": scores.probs[i].tolist(),
                "option_logits": scores.option_logits[i].tolist(),  # -inf (absent option) → null
                "option_mass": float(scores.option_mass[i]),
            }
        )
    return records


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_record(record, where: str, path: str) -> None:
    """Types and ranges of one predictions.jsonl record (the schema ``prediction_records`` writes)."""

    def bad(reason):
        return ParameterError("path", path, f"{where}{reason}")

    if not isinstance(record, dict):
        raise bad(" is not a JSON object")
    missing = {"answer", "correct", "confidence", "option_logits"} - set(record)
    if missing:
        raise bad(f" lacks {sorted(missing)}")
    answer, correct, conf, logits = (record[k] for k in ("answer", "correct", "confidence", "option_logits"))
    if not isinstance(answer, int) or isinstance(answer, bool) or answer < 0:
        raise bad(f": 'answer' must be an option index ≥ 0, got {answer!r}")
    if not isinstance(correct, bool):
        raise bad(f": 'correct' must be true or false, got {correct!r}")
    if not _is_number(conf) or not 0.0 <= conf <= 1.0:
        raise bad(f": 'confidence' must be a number in [0, 1], got {conf!r}")
    if not isinstance(logits, list) or not all(v is None or _is_number(v) for v in logits):
        raise bad(f": 'option_logits' must be a list of numbers (null for absent options), got {logits!r}")
    if any(v is not None and not math.isfinite(v) for v in logits):
        raise bad(f": 'option_logits' must be finite, got {logits!r}")
    if answer >= len(logits):
        raise bad(f": 'answer' {answer} is out of range for {len(logits)} options")
    if "prediction" in record:  # evaluate writes all three: an edited 'correct' would invert a fitted calibrator
        prediction = record["prediction"]
        if not isinstance(prediction, int) or isinstance(prediction, bool) or not 0 <= prediction < len(logits):
            raise bad(f": 'prediction' must be an option index below {len(logits)}, got {prediction!r}")
        if correct != (prediction == answer):
            raise bad(f": 'correct' is {str(correct).lower()} but 'prediction' {prediction} "
                      f"{'is' if prediction == answer else 'is not'} 'answer' {answer}; fix the line or score again")


def read_predictions(path) -> list[dict]:
    """Records of a predictions.jsonl, validated.

    Raises MissingPathError (a FileNotFoundError) or ParameterError naming ``path``, with the file and the
    line in the message.
    """
    name = str(path)
    path = Path(path)
    if not path.is_file():
        raise MissingPathError("path", name, f"{name!r} is not a file")
    records = []
    try:
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                where = f"{name!r} line {lineno}"
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as err:
                    raise ParameterError("path", name, f"{where} is not JSON ({err.msg})") from None
                _check_record(record, where, name)
                records.append(record)
    except UnicodeDecodeError as err:
        raise ParameterError("path", name, f"{name!r} is not UTF-8 text ({err.reason} at byte {err.start})") from None
    if not records:
        raise ParameterError("path", name, f"{name!r} holds no predictions")
    return records


def option_logits_of(records: list[dict]) -> np.ndarray:
    """(n, K) option logits of prediction records; every question must have the same K options, else
    ParameterError naming ``records``."""
    widths = {len(r["option_logits"]) for r in records}
    missing = [i for i, r in enumerate(records) if any(v is None for v in r["option_logits"])]
    if len(widths) != 1 or missing:
        raise ParameterError(
            "records", None, f"logit calibrators need the same number of options for every question; "
            f"got widths {sorted(widths)}" + (f", first question with fewer options: #{missing[0]}" if missing else "")
        )
    return np.array([r["option_logits"] for r in records], dtype=np.float64)


def strict_json(obj):
    """``obj`` with NaN/inf floats replaced by None (strict JSON has no NaN; e.g. AUROC with one class)."""
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        return float(obj) if np.isfinite(obj) else None
    return obj


def write_json(path: Path, obj) -> None:
    text = json.dumps(strict_json(obj), indent=2, default=_json_default, allow_nan=False)
    path.write_text(text + "\n", encoding="utf-8")


def write_jsonl(path: Path, records) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(strict_json(r), default=_json_default, allow_nan=False) + "\n")


EVALUATION_FILES = ("predictions.jsonl", "metrics.json", "reliability_diagram.png")


def diagram_title(run: dict) -> str:
    """The reliability diagram's title: model, the data scored (with its subjects, which the diagram is of) and n,
    e.g. "SmolLM2-135M-Instruct · mmlu: humanities (n=200)"."""
    data = f"{run['dataset']}: {run['subjects']}" if run.get("subjects") else str(run["dataset"])
    return f"{str(run['model']).split('/')[-1]} · {data} (n={run['n']})"


def write_evaluation(out: Path, dataset, scores, metrics: dict, run: dict, *, n_bins: int = 15,
                     binning: str = "uniform", job: str = "evaluate", overwrite: bool = False,
                     calibrator=None) -> None:
    """Write predictions.jsonl, metrics.json and reliability_diagram.png (``n_bins`` bins, ``binning``; with
    ``calibrator``, the curve after it too) into ``out`` atomically, as ``job`` (``outputs.AtomicOutputDir``:
    another job's folder is refused unless ``overwrite``)."""
    from hf_calibration.reporting.plotting import plot_reliability_diagram

    with AtomicOutputDir(out, job, overwrite=overwrite) as tmp:
        write_jsonl(tmp / "predictions.jsonl", prediction_records(dataset, scores))
        write_json(tmp / "metrics.json", {"run": run, **metrics})
        after = {} if calibrator is None else {"calibrated": posthoc_inputs(calibrator, scores),
                                                "calibrated_label": f"after {calibrator.method}"}
        fig = plot_reliability_diagram(scores.labels, scores.probs, n_bins=n_bins, binning=binning,
                                       title=diagram_title(run), **after)
        fig.savefig(tmp / "reliability_diagram.png", dpi=120, bbox_inches="tight")

