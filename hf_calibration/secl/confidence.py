"""Confidence signals of a causal LM about its own answer (docs/methods.md, "SECL"; baselines).

One home for the four signals that ``diagnose`` and SECL share:

- **verbalized confidence** (generative): after the answer, a follow-up turn asks for a number from
  0 to 10; the confidence is the expectation ``Σ_k P(k)·k/10`` over the digit tokens, renormalised
  over those tokens, so it is differentiable in the model's parameters (docs/methods.md, "SECL: verbalized confidence";
  reconstruction). The greedy number is returned beside it.
- **P(True)** (discriminative, Kadavath et al. 2022): after the answer, a follow-up turn asks whether
  the answer is correct; ``P(Yes) / (P(Yes) + P(No))``.
- **P(True)Norm** over the answer and its distractors: ``softmax(P_T / τ_n)`` (docs/methods.md, "SECL: P(True)Norm").
- **DINCO-style score** (Wang & Stengel-Eskin, ICLR 2026) without the NLI model; see ``dinco_score``.

Prompts. Every signal continues the conversation in which the model gave the answer:
``build_prompt(question) + answer + follow-up turn``. Token ids are concatenated, never re-tokenised
across the boundary, so the prompt the model answered is a prefix of every follow-up prompt; in process the
prefix is run once and its key/value cache is shared by all follow-ups of that question (an answer
and K distractors cost one long pass plus K+1 short ones; ``mcqa_signals`` through
``ScoringBackend.prefix_reads``, the in-process ``CachedPrefixReads``).

Multi-token numbers. Tokenizers that split digits (SmolLM2, Qwen2.5, Llama 3) have no single token
"10". Then the first step reads "0".."9"; the mass of "1" is split by a second next-token read after
"1": ``P(10) = P("1")·P("0" | "1")`` and ``P(1) = P("1")·(1 − P("0" | "1"))`` (the scale stops at
10, so any other continuation means 1). That read is counted as one more forward pass; where one
answer is read in process (``continuation_then_token``: SECL's ``generate``, ``mcqa_signals``) it costs one
more token in the same pass, "1" appended to the follow-up.

Forward passes are counted logically: one per next-token distribution read (one scored prompt), as if
no cache were shared; the ``seconds`` fields give the real cost with the cache.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from hf_calibration.errors import ParameterError
# the key/value-cache plumbing the signals run on (also imported from here by secl.mixin)
from hf_calibration.modeling.cache import (cache_row, continuation_logprobs, continuation_then_token,  # noqa: F401
                                           extend_cache, followup_logprobs, prefix_pass)
from hf_calibration.modeling.backends.base import as_backend
from hf_calibration.modeling.prompts import (LETTERS, build_mcqa_prompt, build_prompt, option_token_ids,
                                             resolve_prompt_format, single_token_ids)
from hf_calibration.modeling.signals import SIGNAL_NAMES, SIGNALS  # noqa: F401  (re-exported; defined below the report page)

# Anchored wording ("0 (certainly wrong) to 10 (certainly correct)") made Qwen2.5-Coder-0.5B answer "1"
# to every question; this wording gives a number that varies (greedy mostly 5-8). Our measurement.
CONFIDENCE_TEMPLATE = (
    'Rate your confidence that "{answer}" is correct from 0 to 10, where 10 means completely sure. '
    "Reply with the number only."
)
P_TRUE_TEMPLATE = 'Is the answer "{answer}" correct? Reply with Yes or No.'
# Plain prompts (no chat template) end with these prefixes, so the next token is the number / the word.
PLAIN_CONFIDENCE_PREFIX = "Confidence (0-10):"
PLAIN_P_TRUE_PREFIX = "Answer (Yes or No):"
DEFAULT_TAU_N = 0.2


def check_template(template: str, name: str = "template") -> str:
    """Raise ParameterError naming ``name`` unless ``template`` is a str with the ``{answer}`` slot and no
    other slot."""
    if not isinstance(template, str) or "{answer}" not in template:
        raise ParameterError(name, template, f"must be a str containing the '{{answer}}' slot, got {template!r}")
    try:
        template.format(answer="x")
    except (KeyError, IndexError, ValueError) as err:
        raise ParameterError(name, template,
                             f"only the '{{answer}}' slot is allowed, got {template!r} ({err})") from None
    return template


@dataclass(frozen=True)
class ConfidenceTokens:
    """Token ids read by the signals (each entry: the single-token variants, e.g. "7" and " 7").

    digits : variants of "0".."9" (index = value).
    ten : variants of "10" when it is one token; empty → the two-step read of the module docstring.
    zero_after_one : ids of "0" read after "1" in the two-step read.
    yes, no : variants of "Yes"/"No" (P(True)).
    """

    digits: tuple[tuple[int, ...], ...]
    ten: tuple[int, ...]
    zero_after_one: tuple[int, ...]
    yes: tuple[int, ...]
    no: tuple[int, ...]

    @classmethod
    def from_tokenizer(cls, tokenizer, *, need_digits: bool = True, need_yes_no: bool = True) -> "ConfidenceTokens":
        """Look the tokens up; ValueError naming the tokens that are not single tokens."""
        unk = tokenizer.unk_token_id

        def ids(texts):  # the unknown token is one token too, but not the word asked for
            return tuple(i for i in single_token_ids(tokenizer, texts) if i != unk)

        digits = tuple(ids([str(d), f" {d}"]) for d in range(10))
        yes, no = ids(["Yes", " Yes"]), ids(["No", " No"])
        missing = []
        if need_digits:
            missing += [f"{d!r}" for d in "0123456789" if not digits[int(d)]]
        if need_yes_no:
            missing += [w for w, ids in (("'Yes'", yes), ("'No'", no)) if not ids]
        if missing:
            raise ValueError(
                f"tokenizer: these tokens (with or without a leading space) are not single tokens: "
                f"{', '.join(missing)}; the confidence signals read them as next tokens"
            )
        return cls(
            digits=digits,
            ten=ids(["10", " 10"]),
            zero_after_one=ids(["0"]) or digits[0],
            yes=yes,
            no=no,
        )

    @property
    def two_step(self) -> bool:
        return not self.ten


def _logsumexp_ids(logprobs: torch.Tensor, ids: Sequence[int]) -> torch.Tensor:
    return torch.logsumexp(logprobs[:, list(ids)], dim=-1)


def _values_logprobs(logprobs, tokens: ConfidenceTokens, after_one) -> tuple[torch.Tensor, torch.Tensor]:
    """(unnormalised log-probabilities (n, 11) of the numbers 0..10, the digits' (n, 10) at the first step)."""
    if tokens.two_step and after_one is None:
        raise ValueError("after_one: required when '10' is not a single token")
    digit_lp = torch.stack([_logsumexp_ids(logprobs, ids) for ids in tokens.digits], dim=1)  # (n, 10)
    if tokens.two_step:
        p_zero = torch.exp(_logsumexp_ids(after_one, tokens.zero_after_one)).clamp(0.0, 1.0)
        lp_ten = digit_lp[:, 1] + torch.log(p_zero.clamp_min(1e-30))
        lp_one = digit_lp[:, 1] + torch.log1p(-p_zero.clamp(max=1 - 1e-7))
        return torch.cat([digit_lp[:, :1], lp_one[:, None], digit_lp[:, 2:], lp_ten[:, None]], dim=1), digit_lp
    return torch.cat([digit_lp, _logsumexp_ids(logprobs, tokens.ten)[:, None]], dim=1), digit_lp


def confidence_distribution(
    logprobs: torch.Tensor, tokens: ConfidenceTokens, after_one: torch.Tensor | None = None
) -> torch.Tensor:
    """The verbalized confidence as a distribution over the 11 values 0, 0.1, …, 1 (differentiable): log-
    probabilities (n, 11), renormalised over the number tokens, whose expectation is ``verbalized_from_logprobs``'
    confidence. Arguments as there; raises ValueError when ``after_one`` is missing and "10" is two tokens."""
    return torch.log_softmax(_values_logprobs(logprobs, tokens, after_one)[0], dim=1)


def expected_value(log_weights: torch.Tensor) -> torch.Tensor:
    """Σ_k P(k)·k/10 of log-probabilities (n, 11) over the values 0..10: the confidence (n,) in [0, 1]."""
    values = torch.arange(11, dtype=log_weights.dtype, device=log_weights.device) / 10.0
    return (torch.exp(log_weights) * values).sum(dim=1)


def two_point_target(target: float, n_values: int = 11) -> torch.Tensor:
    """The distribution (n_values,) over the grid 0, 1/(n_values − 1), …, 1 with mass on the two grid values
    around ``target`` only, split so that its expectation is ``target`` (the linear interpolation weights; all
    mass on one value when ``target`` is on the grid). Raises ValueError for ``target`` outside [0, 1]."""
    if not 0.0 <= target <= 1.0:
        raise ValueError(f"target: {target!r} (expected a value in [0, 1])")
    x = target * (n_values - 1)
    low = min(int(np.floor(x)), n_values - 2)
    q = torch.zeros(n_values, dtype=torch.float64)
    q[low], q[low + 1] = low + 1 - x, x - low
    return q


def confidence_kl(log_weights: torch.Tensor, target: float) -> torch.Tensor:
    """KL(q ‖ p) of ``two_point_target(target)`` q against the read's distribution p (log-probabilities (11,)):
    a scalar tensor ≥ 0, 0 exactly when p = q. Its gradient with respect to the number tokens' logits is p − q,
    which does not vanish when p puts all its mass on one value, unlike that of (E_p − target)²
    (docs/methods.md, "SECL: the confidence loss")."""
    q = two_point_target(target).to(log_weights)
    keep = q > 0
    return (q[keep] * (torch.log(q[keep]) - log_weights[keep])).sum()


def verbalized_from_logprobs(
    logprobs: torch.Tensor, tokens: ConfidenceTokens, after_one: torch.Tensor | None = None
) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    """Expected confidence from next-token log-probabilities (differentiable).

    logprobs : (n, V) log-softmax at the number's position. after_one : (n, V) log-softmax after "1"
    (needed when ``tokens.two_step``). Returns (confidence (n,) tensor in [0, 1], greedy (n,) float
    array in {0, 0.1, …, 1} or NaN when the most likely token is not a number, mass (n,) probability of
    the digit tokens at the first step, in [0, 1]).
    """
    values_lp, digit_lp = _values_logprobs(logprobs, tokens, after_one)
    confidence = expected_value(torch.log_softmax(values_lp, dim=1))
    mass = torch.exp(torch.logsumexp(digit_lp, dim=1))
    if not tokens.two_step:
        mass = mass + torch.exp(values_lp[:, 10])
    greedy = np.full(len(logprobs), np.nan)
    top = logprobs.argmax(dim=1).tolist()
    for i, t in enumerate(top):
        if t in tokens.ten:
            greedy[i] = 1.0
        for d, ids in enumerate(tokens.digits):
            if t in ids:
                greedy[i] = d / 10.0
                if d == 1 and tokens.two_step and int(after_one[i].argmax()) in tokens.zero_after_one:
                    greedy[i] = 1.0
    return confidence, greedy, mass.detach().cpu().numpy().astype(np.float64)


def p_true_from_logprobs(logprobs: torch.Tensor, tokens: ConfidenceTokens) -> tuple[torch.Tensor, np.ndarray]:
    """P(Yes)/(P(Yes)+P(No)) (n,) tensor in [0, 1] and the mass on Yes/No (n,) in [0, 1]."""
    lp_yes = _logsumexp_ids(logprobs, tokens.yes)
    lp_no = _logsumexp_ids(logprobs, tokens.no)
    p = torch.sigmoid(lp_yes - lp_no)
    mass = torch.exp(torch.logaddexp(lp_yes, lp_no))
    return p, mass.detach().cpu().numpy().astype(np.float64)


def followup_ids(tokenizer, text: str, *, prompt_format: str = "auto", plain_prefix: str = "") -> list[int]:
    """Token ids that close the assistant's answer and open a new user turn with ``text``.

    Chat: the template's rendering between an assistant message and the next generation prompt
    (e.g. ChatML ``<|im_end|>\\n<|im_start|>user\\n{text}<|im_end|>\\n<|im_start|>assistant\\n``).
    Plain: ``"\\n{text}\\n{plain_prefix}"``.
    """
    fmt = resolve_prompt_format(tokenizer, prompt_format)
    if fmt == "chat":
        marker_q, marker_a = "\u00a7Q\u00a7", "\u00a7A\u00a7"
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": marker_q}, {"role": "assistant", "content": marker_a},
             {"role": "user", "content": text}],
            tokenize=False, add_generation_prompt=True,
        )
        suffix = rendered.split(marker_a, 1)[1]
    else:
        suffix = f"\n{text}\n{plain_prefix}"
    return tokenizer.encode(suffix, add_special_tokens=False)


@dataclass
class SignalResult:
    """One confidence signal for n (question, answer) pairs.

    confidence : (n,) float64 in [0, 1] (a torch tensor with gradients when asked for).
    mass : (n,) probability of the tokens read, in [0, 1] (how much of the next-token distribution
        the signal is built from). greedy : (n,) greedy verbalized number / 10, NaN when not a number
        (verbalized only). forward_passes : total logical passes. seconds : wall time.
    """

    confidence: np.ndarray | torch.Tensor
    mass: np.ndarray
    forward_passes: int
    seconds: float
    greedy: np.ndarray | None = None


def _group_by_question(questions, answers):
    if len(questions) != len(answers):
        raise ValueError(f"answers: need one per question, got {len(answers)} for {len(questions)} questions")
    if len(questions) == 0:
        raise ValueError("questions: empty")
    groups: dict[str, list[int]] = {}
    for i, q in enumerate(questions):
        groups.setdefault(q, []).append(i)
    return groups


def assistant_answer_ids(tokenizer, answer: str, prompt_format: str) -> list[int]:
    """Ids of ``answer`` (str) as the assistant says it: as is after a chat template's generation prompt, after a
    space following a plain prompt's "Answer:". ``prompt_format``: "chat" or "plain" (resolved)."""
    return tokenizer.encode(answer if prompt_format == "chat" else " " + answer, add_special_tokens=False)


def _answer_then_followup(tokenizer, answer: str, text: str, fmt: str, plain_prefix: str) -> list[int]:
    """Ids of the assistant's ``answer`` then the follow-up user turn ``text`` (template already filled)."""
    return assistant_answer_ids(tokenizer, answer, fmt) + followup_ids(tokenizer, text, prompt_format=fmt,
                                                                       plain_prefix=plain_prefix)


def _prompt_ids(tokenizer, question: str, fmt: str) -> list[int]:
    return tokenizer.encode(build_prompt(tokenizer, question, prompt_format=fmt), add_special_tokens=False)


def verbalized_confidence(
    model,
    tokenizer,
    questions: Sequence[str],
    answers: Sequence[str],
    *,
    template: str = CONFIDENCE_TEMPLATE,
    prompt_format: str = "auto",
    batch_size: int = 8,
    requires_grad: bool = False,
    tokens: ConfidenceTokens | None = None,
) -> SignalResult:
    """Verbalized confidence of each answer, read as an expectation over "0".."10" (module docstring).

    questions : the user turns (e.g. ``format_mcqa(question, choices)``); answers : the assistant's
    answers (same length). Cost: 1 forward pass per answer, 2 when "10" is not a single token.
    ``confidence`` is a tensor with gradients when ``requires_grad``, else a float64 array.
    Raises ValueError for mismatched lengths, a template without ``{answer}``, or a tokenizer without
    single-token digits.
    """
    check_template(template)
    tokens = tokens or ConfidenceTokens.from_tokenizer(tokenizer, need_yes_no=False)
    fmt = resolve_prompt_format(tokenizer, prompt_format)
    groups = _group_by_question(questions, answers)
    start = time.perf_counter()
    conf = [None] * len(questions)
    greedy = np.full(len(questions), np.nan)
    mass = np.zeros(len(questions))
    for q, idx in groups.items():
        conts = [_answer_then_followup(tokenizer, answers[i], template.replace("{answer}", answers[i]), fmt,
                                       PLAIN_CONFIDENCE_PREFIX) for i in idx]
        if tokens.two_step:
            conts += [c + [tokens.digits[1][0]] for c in conts]
        _, lp = followup_logprobs(model, _prompt_ids(tokenizer, q, fmt), conts, batch_size=batch_size,
                                  requires_grad=requires_grad, pad_id=tokenizer.pad_token_id or 0)
        first, second = (lp[: len(idx)], lp[len(idx):]) if tokens.two_step else (lp, None)
        c, g, m = verbalized_from_logprobs(first, tokens, second)
        for j, i in enumerate(idx):
            conf[i], greedy[i], mass[i] = c[j], g[j], m[j]
    confidence = torch.stack(conf)
    if not requires_grad:
        confidence = confidence.detach().cpu().numpy().astype(np.float64)
    passes = len(questions) * (2 if tokens.two_step else 1)
    return SignalResult(confidence, mass, passes, time.perf_counter() - start, greedy)


def p_true(
    model,
    tokenizer,
    questions: Sequence[str],
    answers: Sequence[str],
    *,
    template: str = P_TRUE_TEMPLATE,
    prompt_format: str = "auto",
    batch_size: int = 8,
    tokens: ConfidenceTokens | None = None,
) -> SignalResult:
    """P(True) of each answer: P(Yes)/(P(Yes)+P(No)) after "is the answer correct?" (Kadavath et al.).

    One forward pass per answer; answers to the same question share the question's cache. Returns
    float64 arrays. Raises ValueError for mismatched lengths, a bad template or a tokenizer whose
    "Yes"/"No" are not single tokens.
    """
    check_template(template)
    tokens = tokens or ConfidenceTokens.from_tokenizer(tokenizer, need_digits=False)
    fmt = resolve_prompt_format(tokenizer, prompt_format)
    groups = _group_by_question(questions, answers)
    start = time.perf_counter()
    p = np.zeros(len(questions))
    mass = np.zeros(len(questions))
    for q, idx in groups.items():
        conts = [_answer_then_followup(tokenizer, answers[i], template.replace("{answer}", answers[i]), fmt,
                                       PLAIN_P_TRUE_PREFIX) for i in idx]
        with torch.no_grad():
            _, lp = followup_logprobs(model, _prompt_ids(tokenizer, q, fmt), conts, batch_size=batch_size,
                                      pad_id=tokenizer.pad_token_id or 0)
        pt, m = p_true_from_logprobs(lp, tokens)
        p[idx], mass[idx] = pt.cpu().numpy(), m
    return SignalResult(p, mass, len(questions), time.perf_counter() - start)


def norm_p_true(p_true_options: np.ndarray, *, tau: float = DEFAULT_TAU_N) -> np.ndarray:
    """P(True)Norm: ``softmax(P_T / τ_n)`` over each row's candidates (docs/methods.md, "SECL: P(True)Norm").

    p_true_options : (n, K) P(True) of the answer and its distractors in [0, 1]; NaN marks a missing
    candidate (a question with fewer options), which gets 0. tau : τ_n > 0. Returns (n, K), rows sum
    to 1; the answer's column is its P(True)Norm. Normalising over mutually exclusive candidates
    removes the suggestibility bias of raw P(True) (it confirms whatever it is shown).
    """
    p = np.asarray(p_true_options, dtype=np.float64)
    if p.ndim != 2 or p.shape[1] < 1:
        raise ValueError(f"p_true_options: must have shape (n, K), got {p.shape}")
    if not (isinstance(tau, (int, float)) and tau > 0):
        raise ValueError(f"tau: must be > 0, got {tau!r}")
    z = np.where(np.isnan(p), -np.inf, p / tau)
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def dinco_score(p_true_options: np.ndarray, answer_index: np.ndarray, consistency: np.ndarray) -> np.ndarray:
    """DINCO-style confidence without the NLI model (Wang & Stengel-Eskin, ICLR 2026).

    DINCO's normalised verbalized confidence is ``P0 / (P0 + Σ_j P_j·c_0j/(deg_j − s_0j))`` with NLI
    contradiction weights c_0j and similarity terms; here every distinct candidate is taken to fully
    contradict the answer and none to duplicate it (c = 1, deg − s = 1), which holds for the distinct
    options of MCQA and for deduplicated alternatives, and P_j is P(True) rather than a verbalized
    confidence. The result is averaged with a self-consistency score, as DINCO does: pass the
    probability that a sampled answer equals the greedy one (MCQA: the option probability of the
    prediction, which needs no sampling). Returns (n,) in [0, 1].

    p_true_options : (n, K) with NaN for missing candidates; answer_index : (n,) int;
    consistency : (n,) in [0, 1].
    """
    p = np.asarray(p_true_options, dtype=np.float64)
    idx = np.asarray(answer_index, dtype=int)
    p0 = p[np.arange(len(p)), idx]
    total = np.nansum(p, axis=1)
    nvc = np.divide(p0, total, out=np.full(len(p), 1.0 / np.maximum(1, np.sum(~np.isnan(p), axis=1))),
                    where=total > 0)
    return 0.5 * (nvc + np.asarray(consistency, dtype=np.float64))




@dataclass
class MCQASignals:
    """All signals for n MCQA questions (K = most options), computed with one shared cache per question.

    option_probs : (n, K) softmax over the option letters (NaN-free; 0 for missing options).
    prediction, labels : (n,) int; correct : (n,) bool.
    confidence : dict signal → (n,) float64 in [0, 1], for the signals in ``SIGNALS``; each is the
        confidence that the *predicted* option is correct.
    p_true_options : (n, K) P(True) of every option (NaN for missing options).
    norm_p_true_options : (n, K) P(True)Norm, rows sum to 1.
    verbalized_greedy : (n,) greedy verbalized number / 10 (NaN when not a number).
    mass : dict signal → (n,) probability mass of the tokens read for it.
    forward_passes : dict signal → passes per question to obtain it, the answer's pass included.
    seconds : dict signal → seconds per question, likewise cumulative (with the shared cache).
    """

    option_probs: np.ndarray
    prediction: np.ndarray
    labels: np.ndarray
    correct: np.ndarray
    confidence: dict
    p_true_options: np.ndarray
    norm_p_true_options: np.ndarray
    verbalized_greedy: np.ndarray
    mass: dict
    forward_passes: dict
    seconds: dict
    prompt_format: str
    tau_n: float


def mcqa_answer_text(letter: str, choice: str, max_chars: int = 200) -> str:
    """How an option is restated in the follow-up turns: "C. <choice text>" (truncated)."""
    choice = " ".join(str(choice).split())
    return f"{letter}. {choice[:max_chars]}"


def check_signal_inputs(tokenizer, dataset, *, tau_n, prompt_format, confidence_template, p_true_template):
    """The checks every reader of the MCQA signals makes before scoring (in process or through a server):
    (rows as a list, ``ConfidenceTokens``, the resolved prompt format). ValueError for bad templates, τ_n ≤ 0,
    an empty dataset or a tokenizer without single-token digits or Yes/No."""
    check_template(confidence_template, "confidence_template")
    check_template(p_true_template, "p_true_template")
    if not (isinstance(tau_n, (int, float)) and tau_n > 0):
        raise ValueError(f"tau_n: must be > 0, got {tau_n!r}")
    rows = list(dataset)
    if not rows:
        raise ValueError("dataset: no questions to score")
    return rows, ConfidenceTokens.from_tokenizer(tokenizer), resolve_prompt_format(tokenizer, prompt_format)


def mcqa_signals(backend, tokenizer, dataset, *, tau_n: float = DEFAULT_TAU_N, prompt_format: str = "auto",
                 confidence_template: str = CONFIDENCE_TEMPLATE, p_true_template: str = P_TRUE_TEMPLATE,
                 batch_size: int | None = None, progress: bool = True, checkpoint=None) -> MCQASignals:
    """Option probability, P(True), P(True)Norm, verbalized confidence and the DINCO-style score.

    Per question: the option letters after the MCQA prompt, then K P(True) follow-ups (the answer restated as
    "C. text") and the verbalized follow-up of the prediction (two reads when "10" is split), all continuing the
    prompt's token ids through one ``backend.prefix_reads`` session: in process the prompt runs once and its
    key/value cache serves every follow-up; a server gets all questions' reads as whole prompts, concurrently.
    Logical forward passes per question: option 1, P(True) 2, P(True)Norm and DINCO K+1, verbalized 2 (3).

    backend : ScoringBackend, or a bare model (wrapped once, ``modeling.backends.as_backend``, with
    ``batch_size`` follow-ups per pass). dataset : rows with question, choices, answer. checkpoint : optional
    ``ScoreCheckpoint`` keeping each read as it arrives (whole prompts; a rerun reads only what it lacks).
    Raises ValueError for an empty dataset, bad templates, τ_n ≤ 0, or a tokenizer without single-token option
    letters, digits or Yes/No; ParameterError naming ``prompts`` for a prompt longer than the backend's context.
    """
    from tqdm.auto import tqdm

    backend = as_backend(backend, tokenizer, batch_size=batch_size)
    rows, tokens, fmt = check_signal_inputs(tokenizer, dataset, tau_n=tau_n, prompt_format=prompt_format,
                                            confidence_template=confidence_template, p_true_template=p_true_template)
    n, k_max = len(rows), max(len(r["choices"]) for r in rows)
    reads = _MCQAReads(n, k_max)
    variants = option_token_ids(tokenizer, k_max)
    built = [_question_prompts(tokenizer, r, fmt, p_true_template) for r in rows]
    backend.check_lengths([b[0] + f for b in built for f in [[], *b[2]]], extra=1)
    step = backend.prefixes_per_session or n
    with tqdm(total=n, desc="diagnose", disable=not progress, unit="q") as bar:
        for start in range(0, n, step):
            idx = list(range(start, min(n, start + step)))
            with backend.prefix_reads([built[i][0] for i in idx], checkpoint=checkpoint) as session:
                _read_questions(session, tokenizer, rows, built, idx, reads, variants=variants, tokens=tokens,
                                fmt=fmt, confidence_template=confidence_template)
            bar.update(len(idx))
    return _mcqa_result(rows, reads, tokens, fmt, tau_n)


class _MCQAReads:
    """The per-question reads of ``mcqa_signals``, with the seconds each read took."""

    def __init__(self, n: int, k_max: int):
        self.option_probs, self.option_mass = np.zeros((n, k_max)), np.zeros(n)
        self.pt, self.pt_mass = np.full((n, k_max), np.nan), np.full((n, k_max), np.nan)
        self.verb, self.greedy, self.verb_mass = np.zeros(n), np.full(n, np.nan), np.zeros(n)
        self.t_option = self.t_ptrue = self.t_verb = 0.0


def _read_ids(tokens: ConfidenceTokens, variants) -> list[int]:
    """Every token id a signal reads: the option letters, the digits ("10", "0" after "1"), Yes and No."""
    ids = [t for v in variants for t in v] + [t for v in tokens.digits for t in v]
    ids += list(tokens.ten) + list(tokens.zero_after_one) + list(tokens.yes) + list(tokens.no)
    return list(dict.fromkeys(ids))


def _question_prompts(tokenizer, row, fmt: str, p_true_template: str):
    """(the MCQA prompt's ids, the K restated answers "C. text", the K P(True) follow-ups' ids)."""
    prompt = tokenizer.encode(build_mcqa_prompt(tokenizer, row["question"], row["choices"], prompt_format=fmt),
                              add_special_tokens=False)
    answers = [mcqa_answer_text(LETTERS[j], c) for j, c in enumerate(row["choices"])]
    p_true = [_answer_then_followup(tokenizer, LETTERS[j], p_true_template.replace("{answer}", a), fmt,
                                    PLAIN_P_TRUE_PREFIX) for j, a in enumerate(answers)]
    return prompt, answers, p_true


def _read_questions(session, tokenizer, rows, built, idx: list[int], reads: _MCQAReads, *, variants, tokens, fmt,
                    confidence_template: str) -> None:
    """The three reads of questions ``idx`` through one ``PrefixReads`` session (the MCQA prompts its prefixes):
    option letters, then every option's P(True), then the prediction's verbalized confidence."""
    ids, vocab = _read_ids(tokens, variants), session.backend.vocab_size
    t0 = time.perf_counter()
    first = session.read([[[]] for _ in idx], ids, what="option reads")[0].dense(ids, vocab)
    for row, i in enumerate(idx):
        k = len(rows[i]["choices"])
        letter_lp = torch.stack([torch.logsumexp(first[row, list(v)], dim=0) for v in variants[:k]])
        reads.option_probs[i, :k] = torch.softmax(letter_lp, dim=0).numpy()
        reads.option_mass[i] = float(torch.exp(torch.logsumexp(letter_lp, dim=0)))
    t1 = time.perf_counter()
    lp_true = session.read([built[i][2] for i in idx], ids, what="P(True) reads (after all option reads)")[0]
    p, m = p_true_from_logprobs(lp_true.dense(ids, vocab), tokens)
    at = 0
    for i in idx:
        k = len(rows[i]["choices"])
        reads.pt[i, :k], reads.pt_mass[i, :k] = p[at:at + k].numpy(), m[at:at + k]
        at += k
    t2 = time.perf_counter()
    pred = [int(np.argmax(reads.option_probs[i, :len(rows[i]["choices"])])) for i in idx]
    verbal = [[_answer_then_followup(tokenizer, LETTERS[j], confidence_template.replace("{answer}", built[i][1][j]),
                                     fmt, PLAIN_CONFIDENCE_PREFIX)] for i, j in zip(idx, pred)]
    lp_v, lp_after_one = session.read(verbal, ids, then_token=tokens.digits[1][0] if tokens.two_step else None,
                                      what="verbalized reads (after all option and P(True) reads)")
    c, g, m = verbalized_from_logprobs(lp_v.dense(ids, vocab), tokens,
                                       None if lp_after_one is None else lp_after_one.dense(ids, vocab))
    reads.verb[idx], reads.greedy[idx], reads.verb_mass[idx] = c.numpy().astype(np.float64), g, m
    t3 = time.perf_counter()
    reads.t_option += t1 - t0
    reads.t_ptrue += t2 - t1
    reads.t_verb += t3 - t2


def _mcqa_result(rows, reads: _MCQAReads, tokens, fmt: str, tau_n: float) -> MCQASignals:
    n = len(rows)
    option_probs, pt, pt_mass = reads.option_probs, reads.pt, reads.pt_mass
    labels, prediction = np.array([int(r["answer"]) for r in rows]), option_probs.argmax(axis=1)
    norm, rows_idx = norm_p_true(pt, tau=tau_n), np.arange(n)
    confidence = {
        "option_probability": option_probs[rows_idx, prediction], "p_true": pt[rows_idx, prediction],
        "norm_p_true": norm[rows_idx, prediction], "verbalized": reads.verb,
        "dinco": dinco_score(pt, prediction, option_probs[rows_idx, prediction]),
    }
    n_opts, verb_passes = np.array([len(r["choices"]) for r in rows]), 3 if tokens.two_step else 2
    s_opt, s_pt, s_verb = reads.t_option / n, reads.t_ptrue / n, reads.t_verb / n
    return MCQASignals(
        option_probs=option_probs, prediction=prediction, labels=labels, correct=prediction == labels,
        confidence=confidence, p_true_options=pt, norm_p_true_options=norm, verbalized_greedy=reads.greedy,
        mass={
            "option_probability": reads.option_mass, "p_true": pt_mass[rows_idx, prediction],
            "norm_p_true": np.nanmean(pt_mass, axis=1), "verbalized": reads.verb_mass,
            "dinco": np.nanmean(pt_mass, axis=1),
        },
        forward_passes={
            "option_probability": 1.0, "p_true": 2.0, "norm_p_true": float(1 + n_opts.mean()),
            "verbalized": float(verb_passes), "dinco": float(1 + n_opts.mean()),
        },
        seconds={
            "option_probability": s_opt, "p_true": s_opt + s_pt / n_opts.mean(), "norm_p_true": s_opt + s_pt,
            "verbalized": s_opt + s_verb, "dinco": s_opt + s_pt,
        },
        prompt_format=fmt, tau_n=float(tau_n),
    )
