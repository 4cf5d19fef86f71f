"""The scoring interface every job reads a model through, and its in-process transformers implementation.

A backend answers three questions about token-id prompts (the tokenizer and chat template stay on the
caller's side, so the same ids reach an in-process model and a served one):

- ``next_token_logprobs``: the log-probabilities of chosen next tokens (option letters, confidence digits,
  Yes/No), exactly, plus the most likely next token;
- ``continuation_logprobs``: the log-likelihood of a continuation after a prompt;
- ``generate``: greedy generation with each generated token's log-probability and the entropy of the
  next-token distribution it was chosen from (the signal SECL's gate reads).

Two reads every backend gets from those, and where each backend makes them fast:

- ``read_next_tokens``: many prompts' next-token reads in calls of ``prompts_per_call`` prompts (a server: one
  prompt per request, ``max_in_flight`` at a time; in process: ``batch_size`` prompts per forward pass, sorted by
  length so that a batch holds prompts of similar length), optionally kept in a ``ScoreCheckpoint`` as they
  arrive (a run that stops resumes);
- ``backend.prefix_reads(prefixes)``: reads after a few prompts and follow-ups of them (a question, then the
  follow-up turns asking about its answer). By default every read is a whole prompt (a server shares the prefix
  in its own prefix cache); ``TransformersBackend`` runs each prefix once and reads every follow-up on its
  key/value cache (``CachedPrefixReads``).

Log-probabilities are natural-log, normalised over the full vocabulary, before any sampling temperature.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from hf_calibration.errors import ParameterError


class ServerError(ParameterError):
    """The server at ``base_url`` could not be reached, or stopped answering (after the retries)."""


class ServerUnreachable(ServerError):
    """A ``ServerError`` where no answer came at all (connection refused, a name that does not resolve, a timeout):
    the server is down or not up yet, as opposed to one that answered with an error."""


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
    prompts_per_call: int = 1  # prompts per ``next_token_logprobs`` call in ``read_next_tokens``
    max_in_flight: int = 1  # such calls at once (a server's concurrent requests)
    prefixes_per_session: int | None = None  # prefixes one ``prefix_reads`` holds (None: all)

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

    def prefix_reads(self, prefixes: Sequence[Sequence[int]], *, checkpoint=None) -> "PrefixReads":
        """Next-token reads after ``prefixes`` and follow-ups of them (``PrefixReads``): whole prompts, each read of
        the session in one ``read_next_tokens`` (kept in ``checkpoint`` when given)."""
        return PrefixReads(self, prefixes, checkpoint=checkpoint)

    def close(self) -> None:
        """Release connections (a no-op in process)."""


def read_next_tokens(backend: ScoringBackend, prompts: Sequence[Sequence[int]], token_ids: Sequence[int], *,
                     checkpoint=None, what: str = "prompts", progress: bool = False, desc: str = "scoring"
                     ) -> TokenLogprobs:
    """``backend.next_token_logprobs(prompts, token_ids)`` in calls of ``backend.prompts_per_call`` prompts, the
    longest first, ``backend.max_in_flight`` calls at a time; a tqdm bar over the prompts when ``progress``.

    checkpoint : optional ``ScoreCheckpoint``: the prompts it holds for this pass (its fingerprint: the run, the
        exact prompts and ids) are not read again, and each call's reads are appended as soon as they arrive, so
        an error, a dead server or Ctrl-C loses no finished call. A server's ``ServerError`` is re-raised saying
        how many of the prompts (``what`` they are) are kept and that the same run resumes.

    Every prompt is checked against the backend's context first (ParameterError naming ``prompts``).
    """
    from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

    from tqdm.auto import tqdm

    rows, ids = check_token_prompts(prompts), backend._check_ids(token_ids)
    backend.check_lengths(rows, extra=1)
    key = None if checkpoint is None else checkpoint.pass_key(rows, ids)
    kept = {} if checkpoint is None else checkpoint.kept(key)
    todo = sorted((i for i in range(len(rows)) if i not in kept), key=lambda i: -len(rows[i]))
    size = max(1, int(backend.prompts_per_call))
    calls = [todo[start:start + size] for start in range(0, len(todo), size)]
    bar = tqdm(total=len(rows), initial=len(kept), desc=desc, disable=not progress, unit="prompt")

    def one(call):
        got = backend.next_token_logprobs([rows[i] for i in call], ids)
        reads = [(got.logprobs[j].tolist(), int(got.top_ids[j]), float(got.top_logprobs[j]))
                 for j in range(len(call))]
        if checkpoint is not None:
            checkpoint.append_many(key, zip(call, reads))
        kept.update(zip(call, reads))
        bar.update(len(call))

    failed = None
    try:
        if int(backend.max_in_flight) <= 1:
            for call in calls:
                one(call)
        else:
            pool = ThreadPoolExecutor(int(backend.max_in_flight))
            try:
                done, _ = wait([pool.submit(one, call) for call in calls], return_when=FIRST_EXCEPTION)
                failed = next((f.exception() for f in done if f.exception() is not None), None)
            finally:  # on an error or Ctrl-C nothing new starts; the calls in flight finish (and are kept)
                pool.shutdown(wait=True, cancel_futures=True)
    except Exception as err:  # noqa: BLE001 - re-raised below, with what was kept said when it is a server's
        failed = err
    finally:
        bar.close()
    if failed is not None:
        raise (failed if checkpoint is None else checkpoint.interrupted(failed, len(kept), len(rows), what))
    return TokenLogprobs(np.array([kept[i][0] for i in range(len(rows))], dtype=np.float64).reshape(len(rows), -1),
                         np.array([kept[i][1] for i in range(len(rows))], dtype=np.int64),
                         np.array([kept[i][2] for i in range(len(rows))], dtype=np.float64))


class PrefixReads:
    """Next-token reads after ``prefixes`` (token-id prompts) and follow-ups of them, from ``backend``: what the
    confidence signals read about one answer (``secl.confidence.mcqa_signals``: the question, then the follow-up
    turns asking about the answer). Returned by ``backend.prefix_reads``; use it as a context manager (what it
    holds, such as a key/value cache, is released on exit).

    This default reads whole prompts (prefix + follow-up), each ``read`` in one ``read_next_tokens`` (kept in
    ``checkpoint`` when given): a server runs them concurrently and shares the prefix in its own prefix cache.
    ``TransformersBackend`` overrides it with ``CachedPrefixReads``.
    """

    def __init__(self, backend: ScoringBackend, prefixes: Sequence[Sequence[int]], *, checkpoint=None):
        self.backend, self.prefixes = backend, check_token_prompts(prefixes, "prefixes")
        self.checkpoint = checkpoint

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self) -> None:
        """Release what the reads hold (nothing here)."""

    def read(self, followups: Sequence[Sequence[Sequence[int]]], token_ids: Sequence[int], *,
             then_token: int | None = None, what: str = "reads") -> tuple[TokenLogprobs, TokenLogprobs | None]:
        """The next-token log-probabilities of ``token_ids`` after ``prefix i + f`` for each follow-up f in
        ``followups[i]`` (an empty follow-up reads after the prefix itself), in that order (prefix 0's follow-ups
        first): TokenLogprobs (Σ_i len(followups[i]), m). With ``then_token``, also the reads after each
        follow-up plus that one token (a two-step number's second digit), in the same order; else None.
        ``what`` names the reads in a kept run's message."""
        prompts = self._prompts(followups)
        if then_token is not None:
            prompts += [p + [int(then_token)] for p in prompts]
        got = read_next_tokens(self.backend, prompts, token_ids, checkpoint=self.checkpoint, what=what)
        if then_token is None:
            return got, None
        n = len(prompts) // 2
        return _rows(got, slice(0, n)), _rows(got, slice(n, 2 * n))

    def _prompts(self, followups) -> list[list[int]]:
        if len(followups) != len(self.prefixes):
            raise ParameterError("followups", len(followups), f"need one list per prefix ({len(self.prefixes)}), "
                                 f"got {len(followups)}")
        return [p + [int(t) for t in f] for p, fs in zip(self.prefixes, followups) for f in fs]


def _rows(got: TokenLogprobs, rows) -> TokenLogprobs:
    return TokenLogprobs(got.logprobs[rows], got.top_ids[rows], got.top_logprobs[rows])


def _token_reads(rows, ids: list[int]) -> TokenLogprobs:
    """TokenLogprobs of ``ids`` (and the argmax) from full log-softmax rows (n, V)."""
    best = rows.max(dim=-1)
    return TokenLogprobs(rows[:, ids].double().cpu().numpy(), best.indices.cpu().numpy().astype(np.int64),
                         best.values.double().cpu().numpy())


class TransformersBackend(ScoringBackend):
    """A causal LM in this process: the in-process read path of every job and signal.

    Where its speed comes from: batched forward passes with left padding (position ids from the mask, so a padded
    prompt scores as it does alone), the prompts of a ``next_token_logprobs`` call sorted by length so a batch
    holds prompts of similar length, only the read positions' logits computed (``logits_to_keep``), and in
    ``prefix_reads`` each prefix run once, its key/value cache shared by its follow-ups (``CachedPrefixReads``).

    model : a transformers causal LM (eval mode), or a wrapper with the same call (``CALMModel``). batch_size :
    prompts per forward pass (``read_next_tokens`` sends that many per call). pad_id : the id padding is filled
    with (masked, never read). ParameterError naming ``batch_size``.
    """

    name = "transformers"
    prefixes_per_session = 1  # one question's key/value cache held at a time

    def __init__(self, model, *, batch_size: int = 8, pad_id: int = 0):
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ParameterError("batch_size", batch_size, f"must be a positive integer, got {batch_size!r}")
        self.model, self.batch_size, self.pad_id = model, int(batch_size), int(pad_id)
        self.prompts_per_call = self.batch_size
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.max_context = getattr(model.config, "max_position_embeddings", None)

    def check_lengths(self, prompts, extra: int = 0) -> None:
        """As ``ScoringBackend.check_lengths``, less one token: in process the next token is read from the
        prompt's last position's logits and needs no position of its own (a server generates it)."""
        super().check_lengths(prompts, max(0, extra - 1))

    def prefix_reads(self, prefixes, *, checkpoint=None) -> PrefixReads:
        """``CachedPrefixReads`` (each prefix run once); with a ``checkpoint``, whole prompts kept as they are read
        (``PrefixReads``)."""
        if checkpoint is not None:
            return PrefixReads(self, prefixes, checkpoint=checkpoint)
        return CachedPrefixReads(self, prefixes)

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
        """Batches of ``batch_size`` prompts, longest first (less padding), each with ``logits_to_keep=1``; the
        reads are returned in the prompts' order."""
        rows, ids = check_token_prompts(prompts), self._check_ids(token_ids)
        n = len(rows)
        order = np.argsort([-len(r) for r in rows], kind="stable")
        lp, top, top_lp = np.empty((n, len(ids))), np.empty(n, dtype=np.int64), np.empty(n)
        for start in range(0, n, self.batch_size):
            idx = order[start:start + self.batch_size]
            got = _token_reads(self._log_softmax([rows[i] for i in idx], 1)[:, -1], ids)
            lp[idx], top[idx], top_lp[idx] = got.logprobs, got.top_ids, got.top_logprobs
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


def as_backend(model_or_backend, tokenizer=None, *, batch_size: int | None = None) -> ScoringBackend:
    """``model_or_backend`` as a ``ScoringBackend``: a backend as it is; a bare model (a transformers causal LM, or
    a wrapper such as ``CALMModel``) wrapped in ``TransformersBackend(model, batch_size=batch_size or 8,
    pad_id=tokenizer.pad_token_id or 0)``. The one place a model becomes a backend, for the functions that accept
    either (``modeling.score_mcqa``, ``secl.confidence.mcqa_signals``). ParameterError naming ``batch_size`` when
    it is given with a backend (which keeps its own) or is not a positive integer."""
    if isinstance(model_or_backend, ScoringBackend):
        if batch_size is not None:
            raise ParameterError("batch_size", batch_size, "applies to a bare model; a backend keeps its own "
                                 f"(got {type(model_or_backend).__name__})")
        return model_or_backend
    pad = getattr(tokenizer, "pad_token_id", None)
    return TransformersBackend(model_or_backend, batch_size=8 if batch_size is None else batch_size,
                               pad_id=pad or 0)


class CachedPrefixReads(PrefixReads):
    """``PrefixReads`` in process: each prefix is run once (``modeling.cache.prefix_pass``, on first use) and its
    key/value cache is shared by every follow-up: batched follow-ups left-padded after the prefix, only the last
    position's logits computed (``continuation_logprobs``), and a follow-up plus ``then_token`` read in one pass
    at its last two positions (``continuation_then_token``). Every read equals the uncached whole-prompt one
    within float32 rounding (``tests/modeling/test_backends.py``). The caches are dropped on ``close``.

    caches : optional, one per prefix: None (the prefix is run on first use) or ``(cache, mask)``, a cache that
        already holds the prefix's first ``mask.sum()`` tokens (``mask`` (n,): 1 for a real token, 0 for padding
        inside the cache, e.g. a row of a batched ``generate``'s cache); the prefix's remaining tokens are run on
        it on first use (``extend_cache``, no gradients) and the given cache is never modified. An empty follow-up
        (a read after the prefix itself) needs a prefix run here. SECL's reads start from ``generate``'s cache so.
    requires_grad : the reads keep their autograd graph (``rows``; a prefix run here too): the training read of
        SECL's update steps. Default False: every read runs under ``torch.no_grad``.
    """

    def __init__(self, backend: "TransformersBackend", prefixes, *, caches=None, requires_grad: bool = False):
        super().__init__(backend, prefixes)
        if caches is not None and len(caches) != len(self.prefixes):
            raise ParameterError("caches", len(caches), f"need one per prefix ({len(self.prefixes)}), got "
                                 f"{len(caches)}")
        self._given = list(caches) if caches is not None else [None] * len(self.prefixes)
        self.requires_grad = bool(requires_grad)
        self._cached: dict[int, tuple] = {}

    def close(self) -> None:
        self._cached.clear()

    def _prefix(self, i: int):
        """(log-softmax after the prefix (V,) or None for a given cache, cache, its length, its mask or None)."""
        from hf_calibration.modeling.cache import extend_cache, prefix_pass

        if i in self._cached:
            return self._cached[i]
        self.backend.check_lengths([self.prefixes[i]], extra=1)
        given = self._given[i]
        if given is None:
            lp, cache, n = prefix_pass(self.backend.model, self.prefixes[i], requires_grad=self.requires_grad)
            self._cached[i] = (lp, cache, n, None)
            return self._cached[i]
        import torch

        cache, mask = given
        have, rest = int(mask.sum()), self.prefixes[i][int(mask.sum()):]
        if have > len(self.prefixes[i]):
            raise ParameterError("caches", f"cache {i}", f"cache {i} holds {have} tokens, its prefix has "
                                 f"{len(self.prefixes[i])}")
        if rest:
            cache = extend_cache(self.backend.model, cache, len(mask), rest, prefix_mask=mask, start_position=have)
            mask = torch.cat([mask, torch.ones(len(rest), dtype=torch.long)])
        self._cached[i] = (None, cache, len(mask), mask)
        return self._cached[i]

    def prefix_cache(self, i: int) -> tuple:
        """``(cache, mask)`` of prefix ``i`` (run, or the given cache extended, on first use; mask (n,) 1 for a
        real token): a cache later reads, of this or another ``CachedPrefixReads``, can start from."""
        _, cache, n, mask = self._prefix(i)
        import torch

        return cache, (torch.ones(n, dtype=torch.long) if mask is None else mask)

    def rows(self, followups, *, then_token: int | None = None):
        """The full next-token log-softmax rows after ``prefix i + f`` for each follow-up f in ``followups[i]``, in
        ``read``'s order: a float32 tensor (Σ_i len(followups[i]), V), and with ``then_token`` the rows one token
        later (same shape), else None. With ``requires_grad`` they carry their graph. ``read`` takes the chosen
        ids and the argmax from them."""
        import torch

        from hf_calibration.modeling.cache import continuation_logprobs, continuation_then_token

        self.backend.check_lengths(self._prompts(followups), extra=1 + (then_token is not None))
        firsts, seconds = [], []
        with torch.set_grad_enabled(self.requires_grad):
            for i, fs in enumerate(followups):
                prefix_lp, cache, n, mask = self._prefix(i)
                fs = [[int(t) for t in f] for f in fs]
                if prefix_lp is None and not all(fs):
                    raise ParameterError("followups", f"prefix {i}", "an empty follow-up reads after the prefix "
                                         f"itself, which prefix {i}'s given cache does not hold")
                if then_token is None:  # the follow-ups of one prefix batched on its cache
                    rows = continuation_logprobs(self.backend.model, cache, n, [f for f in fs if f],
                                                 batch_size=self.backend.batch_size, pad_id=self.backend.pad_id,
                                                 prefix_mask=mask, requires_grad=self.requires_grad
                                                 ) if any(fs) else None
                    firsts.extend(self._in_order(fs, prefix_lp, rows))
                    continue
                for f in fs:  # follow-up and then_token in one pass
                    first, second = (continuation_then_token(self.backend.model, cache, n, f, int(then_token),
                                                             prefix_mask=mask, requires_grad=self.requires_grad)
                                     if f else (prefix_lp[None], self._after(cache, n, [int(then_token)])))
                    firsts.append(first)
                    seconds.append(second)
        return torch.cat(firsts), (torch.cat(seconds) if then_token is not None else None)

    def read(self, followups, token_ids, *, then_token=None, what="reads"):
        import torch

        ids = self.backend._check_ids(token_ids)
        with torch.no_grad():
            first, second = self.rows(followups, then_token=then_token)
        return _token_reads(first, ids), (_token_reads(second, ids) if second is not None else None)

    def _after(self, cache, n, tokens):
        from hf_calibration.modeling.cache import continuation_logprobs

        return continuation_logprobs(self.backend.model, cache, n, [tokens], pad_id=self.backend.pad_id,
                                     requires_grad=self.requires_grad)

    @staticmethod
    def _in_order(fs, prefix_lp, rows):
        """The rows of ``fs`` in order: the prefix's own row for an empty follow-up, else the next batched row."""
        out, at = [], 0
        for f in fs:
            if f:
                out.append(rows[at:at + 1])
                at += 1
            else:
                out.append(prefix_lp[None])
        return out


def _as_index(tokens, device):
    import torch

    return torch.as_tensor(tokens, dtype=torch.long, device=device)[:, None]
