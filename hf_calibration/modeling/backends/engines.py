"""What a serving engine can read exactly, found out at start-up, and one read strategy per way of reading.

``probe(backend)`` asks the server behind an ``OpenAICompatibleBackend`` what it can do, without trusting its name:

- its model list (``/v1/models``): the served names, the context (vLLM's ``max_model_len``; llama.cpp's
  ``meta.n_ctx``, else ``/props``), the vocabulary size (llama.cpp's ``meta.n_vocab``);
- its tokenizer endpoint and that endpoint's request shape (vLLM's ``{"prompt", "add_special_tokens"}``,
  llama.cpp's ``{"content", "add_special", "parse_special"}``): the probe texts and the chat template's turn must
  be split exactly as the local tokenizer splits them. A mismatch is reported only when the server returned tokens
  and they differ; an endpoint that answers neither shape leaves the tokenizer unchecked (said in the start-up line);
- how the log-probabilities of chosen token ids can be read exactly, in this order: vLLM's ``logprob_token_ids``
  (the ids asked for, whatever their rank); else, with log-probabilities in the chat shape (``logprobs.content[j] =
  {id, logprob, top_logprobs: [{id, logprob}]}``), the full next-token distribution (``n_probs`` = the vocabulary
  size, when the server returns all of it) and reads of one token forced with ``logit_bias`` (when the server
  returns that token's raw log-probability, before the bias: checked against the full distribution);
- whether LoRA adapters can be loaded at run time (vLLM's ``/v1/load_lora_adapter``), only at start
  (llama.cpp's ``--lora`` and ``/lora-adapters``), or not at all.

It returns the read strategy (``TokenIdReads`` for vLLM's dialect, ``DistributionReads`` for llama.cpp's) with
its ``Capabilities``; ``Capabilities.line()`` is the one start-up line naming the engine and the read path, and
``Capabilities.record()`` is what the jobs write into ``metrics.json``. A server that can read none of the ways
above is refused with a ParameterError naming ``base_url`` and what is missing. Engines, what each returns and
what the backend does there: docs/serving.md.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from hf_calibration.errors import ParameterError
from hf_calibration.modeling.backends.base import Generation, ServerError, truncated_entropy

MAX_IDS = 128  # vLLM's cap on logprob_token_ids per request (MAX_LOGPROB_TOKEN_IDS)
FORCE_BIAS = 100.0  # logit_bias that makes greedy decoding pick a token (logits differ by far less)
# Texts whose tokens the server must split exactly as the local tokenizer does (words, digits, spaces,
# punctuation, non-ASCII), plus the chat template's rendering of a turn when there is one.
PROBE_TEXTS = ("Is the answer \"C. Paris\" correct? Reply with Yes or No. 0 1 2 10 ÷ naïve café\n\t  x",)


@dataclass(frozen=True)
class Capabilities:
    """What the server behind a backend reads, and how (``probe``).

    engine : "vllm", "llama.cpp" or the model list's ``owned_by``. tokenizer : the endpoint shape the tokenizer was
    compared through ("vllm", "llama.cpp") or None (not compared). max_context : tokens, or None. chosen_ids : how
    chosen next-token log-probabilities are read ("logprob_token_ids", "full distribution", "forced reads
    (logit_bias)", or "full distribution or forced reads"). forced_max : with both, up to this many distinct ids
    are read by forced reads (one request each), more by one full-distribution read; chosen from the two probes'
    times. entropy : "exact (full distribution)" or "top-k bound". lora : "runtime", "start-up" or "none".
    model_checked : the served name was found in the model list (False where the engine ignores ``model``).
    """

    engine: str
    tokenizer: str | None
    max_context: int | None
    chosen_ids: str
    entropy: str
    lora: str
    model_checked: bool
    forced_max: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)

    def line(self) -> str:
        """The one start-up line: engine, read path, tokenizer check, LoRA loading."""
        ids = self.chosen_ids + (f" (forced reads up to {self.forced_max} ids)" if self.forced_max and
                                 "or" in self.chosen_ids else "")
        tok = f"tokenizer checked ({self.tokenizer} /tokenize)" if self.tokenizer else "tokenizer not checked"
        return (f"server: {self.engine}; chosen-token reads: {ids}; continuations: per-prefix reads; generation "
                f"entropy: {self.entropy}; {tok}; context {self.max_context or 'unknown'}; LoRA: {self.lora}"
                + "".join(f"; {n}" for n in self.notes))

    def record(self) -> dict:
        """A JSON-able dict for ``metrics.json``'s ``run.server``, with the start-up line as ``read_path``."""
        return {**asdict(self), "notes": list(self.notes), "read_path": self.line()}


def _token_id(token: str) -> int:
    """``"token_id:123"`` (vLLM's ``return_tokens_as_token_ids``) → 123."""
    return int(str(token).rsplit(":", 1)[-1])


def _top_dict(top: dict) -> dict[int, float]:
    return {_token_id(k): float(v) for k, v in top.items()}


def _logprob(value) -> float:
    """A served log-probability; llama.cpp writes log(0) as the lowest float: −inf."""
    value = float(value)
    return -math.inf if value < -1e30 else value


class TokenIdReads:
    """vLLM's dialect: ``/v1/completions`` with ``logprob_token_ids`` (the chosen ids' log-probabilities whatever
    their rank, ≤ ``MAX_IDS`` a request) and one token at temperature 0 (the most likely one); continuations as
    chosen next tokens after each prefix, batched; generation with ``top_logprobs`` (entropy: the top-k bound of
    ``base.truncated_entropy``). Log-probabilities are vLLM's default raw ones (docs/serving.md)."""

    def __init__(self, backend):
        self.backend = backend

    def _complete(self, prompts, **options):
        return self.backend.complete(prompts, return_tokens_as_token_ids=True, **options)

    def next_token(self, row: list[int], ids: list[int]):
        """(log-probabilities of ``ids``, greedy id, its log-probability) after ``row``."""
        unique = list(dict.fromkeys(ids))
        read: dict[int, float] = {}
        best = best_lp = None
        for start in range(0, len(unique), MAX_IDS):
            chunk = unique[start:start + MAX_IDS]
            lp = self._complete([row], max_tokens=1, logprobs=len(chunk), logprob_token_ids=chunk)[0]["logprobs"]
            read.update(_top_dict(lp["top_logprobs"][0]))
            best, best_lp = _token_id(lp["tokens"][0]), float(lp["token_logprobs"][0])
        return [read[t] for t in ids], best, best_lp

    def continuation(self, prefixes: list[list[int]], tokens: list[int]) -> np.ndarray:
        out = np.empty(len(prefixes))
        for start in range(0, len(prefixes), MAX_IDS):  # ≤ MAX_IDS distinct ids per request
            part = tokens[start:start + MAX_IDS]
            wanted = list(dict.fromkeys(part))
            choices = self._complete(prefixes[start:start + MAX_IDS], max_tokens=1, logprobs=len(wanted),
                                     logprob_token_ids=wanted)
            for j, (choice, token) in enumerate(zip(choices, part)):
                out[start + j] = _top_dict(choice["logprobs"]["top_logprobs"][0])[token]
        return out

    def generate(self, row: list[int], max_new_tokens: int) -> Generation:
        b = self.backend
        lp = self._complete([row], max_tokens=max_new_tokens, logprobs=b.top_logprobs)[0]["logprobs"]
        toks = [_token_id(t) for t in lp["tokens"]]
        low, gap = zip(*(truncated_entropy(list(_top_dict(d).values()), b.vocab_size)
                         for d in lp["top_logprobs"])) if toks else ((), ())
        return Generation(toks, np.array(lp["token_logprobs"], dtype=np.float64), np.array(low), np.array(gap))


class DistributionReads:
    """llama.cpp's dialect: log-probabilities in the chat shape with native ids, computed from the raw logits
    (before temperature, ``logit_bias`` or grammar), no cap on ``n_probs``; every request sends
    ``cache_prompt: false``, since reads that reuse the server's prompt cache differ from full-prompt reads
    (docs/serving.md), and exactness needs each prompt evaluated whole.

    Chosen ids: up to ``forced_max`` distinct ids, one request each with the id forced by ``logit_bias`` and
    ``n_probs 1`` (the forced token's raw log-probability and the most likely token's); more ids, one request
    with ``n_probs`` = the vocabulary size (the whole distribution). Continuations: each token forced after its
    prefix. Generation: greedy, the whole distribution at each step, so the entropy is exact (gap 0)."""

    def __init__(self, backend, *, full: bool, forced: bool, forced_max: int = 0):
        self.backend, self.full = backend, full
        self.forced_max = forced_max if forced else 0
        if not full:
            self.forced_max = 10 ** 9

    def steps(self, row: list[int], *, n_probs: int, max_tokens: int = 1, force: int | None = None) -> list[dict]:
        """The ``logprobs.content`` steps of one greedy completion of ``row``."""
        options = {"max_tokens": max_tokens, "n_probs": n_probs, "cache_prompt": False}
        if force is not None:
            options["logit_bias"] = [[int(force), FORCE_BIAS]]
        choice = self.backend.complete([row], **options)[0]
        content = (choice.get("logprobs") or {}).get("content")
        if not isinstance(content, list):
            raise ServerError("base_url", self.backend.base_url, "a completion came back without log-probabilities "
                              "in the chat shape (logprobs.content)")
        return content

    def forced_read(self, row: list[int], token: int) -> tuple[float, int, float]:
        """(raw log-probability of ``token`` after ``row``, most likely id, its log-probability)."""
        step = self.steps(row, n_probs=1, force=token)[0]
        if int(step["id"]) != int(token):
            raise ServerError("base_url", self.backend.base_url, f"token {token} forced with logit_bias "
                              f"{FORCE_BIAS:g} was not the one generated ({step['id']})")
        top = step["top_logprobs"][0]
        return _logprob(step["logprob"]), int(top["id"]), _logprob(top["logprob"])

    def distribution(self, step: dict) -> dict[int, float]:
        """The whole next-token distribution of one step, id → log-probability; ServerError when it is not whole."""
        dist = {int(d["id"]): _logprob(d["logprob"]) for d in step["top_logprobs"]}
        if len(dist) < self.backend.vocab_size:
            raise ServerError("base_url", self.backend.base_url, f"asked for all {self.backend.vocab_size} next-token "
                              f"log-probabilities, the server returned {len(dist)}")
        return dist

    def next_token(self, row: list[int], ids: list[int]):
        unique = list(dict.fromkeys(ids))
        if len(unique) <= self.forced_max:
            read = {}
            for t in unique:
                read[t], best, best_lp = self.forced_read(row, t)
            return [read[t] for t in ids], best, best_lp
        step = self.steps(row, n_probs=self.backend.vocab_size)[0]
        dist = self.distribution(step)
        best = max(dist, key=dist.get)
        return [dist[t] for t in ids], best, dist[best]

    def continuation(self, prefixes: list[list[int]], tokens: list[int]) -> np.ndarray:
        return np.array([self.next_token(p, [t])[0][0] for p, t in zip(prefixes, tokens)], dtype=np.float64)

    def generate(self, row: list[int], max_new_tokens: int) -> Generation:
        if not self.full:
            raise ParameterError("base_url", self.backend.base_url, "greedy generation with an exact entropy needs "
                                 "the full next-token distribution, which this server does not return")
        steps = self.steps(row, n_probs=self.backend.vocab_size, max_tokens=max_new_tokens)
        toks, lps, ents = [], [], []
        for step in steps:
            lp = np.array(list(self.distribution(step).values()), dtype=np.float64)
            finite = np.isfinite(lp)
            toks.append(int(step["id"]))
            lps.append(_logprob(step["logprob"]))
            ents.append(float(-(np.exp(lp[finite]) * lp[finite]).sum()))
        return Generation(toks, np.array(lps, dtype=np.float64), np.array(ents), np.zeros(len(toks)))


# ------------------------------------------------------------------------------------------------ probing


def _refuse(backend, what: str, why: str) -> ParameterError:
    return ParameterError("base_url", backend.base_url, f"the server cannot {what} exactly ({why}); engines and what "
                          "each returns: docs/serving.md")


def probe(backend):
    """``(reads, Capabilities)`` for the server behind ``backend`` (module docstring). Raises ParameterError naming
    ``served_model`` (a name-checking server that does not serve it) or ``base_url`` (a tokenizer that splits
    differently, another vocabulary, no exact way to read chosen ids), ServerError when it cannot be reached."""
    cards = backend.request("GET", "/models").get("data") or []
    owners = {str(c.get("owned_by", "")).lower() for c in cards}
    llama = "llamacpp" in owners or any(isinstance(c.get("meta"), dict) for c in cards)
    engine = "llama.cpp" if llama else "vllm" if "vllm" in owners else (sorted(owners - {""}) or ["unknown"])[0]
    card = next((c for c in cards if c.get("id") == backend.served_model), None)
    if card is None and not llama:  # llama.cpp serves one model and ignores the name a request gives
        raise ParameterError("served_model", backend.served_model, f"{backend.base_url} serves "
                             f"{[c.get('id') for c in cards]}, not {backend.served_model!r} (a LoRA must be loaded by "
                             "the server: --lora-modules or /v1/load_lora_adapter)")
    max_context, n_vocab = _context(backend, cards, card)
    shape = _check_tokenizer(backend)
    if n_vocab is not None and int(n_vocab) != backend.vocab_size:
        raise ParameterError("base_url", backend.base_url, f"the server's model has a vocabulary of {n_vocab} tokens, "
                             f"the local tokenizer {backend.vocab_size}: the server serves another model than the one "
                             "whose tokenizer --model names")
    ids = backend.tokenizer.encode(PROBE_TEXTS[0], add_special_tokens=False)[:8]
    reads, chosen, forced_max = _probe_reads(backend, ids)
    if isinstance(reads, TokenIdReads):
        entropy, lora = f"top-{backend.top_logprobs} bound", _vllm_lora(backend)
    else:
        entropy = "exact (full distribution)" if reads.full else "not available"
        lora = _llamacpp_lora(backend)
    notes = () if card is not None else ("the served name is not checked (the engine ignores it; the tokenizer and "
                                         "vocabulary are)",)
    return reads, Capabilities(engine=engine, tokenizer=shape, max_context=max_context, chosen_ids=chosen,
                               entropy=entropy, lora=lora, model_checked=card is not None, forced_max=forced_max,
                               notes=notes)


def _context(backend, cards, card) -> tuple[int | None, int | None]:
    """(context length, vocabulary size or None) from the model list, else llama.cpp's ``/props``."""
    card = card or (cards[0] if len(cards) == 1 else {})
    parent = next((m for m in cards if m.get("id") == card.get("parent")), card)
    meta = card.get("meta") if isinstance(card.get("meta"), dict) else {}
    ctx = card.get("max_model_len") or parent.get("max_model_len") or meta.get("n_ctx")
    if ctx is None and meta:
        got = backend.request_at_root("GET", "/props")
        if got is not None and got[0] < 400 and isinstance(got[1], dict):
            ctx = (got[1].get("default_generation_settings") or {}).get("n_ctx")
    return (int(ctx) if ctx else None), meta.get("n_vocab")


def _tokenize(backend, text: str, shape: str) -> list[int] | None:
    payload = ({"model": backend.served_model, "prompt": text, "add_special_tokens": False} if shape == "vllm"
               else {"content": text, "add_special": False, "parse_special": True})
    got = backend.request_at_root("POST", "/tokenize", payload)
    if got is None or got[0] >= 400 or not isinstance(got[1], dict):
        return None
    tokens = got[1].get("tokens")
    if not isinstance(tokens, list):
        return None
    return [int(t["id"]) if isinstance(t, dict) else int(t) for t in tokens]


def _check_tokenizer(backend) -> str | None:
    """The ``/tokenize`` shape the server answers ("vllm", "llama.cpp") after checking the probes, or None."""
    tok = backend.tokenizer
    probes = list(PROBE_TEXTS)
    if getattr(tok, "chat_template", None):
        probes.append(tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                              add_generation_prompt=True))
    shape = next((s for s in ("vllm", "llama.cpp") if _tokenize(backend, probes[0], s)), None)
    if shape is None:
        return None
    for text in probes:
        local, served = tok.encode(text, add_special_tokens=False), _tokenize(backend, text, shape)
        if served != local:
            raise ParameterError("base_url", backend.base_url, f"the server's tokenizer splits {text[:40]!r} into "
                                 f"{(served or [])[:12]}…, the local one into {local[:12]}…: the server serves "
                                 "another model than the one whose tokenizer --model names")
    return shape


def _probe_reads(backend, ids: list[int]):
    """(reads, chosen-ids description, forced_max): the first exact way of reading chosen ids the server has."""
    probe_ids = sorted(set(ids))[:4]
    try:
        lp, _, _ = TokenIdReads(backend).next_token(ids, probe_ids)
        if all(np.isfinite(lp)):
            return TokenIdReads(backend), "logprob_token_ids", 0
    except (KeyError, TypeError, IndexError, ValueError, AttributeError) as err:
        if isinstance(err, ParameterError) and err.parameter != "base_url":
            raise
    reads = DistributionReads(backend, full=True, forced=True)
    full = dist = None
    try:
        t0 = time.perf_counter()
        dist = reads.distribution(reads.steps(ids, n_probs=backend.vocab_size)[0])
        full = time.perf_counter() - t0
    except (ServerError, KeyError, TypeError, IndexError, ValueError):
        dist = None
    forced = None
    try:
        t0 = time.perf_counter()
        got, _, _ = reads.forced_read(ids, probe_ids[-1])
        forced = time.perf_counter() - t0
        # the forced read must be the raw log-probability (before the bias): the full distribution's value
        if dist is not None and not abs(got - dist[probe_ids[-1]]) <= 1e-3:
            forced = None
    except (ServerError, KeyError, TypeError, IndexError, ValueError):
        forced = None
    if full is None and forced is None:
        raise _refuse(backend, "read the log-probabilities of chosen token ids", "it has neither vLLM's "
                      "logprob_token_ids, nor a full next-token distribution through n_probs, nor raw "
                      "log-probabilities of a token forced with logit_bias")
    if full is None:
        return DistributionReads(backend, full=False, forced=True), "forced reads (logit_bias)", 0
    if forced is None:
        return DistributionReads(backend, full=True, forced=False), "full distribution", 0
    forced_max = max(1, min(64, int(full / max(forced, 1e-6))))
    return (DistributionReads(backend, full=True, forced=True, forced_max=forced_max),
            "full distribution or forced reads (logit_bias)", forced_max)


def _vllm_lora(backend) -> str:
    """vLLM registers /v1/load_lora_adapter only with runtime LoRA updating on (VLLM_ALLOW_RUNTIME_LORA_UPDATING):
    there a load naming no adapter (empty ``lora_name`` and ``lora_path``) is refused as a bad request, HTTP 400,
    and nothing is loaded; without the route the answer is 404 (405 for a path that exists for other methods).
    Decided from the status only."""
    got = backend.request_at_root("POST", "/v1/load_lora_adapter", {"lora_name": "", "lora_path": ""})
    return "runtime" if got is not None and got[0] == 400 else "none"


def _llamacpp_lora(backend) -> str:
    got = backend.request_at_root("GET", "/lora-adapters")
    if got is None or got[0] >= 400 or not isinstance(got[1], list):
        return "none"
    return f"start-up only (--lora; {len(got[1])} loaded, scaled per request)"
