"""A stream of questions from several domains, as token ids a causal LM answers one after the other, and the rule
its answers are graded by.

``build_stream`` draws each domain's questions (``data.load_mcqa`` / ``data.load_open_qa``, looked up on ``data``
at the call) and builds each prompt
(``modeling.prompts``): MCQA questions with lettered options, open-ended ones asking for the final number.
``judge`` grades a generated answer: the option letter it names, or the number it ends with (``data.numbers``).
The stream lives here, not in ``data``, because it builds prompts and token ids, which are ``modeling``'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from hf_calibration import data
from hf_calibration.data import MCQA_DATASETS, OPEN_QA_DATASETS, parse_domains
from hf_calibration.data.numbers import extract_final_number, same_number
from hf_calibration.errors import ParameterError, renamed_parameters
from hf_calibration.modeling.prompts import LETTERS, build_prompt, first_option_letter, format_mcqa

__all__ = ["OPEN_QA_INSTRUCTION", "STREAM_DOMAINS", "StreamItem", "build_stream", "judge", "parse_stream"]

# every domain a stream may hold: the MCQA datasets, then the open-ended ones
STREAM_DOMAINS = tuple(MCQA_DATASETS) + tuple(OPEN_QA_DATASETS)
OPEN_QA_INSTRUCTION = "Reply with the final number only."


@dataclass
class StreamItem:
    """One question of the stream. ``gold``: option index (MCQA) or the final number as text (open)."""

    domain: str
    prompt_ids: list
    gold: object
    kind: str  # "mcqa" or "open"
    n_options: int = 0
    choices: list | None = None  # MCQA: the option texts in letter order (P(True) is asked about them)


def parse_stream(stream: str) -> list[tuple[str, str | None]]:
    """"mmlu:humanities,gsm8k,halueval_qa" → [("mmlu", "humanities"), ("gsm8k", None), ("halueval_qa", None)]:
    ``data.parse_domains`` over the stream's domains (``STREAM_DOMAINS``), MMLU subjects or
    categories '+'-joined (``mmlu:stem+other``). Raises ParameterError naming ``stream``."""
    with renamed_parameters(domains="stream"):
        return parse_domains(stream, STREAM_DOMAINS)


def build_stream(tokenizer, stream: str, *, limit_per_domain: int, seed: int = 0, prompt_format: str = "auto",
                 balance_gold: bool = False, context: int | None = None, reserve: int = 0,
                 on_overflow: str = "truncate") -> list:
    """The stream's items, domain after domain, ``limit_per_domain`` each (seeded sample).

    balance_gold : passed to ``load_mcqa`` (every option letter gold equally often in each MCQA domain).
    context, reserve, on_overflow : each prompt plus ``reserve`` tokens (the answer and follow-up turns) fitted
        to ``context`` tokens by ``modeling.context.fit_to_context`` (None: not checked).
    Raises ParameterError naming ``stream``, ``limit_per_domain`` or (``on_overflow="error"``) ``on_overflow``.
    """
    from hf_calibration.modeling.context import fit_to_context

    if isinstance(limit_per_domain, bool) or not isinstance(limit_per_domain, int) or limit_per_domain < 1:
        raise ParameterError("limit_per_domain", limit_per_domain,
                             f"must be a positive integer, got {limit_per_domain!r}")
    items = []
    for name, subjects in parse_stream(stream):
        label = name if subjects is None else f"{name}:{subjects.replace(',', '+')}"
        if name in MCQA_DATASETS:
            rows = list(data.load_mcqa(name, subjects=subjects, limit=limit_per_domain, seed=seed,
                                       balance_gold=balance_gold))
            user = [lambda q, c=row["choices"]: format_mcqa(q, c) for row in rows]
        else:
            rows = list(data.load_open_qa(name, limit=limit_per_domain, seed=seed))
            user = [lambda q: f"{q.strip()}\n{OPEN_QA_INSTRUCTION}"] * len(rows)
        fit = fit_to_context(tokenizer, [r["question"] for r in rows], limit=context, reserve=reserve,
                             build=lambda i, q: build_prompt(tokenizer, user[i](q), prompt_format=prompt_format),
                             on_overflow=on_overflow)
        for i, question in zip(fit.kept, fit.texts):
            row = rows[i]
            ids = tokenizer.encode(build_prompt(tokenizer, user[i](question), prompt_format=prompt_format),
                                   add_special_tokens=False)
            if name in MCQA_DATASETS:
                items.append(StreamItem(label, ids, int(row["answer"]), "mcqa", len(row["choices"]),
                                        list(row["choices"])))
            else:
                items.append(StreamItem(label, ids, str(row["final_answer"]), "open"))
    return items


def judge(item: StreamItem, text: str) -> tuple[str, bool]:
    """(parsed answer, correct) of a generated answer text.

    MCQA: the first standalone option letter in the first 40 characters ("C", "C. …", "The answer is C");
    open-ended: the last number in the text (``extract_final_number``) compared numerically.
    """
    if item.kind == "mcqa":
        letter = first_option_letter(text)
        k = LETTERS.index(letter) if letter is not None and LETTERS.index(letter) < item.n_options else -1
        return (LETTERS[k] if k >= 0 else ""), k == item.gold
    number = extract_final_number(text)
    return ("" if number is None else str(number)), number is not None and same_number(number, item.gold)
