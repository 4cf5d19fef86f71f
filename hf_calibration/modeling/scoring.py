"""Batched next-token scoring: option letters for MCQA, or any set of single tokens."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from hf_calibration.modeling.prompts import mcqa_prompts


def _check_batch_size(batch_size):
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size <= 0:
        raise ValueError(f"batch_size: must be a positive integer, got {batch_size!r}")


@dataclass
class NextTokenScores:
    """Next-token logits of selected token ids.

    logits : (n, m) float32, raw logits of the m requested ids.
    log_normalizer : (n,) float32, logsumexp of the full-vocabulary logits, so
        ``exp(logits - log_normalizer[:, None])`` are the full-vocabulary probabilities of those ids.
    """

    logits: np.ndarray
    log_normalizer: np.ndarray

    @property
    def probs(self) -> np.ndarray:
        return np.exp(self.logits - self.log_normalizer[:, None])


@torch.no_grad()
def next_token_scores(
    model,
    tokenizer,
    prompts: Sequence[str],
    token_ids: Sequence[int],
    *,
    batch_size: int = 8,
    progress: bool = True,
    desc: str = "scoring",
) -> NextTokenScores:
    """Logits of ``token_ids`` at the position after each prompt, batched with left padding.

    Prompts are sorted by length to reduce padding and returned in input order. Position ids are
    derived from the attention mask, so a padded prompt gets the same logits as the prompt alone.
    Only the last position's logits are computed (``logits_to_keep=1``), which matters for large
    vocabularies (Qwen2.5: 151,936). One forward pass per prompt.
    """
    _check_batch_size(batch_size)
    if len(prompts) == 0:
        raise ValueError("prompts: empty")
    ids = torch.as_tensor(list(token_ids), dtype=torch.long)
    vocab = model.get_output_embeddings().weight.shape[0]
    if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= vocab:
        raise ValueError(f"token_ids: must be non-empty ids in [0, {vocab}), got {list(token_ids)!r}")
    device = next(model.parameters()).device
    order = np.argsort([-len(p) for p in prompts], kind="stable")
    logits = np.empty((len(prompts), len(ids)), dtype=np.float32)
    lognorm = np.empty(len(prompts), dtype=np.float32)
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        for start in tqdm(range(0, len(prompts), batch_size), desc=desc, disable=not progress, unit="batch"):
            idx = order[start : start + batch_size]
            enc = tokenizer([prompts[i] for i in idx], return_tensors="pt", padding=True, add_special_tokens=False)
            mask = enc["attention_mask"].to(device)
            position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
            out = model(
                input_ids=enc["input_ids"].to(device), attention_mask=mask, position_ids=position_ids,
                logits_to_keep=1, use_cache=False,
            )
            last = out.logits[:, -1, :].float()
            logits[idx] = last[:, ids.to(device)].cpu().numpy()
            lognorm[idx] = torch.logsumexp(last, dim=-1).cpu().numpy()
    finally:
        tokenizer.padding_side = side
    return NextTokenScores(logits=logits, log_normalizer=lognorm)


@dataclass
class MCQAScores:
    """Per-question results of ``score_mcqa`` (n questions, K = most options of any question).

    option_logits : (n, K) log-score of each option letter (logsumexp over its token variants);
        -inf for options a question does not have.
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


def score_mcqa(
    model,
    tokenizer,
    dataset,
    *,
    batch_size: int = 8,
    prompt_format: str = "auto",
    progress: bool = True,
) -> MCQAScores:
    """Score multiple-choice questions by the next-token probabilities of the option letters.

    Parameters
    ----------
    dataset : datasets.Dataset or list of dict
        Rows with ``question``, ``choices`` and ``answer`` (the schema of ``hf_calibration.data``).
    batch_size : int > 0
    prompt_format : {"auto", "chat", "plain"}
        "auto" uses the chat template when the tokenizer has one (see ``modeling.prompts``).

    Returns
    -------
    MCQAScores (see its docstring). Raises ValueError for an empty dataset, a bad batch size or a
    tokenizer without single-token option letters.
    """
    _check_batch_size(batch_size)
    rows, fmt, n_opts, k, variants, flat, prompts = mcqa_prompts(tokenizer, dataset, prompt_format=prompt_format)
    scores = next_token_scores(model, tokenizer, prompts, flat, batch_size=batch_size, progress=progress)
    option_logits = np.full((len(rows), k), -np.inf, dtype=np.float64)
    col = 0
    for j, v in enumerate(variants):
        option_logits[:, j] = np.logaddexp.reduce(scores.logits[:, col : col + len(v)].astype(np.float64), axis=1)
        col += len(v)
    option_logits[np.arange(k)[None, :] >= n_opts[:, None]] = -np.inf
    shifted = option_logits - option_logits.max(axis=1, keepdims=True)
    probs = np.exp(shifted)
    probs /= probs.sum(axis=1, keepdims=True)
    labels = np.array([int(r["answer"]) for r in rows])
    prediction = probs.argmax(axis=1)
    return MCQAScores(
        option_logits=option_logits,
        probs=probs,
        option_mass=np.exp(np.logaddexp.reduce(option_logits, axis=1) - scores.log_normalizer.astype(np.float64)),
        prediction=prediction,
        confidence=probs.max(axis=1),
        labels=labels,
        correct=prediction == labels,
        prompt_format=fmt,
        prompts=prompts,
    )
