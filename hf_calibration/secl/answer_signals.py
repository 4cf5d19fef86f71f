"""The confidence signals of one generated answer, read through any ``ScoringBackend`` (the calibration gateway).

``confidence.mcqa_signals`` / ``served.mcqa_signals_with`` score a data set of multiple-choice rows; a deployed
model answers one conversation at a time, whatever its prompt. ``answer_signal`` computes one signal for one
answer after an arbitrary prompt (token ids: a chat conversation rendered by the model's chat template, or a
plain completion prompt), from the same pieces those functions use: the follow-up turn after the answer
(``confidence.followup_ids``, its templates and plain prefixes), the read of exactly the tokens a signal needs
(``ScoringBackend.next_token_logprobs``, placed in a row by ``TokenLogprobs.dense``) and the shared
``p_true_from_logprobs`` / ``verbalized_from_logprobs`` / ``norm_p_true``. Every follow-up prompt starts with the
prompt the model answered, so a server with a prefix cache (vLLM) reuses its key/value blocks.

Signals (docs/methods.md, "SECL"; docs/gateway.md):

- ``p_true``: P(Yes)/(P(Yes)+P(No)) after "is the answer correct?" (Kadavath et al. 2022). 1 read.
- ``norm_p_true``: ``softmax(P_T / τ_n)`` over the answer and the request's other options; K reads.
- ``verbalized``: the expectation over the digits 0..10 after "rate your confidence"; 1 read (2 prompts when
  "10" is two tokens).
- ``option_probability``: the options' letters' next-token probabilities after the prompt, softmax over the K
  options (``score_mcqa``'s top-label probability); 1 read.

For a multiple-choice request (``multiple_choice=True``: the prompt lists the options as "A. …" lines, as
``format_mcqa`` writes them) the answer is the option the reply names (``prompts.first_option_letter``), said as
its letter and restated as "C. text" in the follow-up turns, exactly as ``mcqa_signals`` restates it; the values
then equal ``mcqa_signals``' for that option.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from hf_calibration.errors import ParameterError
from hf_calibration.modeling.prompts import LETTERS, first_option_letter, option_token_ids
from hf_calibration.secl.confidence import (CONFIDENCE_TEMPLATE, DEFAULT_TAU_N, P_TRUE_TEMPLATE,
                                            PLAIN_CONFIDENCE_PREFIX, PLAIN_P_TRUE_PREFIX, ConfidenceTokens,
                                            _answer_then_followup, mcqa_answer_text, norm_p_true,
                                            p_true_from_logprobs, verbalized_from_logprobs)

ANSWER_SIGNALS = ("p_true", "norm_p_true", "verbalized", "option_probability")
NEEDS_OPTIONS = ("norm_p_true", "option_probability")


@dataclass
class AnswerSignal:
    """One signal of one answer.

    raw : the signal's value in [0, 1]. mass : probability of the tokens read, in [0, 1] (how much of the
    next-token distribution the value is built from). option : index of the option the answer is (None for a
    free-form answer without options). reads : prompts sent to the backend. detail : the per-option values
    (``p_true_options``, ``option_probs``) or the greedy verbalized number, where the signal has them.
    """

    raw: float
    mass: float
    option: int | None
    reads: int
    detail: dict


def _normalised(text: str) -> str:
    return " ".join(str(text).split()).casefold().rstrip(".")


def candidates(answer: str, options: Sequence[str] | None, multiple_choice: bool):
    """(candidates as ``(said, restated)`` pairs, index of the answer among them).

    Multiple choice: one candidate per option, said as its letter and restated as "C. text"; the answer is the
    option its first standalone letter names (ParameterError naming ``choices.message.content`` when it names
    none). Free form with options: the options, the answer being the one equal to it (case and spacing aside),
    or the answer put first when none is. Free form without options: the answer alone.
    """
    if multiple_choice:
        if not options or not 2 <= len(options) <= len(LETTERS):
            raise ParameterError("calibration.options", options, f"a multiple-choice request needs 2 to "
                                 f"{len(LETTERS)} options, got {options!r}")
        letter = first_option_letter(answer)
        if letter is None or LETTERS.index(letter) >= len(options):
            raise ParameterError("choices.message.content", answer, f"the answer {answer[:60]!r} names no option "
                                 f"letter A-{LETTERS[len(options) - 1]}")
        pairs = [(LETTERS[j], mcqa_answer_text(LETTERS[j], o)) for j, o in enumerate(options)]
        return pairs, LETTERS.index(letter)
    if not options:
        return [(answer, answer)], 0
    pairs = [(o, o) for o in options]
    match = [j for j, o in enumerate(options) if _normalised(o) == _normalised(answer)]
    if match:
        return pairs, match[0]
    return [(answer, answer), *pairs], 0


def _followups(tokenizer, prompt_ids, pairs, template, fmt, prefix) -> list[list[int]]:
    return [list(prompt_ids) + _answer_then_followup(tokenizer, said, template.replace("{answer}", restated), fmt,
                                                     prefix) for said, restated in pairs]


def _read(backend, prompts, ids):
    backend.check_lengths(prompts, extra=1)
    return backend.next_token_logprobs(prompts, ids).dense(ids, backend.vocab_size)


def answer_signal(backend, tokenizer, prompt_ids: Sequence[int], answer: str, signal: str, *, prompt_format: str,
                  options: Sequence[str] | None = None, multiple_choice: bool = False,
                  tau_n: float = DEFAULT_TAU_N, tokens: ConfidenceTokens | None = None) -> AnswerSignal:
    """``signal`` (one of ``ANSWER_SIGNALS``) of ``answer`` (the model's reply text) after ``prompt_ids`` (the
    token ids the model answered: a chat template's rendering with the generation prompt, or a plain prompt),
    read through ``backend``. ``prompt_format``: "chat" or "plain" (how the follow-up turn is written).
    ``options`` : the request's options (needed by ``norm_p_true`` and ``option_probability``);
    ``multiple_choice`` : the options are lettered in the prompt (module docstring). ``tau_n`` > 0: P(True)Norm's
    temperature.

    Raises ParameterError naming ``signal``, ``calibration.options`` or ``choices.message.content`` for a request
    the signal cannot be read for, and the backend's errors (``ServerError`` when the server does not answer).
    """
    if signal not in ANSWER_SIGNALS:
        raise ParameterError("signal", signal, f"must be one of {', '.join(ANSWER_SIGNALS)}, got {signal!r}")
    if signal in NEEDS_OPTIONS and not options:
        raise ParameterError("calibration.options", options, f"the signal {signal} needs the request's options "
                             "(calibration.options)")
    if signal == "option_probability" and not multiple_choice:
        raise ParameterError("calibration.multiple_choice", multiple_choice, "option_probability reads the option "
                             "letters: the request must be multiple choice (calibration.multiple_choice: true)")
    tokens = tokens or ConfidenceTokens.from_tokenizer(tokenizer)
    pairs, at = candidates(answer, options, multiple_choice)
    if signal == "option_probability":
        return _option_probability(backend, tokenizer, prompt_ids, len(pairs), at)
    if signal == "verbalized":
        return _verbalized(backend, tokenizer, prompt_ids, pairs[at], at if options else None, prompt_format, tokens)
    yes_no = list(dict.fromkeys([*tokens.yes, *tokens.no]))
    chosen = pairs if signal == "norm_p_true" else [pairs[at]]
    lp = _read(backend, _followups(tokenizer, prompt_ids, chosen, P_TRUE_TEMPLATE, prompt_format,
                                   PLAIN_P_TRUE_PREFIX), yes_no)
    p, mass = p_true_from_logprobs(lp, tokens)
    p = p.numpy().astype(np.float64)
    if signal == "p_true":
        return AnswerSignal(float(p[0]), float(mass[0]), at if options else None, 1, {})
    norm = norm_p_true(p[None, :], tau=tau_n)[0]
    return AnswerSignal(float(norm[at]), float(np.mean(mass)), at, len(pairs),
                        {"p_true_options": p.tolist(), "norm_p_true_options": norm.tolist()})


def _verbalized(backend, tokenizer, prompt_ids, pair, option, fmt, tokens) -> AnswerSignal:
    prompt = _followups(tokenizer, prompt_ids, [pair], CONFIDENCE_TEMPLATE, fmt, PLAIN_CONFIDENCE_PREFIX)
    if tokens.two_step:
        prompt.append(prompt[0] + [tokens.digits[1][0]])
    ids = list(dict.fromkeys([t for v in tokens.digits for t in v] + list(tokens.ten) + list(tokens.zero_after_one)))
    lp = _read(backend, prompt, ids)
    value, greedy, mass = verbalized_from_logprobs(lp[:1], tokens, lp[1:] if tokens.two_step else None)
    return AnswerSignal(float(value[0]), float(mass[0]), option, len(prompt),
                        {"verbalized_greedy": None if np.isnan(greedy[0]) else float(greedy[0])})


def _option_probability(backend, tokenizer, prompt_ids, k: int, at: int) -> AnswerSignal:
    variants = option_token_ids(tokenizer, k)
    ids = [t for v in variants for t in v]
    lp = _read(backend, [list(prompt_ids)], ids)[0]
    letter_lp = torch.stack([torch.logsumexp(lp[list(v)], dim=0) for v in variants])
    probs = torch.softmax(letter_lp, dim=0).double().numpy()
    return AnswerSignal(float(probs[at]), float(torch.exp(torch.logsumexp(letter_lp, dim=0))), at, 1,
                        {"option_probs": probs.tolist()})
