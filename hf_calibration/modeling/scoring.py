"""Multiple-choice scoring through any ``ScoringBackend``: the option letters' next-token probabilities."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hf_calibration.modeling.backends.base import as_backend, read_next_tokens
from hf_calibration.modeling.prompts import mcqa_prompts


@dataclass
class MCQAScores:
    """Per-question results of ``score_mcqa`` (n questions, K = most options of any question).

    option_logits : (n, K) log-probability of each option letter over the full vocabulary (logsumexp over its
        token variants), ≤ 0; -inf for options a question does not have. The same quantity in process and through
        a server (which returns log-probabilities, not raw logits).
    probs : (n, K) softmax over the options (renormalised among the option letters).
    option_mass : (n,) full-vocabulary probability mass on the option-letter tokens, in [0, 1]: how
        much of the model's next-token distribution the scores read.
    prediction, labels : (n,) int; confidence : (n,) max probability in [1/K, 1]; correct : (n,) bool.
    """

    option_logits: np.ndarray
    probs: np.ndarray
    option_mass: np.ndarray
    prediction: np.ndarray
    confidence: np.ndarray
    labels: np.ndarray
    correct: np.ndarray
    prompt_format: str
    prompts: list[str] = field(repr=False, default_factory=list)


def score_mcqa(backend, tokenizer, dataset, *, prompt_format: str = "auto", batch_size: int | None = None,
               progress: bool = True, adjust=None, checkpoint=None) -> MCQAScores:
    """Score multiple-choice questions by the next-token probabilities of the option letters.

    Parameters
    ----------
    backend : ScoringBackend, or a transformers causal LM
        Where the log-probabilities come from: ``TransformersBackend`` (in process), ``OpenAICompatibleBackend``
        (a server such as vLLM), any backend of ``modeling.backends``. A bare model is wrapped in
        ``TransformersBackend(model, batch_size=batch_size)`` (``modeling.backends.as_backend``).
    tokenizer : the model's tokenizer (with its chat template); the prompts are built and tokenised here and
        sent as token ids.
    dataset : datasets.Dataset or list of dict
        Rows with ``question``, ``choices`` and ``answer`` (the schema of ``hf_calibration.data``).
    prompt_format : {"auto", "chat", "plain"}
        "auto" uses the chat template when the tokenizer has one (see ``modeling.prompts``).
    batch_size : int > 0, optional
        Prompts per forward pass of a bare model (default 8); a backend keeps its own (ParameterError when given
        with one).
    progress : bool
        A progress bar over the questions.
    adjust : callable, optional
        ``(token_ids, logprobs (n, m)) → (n, m)`` applied to the read log-probabilities before the options are
        formed (a CALM logit adjustment served beside its LoRA: ``calm.served``).
    checkpoint : ScoreCheckpoint, optional
        Each call's reads are appended to it as they arrive and the questions it holds are not read again
        (``modeling.backends.checkpoint``): a run that stops resumes.

    Returns
    -------
    MCQAScores (see its docstring). Every prompt is checked against the backend's context before the first read
    (ParameterError naming ``prompts``). Raises ValueError for an empty dataset or a tokenizer without
    single-token option letters, ParameterError for a bad ``batch_size``, and the backend's errors.
    """
    backend = as_backend(backend, tokenizer, batch_size=batch_size)
    rows, fmt, n_opts, k, variants, flat, prompts = mcqa_prompts(tokenizer, dataset, prompt_format=prompt_format)
    ids = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    lp = read_next_tokens(backend, ids, flat, checkpoint=checkpoint, what="questions", progress=progress).logprobs
    if adjust is not None:
        lp = np.asarray(adjust(flat, lp), dtype=np.float64)
    option_logits = np.full((len(rows), k), -np.inf, dtype=np.float64)
    col = 0
    for j, v in enumerate(variants):
        option_logits[:, j] = np.logaddexp.reduce(lp[:, col:col + len(v)], axis=1)
        col += len(v)
    option_logits[np.arange(k)[None, :] >= n_opts[:, None]] = -np.inf
    probs = np.exp(option_logits - option_logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    labels = np.array([int(r["answer"]) for r in rows])
    prediction = probs.argmax(axis=1)
    return MCQAScores(option_logits=option_logits, probs=probs,
                      option_mass=np.exp(np.logaddexp.reduce(option_logits, axis=1)), prediction=prediction,
                      confidence=probs.max(axis=1), labels=labels, correct=prediction == labels, prompt_format=fmt,
                      prompts=prompts)
