"""``OpenAICompatibleBackend``: scoring through a server speaking the OpenAI completions protocol (vLLM).

Every request sends token ids (``prompt`` as a list of ints), never text, so the server scores exactly the
ids the local tokenizer and chat template produced. What is read, and how exactly:

- chosen next tokens: one request per prompt with ``logprob_token_ids`` (vLLM's extension of the completions
  protocol: the log-probabilities of exactly these ids, whatever their rank) and one generated token at
  temperature 0, which is the most likely next token; nothing is guessed from a top-k list;
- continuations: every continuation token as the chosen next token after the prompt and the tokens before it,
  the prefixes batched in one request; exact;
- greedy generation: ``temperature 0`` with ``logprobs = top_logprobs``; the generated tokens' log-probabilities
  are exact, the entropy is the top-k bound of ``base.truncated_entropy``.

vLLM returns log-probabilities of the raw model distribution (``--logprobs-mode raw_logprobs``, its default),
before temperature, top-p or penalties (docs/serving.md), which is what every calibration signal reads.

Requests run concurrently (``max_in_flight`` at a time, a thread pool over one ``httpx.Client``); a connection
error, a timeout or HTTP 408/429/5xx is retried ``retries`` times with exponential back-off, then raises
``ServerError`` (a ParameterError naming ``base_url``). Before anything is scored, ``OpenAICompatibleBackend``
checks that the server serves ``served_model`` (else ParameterError naming ``served_model`` with the names it
serves), reads its context length (``max_model_len``) and compares its tokenizer with the local one.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

import numpy as np

from hf_calibration.errors import ParameterError
from hf_calibration.modeling.backends.base import (Generation, ScoringBackend, TokenLogprobs, check_token_prompts,
                                                   truncated_entropy)

TRANSIENT_STATUS = (408, 429, 500, 502, 503, 504)
MAX_IDS = 128  # vLLM's cap on logprob_token_ids per request (MAX_LOGPROB_TOKEN_IDS)
# Texts whose tokens the server must split exactly as the local tokenizer does (words, digits, spaces,
# punctuation, non-ASCII), plus the chat template's rendering of a turn when there is one.
PROBE_TEXTS = ("Is the answer \"C. Paris\" correct? Reply with Yes or No. 0 1 2 10 ÷ naïve café\n\t  x",)


class ServerError(ParameterError):
    """The server at ``base_url`` could not be reached, or stopped answering (after the retries)."""


def _first_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text[:limit]


class OpenAICompatibleBackend(ScoringBackend):
    """Scores through ``base_url`` (e.g. ``http://127.0.0.1:8000/v1``), the model served as ``served_model``.

    tokenizer : the local tokenizer of the served model (prompts are built and tokenised here).
    top_logprobs : next tokens read per request (vLLM's default cap ``--max-logprobs`` is 20).
    max_in_flight : concurrent requests. timeout : seconds per request. retries : attempts after the first.
    check : run the start-up checks (model name, context, tokenizer); leave True outside tests of them.

    Raises ServerError naming ``base_url`` when the server cannot be reached, ParameterError naming
    ``served_model`` when it does not serve that name, ParameterError naming ``base_url`` when its tokenizer
    splits text differently from ``tokenizer`` or it does not return log-probabilities.
    """

    name = "server"

    def __init__(self, base_url: str, served_model: str, tokenizer, *, top_logprobs: int = 20, max_in_flight: int = 8,
                 timeout: float = 300.0, retries: int = 3, check: bool = True):
        import httpx

        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ParameterError("base_url", base_url, f"must be an http(s) URL such as http://127.0.0.1:8000/v1, "
                                 f"got {base_url!r}")
        if not isinstance(served_model, str) or not served_model:
            raise ParameterError("served_model", served_model, f"must name the served model, got {served_model!r}")
        for name, value in (("top_logprobs", top_logprobs), ("max_in_flight", max_in_flight)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ParameterError(name, value, f"must be a positive integer, got {value!r}")
        self.base_url, self.served_model, self.tokenizer = base_url.rstrip("/"), served_model, tokenizer
        self.top_logprobs, self.max_in_flight, self.retries = top_logprobs, max_in_flight, retries
        self.vocab_size = len(tokenizer)
        self.max_context = None
        self._client = httpx.Client(timeout=timeout, limits=httpx.Limits(max_connections=max_in_flight))
        if check:
            self.check_server()

    # ------------------------------------------------------------------------------- transport

    def _request(self, method: str, path: str, payload: dict | None = None) -> dict:
        """One request with the retries; the decoded JSON. A 4xx other than 408/429 raises at once."""
        import httpx

        url = f"{self.base_url}{path}"
        for attempt in range(self.retries + 1):
            try:
                response = self._client.request(method, url, json=payload)
            except httpx.TransportError as err:
                problem = f"cannot reach {url}: {type(err).__name__}: {_first_line(err) or 'no answer'}"
            else:
                if response.status_code < 400:
                    try:
                        return response.json()
                    except ValueError:  # a plain-text answer (vLLM's /v1/load_lora_adapter)
                        return {"text": response.text}
                problem = f"{url} answered HTTP {response.status_code}: {_first_line(response.text)}"
                if response.status_code not in TRANSIENT_STATUS:
                    raise ServerError("base_url", self.base_url, problem)
            if attempt < self.retries:
                time.sleep(min(8.0, 0.5 * 2 ** attempt))
        raise ServerError("base_url", self.base_url, f"{problem} (after {self.retries + 1} attempts)")

    def _map(self, fn, items):
        """``fn`` over ``items`` with at most ``max_in_flight`` requests at once; results in input order."""
        items = list(items)
        if len(items) <= 1 or self.max_in_flight == 1:
            return [fn(x) for x in items]
        with ThreadPoolExecutor(self.max_in_flight) as pool:
            return list(pool.map(fn, items))

    def _complete(self, prompts: list[list[int]], **options) -> list[dict]:
        """POST /completions for a batch of token-id prompts → the choices, in prompt order."""
        payload = {"model": self.served_model, "prompt": prompts, "temperature": 0.0,
                   "return_tokens_as_token_ids": True, **options}
        choices = self._request("POST", "/completions", payload).get("choices") or []
        if len(choices) != len(prompts):
            raise ServerError("base_url", self.base_url, f"/completions returned {len(choices)} choices for "
                              f"{len(prompts)} prompts")
        return sorted(choices, key=lambda c: c.get("index", 0))

    def close(self) -> None:
        self._client.close()

    def load_lora_adapter(self, name: str, path: str) -> None:
        """Load a PEFT LoRA folder into the server under ``name`` (vLLM's ``/v1/load_lora_adapter``; the server
        needs ``--enable-lora`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``), then score through it: this
        backend's ``served_model`` becomes ``name``. Raises ServerError naming ``base_url`` with the server's
        answer when it refuses (e.g. started without ``--enable-lora``, or a rank above ``--max-lora-rank``)."""
        self._request("POST", "/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})
        self.served_model = name
        self.check_server()

    # --------------------------------------------------------------------------------- checks

    def check_server(self) -> None:
        """The start-up checks of the class docstring: served name, context length, tokenizer."""
        models = self._request("GET", "/models").get("data") or []
        names = [m.get("id") for m in models]
        card = next((m for m in models if m.get("id") == self.served_model), None)
        if card is None:
            raise ParameterError("served_model", self.served_model, f"{self.base_url} serves {names}, not "
                                 f"{self.served_model!r} (a LoRA must be loaded by the server: --lora-modules or "
                                 "/v1/load_lora_adapter)")
        parent = next((m for m in models if m.get("id") == card.get("parent")), card)
        self.max_context = card.get("max_model_len") or parent.get("max_model_len")
        probes = list(PROBE_TEXTS)
        if getattr(self.tokenizer, "chat_template", None):
            probes.append(self.tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                                             add_generation_prompt=True))
        for text in probes:
            local = self.tokenizer.encode(text, add_special_tokens=False)
            served = self._tokenize(text)
            if served is not None and served != local:
                raise ParameterError("base_url", self.base_url, f"the server's tokenizer splits {text[:40]!r} into "
                                     f"{served[:12]}…, the local one into {local[:12]}…: serve the model whose "
                                     "tokenizer --model names")
        self._check_logprobs(self.tokenizer.encode(PROBE_TEXTS[0], add_special_tokens=False)[:8])

    def _tokenize(self, text: str) -> list[int] | None:
        """vLLM's ``/tokenize`` (at the server root); None where the server has no such endpoint."""
        import httpx

        root = self.base_url[: -len("/v1")] if self.base_url.endswith("/v1") else self.base_url
        try:
            response = self._client.post(f"{root}/tokenize", json={"model": self.served_model, "prompt": text,
                                                                    "add_special_tokens": False})
        except httpx.TransportError:
            return None
        if response.status_code >= 400:
            return None
        return response.json().get("tokens")

    def _check_logprobs(self, ids: list[int]) -> None:
        """One scored request: the server returns the log-probabilities of the token ids asked for."""
        probe = sorted(set(ids))[:4]
        try:
            got = self._one_next_token(ids, probe)
        except (KeyError, TypeError, IndexError, ValueError) as err:
            if isinstance(err, ParameterError):
                raise
            got = None
        if got is None or not all(np.isfinite(got[0])):
            raise ParameterError("base_url", self.base_url, "the server returns no log-probabilities of chosen token "
                                 "ids (need /v1/completions with logprobs and logprob_token_ids, as vLLM has)")

    # -------------------------------------------------------------------------------- scoring

    def next_token_logprobs(self, prompts, token_ids) -> TokenLogprobs:
        rows, ids = check_token_prompts(prompts), self._check_ids(token_ids)
        self.check_lengths(rows, extra=1)
        return _stack(self._map(lambda row: self._one_next_token(row, ids), rows))

    def _one_next_token(self, row: list[int], ids: list[int]):
        """(log-probabilities of ``ids``, greedy id, its log-probability) after ``row``: ``logprob_token_ids``
        returns exactly the ids asked for (at most ``MAX_IDS`` a request) beside the sampled token, which at
        temperature 0 is the most likely one."""
        unique = list(dict.fromkeys(ids))
        read: dict[int, float] = {}
        best = best_lp = None
        for start in range(0, len(unique), MAX_IDS):
            chunk = unique[start:start + MAX_IDS]
            lp = self._complete([row], max_tokens=1, logprobs=len(chunk), logprob_token_ids=chunk)[0]["logprobs"]
            read.update(_top_dict(lp["top_logprobs"][0]))
            best, best_lp = _token_id(lp["tokens"][0]), float(lp["token_logprobs"][0])
        return [read[t] for t in ids], best, best_lp

    def continuation_logprobs(self, prompts, continuations):
        """Each continuation token read as the chosen next token after the prompt and the tokens before it (one
        request per pair, its len(continuation) prompts batched): exact, and independent of ``prompt_logprobs``,
        which vLLM 0.32's CPU build cannot compute with ``--enable-lora`` (docs/serving.md)."""
        rows = check_token_prompts(prompts)
        conts = check_token_prompts(continuations, "continuations")
        if len(rows) != len(conts):
            raise ParameterError("continuations", len(conts), f"need one per prompt ({len(rows)}), got {len(conts)}")
        self.check_lengths([p + c for p, c in zip(rows, conts)], extra=0)

        def one(i):
            prefixes = [rows[i] + conts[i][:j] for j in range(len(conts[i]))]
            out = np.empty(len(prefixes))
            for start in range(0, len(prefixes), MAX_IDS):  # ≤ MAX_IDS distinct ids per request
                part = conts[i][start:start + MAX_IDS]
                wanted = list(dict.fromkeys(part))
                choices = self._complete(prefixes[start:start + MAX_IDS], max_tokens=1, logprobs=len(wanted),
                                         logprob_token_ids=wanted)
                for j, (choice, token) in enumerate(zip(choices, part)):
                    out[start + j] = _top_dict(choice["logprobs"]["top_logprobs"][0])[token]
            return out

        return self._map(one, range(len(rows)))

    def generate(self, prompts, *, max_new_tokens: int):
        rows = check_token_prompts(prompts)
        self.check_lengths(rows, extra=max_new_tokens)

        def one(row):
            choice = self._complete([row], max_tokens=max_new_tokens, logprobs=self.top_logprobs)[0]
            lp = choice["logprobs"]
            toks = [_token_id(t) for t in lp["tokens"]]
            low, gap = zip(*(truncated_entropy(list(_top_dict(d).values()), self.vocab_size)
                             for d in lp["top_logprobs"])) if toks else ((), ())
            return Generation(toks, np.array(lp["token_logprobs"], dtype=np.float64), np.array(low), np.array(gap))

        return self._map(one, rows)


def _token_id(token: str) -> int:
    """``"token_id:123"`` (``return_tokens_as_token_ids``) → 123."""
    return int(str(token).rsplit(":", 1)[-1])


def _top_dict(top: dict) -> dict[int, float]:
    return {_token_id(k): float(v) for k, v in top.items()}


def _stack(results: Sequence[tuple]) -> TokenLogprobs:
    lp = np.array([r[0] for r in results], dtype=np.float64)
    return TokenLogprobs(lp, np.array([r[1] for r in results], dtype=np.int64),
                         np.array([r[2] for r in results], dtype=np.float64))
