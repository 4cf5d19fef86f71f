"""The one rule for "a number" in an answer, used by the GSM8K loader, the SECL stream's grading and Semantic ECE's
lexical equivalence.

A number is an optional sign, then digits with optional thousands commas and an optional fraction, or a bare
fraction: ``-3``, ``1,000``, ``2.50``, ``.5``. A trailing period is the sentence's, not the number's
(``"The answer is 2."`` → 2), and a leading ``$`` is dropped.
"""

from __future__ import annotations

import math
import re

NUMBER = re.compile(r"[-+]?(?:\d[\d,]*(?:\.\d+)?|\.\d+)")

__all__ = ["NUMBER", "extract_final_number", "normalize_number", "parse_number", "same_number"]


def _clean(text: str) -> str:
    return text.strip().rstrip(".").strip().lstrip("$").strip()


def parse_number(text: str) -> float | None:
    """The value of a text that is one number and nothing else (``"$1,000."`` → 1000.0, ``".5"`` → 0.5), else
    None (also for a non-finite value)."""
    cleaned = _clean(text)
    if not NUMBER.fullmatch(cleaned):
        return None
    value = float(cleaned.replace(",", ""))
    return value if math.isfinite(value) else None


def normalize_number(text: str) -> str:
    """Canonical form of a numeric answer: commas and '$' dropped, a whole value without its fraction
    (``"1,000.00"`` → ``"1000"``, ``".5"`` → ``"0.5"``, ``"-3"`` → ``"-3"``); a text that is not one number comes
    back stripped of those characters."""
    value = parse_number(text)
    if value is None:
        return text.replace(",", "").replace("$", "").strip().rstrip(".")
    return str(int(value)) if value == int(value) else repr(value)


def extract_final_number(text: str) -> str | None:
    """The answer after GSM8K's '####' marker, else the last number in ``text``, in ``normalize_number``'s form;
    None when there is none."""
    if "####" in text:
        return normalize_number(text.split("####")[-1])
    numbers = NUMBER.findall(text)
    return normalize_number(numbers[-1]) if numbers else None


def same_number(a, b) -> bool:
    """True when ``a`` and ``b`` (str or number) are both numbers (``parse_number``) of equal value, or, when either
    is not a number, equal texts after stripping whitespace."""
    x, y = parse_number(str(a)), parse_number(str(b))
    if x is None or y is None:
        return str(a).strip() == str(b).strip()
    return x == y
