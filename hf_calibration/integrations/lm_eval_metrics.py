"""ECE inside lm-evaluation-harness: functions a multiple-choice task's YAML names, so lm-eval itself reports
conf-ECE (with a 95 % bootstrap interval) next to accuracy, on any backend (HF, vLLM, an API) and without
our scoring code::

    process_results: !function hf_calibration.integrations.lm_eval_metrics.process_results
    metric_list:
      - {metric: acc, aggregation: mean, higher_is_better: true}
      - {metric: ece, aggregation: !function hf_calibration.integrations.lm_eval_metrics.ece, higher_is_better: false}
      - {metric: ece_low, aggregation: !function hf_calibration.integrations.lm_eval_metrics.ece_low, higher_is_better: false}
      - {metric: ece_high, aggregation: !function hf_calibration.integrations.lm_eval_metrics.ece_high, higher_is_better: false}

lm-eval (0.4.x, ``lm_eval/api/task.py``) hands ``process_results(doc, results)`` one document and its
choices' ``(loglikelihood, is_greedy)`` pairs; it returns, per metric name, a per-document item; after all
documents lm-eval calls each metric's ``aggregation`` on the list of its items. A task that names a
``process_results`` loses lm-eval's built-in one, so this one returns ``acc`` too (the same
``argmax(loglikelihoods) == gold``). The confidence is the softmax over the choices of the log-likelihoods,
exactly ``hf-calibration lm-eval-import``'s ``acc`` scoring, so both report the same conf-ECE.

Why the interval is two more metrics: lm-eval's ``*_stderr`` comes from ``lm_eval.api.metrics.stderr_for_metric``,
which bootstraps only its own whitelisted aggregations (median, F1, MCC, BLEU, ...) and knows closed forms only
for ``mean``; any other aggregation gets "N/A". So ``ece_low`` / ``ece_high`` are the 95 % percentile bootstrap
bounds (``hf_calibration.metrics.bootstrap``, 1000 resamples, seed 0: the resamples ``calibration_report``
draws), and ``ece_stderr`` stays N/A.
"""

from __future__ import annotations

import numpy as np

from hf_calibration.integrations.lm_eval_import import option_probabilities
from hf_calibration.metrics import bootstrap, expected_calibration_error

__all__ = ["ECE_OPTIONS", "ece", "ece_high", "ece_low", "mcqa_results", "process_results"]

# conf-ECE as hf-calibration reports it by default (calibration_report, lm-eval-import)
ECE_OPTIONS = {"n_bins": 15, "n_resamples": 1000, "seed": 0}
_LETTERS = "ABCDEFGHIJ"


def mcqa_results(results, gold: int) -> dict:
    """Per-document items of ``acc`` and the ECE metrics from lm-eval's ``results`` (a list of K
    ``(loglikelihood, is_greedy)``) and the gold choice index ``gold`` (0 ≤ gold < K).

    Returns ``{"acc": 0.0 | 1.0, "ece": (confidence, correct), "ece_low": ..., "ece_high": ...}``: the
    confidence is the top softmax probability of the log-likelihoods, in [1/K, 1]; correct is 0 or 1.
    For your own ``process_results`` when the gold index is not the doc's ``answer``. Raises ValueError for
    a gold index out of range.
    """
    lls = np.array([float(ll) for ll, _ in results], dtype=np.float64)
    if isinstance(gold, bool) or not isinstance(gold, (int, np.integer)) or not 0 <= gold < len(lls):
        raise ValueError(f"gold: must be a choice index in [0, {len(lls)}), got {gold!r}")
    probs = option_probabilities(lls)
    correct = float(np.argmax(lls) == gold)
    item = (float(probs.max()), correct)
    return {"acc": correct, "ece": item, "ece_low": item, "ece_high": item}


def process_results(doc: dict, results) -> dict:
    """lm-eval ``process_results`` for docs whose ``answer`` is the gold index or letter (A–J): MMLU's
    (``cais/mmlu``) schema and hf-calibration's. See ``mcqa_results``; raises TypeError naming ``answer``
    for any other doc (write a two-line ``process_results`` calling ``mcqa_results`` with your gold)."""
    answer = doc.get("answer") if isinstance(doc, dict) else None
    if isinstance(answer, str) and len(answer) == 1 and answer in _LETTERS:
        answer = _LETTERS.index(answer)
    if isinstance(answer, bool) or not isinstance(answer, int):
        raise TypeError(f"answer: process_results needs the doc's 'answer' as a choice index or letter A-J, got "
                         f"{answer!r}; call hf_calibration.integrations.lm_eval_metrics.mcqa_results(results, gold) instead")
    return mcqa_results(results, answer)


def _arrays(items) -> tuple[np.ndarray, np.ndarray]:
    items = np.asarray(list(items), dtype=np.float64).reshape(-1, 2)
    return items[:, 1].astype(np.int64), items[:, 0]


def ece(items) -> float:
    """lm-eval aggregation: conf-ECE (15 equal-width bins, l1) of the ``(confidence, correct)`` items."""
    correct, confidence = _arrays(items)
    return expected_calibration_error(correct, confidence, n_bins=ECE_OPTIONS["n_bins"])


def _interval(items) -> tuple[float, float]:
    correct, confidence = _arrays(items)
    _, low, high = bootstrap(expected_calibration_error, correct, confidence, n_resamples=ECE_OPTIONS["n_resamples"],
                             seed=ECE_OPTIONS["seed"], metric_kwargs={"n_bins": ECE_OPTIONS["n_bins"]})
    return low, high


def ece_low(items) -> float:
    """lm-eval aggregation: lower bound of conf-ECE's 95 % percentile bootstrap interval."""
    return _interval(items)[0]


def ece_high(items) -> float:
    """lm-eval aggregation: upper bound of conf-ECE's 95 % percentile bootstrap interval."""
    return _interval(items)[1]
