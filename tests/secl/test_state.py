"""``SECLState``: what a gateway saves and restores per stream goes on exactly as the live state would."""

import json

import numpy as np

from hf_calibration.secl import SECLConfig
from hf_calibration.secl.replay import ReplayItem
from hf_calibration.secl.state import SECLState


def test_state_round_trips_through_json_and_goes_on_alike():
    """A state with a warmed-up gate, an open burst and a kept question, saved as JSON and loaded into a fresh
    state, gives the same alarms on the same entropies (a step from 1 to 3 nats), the same counters and replay draws."""
    config = SECLConfig(replay_size=4, replay_batch_size=1, replay_scope="stream", burst_size=5)
    live = SECLState.new(config)
    rng = np.random.default_rng(0)
    for h in rng.normal(1.0, 0.1, 30):
        live.gate.update(float(h))
    live.start_burst()
    live.burst_left -= 2
    for i in range(3):
        live.replay.add(ReplayItem([1, 2], [3], "A", 0.25 * i, index=i))
    text = json.dumps(live.state_dict(optimizer=False))  # JSON: what stream.json / secl_state.json hold
    restored = SECLState.new(config)
    restored.load_state_dict(json.loads(text))
    assert restored.counters == live.counters == {**dict.fromkeys(live.counters, 0), "bursts": 1}
    assert restored.burst_left == live.burst_left == 3
    later = [float(h) for h in rng.normal(3.0, 0.1, 20)]
    alarms_live = [live.gate.update(h) for h in later]
    assert [restored.gate.update(h) for h in later] == alarms_live and any(alarms_live)
    assert [[i.index for i in live.replay.sample()] for _ in range(5)] == [
        [i.index for i in restored.replay.sample()] for _ in range(5)]


def test_start_burst_counts_once_and_clears_the_burst_buffer():
    state = SECLState.new(SECLConfig(replay_size=4, burst_size=3))  # replay_scope "burst" (the default)
    state.replay.add(ReplayItem([1], [2], "A", 0.5, index=0))
    state.start_burst()
    assert state.counters["bursts"] == 1 and state.burst_left == 3 and len(state.replay) == 0
    state.replay.add(ReplayItem([1], [2], "A", 0.5, index=1))
    state.start_burst()  # already open: extended, not counted again, buffer kept
    assert state.counters["bursts"] == 1 and len(state.replay) == 1
