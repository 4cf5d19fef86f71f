"""The scoring interface every job reads a model through, and its in-process transformers implementation.

A backend answers three questions about token-id prompts (the tokenizer and chat template stay on the
caller's side, so the same ids reach an in-process model and a served one):

- ``next_token_logprobs``: the log-probabilities of chosen next tokens (option letters, confidence digits,
  Yes/No), exactly, plus the most likely next token;
- ``continuation_logprobs``: the log-likelihood of a continuation after a prompt;
- ``generate``: greedy generation with each generated token's log-probability and the entropy of the
  next-token distribution it was chosen from (the signal SECL's gate reads).

Log-probabilities are natural-log, normalised over the full vocabulary, before any sampling temperature.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from hf_calibration.errors import ParameterError

BACKENDS = ("transformers", "openai")


class ServerError(ParameterError):
    """The server at ``base_url`` could not be reached, or stopped answering (after the retries)."""


@dataclass
class TokenLogprobs:
    """Next-token log-probabilities after n prompts.

    logprobs : (n, m) float64, log P(token_ids[j] | prompt i), ≤ 0, over the full vocabulary.
    top_ids : (n,) int, the most likely next token; top_logprobs : (n,) float64, its log-probability.
    """

    logprobs: np.ndarray
    top_ids: np.ndarray
    top_logprobs: np.ndarray

    def dense(self, token_ids: Sequence[int], vocab_size: int):
        """(n, vocab_size) float32 torch tensor: the read log-probabilities and the top token in place, −inf
        elsewhere. Every function that reads chosen ids and the argmax of a log-softmax row (the confidence
        signals) gets the same answer from it as from the full row."""
        import torch

        out = torch.full((len(self.logprobs), vocab_size), -math.inf, dtype=torch.float32)
        ids = torch.as_tensor(list(token_ids), dtype=torch.long)
        out[:, ids] = torch.as_tensor(self.logprobs, dtype=torch.float32)
        out[torch.arange(len(out)), torch.as_tensor(self.top_ids, dtype=torch.long)] = torch.as_tensor(
            self.top_logprobs, dtype=torch.float32)
        return out


@dataclass
class Generation:
    """One greedy generation.

    token_ids : the generated ids (the end-of-sequence token included when it was generated).
    logprobs : (t,) float64, log-probability of each generated token.
    entropy : (t,) float64, nats, entropy of the next-token distribution at each step. Exact for the
        in-process backend; for a server, over the ``top_k`` returned log-probabilities with the rest of the
        mass lumped into one outcome (``truncated_entropy``), a lower bound.
    entropy_gap : (t,) float64 ≥ 0, how far the true entropy can lie above ``entropy``: 0 when exact, else
        r·log(V − k) for the unread mass r (``truncated_entropy``).
    """

    token_ids: list[int]
    logprobs: np.ndarray
    entropy: np.ndarray
    entropy_gap: np.ndarray = field(default_factory=lambda: np.zeros(0))


def truncated_entropy(top_logprobs: Sequence[float], vocab_size: int) -> tuple[float, float]:
    """Entropy bounds of a distribution known only by its k largest log-probabilities → ``(low, gap)``.

    ``low = −Σ_top p log p − r log r`` with the unread mass r = 1 − Σ_top p treated as one outcome (merging
    outcomes never raises entropy, so low ≤ H); spreading r evenly over the other V − k tokens gives the
    largest entropy they can add, so H ≤ low + r·log(V − k) = low + gap (Cover & Thomas, thm 2.6.4).
    """
    lp = np.asarray(list(top_logprobs), dtype=np.float64)
    p = np.exp(lp)
    r = max(0.0, 1.0 - float(p.sum()))
    low = float(-(p * lp).sum()) - (r * math.log(r) if r > 0 else 0.0)
    rest = vocab_size - len(lp)
    return low, (r * math.log(rest) if r > 0 and rest > 1 else 0.0)


def check_token_prompts(prompts: Sequence[Sequence[int]], name: str = "prompts") -> list[list[int]]:
    """Lists of ints, none empty; ParameterError naming ``name``."""
    out = [list(map(int, p)) for p in prompts]
    if not out:
        raise ParameterError(name, prompts, "no prompts to score")
    empty = [i for i, p in enumerate(out) if not p]
    if empty:
        raise ParameterError(name, prompts, f"prompt {empty[0]} has no tokens")
    return out


class ScoringBackend(ABC):
    """Where log-probabilities come from: a model in this process or a server (see the module docstring).

    Attributes: ``vocab_size`` (ids are checked against it), ``max_context`` (tokens a prompt plus its
    continuation may have; None when unbounded), ``name`` (recorded with every run).
    """

    name: str = "backend"
    vocab_size: int
    max_context: int | None = None

    def check_lengths(self, prompts: Sequence[Sequence[int]], extra: int = 0) -> None:
        """ParameterError naming ``prompts`` when a prompt plus ``extra`` tokens exceeds ``max_context``: checked
        before any request, so nothing is half-scored."""
        if self.max_context is None:
            return
        longest = max(range(len(prompts)), key=lambda i: len(prompts[i]))
        if len(prompts[longest]) + extra > self.max_context:
            raise ParameterError("prompts", f"prompt {longest}", f"prompt {longest} has {len(prompts[longest])} "
                                 f"tokens (+{extra} to read), more than the {self.name} context of {self.max_context}")

    def _check_ids(self, token_ids: Sequence[int]) -> list[int]:
        ids = [int(t) for t in token_ids]
        if not ids or min(ids) < 0 or max(ids) >= self.vocab_size:
            raise ParameterError("token_ids", list(token_ids),
                                 f"must be non-empty ids in [0, {self.vocab_size}), got {list(token_ids)!r}")
        return ids

    @abstractmethod
    def next_token_logprobs(self, prompts: Sequence[Sequence[int]], token_ids: Sequence[int]) -> TokenLogprobs:
        """Log-probabilities of ``token_ids`` as the token after each prompt (TokenLogprobs, (n, m))."""

    @abstractmethod
    def continuation_logprobs(self, prompts: Sequence[Sequence[int]],
                              continuations: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """Per pair, the (len(continuation),) float64 log-probabilities of the continuation's tokens given the
        prompt and the tokens before them; their sum is the continuation's log-likelihood."""

    @abstractmethod
    def generate(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int) -> list[Generation]:
        """Greedy generation (no sampling) of at most ``max_new_tokens`` after each prompt, stopping at the
        end-of-sequence token."""

    def close(self) -> None:
        """Release connections (a no-op in process)."""


class TransformersBackend(ScoringBackend):
    """A causal LM in this process: batched forward passes with left padding (position ids from the mask, so a
    padded prompt scores as it does alone).

    model : a transformers causal LM (eval mode). batch_size : prompts per forward pass. pad_id : the id padding
    is filled with (masked, never read).
    """

    name = "transformers"

    def __init__(self, model, *, batch_size: int = 8, pad_id: int = 0):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ParameterError("batch_size", batch_size, f"must be a positive integer, got {batch_size!r}")
        self.model, self.batch_size, self.pad_id = model, batch_size, pad_id
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.max_context = getattr(model.config, "max_position_embeddings", None)

    def _padded(self, rows: list[list[int]]):
        import torch

        device = next(self.model.parameters()).device
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, width - len(r):] = torch.as_tensor(r)
            mask[i, width - len(r):] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        return ids.to(device), mask.to(device), positions.to(device)

    def _log_softmax(self, rows: list[list[int]], keep: int):
        import torch

        ids, mask, positions = self._padded(rows)
        with torch.no_grad():
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=keep,
                             use_cache=False)
        return torch.log_softmax(out.logits.float(), dim=-1)

    def next_token_logprobs(self, prompts, token_ids):
        rows, ids = check_token_prompts(prompts), self._check_ids(token_ids)
        n = len(rows)
        lp, top, top_lp = np.empty((n, len(ids))), np.empty(n, dtype=np.int64), np.empty(n)
        for start in range(0, n, self.batch_size):
            last = self._log_softmax(rows[start:start + self.batch_size], 1)[:, -1]
            sl = slice(start, start + len(last))
            lp[sl] = last[:, ids].double().cpu().numpy()
            best = last.max(dim=-1)
            top[sl], top_lp[sl] = best.indices.cpu().numpy(), best.values.double().cpu().numpy()
        return TokenLogprobs(lp, top, top_lp)

    def continuation_logprobs(self, prompts, continuations):
        rows = check_token_prompts(prompts)
        conts = check_token_prompts(continuations, "continuations")
        if len(rows) != len(conts):
            raise ParameterError("continuations", len(conts), f"need one per prompt ({len(rows)}), got {len(conts)}")
        out = []
        for start in range(0, len(rows), self.batch_size):
            batch = [p + c for p, c in zip(rows[start:start + self.batch_size], conts[start:start + self.batch_size])]
            keep = max(len(c) for c in conts[start:start + self.batch_size]) + 1
            lp = self._log_softmax(batch, keep)  # rows end together (left padding): the last `keep` positions
            for j, c in enumerate(conts[start:start + len(batch)]):
                at = lp[j, keep - 1 - len(c): keep - 1]  # position t predicts token t + 1
                out.append(at.gather(-1, _as_index(c, at.device)).squeeze(-1).double().cpu().numpy())
        return out

    def generate(self, prompts, *, max_new_tokens: int):
        import torch

        rows = check_token_prompts(prompts)
        eos = self.model.generation_config.eos_token_id
        eos = set(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])
        out = []
        for start in range(0, len(rows), self.batch_size):
            ids, mask, _ = self._padded(rows[start:start + self.batch_size])
            with torch.no_grad():
                gen = self.model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                          max_new_tokens=max_new_tokens, output_scores=True,
                                          return_dict_in_generate=True, pad_token_id=self.pad_id,
                                          temperature=None, top_p=None, top_k=None)
            steps = torch.stack([torch.log_softmax(s.float(), dim=-1) for s in gen.scores], dim=1)  # (b, t, V)
            new = gen.sequences[:, ids.shape[1]:]
            entropy = -(steps.exp() * steps.nan_to_num(neginf=0.0)).sum(-1)
            for j in range(len(new)):
                toks = new[j].tolist()
                end = next((t + 1 for t, tok in enumerate(toks) if tok in eos), len(toks))
                lp = steps[j, :end].gather(-1, new[j, :end, None]).squeeze(-1)
                out.append(Generation(toks[:end], lp.double().cpu().numpy(), entropy[j, :end].double().cpu().numpy(),
                                      np.zeros(end)))
        return out


def _as_index(tokens, device):
    import torch

    return torch.as_tensor(tokens, dtype=torch.long, device=device)[:, None]
