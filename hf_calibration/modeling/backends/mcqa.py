"""Multiple-choice scoring through any ``ScoringBackend``: the option letters' next-token probabilities."""

from __future__ import annotations

import numpy as np

from hf_calibration.modeling.prompts import mcqa_prompts
from hf_calibration.modeling.scoring import MCQAScores


def score_mcqa_with(backend, tokenizer, dataset, *, prompt_format: str = "auto", adjust=None,
                    checkpoint=None) -> MCQAScores:
    """``modeling.score_mcqa`` with the log-probabilities read from ``backend`` (a ``ScoringBackend``).

    The prompts are built and tokenised here, exactly as ``score_mcqa`` builds them, and sent as token ids.
    ``option_logits`` are the options' log-probabilities over the full vocabulary (``score_mcqa`` keeps the raw
    logits, which differ by one constant per question, the log-normaliser a server does not return):
    ``probs``, ``option_mass``, the predictions and every calibrator that is invariant to that shift (temperature
    scaling, Platt, isotonic, histogram binning) agree; vector scaling is not shift-invariant (docs/serving.md).

    ``adjust`` : optional callable ``(token_ids, logprobs (n, m)) → (n, m)`` applied to the read log-probabilities
    before the options are formed (a CALM logit adjustment served beside its LoRA: ``calm.served``).

    ``checkpoint`` : optional ``ScoreCheckpoint``; each question's read log-probabilities are appended to it as
    they arrive and the questions it holds are not sent again (``checkpoint.next_token_logprobs_kept``).

    Every prompt is checked against the backend's context before the first request. Raises ValueError for an
    empty dataset or a tokenizer without single-token option letters, and the backend's errors.
    """
    rows, fmt, n_opts, k, variants, flat, prompts = mcqa_prompts(tokenizer, dataset, prompt_format=prompt_format)
    ids = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    backend.check_lengths(ids, extra=1)
    if checkpoint is None:
        lp = backend.next_token_logprobs(ids, flat).logprobs
    else:
        from hf_calibration.modeling.backends.checkpoint import next_token_logprobs_kept

        lp = next_token_logprobs_kept(backend, ids, flat, checkpoint, what="questions").logprobs
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
