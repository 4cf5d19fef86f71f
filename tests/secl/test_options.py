"""SECLConfig's update options on the tiny model: what the confidence turn restates, the replay buffer over a
burst, and the steps per update. Each test fails when its option is ignored."""

import pytest
import torch

import hf_calibration.secl.burst as burst_module
import hf_calibration.secl.step as step_module
import hf_calibration.secl.mixin as mixin_module
import hf_calibration.secl.replay as replay_module
from hf_calibration.errors import ParameterError
from hf_calibration.secl.config import SECLConfig
from hf_calibration.secl.mixin import apply_secl
from hf_calibration.secl.replay import ReplayBuffer, ReplayItem

PROMPT = "which option is correct ? A. the first city B. a hotel"
CHOICES = ["the first city", "a hotel"]


def encode(tokenizer, text=PROMPT):
    chat = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                         add_generation_prompt=True)
    return tokenizer([chat], return_tensors="pt", add_special_tokens=False)


def answer_a(model, tokenizer, **kwargs):
    """One question whose answer is forced to the single token "A" (the tiny model's own answer is random)."""
    a = tokenizer.convert_tokens_to_ids("A")
    return model.generate(**encode(tokenizer), max_new_tokens=1, do_sample=False, return_dict_in_generate=True,
                          prefix_allowed_tokens_fn=lambda batch, ids: [a], **kwargs)


@pytest.mark.parametrize("kwargs, name", [
    (dict(restate="letter"), "restate"), (dict(replay_size=-1), "replay_size"),
    (dict(replay_batch_size=-1), "replay_batch_size"), (dict(steps_per_update=0), "steps_per_update"),
    (dict(consolidation_epochs=-1), "consolidation_epochs"), (dict(consolidation_batch_size=0), "consolidation_batch_size"),
    # without a replay buffer (the default replay_size 0) there is nothing to consolidate
    (dict(consolidation_epochs=2), "consolidation_epochs"),
    (dict(learning_rate=0), "learning_rate"), (dict(delta=0), "delta"), (dict(replay_size=True), "replay_size"),
    (dict(replay_scope="all"), "replay_scope"),
    # a buffer kept across bursts needs a buffer
    (dict(replay_scope="stream"), "replay_scope"),
])
def test_bad_values_name_the_field(kwargs, name):
    with pytest.raises(ParameterError, match=name):
        SECLConfig(**kwargs)


@pytest.mark.parametrize("kwargs, warned", [
    # a buffer of one burst holds only that burst when it ends: the consolidation is the 'burst' scope's
    (dict(replay_scope="stream", replay_size=50, burst_size=50, replay_batch_size=0, consolidation_epochs=1),
     "replay_scope"),
    (dict(replay_scope="stream", replay_size=30, burst_size=50, replay_batch_size=0, consolidation_epochs=1),
     "replay_scope"),
    (dict(replay_scope="stream", replay_size=100, burst_size=50, replay_batch_size=0, consolidation_epochs=1), None),
    # update steps early in a burst still draw the earlier burst's questions
    (dict(replay_scope="stream", replay_size=50, burst_size=50, replay_batch_size=4), None),
    # a buffer that neither the steps nor a consolidation reads, in either scope
    (dict(replay_size=50, replay_batch_size=0), "replay_size"),
    (dict(replay_scope="stream", replay_size=100, burst_size=50, replay_batch_size=0), "replay_size"),
    (dict(replay_size=50, replay_batch_size=0, consolidation_epochs=3), None),
    (dict(), None),
    # consolidation options without a consolidation
    (dict(consolidation_batch_size=4), "consolidation_batch_size"),
    (dict(consolidation_lr_scheduler="linear"), "consolidation_lr_scheduler"),
    (dict(replay_size=50, replay_batch_size=0, consolidation_epochs=3, consolidation_batch_size=4,
          consolidation_lr_scheduler="linear"), None),
    # minibatches larger than the buffer: capped at what it keeps
    (dict(replay_size=3, replay_batch_size=4), "replay_batch_size"),
    (dict(replay_size=4, replay_batch_size=4), None),
    (dict(replay_size=4, replay_batch_size=0, consolidation_epochs=1, consolidation_batch_size=8),
     "consolidation_batch_size"),
])
def test_replay_settings_that_change_nothing_warn(kwargs, warned):
    import warnings

    from hf_calibration.errors import ParameterWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = SECLConfig(**kwargs)
    ours = [w.message for w in caught if isinstance(w.message, ParameterWarning)]
    assert [w.parameter for w in ours] == ([warned] if warned else [])
    if warned:
        assert f"{warned} {kwargs[warned]!r}" in str(ours[0])
    with warnings.catch_warnings(record=True) as caught:  # a copy for another adapter scope does not warn again
        warnings.simplefilter("always")
        copy = config.replaced(adapter_scope="all")
    assert not caught and copy.adapter_scope == "all" and copy.replay_size == config.replay_size


def test_every_option_has_help():
    import dataclasses

    for f in dataclasses.fields(SECLConfig):
        if f.name in ("restate", "replay_size", "replay_batch_size", "steps_per_update", "learning_rate", "delta",
                      "consolidation_epochs", "consolidation_batch_size"):
            assert len(f.metadata["help"]) > 40, f.name


@pytest.mark.parametrize("restate, expected", [("answer", '"A" is correct'),
                                               ("option_text", '"A. the first city" is correct')])
def test_confidence_turn_restates_what_the_option_says(tiny_model, tiny_tokenizer, monkeypatch, restate, expected):
    texts = []
    real = mixin_module.followup_ids
    monkeypatch.setattr(mixin_module, "followup_ids",
                        lambda tok, text, **kw: texts.append(text) or real(tok, text, **kw))
    secl = apply_secl(tiny_model, tiny_tokenizer, SECLConfig(restate=restate))
    answer_a(secl, tiny_tokenizer, secl_choices=[CHOICES], secl_update=False)
    confidence_turns = [t for t in texts if t.startswith("Rate your confidence")]
    assert len(confidence_turns) == 1 and expected in confidence_turns[0]


def test_option_text_changes_the_confidence_and_falls_back_without_choices(tiny_tokenizer):
    from tests.tiny import make_tiny_model

    conf = {}
    for restate in ("answer", "option_text"):
        secl = apply_secl(make_tiny_model(tiny_tokenizer), tiny_tokenizer, SECLConfig(restate=restate))
        conf[restate, "mcqa"] = float(answer_a(secl, tiny_tokenizer, secl_choices=[CHOICES],
                                               secl_update=False).confidences[0])
        conf[restate, "open"] = float(answer_a(secl, tiny_tokenizer, secl_update=False).confidences[0])
    assert conf["answer", "mcqa"] != conf["option_text", "mcqa"]  # another follow-up text is read
    assert conf["answer", "open"] == conf["option_text", "open"] == conf["answer", "mcqa"]  # no options: the answer


def _spy_steps(monkeypatch):
    calls = []
    real = replay_module.minibatch_step

    def spy(model, items, optimizer, **kw):
        calls.append([item.index for item in items])
        return real(model, items, optimizer, **kw)

    monkeypatch.setattr(replay_module, "minibatch_step", spy)
    monkeypatch.setattr(step_module, "bin_gate_passes", lambda *a, **k: True)
    return calls


def _burst(tiny_model, tiny_tokenizer, questions, **config):
    """A burst of ``questions``; consolidation off unless ``config`` sets it (the per-question steps alone)."""
    config = {"consolidation_epochs": 0, **config}
    secl = apply_secl(tiny_model, tiny_tokenizer, SECLConfig(burst_size=questions, learning_rate=1e-2, **config))
    secl.start_burst()
    records = []
    for _ in range(questions):
        answer_a(secl, tiny_tokenizer, secl_choices=[CHOICES])
        records.append(secl.secl_records[0].to_dict())
    return secl, records


def test_replay_steps_on_the_current_and_every_earlier_burst_question(tiny_model, tiny_tokenizer, monkeypatch):
    calls = _spy_steps(monkeypatch)
    secl, records = _burst(tiny_model, tiny_tokenizer, 4, replay_size=10, replay_batch_size=10, steps_per_update=2)
    # question k: 2 steps, each on k itself and the k earlier ones (all fit in the buffer and the batch)
    assert calls == [[0], [0], [1, 0], [1, 0], [2, 0, 1], [2, 0, 1], [3, 0, 1, 2], [3, 0, 1, 2]]
    assert [r["replayed"] for r in records] == [[[], []], [[0], [0]], [[0, 1], [0, 1]], [[0, 1, 2], [0, 1, 2]]]
    assert secl.secl_counters["updates"] == 4
    # passes: generation + verbalized read ("10" is one token here) + 2 P(True) reads + one per item per step
    assert [r["forward_passes"] for r in records] == [1 + 1 + 2 + 2 * (k + 1) for k in range(4)]


def test_replay_buffer_capacity_batch_and_new_burst(tiny_model, tiny_tokenizer, monkeypatch):
    calls = _spy_steps(monkeypatch)
    secl, records = _burst(tiny_model, tiny_tokenizer, 4, replay_size=2, replay_batch_size=1, steps_per_update=1)
    assert [len(c) for c in calls] == [1, 2, 2, 2]
    assert calls[1][1] == 0 and calls[2][1] in (0, 1) and calls[3][1] in (1, 2)  # only the last 2 are kept
    secl.start_burst()  # a new burst starts with an empty buffer
    answer_a(secl, tiny_tokenizer, secl_choices=[CHOICES])
    assert calls[-1] == [4] and secl.secl_records[0].replayed == [[]]


@pytest.mark.parametrize("scope, consolidated", [("stream", [0, 1, 2, 3]), ("burst", [2, 3])])
def test_replay_scope_stream_keeps_earlier_bursts_for_the_consolidation(tiny_model, tiny_tokenizer, monkeypatch,
                                                                        scope, consolidated):
    """replay_scope 'stream': a new burst keeps the earlier burst's questions, so its consolidation trains on both
    bursts (2 + 2 questions, 1 epoch of minibatches of 1: 4 steps); 'burst' empties the buffer (2 steps)."""
    calls = _spy_steps(monkeypatch)
    secl, _ = _burst(tiny_model, tiny_tokenizer, 2, replay_size=4, replay_batch_size=0, steps_per_update=1,
                     consolidation_epochs=1, replay_scope=scope)
    secl.start_burst()
    for _ in range(2):
        answer_a(secl, tiny_tokenizer, secl_choices=[CHOICES])
    # burst 1: steps on 0, 1, consolidation of 0, 1; burst 2: steps on 2, 3, then the consolidation
    assert calls[:2] == [[0], [1]] and sorted(sum(calls[2:4], [])) == [0, 1] and calls[4:6] == [[2], [3]]
    assert sorted(sum(calls[6:], [])) == consolidated
    assert secl.secl_records[0].consolidation["questions"] == len(consolidated)


def test_save_pretrained_keeps_the_replay_buffer(tiny_model, tiny_tokenizer, tmp_path, monkeypatch):
    """A 'stream'-scope buffer (or an open burst's) survives save_pretrained/from_pretrained: the next burst's
    consolidation rehearses the saved questions as it would have without the save; a format-1 secl_state.json
    (no buffer) still loads, with an empty one."""
    import json

    from hf_calibration.secl.mixin import STATE_NAME, SECLModel
    from tests.tiny import make_tiny_model

    secl, _ = _burst(tiny_model, tiny_tokenizer, 2, replay_size=4, replay_batch_size=0, steps_per_update=1,
                     consolidation_epochs=1, replay_scope="stream")
    secl.save_pretrained(tmp_path)
    loaded = SECLModel.from_pretrained(make_tiny_model(tiny_tokenizer), tiny_tokenizer, tmp_path)
    assert [i.index for i in loaded.secl_replay.items] == [0, 1]
    assert [(i.prompt, i.answer_ids, i.restated, i.c_star) for i in loaded.secl_replay.items] == [
        (i.prompt, i.answer_ids, i.restated, i.c_star) for i in secl.secl_replay.items]
    calls = _spy_steps(monkeypatch)
    loaded.start_burst()
    for _ in range(2):
        answer_a(loaded, tiny_tokenizer, secl_choices=[CHOICES])
    assert sorted(sum(calls[2:], [])) == [0, 1, 2, 3]  # the saved burst is consolidated with the new one
    state = json.loads((tmp_path / STATE_NAME).read_text())
    del state["replay"]
    state["format_version"] = 1
    (tmp_path / STATE_NAME).write_text(json.dumps(state))
    old = SECLModel.from_pretrained(make_tiny_model(tiny_tokenizer), tiny_tokenizer, tmp_path)
    assert len(old.secl_replay) == 0 and old.secl_counters == secl.secl_counters


@pytest.mark.parametrize("scope, kept", [("stream", 1), ("burst", 0)])
def test_service_replay_scope_across_bursts(tiny_model, tiny_tokenizer, tmp_path, scope, kept):
    """SECLService.start_burst empties a stream's buffer only in the 'burst' scope, as SECLModel.start_burst."""
    from hf_calibration.secl.service import SECLService

    secl = apply_secl(tiny_model, tiny_tokenizer, SECLConfig(replay_size=4, replay_scope=scope))
    service = SECLService(None, secl, tmp_path)  # no server: start_burst touches only the stream's state
    service.start_burst("s")
    service.streams["s"].replay.add(ReplayItem([1], [2], "A", 0.5, index=0))
    service.streams["s"].secl.burst_left = 0  # the burst ended
    service.start_burst("s")
    assert len(service.streams["s"].replay) == kept and service.streams["s"].counters["bursts"] == 2


def test_gated_out_questions_are_replayed(tiny_model, tiny_tokenizer, monkeypatch):
    calls = _spy_steps(monkeypatch)
    gate = iter([False, True])
    monkeypatch.setattr(step_module, "bin_gate_passes", lambda *a, **k: next(gate))
    _, records = _burst(tiny_model, tiny_tokenizer, 2, replay_size=5, replay_batch_size=4, steps_per_update=1)
    assert records[0]["skipped_by_bin_gate"] and calls == [[1, 0]]


@pytest.mark.parametrize("steps", [1, 3])
def test_steps_per_update_counts(tiny_model, tiny_tokenizer, monkeypatch, steps):
    calls = _spy_steps(monkeypatch)
    secl, records = _burst(tiny_model, tiny_tokenizer, 1, steps_per_update=steps)
    assert calls == [[0]] * steps and records[0]["forward_passes"] == 1 + 1 + 2 + steps
    assert secl.secl_counters["forward_passes"] == 1 + 1 + 2 + steps


def test_replay_off_is_one_step_on_the_current_question(tiny_model, tiny_tokenizer, monkeypatch):
    calls = _spy_steps(monkeypatch)
    _, records = _burst(tiny_model, tiny_tokenizer, 3, replay_size=0, steps_per_update=1)  # the paper's step
    assert calls == [[0], [1], [2]] and all(r["replayed"] == [[]] for r in records)


def test_consolidation_trains_every_burst_question_when_the_burst_ends(tiny_model, tiny_tokenizer, monkeypatch):
    calls = _spy_steps(monkeypatch)
    targets = []
    real = replay_module.minibatch_step
    monkeypatch.setattr(replay_module, "minibatch_step",
                        lambda model, items, opt, **kw: targets.append([i.target for i in items]) or real(model, items, opt, **kw))
    secl, records = _burst(tiny_model, tiny_tokenizer, 4, replay_size=10, replay_batch_size=0, steps_per_update=1,
                           consolidation_epochs=2, consolidation_batch_size=3)
    # replay_batch_size 0: one step on each question alone; then, after the 4th, 2 epochs of minibatches of 3 and 1
    assert calls[:4] == [[0], [1], [2], [3]] and [len(c) for c in calls[4:]] == [3, 1, 3, 1]
    assert sorted(calls[4] + calls[5]) == sorted(calls[6] + calls[7]) == [0, 1, 2, 3]
    assert all(t is not None for t in targets[0]) and all(t is None for batch in targets[4:] for t in batch)
    assert [("consolidation" in r) for r in records] == [False, False, False, True]
    assert records[3]["consolidation"] == {"questions": 4, "steps": 4, "forward_passes": 8}
    # generation + verbalized read + 2 P(True) reads + its own step, and the last one pays the 2 × 4 epoch passes
    assert [r["forward_passes"] for r in records] == [5, 5, 5, 5 + 8]
    assert secl.secl_counters["forward_passes"] == 4 * 5 + 8


def test_no_consolidation_before_the_burst_ends(tiny_model, tiny_tokenizer, monkeypatch):
    calls = _spy_steps(monkeypatch)
    secl = apply_secl(tiny_model, tiny_tokenizer,
                      SECLConfig(burst_size=3, replay_size=3, replay_batch_size=3, consolidation_epochs=1))
    secl.start_burst()
    for _ in range(2):
        answer_a(secl, tiny_tokenizer, secl_choices=[CHOICES])
        assert secl.secl_records[0].consolidation is None
    assert len(calls) == 2


def test_consolidate_counts_and_empty_buffer(tiny_model, tiny_tokenizer):
    secl = apply_secl(tiny_model, tiny_tokenizer, SECLConfig())
    ids = encode(tiny_tokenizer).input_ids[0].tolist()
    a = [tiny_tokenizer.convert_tokens_to_ids("A")]
    buffer = ReplayBuffer(10, 1)
    opt = torch.optim.SGD(secl.secl_adapter_params(), lr=0.0)
    assert replay_module.consolidate(secl, buffer, opt, epochs=3, batch_size=2, alpha_step=1.0, delta=0.2) == (0, 0)
    for k in range(5):
        buffer.add(ReplayItem(ids, a, "A", 0.2 * k, index=k, target=0.5))
    # 3 epochs × 5 items; ⌈5 / 2⌉ = 3 steps an epoch
    assert replay_module.consolidate(secl, buffer, opt, epochs=3, batch_size=2, alpha_step=1.0, delta=0.2) == (15, 9)
    assert [i.target for i in buffer.items] == [0.5] * 5  # the buffer's items are not modified


def test_consolidate_linear_lr_scheduler_decays_to_zero_and_restores(tiny_model, tiny_tokenizer, monkeypatch):
    """lr_scheduler "linear": step k of S at (1 - k/S) x the rate (hand values for S = 6), the rate restored
    afterwards; "constant" leaves every step at the rate; and the config field reaches the burst's consolidation."""
    secl = apply_secl(tiny_model, tiny_tokenizer, SECLConfig())
    ids = encode(tiny_tokenizer).input_ids[0].tolist()
    a = [tiny_tokenizer.convert_tokens_to_ids("A")]
    buffer = ReplayBuffer(10, 1)
    for k in range(3):
        buffer.add(ReplayItem(ids, a, "A", 0.3 * k, index=k))
    opt = torch.optim.AdamW(secl.secl_adapter_params(), lr=0.06)
    seen, step = [], replay_module.minibatch_step
    monkeypatch.setattr(replay_module, "minibatch_step",
                        lambda model, items, o, **k: (seen.append(o.param_groups[0]["lr"]), step(model, items, o, **k))[1])
    # 2 epochs x ⌈3 / 1⌉ = 6 steps
    assert replay_module.consolidate(secl, buffer, opt, epochs=2, batch_size=1, alpha_step=1.0, delta=0.2,
                                     lr_scheduler="linear") == (6, 6)
    assert seen == pytest.approx([0.06, 0.05, 0.04, 0.03, 0.02, 0.01])
    assert opt.param_groups[0]["lr"] == 0.06
    seen.clear()
    replay_module.consolidate(secl, buffer, opt, epochs=1, batch_size=2, alpha_step=1.0, delta=0.2)
    assert seen == [0.06, 0.06]
    with pytest.raises(ValueError, match="consolidation_lr_scheduler: must be 'constant' or 'linear', got 'cosine'"):
        SECLConfig(consolidation_lr_scheduler="cosine")
    calls, consolidate = [], burst_module.consolidate
    monkeypatch.setattr(burst_module, "consolidate", lambda *a, **k: (calls.append(k["lr_scheduler"]),
                                                                     consolidate(*a, **k))[1])
    cfg = SECLConfig(replay_size=4, replay_batch_size=0, consolidation_epochs=1, consolidation_lr_scheduler="linear")
    secl.secl_config = cfg
    secl.secl_consolidation(buffer, burst=0)
    assert calls == ["linear"]


def test_service_keeps_a_replay_buffer_per_stream(tiny_model, tiny_tokenizer, tmp_path):
    """The service takes the replay/consolidation/option-text config it used to refuse: each stream gets its own
    buffer of the configured size, emptied when a burst opens (as ``SECLModel.start_burst``), with no server
    asked anything (there is none) and nothing written."""
    from hf_calibration.secl.service import SECLService

    cfg = SECLConfig(replay_size=4, replay_batch_size=2, consolidation_epochs=2, restate="option_text")
    service = SECLService(None, apply_secl(tiny_model, tiny_tokenizer, cfg), tmp_path)
    a, b = service.open_stream("a"), service.open_stream("b")
    assert a.replay is not b.replay and (a.replay.capacity, a.replay.batch_size) == (4, 2)
    a.replay.add(ReplayItem([1], [2], "A. x", 0.5, index=0))
    service.start_burst("b")
    assert len(a.replay) == 1 and a.burst_left == 0
    service.start_burst("a")
    assert len(a.replay) == 0 and a.counters["bursts"] == 1 and a.burst_left == cfg.burst_size
    assert not any(tmp_path.iterdir())


def test_buffer_state_round_trips_through_json():
    """What the service writes into stream.json: the items (no cache) and the sampler's state, so a resumed
    stream draws the same earlier questions as one never stopped."""
    import json

    buffer = ReplayBuffer(capacity=6, batch_size=2, seed=3)
    for i in range(5):
        buffer.add(ReplayItem([7, i], [8], f"A. option {i}", i / 10, index=i))
    buffer.sample()
    copy = ReplayBuffer(capacity=6, batch_size=2, seed=3)
    copy.load_state_dict(json.loads(json.dumps(buffer.state_dict())))
    assert [(x.prompt, x.restated, x.c_star, x.index, x.context) for x in copy.items] == [
        ([7, i], f"A. option {i}", i / 10, i, None) for i in range(5)]
    draws = [[x.index for x in buffer.sample()] for _ in range(4)]
    assert [[x.index for x in copy.sample()] for _ in range(4)] == draws
    assert len({tuple(d) for d in draws}) > 1  # the draws move on, so equality is not trivial


def test_buffer_samples_without_replacement_and_restarts_its_draws():
    buffer = ReplayBuffer(capacity=5, batch_size=3, seed=0)
    for i in range(7):
        buffer.add(ReplayItem([], [], "", 0.5, index=i))
    assert [x.index for x in buffer.items] == [2, 3, 4, 5, 6]
    first = [x.index for x in buffer.sample()]
    assert len(set(first)) == 3 and set(first) <= {2, 3, 4, 5, 6}
    buffer.clear()
    assert len(buffer) == 0
    for i in range(2, 7):
        buffer.add(ReplayItem([], [], "", 0.5, index=i))
    assert [x.index for x in buffer.sample()] == first  # the same seeded draw after a restart
    assert ReplayBuffer(capacity=0, batch_size=3).sample() == []


def test_minibatch_step_is_the_gradient_of_the_mean(tiny_model, tiny_tokenizer):
    """One SGD step (lr 1) on two items moves the adapter by minus the mean of the two items' own gradients."""
    secl = apply_secl(tiny_model, tiny_tokenizer, SECLConfig())
    with torch.no_grad():  # a non-identity adapter, so the gradient of A is not 0
        for p in secl.secl_adapter_params():
            p.normal_(0, 0.1)
    ids = encode(tiny_tokenizer).input_ids[0].tolist()
    a = [tiny_tokenizer.convert_tokens_to_ids("A")]
    items = [ReplayItem(ids, a, "A", 0.9, target=0.9), ReplayItem(ids, a, "A. the first city", 0.1, target=0.1)]
    params = secl.secl_adapter_params()
    grads = []
    for item in items:
        secl.zero_grad()
        conf, _ = replay_module.item_confidence(secl, item, requires_grad=True)
        ((conf[0] - item.target) ** 2).backward()
        grads.append([p.grad.clone() for p in params])
    before = [p.detach().clone() for p in params]
    replay_module.minibatch_step(secl, items, torch.optim.SGD(params, lr=1.0), alpha_step=1.0, delta=1.0)
    for p, b, g0, g1 in zip(params, before, *grads):
        torch.testing.assert_close(p.detach(), b - (g0 + g1) / 2, rtol=1e-5, atol=1e-6)


def test_consolidation_without_a_buffer_names_every_option_one_way():
    """The refusal names consolidation_epochs, replay_size and burst_size in one spelling: the fields from Python,
    the options on the command line (it mixed '--consolidation-epochs' with 'replay_size')."""
    from hf_calibration.cli import command_parser

    with pytest.raises(ParameterError) as err:
        SECLConfig(consolidation_epochs=1, replay_size=0)
    assert str(err.value) == ("consolidation_epochs: consolidates the replay buffer, which replay_size 0 turns off: "
                              "set replay_size > 0 (e.g. burst_size) or consolidation_epochs 0")
    parser = command_parser("secl")
    assert err.value.message(parser.option_of) == (
        "--consolidation-epochs: consolidates the replay buffer, which --replay-size 0 turns off: set --replay-size "
        "> 0 (e.g. --burst-size) or --consolidation-epochs 0")
