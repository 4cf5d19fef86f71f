"""lm-evaluation-harness tasks over hf_calibration's multiple-choice data (``data.load_mcqa`` rows or your own):
run lm-eval on the same questions ``hf-calibration evaluate`` scores, on any of its backends.

``write_mcqa_task(rows, folder, "my_task")`` writes ``folder/my_task.jsonl`` (the rows with their prompt) and
``folder/my_task.yaml`` (``dataset_path: json`` over that file); pass ``folder`` to lm-eval as
``--include_path`` (or ``TaskManager(include_path=...)``) and ``my_task`` as a task.
"""

from __future__ import annotations

import json
from pathlib import Path

from hf_calibration.errors import check_choice
from hf_calibration.modeling.prompts import LETTERS, format_mcqa

__all__ = ["CHOICE_STYLES", "ECE_YAML", "write_mcqa_task"]

# how the choices are scored: the option letter after the lettered options (lm-eval's MMLU), or the text itself
CHOICE_STYLES = ("letters", "texts")

# The lines of a multiple-choice task's YAML that make lm-eval report conf-ECE and its 95 % interval beside acc
# (``hf_calibration.integrations.lm_eval_metrics``); README.md and docs/lm_eval.md show them as they are here.
ECE_YAML = """process_results: !function hf_calibration.integrations.lm_eval_metrics.process_results
metric_list:
  - {metric: acc, aggregation: mean, higher_is_better: true}
  - {metric: ece, aggregation: !function hf_calibration.integrations.lm_eval_metrics.ece, higher_is_better: false}
  - {metric: ece_low, aggregation: !function hf_calibration.integrations.lm_eval_metrics.ece_low, higher_is_better: false}
  - {metric: ece_high, aggregation: !function hf_calibration.integrations.lm_eval_metrics.ece_high, higher_is_better: false}
"""
_ACC_YAML = """metric_list:
  - {metric: acc, aggregation: mean, higher_is_better: true}
  - {metric: acc_norm, aggregation: mean, higher_is_better: true}
"""


def write_mcqa_task(rows, folder, name: str, *, choices: str = "letters", ece: bool = False, tokenizer=None,
                    max_length: int | None = None, on_overflow: str = "truncate") -> Path:
    """Write an lm-eval ``multiple_choice`` task over MCQA ``rows`` (``question``, ``choices``, ``answer`` index,
    optional ``subject``) into ``folder``; returns the YAML's path.

    ``choices="letters"``: the prompt is ``modeling.prompts.format_mcqa`` (the question, "A. …" lines, the
    instruction) plus "\\nAnswer:" (``evaluate --prompt-format plain``'s text) and the choices are the letters;
    ``"texts"``: the prompt is the question plus "\\nAnswer:" and the choices are the option texts (cloze).
    The task reports ``acc`` and ``acc_norm``; with ``ece``, ``acc`` and conf-ECE with its 95 % interval through
    ``hf_calibration.integrations.lm_eval_metrics`` instead (lm-eval then needs hf_calibration importable).

    tokenizer, max_length, on_overflow : with a tokenizer and the model's context (tokens), every prompt plus its
        longest choice is fitted to it before it is written (``modeling.context.fit_to_context``: the question's
        middle cut, or the row skipped, or a ParameterError naming ``on_overflow``); lm-eval itself would cut the
        prompt's start (its left truncation), the question with it.

    Raises ValueError for an unknown ``choices`` style, a ``name`` that is not a plain file name, or no rows.
    """
    check_choice(choices, "choices", CHOICE_STYLES)
    if not name or Path(name).name != name or name.startswith("."):
        raise ValueError(f"name: must be a plain task name, got {name!r}")
    rows = [dict(r) for r in rows]
    if not rows:
        raise ValueError("rows: no questions")

    def text(r, question):
        return (format_mcqa(question, r["choices"]) if choices == "letters" else question.strip()) + "\nAnswer:"

    if tokenizer is not None and max_length is not None:
        rows = _fit_rows(rows, tokenizer, max_length, on_overflow, text, choices)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / f"{name}.jsonl"
    with open(data, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps({**r, "prompt": text(r, r["question"]), "letters": list(LETTERS[: len(r["choices"])])},
                               ensure_ascii=False) + "\n")
    yaml = "\n".join([
        f"task: {name}", "dataset_path: json", "dataset_kwargs:", "  data_files:",
        f"    test: {json.dumps(str(data.resolve()))}", "test_split: test", "output_type: multiple_choice",
        "doc_to_text: prompt", f"doc_to_choice: {'letters' if choices == 'letters' else 'choices'}",
        "doc_to_target: answer", ECE_YAML if ece else _ACC_YAML])
    path = folder / f"{name}.yaml"
    path.write_text(yaml, encoding="utf-8")
    return path


def _fit_rows(rows: list[dict], tokenizer, max_length: int, on_overflow: str, text, choices: str) -> list[dict]:
    """``rows`` with each prompt (``text(row, question)``) plus its longest choice fitted to ``max_length``."""
    from hf_calibration.modeling.context import fit_to_context

    def longest(r):
        options = list(LETTERS[: len(r["choices"])]) if choices == "letters" else r["choices"]
        return max(len(tokenizer(" " + o, add_special_tokens=False)["input_ids"]) for o in options)

    fit = fit_to_context(tokenizer, [r["question"] for r in rows], build=lambda i, q: text(rows[i], q),
                         limit=max_length, reserve=[longest(r) for r in rows], on_overflow=on_overflow)
    return [{**rows[i], "question": q} for i, q in zip(fit.kept, fit.texts)]
