"""Read lm-evaluation-harness per-sample logs of multiple-choice tasks into option probabilities.

``lm_eval ... --log_samples --output_path OUT`` writes, per task, ``OUT/<model>/samples_<task>_<date>.jsonl``
(``lm_eval.loggers.EvaluationTracker.save_results_samples``) beside ``results_<date>.json``. For a task of
``output_type: multiple_choice`` (lm-eval 0.4.x) each line is one document::

    {"doc_id": 0, "doc": {...the dataset row...}, "target": "2",
     "arguments": {"gen_args_0": {"arg_0": "<context>", "arg_1": "<target_delimiter><choice 0>"}, ...},
     "resps": [[["-3.21", "False"]], ...], "filtered_resps": [["-3.21", "False"], ...],
     "filter": "none", "metrics": ["acc", "acc_norm"], "acc": 1.0, "acc_norm": 0.0, ...}

``filtered_resps[i]`` is (log-likelihood of continuation i given the context, is it the greedy
continuation), written as strings (``str(float)`` round-trips exactly). lm-eval's ``process_results``
(``lm_eval/api/task.py``) scores a document as

- ``acc``: ``argmax(lls) == gold``;
- ``acc_norm``: ``argmax(lls / len(choice)) == gold``, the length in *characters* of the choice text
  (``doc_to_choice``, without the target delimiter);
- ``acc_bytes``: ``argmax(lls / len(choice.encode("utf-8"))) == gold``.

Each of these ``SCORINGS`` gives option probabilities here: the softmax over the choices of the same
(normalised) log-likelihoods, so the top option is exactly lm-eval's prediction and its probability is
the confidence that calibration metrics judge. ``target`` is the gold index as lm-eval resolves it: a
digit string is the index, any other string the choice text.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from scipy.special import softmax

from hf_calibration.errors import MissingPathError, ParameterError

__all__ = ["SCORINGS", "LMEvalSamples", "find_samples", "option_log_scores", "option_probabilities",
           "read_samples", "to_mcqa_scores"]

# scoring (lm-eval's metric of the same name) → what its option probabilities are the softmax of
SCORINGS = {
    "acc": "log-likelihoods",
    "acc_norm": "log-likelihoods per character",
    "acc_bytes": "log-likelihoods per UTF-8 byte",
}

# samples_<task>_<date>.jsonl; the date is datetime.isoformat() with ':' replaced by '-'
_SAMPLES_FILE = re.compile(r"^samples_(?P<task>.+)_(?P<date>\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}(?:\.\d+)?)\.jsonl$")


def choice_lengths(choices: list[str], scoring: str) -> np.ndarray:
    """(K,) float64 divisors of the choices' log-likelihoods under ``scoring`` (a key of ``SCORINGS``)."""
    if scoring == "acc":
        return np.ones(len(choices))
    if scoring == "acc_norm":
        return np.array([float(len(c)) for c in choices])
    if scoring == "acc_bytes":
        return np.array([float(len(c.encode("utf-8"))) for c in choices])
    raise ParameterError("scoring", scoring, f"must be one of {', '.join(map(repr, SCORINGS))}, got {scoring!r}")


def option_probabilities(loglikelihoods, lengths=None) -> np.ndarray:
    """Softmax over the choices of ``loglikelihoods / lengths``: (K,) or (n, K) float64 probabilities.

    ``loglikelihoods``: (K,) or (n, K) summed log-likelihoods of the choices (-inf for an absent choice);
    ``lengths``: the same shape or broadcastable, > 0 (default 1: lm-eval's ``acc``). The argmax is lm-eval's
    prediction, computed by the same float64 division.
    """
    scores = np.asarray(loglikelihoods, dtype=np.float64)
    if lengths is not None:
        scores = scores / np.asarray(lengths, dtype=np.float64)
    return softmax(scores, axis=-1)


@dataclass
class LMEvalSamples:
    """One task's per-sample log, read by ``read_samples`` (n documents, K_i choices each).

    task : the task name (from the file name).
    path : the samples file.
    loglikelihoods : n arrays of shape (K_i,), float64: lm-eval's ``filtered_resps`` log-likelihoods.
    choices : n lists of K_i choice texts (the continuations without the target delimiter).
    labels : (n,) int gold indices.
    subjects : n subjects (the doc's ``subject`` field) or None.
    contexts : n contexts (the prompt lm-eval scored the choices after).
    logged : lm-eval's own per-document 0/1 ``acc`` / ``acc_norm`` / ``acc_bytes``, (n,) float, where logged.
    target_delimiter : what was stripped from each continuation to get the choice text.
    results : the run's ``results_<date>.json`` beside the file ({} when absent).
    """

    task: str
    path: Path
    loglikelihoods: list[np.ndarray]
    choices: list[list[str]]
    labels: np.ndarray
    subjects: list[str | None]
    contexts: list[str]
    logged: dict[str, np.ndarray] = field(default_factory=dict)
    target_delimiter: str = " "
    results: dict = field(default_factory=dict)

    @property
    def model(self) -> str:
        """The model lm-eval ran: ``model_name``, else ``pretrained=`` of its model arguments, else the backend."""
        config = self.results.get("config") or {}
        args = config.get("model_args")
        if isinstance(args, str):
            args = dict(part.split("=", 1) for part in args.split(",") if "=" in part)
        return (self.results.get("model_name") or (args or {}).get("pretrained") or config.get("model")
                or "unknown model")


def _date(path: Path) -> str:
    return _SAMPLES_FILE.match(path.name).group("date")


def find_samples(path, *, name: str = "samples") -> tuple[dict[str, Path], list[Path]]:
    """({task: samples file}, older files left out) under ``path``: a samples file, or a folder searched
    recursively for ``samples_<task>_<date>.jsonl``. A task logged by several runs keeps its newest file.

    MissingPathError (a FileNotFoundError) or ParameterError naming ``name`` when there is nothing to read.
    """
    raw = str(path)
    path = Path(path)
    if path.is_file():
        match = _SAMPLES_FILE.match(path.name)
        return {match.group("task") if match else path.stem: path}, []
    if not path.is_dir():
        raise MissingPathError(name, raw, f"{raw!r} is neither a samples file nor a folder")
    files = sorted((p for p in path.rglob("samples_*.jsonl") if _SAMPLES_FILE.match(p.name)), key=_date)
    if not files:
        raise ParameterError(name, raw, f"{raw!r} holds no lm-eval samples_<task>_<date>.jsonl "
                                        "(run lm_eval with --log_samples --output_path)")
    newest: dict[str, Path] = {}
    for f in files:  # oldest first: a newer run of the same task replaces it
        newest[_SAMPLES_FILE.match(f.name).group("task")] = f
    kept = set(newest.values())
    return newest, [f for f in files if f not in kept]


def _results_beside(path: Path) -> dict:
    """The ``results_<date>.json`` lm-eval wrote with a samples file ({} when absent or unreadable)."""
    match = _SAMPLES_FILE.match(path.name)
    if not match:
        return {}
    results = path.with_name(f"results_{match.group('date')}.json")
    try:
        return json.loads(results.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}


def _delimiter(results: dict, task: str, continuations: list[str]) -> str:
    """The target delimiter lm-eval put before every choice: the task's ``target_delimiter`` (``""`` under a
    chat template unless ``gen_prefix`` ends without whitespace, as ``ConfigurableTask.construct_requests``);
    without the task's config, a space if every continuation starts with one (lm-eval's default), else ``""``."""
    config = (results.get("configs") or {}).get(task)
    if config is not None:
        delimiter = config.get("target_delimiter", " ")
        prefix = config.get("gen_prefix") or ""
        if results.get("chat_template") and not (prefix and not prefix[-1].isspace()):
            return ""
        return delimiter
    return " " if all(c.startswith(" ") for c in continuations) else ""


def _gold(target: str, choices: list[str]) -> int | None:
    """lm-eval's gold index from the logged ``target`` (``str(doc_to_target(doc))``), or None."""
    if target.isdigit():
        return int(target) if int(target) < len(choices) else None
    return choices.index(target) if target in choices else None


def _read_records(path: Path, raw: str, name: str) -> list[tuple[int, object]]:
    """(line number, parsed JSON) of every non-blank line of a samples file; ParameterError naming ``name`` for a
    file that is not UTF-8 JSON lines, holds no samples or logs several filters."""
    records = []
    try:
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    try:
                        records.append((lineno, json.loads(line)))
                    except json.JSONDecodeError as err:
                        raise ParameterError(name, raw, f"{raw!r} line {lineno} is not JSON ({err.msg})") from None
    except UnicodeDecodeError as err:
        raise ParameterError(name, raw, f"{raw!r} is not UTF-8 text ({err.reason} at byte {err.start})") from None
    if not records:
        raise ParameterError(name, raw, f"{raw!r} holds no samples")
    filters = {r.get("filter") for _, r in records if isinstance(r, dict)}
    if len(filters) > 1:
        raise ParameterError(name, raw, f"{raw!r} logs several filters {sorted(map(str, filters))}; multiple-choice "
                                        "tasks have one")
    return records


def _parse_record(lineno: int, record, raw: str, name: str) -> tuple[str, dict, np.ndarray, list[str]]:
    """(where, record, log-likelihoods, continuations) of one logged sample, the unconditional half of an
    ``acc_mutual_info`` document left out; ParameterError naming ``name`` for a record that is no such sample."""
    where = f"{raw!r} line {lineno}"

    def bad(reason):
        return ParameterError(name, raw, f"{where}: {reason}")

    if not isinstance(record, dict) or not {"doc", "target", "arguments", "filtered_resps"} <= set(record):
        raise bad("is not an lm-eval sample (needs doc, target, arguments, filtered_resps)")
    try:
        pairs = [(float(ll), str(greedy)) for ll, greedy in record["filtered_resps"]]
        args = record["arguments"]
        continuations = [args[f"gen_args_{i}"]["arg_1"] for i in range(len(args))]
    except (TypeError, ValueError, KeyError):
        raise bad("filtered_resps are not (log-likelihood, is_greedy) pairs: not a multiple_choice task") from None
    lls = np.array([ll for ll, _ in pairs], dtype=np.float64)
    if "acc_mutual_info" in (record.get("metrics") or []):  # then the unconditional lls follow
        lls, continuations = lls[: len(lls) // 2], continuations[: len(lls) // 2]
    if len(lls) < 2 or len(lls) != len(continuations):
        raise bad(f"needs ≥ 2 choices with one log-likelihood each, got {len(lls)} for {len(continuations)}")
    if not all(math.isfinite(v) for v in lls):
        raise bad(f"log-likelihoods must be finite, got {lls.tolist()}")
    return where, record, lls, continuations


def read_samples(path, *, task: str | None = None, name: str = "samples") -> LMEvalSamples:
    """Read one lm-eval ``samples_<task>_<date>.jsonl`` of a multiple-choice task.

    ``task`` defaults to the name in the file name. The run's ``results_<date>.json`` beside it, when there,
    gives the task's target delimiter and the model. Documents logged with ``acc_mutual_info`` keep their
    conditional log-likelihoods (the first half).

    Raises MissingPathError or ParameterError naming ``name`` (file and line in the message) for a file that is
    not such a log: not JSON, a task of another output type (``filtered_resps`` not log-likelihood pairs),
    several filters, fewer than 2 choices, a list of gold answers, or a target that is not a choice.
    """
    raw = str(path)
    path = Path(path)
    if not path.is_file():
        raise MissingPathError(name, raw, f"{raw!r} is not a file")
    match = _SAMPLES_FILE.match(path.name)
    task = task or (match.group("task") if match else path.stem)
    results = _results_beside(path)
    parsed = [_parse_record(lineno, record, raw, name) for lineno, record in _read_records(path, raw, name)]
    delimiter = _delimiter(results, task, [c for _, _, _, cs in parsed for c in cs])
    lls_all, choices_all, labels, subjects, contexts = [], [], [], [], []
    logged = {m: [] for m in SCORINGS if all(m in r for _, r, _, _ in parsed)}
    for where, record, lls, continuations in parsed:
        choices = [c[len(delimiter):] if delimiter and c.startswith(delimiter) else c for c in continuations]
        target = str(record["target"])
        if target.startswith("[") and target.endswith("]"):
            raise ParameterError(name, raw, f"{where}: several gold answers ({target}) are not supported")
        gold = _gold(target, choices)
        if gold is None:
            raise ParameterError(name, raw, f"{where}: target {target!r} is neither a choice index < {len(choices)} "
                                            f"nor one of the choices {choices}")
        doc = record["doc"] if isinstance(record["doc"], dict) else {}
        subject = doc.get("subject")
        lls_all.append(lls)
        choices_all.append(choices)
        labels.append(gold)
        subjects.append(subject if isinstance(subject, str) else None)
        contexts.append(record["arguments"]["gen_args_0"].get("arg_0", ""))
        for metric, values in logged.items():
            values.append(float(record[metric]))
    return LMEvalSamples(task=task, path=path, loglikelihoods=lls_all, choices=choices_all,
                         labels=np.array(labels, dtype=np.int64), subjects=subjects, contexts=contexts,
                         logged={m: np.array(v) for m, v in logged.items()}, target_delimiter=delimiter,
                         results=results)


def option_log_scores(samples: LMEvalSamples, scoring: str = "acc") -> np.ndarray:
    """(n, K) float64 ``loglikelihood / length`` of every choice under ``scoring`` (K = most choices of any
    document; -inf where a document has fewer). Its row argmax is lm-eval's prediction for that metric."""
    k = max(len(ll) for ll in samples.loglikelihoods)
    scores = np.full((len(samples.loglikelihoods), k), -np.inf)
    for i, (lls, choices) in enumerate(zip(samples.loglikelihoods, samples.choices)):
        scores[i, : len(lls)] = lls / choice_lengths(choices, scoring)
    return scores


def to_mcqa_scores(samples: LMEvalSamples, scoring: str = "acc"):
    """``modeling.MCQAScores`` of the samples under ``scoring``, for ``reports``: ``option_logits`` are the
    (normalised) log-likelihoods of ``option_log_scores``, ``probs`` their softmax, ``option_mass`` the
    probability of the choices' continuations summed (exp of the raw log-likelihoods: how much of the
    model's distribution the choices cover; near 1 for single-letter choices a model expects)."""
    from hf_calibration.modeling.scoring import MCQAScores

    logits = option_log_scores(samples, scoring)
    probs = softmax(logits, axis=1)
    prediction = logits.argmax(axis=1)
    return MCQAScores(
        option_logits=logits, probs=probs,
        option_mass=np.array([float(np.exp(lls).sum()) for lls in samples.loglikelihoods]),
        prediction=prediction, confidence=probs.max(axis=1), labels=samples.labels,
        correct=prediction == samples.labels, prompt_format="lm-eval", prompts=list(samples.contexts),
    )
