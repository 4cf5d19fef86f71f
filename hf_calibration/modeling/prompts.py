"""Prompt formats for MCQA scoring; the format is recorded with every number (``run["prompt_format"]`` of every job)."""

from __future__ import annotations

import re
from typing import Sequence

from hf_calibration.errors import ParameterError

LETTERS = "ABCDEFGHIJ"
MCQA_INSTRUCTION = "Answer with the letter of the correct option only."
PROMPT_FORMATS = ("auto", "chat", "plain")
_OPTION_LETTER = re.compile(r"\b([A-J])\b")  # LETTERS


def first_option_letter(text: str) -> str | None:
    """The first standalone option letter A–J in the first 40 characters of ``text`` ("C", "C. Paris",
    "The answer is C"), or None: the rule generated MCQA answers are read by."""
    m = _OPTION_LETTER.search(text.strip()[:40])
    return m.group(1) if m else None


def format_mcqa(question: str, choices: Sequence[str]) -> str:
    """The question, the options as "A. …" lines, and the instruction to answer with a letter."""
    if not 2 <= len(choices) <= len(LETTERS):
        raise ValueError(f"choices: need 2 to {len(LETTERS)} options, got {len(choices)}")
    options = "\n".join(f"{LETTERS[i]}. {c}" for i, c in enumerate(choices))
    return f"{question.strip()}\n{options}\n{MCQA_INSTRUCTION}"


def resolve_prompt_format(tokenizer, prompt_format: str = "auto") -> str:
    """"chat" when the tokenizer has a chat template (for "auto"), else "plain"; validates the value."""
    if prompt_format not in PROMPT_FORMATS:
        raise ParameterError("prompt_format", prompt_format,
                             f"must be 'auto', 'chat' or 'plain', got {prompt_format!r}")
    if prompt_format == "auto":
        return "chat" if getattr(tokenizer, "chat_template", None) else "plain"
    if prompt_format == "chat" and not getattr(tokenizer, "chat_template", None):
        raise ParameterError("prompt_format", prompt_format, "'chat' was asked for but the tokenizer has no chat template")
    return prompt_format


def build_prompt(tokenizer, user_text: str, *, prompt_format: str = "auto", assistant_prefix: str = "") -> str:
    """One user turn ready for the model's next token.

    "chat": the tokenizer's chat template with the generation prompt, then ``assistant_prefix``.
    "plain": ``user_text`` followed by "\\nAnswer:" (or ``assistant_prefix`` when given).
    """
    fmt = resolve_prompt_format(tokenizer, prompt_format)
    if fmt == "chat":
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": user_text}], tokenize=False, add_generation_prompt=True
        )
        return text + assistant_prefix
    return f"{user_text}\n{assistant_prefix or 'Answer:'}"


def build_mcqa_prompt(tokenizer, question: str, choices: Sequence[str], *, prompt_format: str = "auto") -> str:
    """MCQA prompt whose next token is the option letter (see ``format_mcqa`` and ``build_prompt``)."""
    return build_prompt(tokenizer, format_mcqa(question, choices), prompt_format=prompt_format)


def single_token_ids(tokenizer, texts: Sequence[str]) -> list[int]:
    """Token ids of those ``texts`` that encode to exactly one token (variants such as "A" and " A").

    The unknown token does not count: a word-level vocabulary maps any missing text to it.
    """
    unk = getattr(tokenizer, "unk_token_id", None)
    ids = []
    for text in texts:
        enc = tokenizer.encode(text, add_special_tokens=False)
        if len(enc) == 1 and enc[0] != unk and enc[0] not in ids:
            ids.append(enc[0])
    return ids


def option_token_ids(tokenizer, n_options: int) -> list[list[int]]:
    """For each letter A, B, …: the single-token ids of "A" and " A" (tokenizers differ in which exist).

    The probability of an option is the summed probability of its variants (logsumexp of their logits).
    Raises ValueError naming the letter when neither variant is a single token.
    """
    out = []
    for letter in LETTERS[:n_options]:
        ids = single_token_ids(tokenizer, [letter, " " + letter])
        if not ids:
            raise ValueError(f"tokenizer: neither {letter!r} nor {' ' + letter!r} is a single token")
        out.append(ids)
    return out


def mcqa_prompts(tokenizer, dataset, *, prompt_format: str = "auto"):
    """What every MCQA scorer (in process or through a server) prepares: (rows as a list, the resolved prompt
    format, (n,) option counts, K = the largest, ``option_token_ids`` for K letters (each letter's token ids),
    the same flattened, the n prompt strings). ValueError for an empty dataset or a tokenizer without single-token
    option letters."""
    import numpy as np

    rows = list(dataset)
    if not rows:
        raise ValueError("dataset: no questions to score")
    fmt = resolve_prompt_format(tokenizer, prompt_format)
    n_opts = np.array([len(r["choices"]) for r in rows])
    k = int(n_opts.max())
    variants = option_token_ids(tokenizer, k)
    flat = [t for v in variants for t in v]
    prompts = [build_mcqa_prompt(tokenizer, r["question"], r["choices"], prompt_format=fmt) for r in rows]
    return rows, fmt, n_opts, k, variants, flat, prompts
