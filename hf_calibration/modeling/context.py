"""Inputs longer than the model's context: one rule for every prompt this package builds.

What a step needs to read its answer is never cut: the options, the answer slot (the token(s) the model reads or
writes next), the chat template's markup and the follow-up turns. Only an item's free text (the question, a
HaluEval knowledge passage, dialogue or document) is cut, **from its middle**, to fit the model's context minus
the tokens the step still needs (``reserve``): the head keeps what the item is about (the setting, a document's
start), and the tail keeps what is asked (an MCQA question ends with its question sentence, a HaluEval item with
the sentence to judge); cutting either end would lose one of the two. The cut is marked by ``CUT_MARKER``.

``fit_to_context`` measures every prompt once before the model sees any (O(items) tokenizations) and applies
the ``on_overflow`` policy: ``"truncate"`` cuts (one warning per call counting the cut items and naming the
first), ``"skip"`` drops the items (one warning too), ``"error"`` raises ``ParameterError`` naming the first item.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable, Sequence

from hf_calibration.errors import ParameterError, ParameterWarning

OVERFLOW_POLICIES = ("truncate", "skip", "error")
CUT_MARKER = " [...] "


def context_length(model, tokenizer=None) -> int | None:
    """Tokens the model reads at most: its config's position limit (``max_position_embeddings``, ``n_positions``,
    …), else the tokenizer's ``model_max_length`` when it is a real limit; None when neither says."""
    config = getattr(model, "config", model)
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    value = getattr(tokenizer, "model_max_length", None)
    return value if isinstance(value, int) and 0 < value < 10**7 else None  # 1e30: "no limit" in transformers


@dataclass
class ContextFit:
    """What ``fit_to_context`` did.

    texts : the kept items' free texts, in order, those that did not fit cut in the middle.
    kept : the indices (into the input) of the kept items; all of them unless ``on_overflow="skip"``.
    overflowed : the indices of the items that did not fit (cut, or dropped under "skip").
    limit : the context length fitted to (tokens).
    """

    texts: list[str]
    kept: list[int]
    overflowed: list[int]
    limit: int | None


def _n_tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def _cut_middle(tokenizer, text: str, build: Callable[[str], str], budget: int) -> str | None:
    """``text`` cut in the middle so that ``build(text)`` has at most ``budget`` tokens; None when even the empty
    text does not fit (the options and markup alone are too long)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    keep = len(ids) - (_n_tokens(tokenizer, build(text)) - budget) - _n_tokens(tokenizer, CUT_MARKER)
    for _ in range(6):  # re-tokenising the joined text may differ by a few tokens: shrink until it fits
        if keep <= 0:
            return None if _n_tokens(tokenizer, build("")) > budget else ""
        head = (keep + 1) // 2
        cut = tokenizer.decode(ids[:head]) + CUT_MARKER + tokenizer.decode(ids[len(ids) - (keep - head):])
        over = _n_tokens(tokenizer, build(cut)) - budget
        if over <= 0:
            return cut
        keep -= over + 2
    return None


def fit_to_context(tokenizer, texts: Sequence[str], *, build: Callable[[int, str], str], limit: int | None,
                   reserve=0, on_overflow: str = "truncate", what: str = "question") -> ContextFit:
    """Fit each item's free text so that its prompt plus ``reserve`` tokens fits in ``limit`` tokens.

    texts : the items' cuttable text (n items). build : ``build(i, text)`` → the longest prompt this step builds
        for item ``i`` with that text (the options, markup and follow-up turns included). limit : the model's
        context (``context_length``); None: nothing is checked. reserve : tokens the step appends or generates
        after the prompt (an int, or one per item). on_overflow : "truncate", "skip" or "error" (module
        docstring). what : how the warning and the error name an item ("question 7").

    Raises ParameterError naming ``on_overflow`` for an unknown policy, and, under "error", for the first item
    that does not fit (nothing is scored or written by a job that calls this before its model runs). An item
    whose fixed parts alone exceed the context is dropped under "truncate" too (and counted in the warning).
    """
    if on_overflow not in OVERFLOW_POLICIES:
        raise ParameterError("on_overflow", on_overflow, f"must be one of {', '.join(map(repr, OVERFLOW_POLICIES))}, "
                             f"got {on_overflow!r}")
    texts = list(texts)
    if limit is None:
        return ContextFit(texts, list(range(len(texts))), [], None)
    reserves = [reserve] * len(texts) if isinstance(reserve, int) else list(reserve)
    out, kept, overflowed, dropped, first = [], [], [], 0, None
    for i, text in enumerate(texts):
        budget = limit - reserves[i]
        n = _n_tokens(tokenizer, build(i, text))
        if n <= budget:
            out.append(text)
            kept.append(i)
            continue
        overflowed.append(i)
        first = first or (i, n)
        if on_overflow == "error":
            raise ParameterError("on_overflow", on_overflow, f"{what} {i} is {n:,} tokens with its prompt, over the "
                                 f"model's context of {limit:,} (the step needs {reserves[i]} more); "
                                 f"{{on_overflow}} truncate cuts it in the middle, skip drops it")
        cut = None if on_overflow == "skip" else _cut_middle(tokenizer, text, lambda t: build(i, t), budget)
        if cut is None:
            dropped += on_overflow == "truncate"
            continue
        out.append(cut)
        kept.append(i)
    if overflowed:
        _warn(len(overflowed), len(texts), dropped, first, limit, on_overflow, what)
    return ContextFit(out, kept, overflowed, limit)


def _warn(n_over: int, n: int, dropped: int, first: tuple, limit: int, on_overflow: str, what: str) -> None:
    done = "cut in the middle to fit" if on_overflow == "truncate" else "skipped"
    extra = f" ({dropped} dropped: their options alone do not fit)" if dropped else ""
    warnings.warn(ParameterWarning("on_overflow", on_overflow,
                                   f"{n_over} of {n} {what}s are longer than the model's context of {limit:,} tokens "
                                   f"and were {done}{extra}; the first: {what} {first[0]} ({first[1]:,} tokens); "
                                   + ("{on_overflow} skip drops them, error stops" if on_overflow == "truncate"
                                      else "{on_overflow} truncate cuts them instead, error stops")), stacklevel=3)
