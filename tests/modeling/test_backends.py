"""The scoring backends without a server: the in-process backend against direct forward passes on the tiny model,
the entropy bounds by hand, the option checks. (Against a real vLLM server: tests/serving/.)"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hf_calibration.errors import ParameterError
from hf_calibration.modeling.backends import (ScoringBackend, TokenLogprobs, TransformersBackend,
                                              check_backend_options, truncated_entropy)


def _full(model, ids):
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)


def test_next_token_logprobs_equal_unbatched_passes(tiny_model):
    prompts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]
    ids = [3, 4, 20]
    got = TransformersBackend(tiny_model, batch_size=2).next_token_logprobs(prompts, ids)
    for i, p in enumerate(prompts):
        ref = _full(tiny_model, p)[-1]
        # batched with left padding vs alone: float32 sums in another order; the tiny model's logits are O(1)
        # over a hidden size of 32 and 2 layers, so 64·eps·|z| ≈ 1e-5 bounds the difference
        np.testing.assert_allclose(got.logprobs[i], ref[ids].numpy(), atol=1e-5)
        assert got.top_ids[i] == int(ref.argmax())


def test_continuation_logprobs_equal_unbatched_passes(tiny_model):
    prompts, conts = [[5, 6, 7], [8, 9, 10, 11, 12]], [[13, 14, 15], [16]]
    got = TransformersBackend(tiny_model, batch_size=2).continuation_logprobs(prompts, conts)
    for p, c, g in zip(prompts, conts, got):
        full = _full(tiny_model, p + c)
        ref = [float(full[len(p) - 1 + j, t]) for j, t in enumerate(c)]
        np.testing.assert_allclose(g, ref, atol=1e-5)  # as above


def test_generation_entropy_is_exact_in_process(tiny_model):
    gen = TransformersBackend(tiny_model).generate([[5, 6, 7]], max_new_tokens=3)[0]
    seq = [5, 6, 7] + gen.token_ids
    full = _full(tiny_model, seq)
    for j, tok in enumerate(gen.token_ids):
        row = full[2 + j]
        assert tok == int(row.argmax())
        np.testing.assert_allclose(gen.logprobs[j], float(row[tok]), atol=1e-5)
        np.testing.assert_allclose(gen.entropy[j], float(-(row.exp() * row).sum()), atol=1e-5)
    assert np.all(gen.entropy_gap == 0)


def test_truncated_entropy_by_hand():
    # p = (0.5, 0.25) read of V = 10 tokens: r = 0.25; low = 0.5 ln 2 + 0.25 ln 4 + 0.25 ln 4 = 1.5 ln 2,
    # gap = 0.25 ln 8
    low, gap = truncated_entropy([math.log(0.5), math.log(0.25)], 10)
    assert low == pytest.approx(1.5 * math.log(2), abs=1e-12)
    assert gap == pytest.approx(0.25 * math.log(8), abs=1e-12)
    # the bounds hold for a distribution with those two top probabilities: the rest spread unevenly over 8
    rest = np.array([0.1, 0.05, 0.05, 0.02, 0.01, 0.01, 0.005, 0.005])
    p = np.concatenate([[0.5, 0.25], rest])
    h = float(-(p * np.log(p)).sum())
    assert low <= h <= low + gap
    assert truncated_entropy([0.0], 5) == (0.0, 0.0)  # all the mass read


def test_dense_row_keeps_read_ids_and_argmax():
    lp = TokenLogprobs(np.array([[-1.0, -3.0]]), np.array([7]), np.array([-0.5]))
    row = lp.dense([2, 4], 10)[0]
    assert row[2] == -1.0 and row[4] == -3.0 and row[7] == -0.5 and int(row.argmax()) == 7
    assert torch.isinf(row[[0, 1, 3, 5, 6, 8, 9]]).all()


def test_backend_options():
    check_backend_options("transformers", None, None)
    check_backend_options("openai", "http://127.0.0.1:8000/v1", None)
    with pytest.raises(ParameterError, match="backend") as err:
        check_backend_options("vllm", None, None)
    assert err.value.parameter == "backend"
    with pytest.raises(ParameterError) as err:
        check_backend_options("openai", None, None)
    assert err.value.parameter == "base_url"
    with pytest.raises(ParameterError) as err:
        check_backend_options("transformers", None, "name")
    assert err.value.parameter == "served_model"


def test_prompt_longer_than_context_is_refused_before_scoring(tiny_model):
    backend = TransformersBackend(tiny_model)
    backend.max_context = 4
    # in process the next token's log-probabilities come from the prompt's last position: 4 tokens fit a context
    # of 4; a read token fed back in (extra=2: a two-step number's second digit) needs a fifth position
    backend.check_lengths([[1, 2], [1, 2, 3, 4]], extra=1)
    for prompts, extra in (([[1, 2], [1, 2, 3, 4, 5]], 1), ([[1, 2, 3, 4]], 2)):
        with pytest.raises(ParameterError, match="context of 4") as err:
            backend.check_lengths(prompts, extra=extra)
        assert err.value.parameter == "prompts"


@pytest.mark.parametrize("cached", [True, False])
def test_prefix_reads_equal_whole_prompt_passes(tiny_model, cached):
    """Each read of a session, after a prefix alone (empty follow-up), after prefix + follow-up, and after one more
    token, equals one unpadded forward pass over the whole prompt: the cached session (in process) and the default
    one (whole prompts, as a server gets them)."""
    from hf_calibration.modeling.backends import CachedPrefixReads, PrefixReads

    backend = TransformersBackend(tiny_model, batch_size=2)
    prefixes, ids, then = [[5, 6, 7, 8], [9, 10]], [3, 4, 20], 11
    follow = [[[], [12, 13], [14]], [[15, 16, 17]]]
    session = (CachedPrefixReads if cached else PrefixReads)(backend, prefixes)
    with session:
        got, none = session.read(follow, ids)
        first, second = session.read([[[12, 13]], [[]]], ids, then_token=then)
    assert none is None
    whole = [p + f for p, fs in zip(prefixes, follow) for f in fs]
    for row, prompt in enumerate(whole):
        ref = _full(tiny_model, prompt)[-1]
        np.testing.assert_allclose(got.logprobs[row], ref[ids].numpy(), atol=1e-5)  # as above
        assert got.top_ids[row] == int(ref.argmax())
    for row, prompt in enumerate([prefixes[0] + [12, 13], prefixes[1]]):
        np.testing.assert_allclose(first.logprobs[row], _full(tiny_model, prompt)[-1][ids].numpy(), atol=1e-5)
        np.testing.assert_allclose(second.logprobs[row], _full(tiny_model, prompt + [then])[-1][ids].numpy(),
                                   atol=1e-5)


def test_in_process_backend_chooses_the_cached_session(tiny_model, tmp_path):
    from hf_calibration.modeling.backends import CachedPrefixReads, PrefixReads
    from hf_calibration.modeling.backends.checkpoint import ScoreCheckpoint

    backend = TransformersBackend(tiny_model)
    assert type(backend.prefix_reads([[1, 2]])) is CachedPrefixReads
    kept = backend.prefix_reads([[1, 2]], checkpoint=ScoreCheckpoint(tmp_path / "k.jsonl", {"run": 1}))
    assert type(kept) is PrefixReads  # a kept run reads whole prompts, each kept as it arrives


class _Stopping(TransformersBackend):
    """The tiny model in process, interrupted (Ctrl-C) at call ``stop_at``; ``sent`` counts the prompts read."""

    def __init__(self, model, stop_at=None):
        super().__init__(model, batch_size=2)
        self.stop_at, self.calls, self.sent = stop_at, 0, 0

    def next_token_logprobs(self, prompts, token_ids):
        self.calls += 1
        if self.calls == self.stop_at:
            raise KeyboardInterrupt
        self.sent += len(prompts)
        return super().next_token_logprobs(prompts, token_ids)


def test_read_next_tokens_keeps_finished_batches_and_resumes(tiny_model, tmp_path):
    from hf_calibration.modeling.backends import read_next_tokens
    from hf_calibration.modeling.backends.checkpoint import ScoreCheckpoint

    prompts, ids = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14], [15, 16]], [3, 4]
    path = tmp_path / "kept.jsonl"
    with pytest.raises(KeyboardInterrupt):
        read_next_tokens(_Stopping(tiny_model, stop_at=2), prompts, ids, checkpoint=ScoreCheckpoint(path, {"r": 1}))
    assert len(path.read_text().splitlines()) == 1 + 2  # the header and the first batch of two
    resumed = _Stopping(tiny_model)
    got = read_next_tokens(resumed, prompts, ids, checkpoint=ScoreCheckpoint(path, {"r": 1}))
    assert resumed.sent == 3  # the kept batch is not read again
    for i, p in enumerate(prompts):
        np.testing.assert_allclose(got.logprobs[i], _full(tiny_model, p)[-1][ids].numpy(), atol=1e-5)  # as above
    other = _Stopping(tiny_model)
    read_next_tokens(other, prompts, ids, checkpoint=ScoreCheckpoint(path, {"r": 2}))
    assert other.sent == len(prompts)  # another run's kept reads are never mixed in


def test_the_registry_is_what_the_cli_and_the_checks_read(monkeypatch):
    """The --backend choices and check_backend_options come from REGISTRY: an entry added there is accepted."""
    import dataclasses

    from hf_calibration.jobs import EvaluateConfig
    from hf_calibration.modeling.backends import registry

    choices = {f.name: f for f in dataclasses.fields(EvaluateConfig)}["backend"].metadata["choices"]
    assert choices == list(registry.REGISTRY) == list(registry.BACKENDS)
    for name, entry in registry.REGISTRY.items():
        assert issubclass(entry.backend_class(), ScoringBackend)
        assert entry.capabilities <= set(registry.CAPABILITIES) and set(entry.options) <= set(registry.OPTIONS)
    assert registry.has_capability("transformers", "exact_entropy")
    assert not registry.has_capability("openai", "exact_entropy")
    monkeypatch.setitem(registry.REGISTRY, "other", registry.BackendEntry(
        "hf_calibration.modeling.backends.server:OpenAICompatibleBackend", None, "another server",
        options=("base_url",), required=("base_url",)))
    check_backend_options("other", "http://127.0.0.1:1/v1", None)
    with pytest.raises(ParameterError) as err:
        check_backend_options("other", None, None)
    assert err.value.parameter == "base_url"
    with pytest.raises(ParameterError) as err:
        check_backend_options("other", "http://127.0.0.1:1/v1", "name")
    assert err.value.parameter == "served_model" and "openai only" in str(err.value)


def test_prefix_reads_from_a_given_padded_cache_equal_whole_prompt_passes(tiny_model):
    """A session started from a cache that holds a prefix's first tokens behind left padding (a row of a batched
    ``generate``'s cache, as SECL hands it over) extends it by the rest of the prefix and reads as one unpadded pass
    over the whole prompt; the cache it was given is not changed; an empty follow-up (a read the given cache does
    not hold) is refused naming ``followups``."""
    from hf_calibration.modeling.backends import CachedPrefixReads

    backend = TransformersBackend(tiny_model, batch_size=2)
    prefix, ids, then = [5, 6, 7, 8, 9], [3, 4, 20], 11
    with torch.no_grad():  # a batch of two, this prompt's first three tokens left-padded by two
        out = tiny_model(input_ids=torch.tensor([[1, 2, 3, 4, 5], [0, 0, 5, 6, 7]]),
                         attention_mask=torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]]),
                         position_ids=torch.tensor([[0, 1, 2, 3, 4], [0, 0, 0, 1, 2]]), use_cache=True)
    from hf_calibration.modeling.cache import cache_row

    cache, mask = cache_row(out.past_key_values, 1, 5), torch.tensor([0, 0, 1, 1, 1])
    before = cache.get_seq_length()
    session = CachedPrefixReads(backend, [prefix], caches=[(cache, mask)])
    got, _ = session.read([[[12, 13], [14]]], ids)
    first, second = session.read([[[12]]], ids, then_token=then)
    for row, f in enumerate([[12, 13], [14]]):
        np.testing.assert_allclose(got.logprobs[row], _full(tiny_model, prefix + f)[-1][ids].numpy(), atol=1e-5)
    np.testing.assert_allclose(first.logprobs[0], _full(tiny_model, prefix + [12])[-1][ids].numpy(), atol=1e-5)
    np.testing.assert_allclose(second.logprobs[0], _full(tiny_model, prefix + [12, then])[-1][ids].numpy(),
                               atol=1e-5)
    assert cache.get_seq_length() == before
    with pytest.raises(ParameterError, match="followups"):
        session.read([[[]]], ids)


def test_prefix_reads_with_gradients_give_the_whole_prompt_gradient(tiny_model):
    """``requires_grad=True`` (the training read of SECL's update steps): the rows carry their graph, and the
    gradient of a read with respect to the weights equals that of one forward pass over the whole prompt."""
    from hf_calibration.modeling.backends import CachedPrefixReads

    backend = TransformersBackend(tiny_model, batch_size=1)
    prefix, follow, token = [5, 6, 7, 8], [12, 13], 3
    weight = tiny_model.get_output_embeddings().weight
    first, _ = CachedPrefixReads(backend, [prefix], requires_grad=True).rows([[follow]])
    (grad,) = torch.autograd.grad(first[0, token], weight)
    ref = torch.log_softmax(tiny_model(torch.tensor([prefix + follow])).logits[0, -1].float(), dim=-1)[token]
    (ref_grad,) = torch.autograd.grad(ref, weight)
    torch.testing.assert_close(grad, ref_grad, atol=1e-5, rtol=0)
    with torch.no_grad():
        plain, _ = CachedPrefixReads(backend, [prefix]).rows([[follow]])
    assert not plain.requires_grad


def test_a_server_that_does_not_answer_is_told_from_one_that_answers_an_error(tiny_tokenizer):
    """``ServerUnreachable`` (no answer: the gateway's 503, serve's "not answering yet") is decided by the error's
    class, not its text: a closed port raises it; a server answering HTTP 500 raises a plain ``ServerError``."""
    import http.server
    import threading

    from hf_calibration.modeling.backends import OpenAICompatibleBackend, ServerError, ServerUnreachable
    from hf_calibration.modeling.backends.launch import free_port

    with pytest.raises(ServerUnreachable):
        OpenAICompatibleBackend(f"http://127.0.0.1:{free_port()}/v1", "m", tiny_tokenizer, retries=0, timeout=5.0)

    class Broken(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(500)
            self.end_headers()
            self.wfile.write(b"broken")

        do_POST = do_GET

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Broken)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(ServerError) as err:
            OpenAICompatibleBackend(f"http://127.0.0.1:{server.server_port}/v1", "m", tiny_tokenizer, retries=0,
                                    timeout=5.0)
        assert not isinstance(err.value, ServerUnreachable)
    finally:
        server.shutdown()
