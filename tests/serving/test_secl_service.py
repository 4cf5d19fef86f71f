"""SECL as a service beside the real vLLM server (``secl.service``) against today's in-process ``SECLModel``.

The same short MMLU stream with a burst opened at its start (every question in the burst, bin-gate width 0, a
learning rate that moves the confidence visibly) runs through ``SECLModel.generate`` in process and through
``SECLService`` (answers, gate entropy, verbalized and P(True) reads served, the update steps local, the adapter
hot-swapped after every update), both in the "all" scope, where every served read is the function the trainer
computes (the service module's docstring says why the "confidence" scope cannot be). The schedule is the
consolidation one (``CONSOLIDATION``: the option text restated, the burst's questions kept in the replay buffer
and consolidated when the burst ends, 3 epochs of the 4 questions, one AdamW step each), which the in-process run
and the service must do alike: the stream is then read again with the adapter each ended with.

Tolerances, from the conftest's ``LOGPROB_ATOL`` ε (served against in-process log-probabilities, float32):
- the verbalized confidence c = Σ_v w_v·v with softmax weights over read log-probabilities in [0, 1]: moving
  every log-probability by ≤ ε moves each weight by at most w·(e^{2ε} − 1), so c by ≤ 2ε (``CONF_ATOL``);
- P(True) = σ(lp_yes − lp_no) moves by ≤ 2ε/4 = ε/2; c* = softmax(P(True)/τ_n)[0] by ≤ 2·(ε/2)/τ_n = ε/τ_n;
- after an update both runs' adapters took AdamW steps on residuals c − ĉ that differ by the tolerances above;
  AdamW normalises the step by the gradient's running scale (its first step is lr·sign(g)), so the adapters,
  and the confidences read with them, differ by the read tolerance again at first order: 2·CONF_ATOL. The
  consolidation's targets are recomputed from the trainer's own (local) reads in both runs, so its steps add
  no served-read error of their own; the final reads are held to the same 2·CONF_ATOL.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

from tests.serving.conftest import LOGPROB_ATOL, MODEL

N_ITEMS = 4
MAX_NEW = 4
CONF_ATOL = 2 * LOGPROB_ATOL
CONSOLIDATION = dict(restate="option_text", tau_n=0.05, replay_size=50, replay_batch_size=0, consolidation_epochs=3,
                     consolidation_batch_size=1)
SETTINGS = dict(burst_size=N_ITEMS, bin_gate_width=0, learning_rate=1e-2, adapter_scope="all", **CONSOLIDATION)


def _config():
    from hf_calibration.secl import SECLConfig

    return SECLConfig(**SETTINGS)


def _secl_model():
    """A fresh SmolLM2 copy with SECL's adapter, its LoRA A drawn from seed 0 (the same in every copy)."""
    from hf_calibration.modeling import load_model
    from hf_calibration.secl import apply_secl

    model, tokenizer = load_model(MODEL)
    torch.manual_seed(0)
    return apply_secl(model, tokenizer, _config())


@pytest.fixture(scope="module")
def items(smollm):
    from hf_calibration.modeling.streams import build_stream

    return build_stream(smollm[1], "mmlu", limit_per_domain=N_ITEMS)


@pytest.fixture(scope="module")
def reference(items):
    """In process: the base model's records (identity adapter, no update), then the SECL records of the stream."""
    secl = _secl_model()
    stop = secl.secl_stop_ids()

    def run(item, update):
        ids = torch.tensor([item.prompt_ids])
        out = secl.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW, do_sample=False,
                            return_dict_in_generate=True, secl_choices=[item.choices], secl_update=update,
                            pad_token_id=secl.secl_tokenizer.pad_token_id)
        answer = out.sequences[0, len(item.prompt_ids):].tolist()
        return {**secl.secl_records[0].to_dict(), "answer_ids": answer[:next((j for j, t in enumerate(answer) if t in stop),
                                                                  len(answer))]}

    base = [run(item, False) for item in items]
    secl.start_burst()
    records = [run(item, True) for item in items]
    final = [run(item, False)["confidence"] for item in items]  # with the adapter the burst ended with
    return base, records, dict(secl.secl_counters), final


def _service(served, state_dir, **options):
    from hf_calibration.secl.service import SECLService

    return SECLService(served, _secl_model(), state_dir, max_new_tokens=MAX_NEW, **options)


def _assert_same(got, want):
    """Equal answers, gate decisions, bursts, bin-gate decisions, updates; confidences and pseudo-labels within
    the module docstring's tolerances."""
    for g, w in zip(got, want, strict=True):
        assert g["answer_ids"] == w["answer_ids"]
        for key in ("alarm", "in_burst", "skipped_by_bin_gate", "updated", "n_distractors"):
            assert g[key] == w[key], key
        assert abs(g["confidence"] - w["confidence"]) <= 2 * CONF_ATOL
        assert abs(g["norm_p_true"] - w["norm_p_true"]) <= 2 * LOGPROB_ATOL / _config().tau_n
        assert abs(g["p_true"] - w["p_true"]) <= LOGPROB_ATOL
        assert abs(g["confidence_after"] - w["confidence_after"]) <= 2 * CONF_ATOL
        assert abs(g["entropy"] - w["entropy"]) <= g["entropy_gap"] + LOGPROB_ATOL * 10  # a top-k lower bound


def _final_reads(service, name, items) -> list[float]:
    """Every question read again (no update) with the adapter the stream ``name`` ended with."""
    return [service.step(name, item.prompt_ids, choices=item.choices, update=False).confidence for item in items]


def test_served_secl_equals_in_process(served, items, reference, tmp_path):
    base, want, counters, final = reference
    # the stream is not trivial: updates happen and move the confidence far beyond the tolerance
    assert sum(r["updated"] for r in want) >= 2
    assert max(abs(r["confidence_after"] - r["confidence"]) for r in want) > 20 * CONF_ATOL
    service = _service(served, tmp_path)
    service.start_burst("s")
    got = [service.step("s", item.prompt_ids, choices=item.choices).to_dict() for item in items]
    _assert_same(got, want)
    stream = service.streams["s"]
    assert {k: stream.counters[k] for k in ("questions", "bursts", "burst_questions", "updates",
                                            "skipped_by_bin_gate")} == {
        k: counters[k] for k in ("questions", "bursts", "burst_questions", "updates", "skipped_by_bin_gate")}
    # the burst ended at its last question: consolidated as in process, 3 epochs x 4 questions, batch 1
    assert got[-1]["consolidation"] == want[-1]["consolidation"] == {"questions": N_ITEMS, "steps": 3 * N_ITEMS,
                                                                      "forward_passes": 3 * N_ITEMS}
    assert "consolidation" not in got[0]
    state = json.loads((tmp_path / "s" / "stream.json").read_text())
    assert [x["index"] for x in state["replay"]["items"]] == list(range(N_ITEMS))
    # one version per update plus the consolidated one, each a PEFT folder; the server serves the current one only
    versions = sorted(p.name for p in (tmp_path / "s").glob("v*"))
    assert len(versions) == counters["updates"] + 1
    assert {"adapter_model.safetensors", "adapter_config.json", "secl_state.json"} <= {
        p.name for p in (tmp_path / "s" / versions[-1]).iterdir()}
    names = service.lora.served()
    assert stream.served_name in names and not any(n.startswith("s-v") and n != stream.served_name for n in names)
    # the first question was read with the identity adapter (the base model), later ones with the new versions
    assert got[0]["adapter"] is None and got[-1]["adapter"] is not None
    assert abs(got[0]["confidence"] - base[0]["confidence"]) <= CONF_ATOL
    assert len(state["records"]) == N_ITEMS and state["version"] == stream.version
    # the consolidated adapter: the same reads in both runs, and not those before the consolidation
    reads = _final_reads(service, "s", items)
    assert max(abs(a - b) for a, b in zip(reads, final)) <= 2 * CONF_ATOL
    # (moved by more than twice the tolerance either read is held to, so the two are told apart)
    assert abs(reads[-1] - got[-1]["confidence_after"]) > 2 * (2 * CONF_ATOL)


def test_two_streams_keep_their_own_adapter(served, items, reference, tmp_path):
    """Two streams on one server, questions interleaved, the same items and bursts: each equals the in-process
    run, which it would not if either read the other's adapter (one version ahead at every read)."""
    _, want, _, _ = reference
    service = _service(served, tmp_path)
    for name in ("a", "b"):
        service.start_burst(name)
    got = {"a": [], "b": []}
    for item in items[:3]:
        for name in ("a", "b"):
            got[name].append(service.step(name, item.prompt_ids, choices=item.choices).to_dict())
    for name in ("a", "b"):
        _assert_same(got[name], want[:3])
    assert service.streams["a"].served_name != service.streams["b"].served_name
    assert service.streams["a"].served_name.startswith("a-") and service.streams["b"].served_name.startswith("b-")


def test_teacher_in_the_burst_served(served, items, reference, tmp_path):
    """``burst_confidence`` "teacher" through the service: each burst question returns its c*, and its verbalized
    read, gate decisions and updates are the default in-process run's (the option changes nothing learnt)."""
    from hf_calibration.secl.service import SECLService

    _, want, _, _ = reference
    trainer = _secl_model()
    trainer.set_secl_config(trainer.secl_config.replaced(burst_confidence="teacher"))
    service = SECLService(served, trainer, tmp_path, max_new_tokens=MAX_NEW)
    service.start_burst("t")
    got = [service.step("t", item.prompt_ids, choices=item.choices).to_dict() for item in items[:3]]
    assert all(g["in_burst"] and g["confidence"] == g["norm_p_true"] for g in got)
    assert max(abs(g["confidence"] - g["verbalized"]) for g in got) > 20 * CONF_ATOL  # told apart
    _assert_same([{**g, "confidence": g["verbalized"]} for g in got], want[:3])


def test_killed_service_resumes(served, items, reference, tmp_path):
    """The server goes away in the middle of a burst (the service's connection points at a closed port): the
    question fails with ServerError naming base_url, the state on disk stays the last finished question's; the
    service is then killed (never closed) and the server forgets the adapter (as a restarted server would). A
    new service on the same folder resumes the stream — adapter, AdamW state, gate, counters, records — and the
    rest of the stream equals the uninterrupted in-process run."""
    from hf_calibration.modeling.backends import ServerError
    from hf_calibration.secl.service import LoRAAdmin

    _, want, _, final = reference
    first = _service(served, tmp_path)
    first.start_burst("r")
    first.step("r", items[0].prompt_ids, choices=items[0].choices)
    loaded = first.streams["r"].served_name
    gone = copy.copy(served)
    gone.base_url, gone.retries = f"http://127.0.0.1:{_closed_port()}/v1", 0
    first.backend, first.lora = gone, LoRAAdmin(gone)
    with pytest.raises(ServerError) as err:
        first.step("r", items[1].prompt_ids, choices=items[1].choices)
    assert err.value.parameter == "base_url"
    saved = json.loads((tmp_path / "r" / "stream.json").read_text())
    assert len(saved["records"]) == 1 and saved["version"] == 1
    LoRAAdmin(served).unload(loaded)
    assert loaded not in LoRAAdmin(served).served()
    del first
    second = _service(served, tmp_path)
    stream = second.open_stream("r")
    assert len(stream.records) == 1 and stream.served_name == loaded and loaded in second.lora.served()
    assert [x.index for x in stream.replay.items] == [0]  # the burst's first question, kept across the kill
    rest = [second.step("r", item.prompt_ids, choices=item.choices) for item in items[1:]]
    _assert_same([r.to_dict() for r in stream.records[:1] + rest], want)
    assert max(abs(a - b) for a, b in zip(_final_reads(second, "r", items), final)) <= 2 * CONF_ATOL
    assert [p.name for p in sorted((tmp_path / "r").glob("v*"))] == [
        f"v{i:06d}" for i in range(1, stream.version + 1)]  # every version kept


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_secl_serve_command(vllm_server, tmp_path, capsys):
    """``hf-calibration secl-serve`` on a two-domain stream, one stream (adapter) per domain, a burst at each
    start: both streams update and are served under their own names; a rerun resumes with nothing left to do."""
    from hf_calibration.cli import main

    argv = ["secl-serve", "--output-dir", str(tmp_path), "--base-url", vllm_server.url, "--served-model",
            vllm_server.model, "--stream", "mmlu:stem,mmlu:humanities", "--limit-per-domain", "2",
            "--stream-per-domain", "--burst-at-start", "--bin-gate-width", "0", "--learning-rate", "1e-2",
            "--max-new-tokens", str(MAX_NEW), "--adapter-scope", "all"]
    assert main(argv) == 0, capsys.readouterr().err
    service = json.loads((tmp_path / "service.json").read_text())
    assert set(service["counters"]) == {"mmlu-stem", "mmlu-humanities"}
    for name, counters in service["counters"].items():
        assert counters["questions"] == 2 and counters["bursts"] == 1
        state = json.loads((tmp_path / name / "stream.json").read_text())
        assert len(state["records"]) == 2 and state["version"] == counters["updates"]
        assert (service["served_adapters"][name] or "").startswith(name) or counters["updates"] == 0
    assert main(argv) == 0
    again = json.loads((tmp_path / "service.json").read_text())
    assert again["run"]["resumed"] == {"mmlu-stem": 2, "mmlu-humanities": 2}
    assert again["counters"] == service["counters"]


def test_rank_above_server_limit_names_lora_r(served, items, tmp_path):
    """The session server runs with --max-lora-rank 8: a rank-16 adapter is refused in one line naming lora_r,
    and the version stays on disk (nothing lost)."""
    from hf_calibration.errors import ParameterError
    from hf_calibration.modeling import load_model
    from hf_calibration.secl import SECLConfig, apply_secl
    from hf_calibration.secl.service import SECLService

    model, tokenizer = load_model(MODEL)
    secl = apply_secl(model, tokenizer, SECLConfig(**{**SETTINGS, "lora_r": 16}))
    service = SECLService(served, secl, tmp_path, max_new_tokens=MAX_NEW)
    service.start_burst("big")
    with pytest.raises(ParameterError) as err:
        for item in items:
            service.step("big", item.prompt_ids, choices=item.choices)
    assert err.value.parameter == "lora_r" and "--max-lora-rank" in str(err.value)
    assert len(list((tmp_path / "big").glob("v*"))) == 1 and service.streams["big"].pending
    assert service.streams["big"].served_name is None


def test_service_options_name_the_bad_one(tmp_path, capsys):
    """Bad options of the job and the service: one line naming the option, exit 2, before any server or model."""
    from hf_calibration.cli import main
    from hf_calibration.errors import ParameterError
    from hf_calibration.jobs.secl_service import SECLServiceConfig
    from hf_calibration.secl.service import SECLService

    for options, name in (({"base_url": "localhost:8000"}, "base_url"), ({"swap": "often"}, "swap"),
                          ({"limit_per_domain": 0}, "limit_per_domain"), ({"stream": "nope"}, "stream")):
        with pytest.raises(ParameterError) as err:
            SECLServiceConfig(**{"output_dir": str(tmp_path), "base_url": "http://127.0.0.1:1/v1", **options})
        assert err.value.parameter == name
    with pytest.raises(ParameterError) as err:
        SECLService(object(), object(), tmp_path)
    assert err.value.parameter == "trainer"
    rc = main(["secl-serve", "--output-dir", str(tmp_path / "out"), "--base-url", "http://127.0.0.1:8000/v1",
               "--limit-per-domain", "0"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "--limit-per-domain" in lines[0]
    assert not (tmp_path / "out").exists()


def test_relative_state_dir_reaches_the_server(served, items, tmp_path, monkeypatch):
    """A state folder given relative to this process (``secl-serve --output-dir outputs/x``) is loaded by a server
    whose working directory is another (the session server runs in its log's folder): before, vLLM answered 404
    "No adapter found" for the relative path and the stream stopped at its first update."""
    monkeypatch.chdir(tmp_path)
    service = _service(served, "relative")
    service.start_burst("r")
    record = service.step("r", items[0].prompt_ids, choices=items[0].choices)
    assert record.updated and service.streams["r"].served_name == "r-v1"
    assert "r-v1" in {m["id"] for m in served.request("GET", "/models")["data"]}  # the server holds it
    service.lora.unload("r-v1")  # the session server's LoRA slots are shared with the other tests
