"""Page-Hinkley against hand-computed sequences and river's implementation; the entropy gate."""

import numpy as np
import pytest
from river.drift import PageHinkley as RiverPageHinkley

from hf_calibration.secl.drift import EntropyShiftDetector, PageHinkley


def alarms(detector, xs):
    return [i for i, x in enumerate(xs) if detector.update(x)]


def test_hand_computed_increase():
    # t=4: mean 2.5, deviation 7.5 → U = 7.5 > λ = 5 while min U = 0.
    assert alarms(PageHinkley(delta=0, threshold=5, min_instances=1), [0, 0, 0, 10, 10]) == [3]
    # λ = 8: t=4 gives 7.5 (no alarm); t=5: mean 4, deviation 6 → U = 13.5 > 8.
    ph = PageHinkley(delta=0, threshold=8, min_instances=1)
    assert alarms(ph, [0, 0, 0, 10]) == [] and ph.statistics == pytest.approx((7.5, 0.0))
    assert ph.update(10)


def test_hand_computed_decrease_and_modes():
    xs = [10, 10, 10, 0]
    assert alarms(PageHinkley(delta=0, threshold=5, min_instances=1), xs) == [3]
    assert alarms(PageHinkley(delta=0, threshold=5, min_instances=1, mode="up"), xs) == []
    # δ enters every step, lowering U and raising L.
    ph = PageHinkley(delta=1, threshold=100, min_instances=1)
    alarms(ph, [0, 0, 0, 10])
    # U: −1, −2, −3, 7.5 − 1 − 3 = 3.5; min U = −3 → 6.5.  L: 1, 2, 3, 3 + 7.5 + 1 = 11.5; max 11.5 → 0.
    assert ph.statistics == pytest.approx((6.5, 0.0))


def test_min_instances_delays_alarm():
    assert alarms(PageHinkley(delta=0, threshold=5, min_instances=5), [0, 0, 0, 10, 10, 10]) == [4]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("params", [
    dict(delta=0.005, threshold=50, min_instances=30, alpha=1 - 1e-4),
    dict(delta=0.5, threshold=10, min_instances=10, alpha=1.0),
    dict(delta=0.1, threshold=5, min_instances=5, alpha=0.99, mode="up"),
])
def test_matches_river(seed, params):
    rng = np.random.default_rng(seed)
    xs = np.concatenate([rng.normal(0, 1, 300), rng.normal(2, 1, 200), rng.normal(-1, 1, 200), rng.normal(0, 1, 300)])
    ours, theirs = PageHinkley(**params), RiverPageHinkley(**params)
    mine, river = [], []
    for i, x in enumerate(xs):
        if ours.update(x):
            mine.append(i)
        theirs.update(x)
        if theirs.drift_detected:
            river.append(i)
    assert mine == river and len(mine) > 0


@pytest.mark.parametrize("seed", range(5))
def test_gate_quiet_on_stationary_and_alarms_on_step(seed):
    rng = np.random.default_rng(seed)
    gate = EntropyShiftDetector()
    assert alarms(gate, 0.8 + 0.2 * rng.standard_normal(500)) == []
    gate.reset()
    xs = 0.8 + 0.2 * rng.standard_normal(200)
    xs[100:] += 0.6  # 3σ step in the entropy
    hits = alarms(gate, xs)
    assert hits and 100 <= hits[0] <= 125


def test_gate_state_roundtrip_and_reset():
    gate = EntropyShiftDetector()
    for x in np.linspace(0.5, 1.0, 40):
        gate.update(x)
    other = EntropyShiftDetector()
    other.load_state_dict(gate.state_dict())
    assert other.mean == pytest.approx(gate.mean) and other.std == pytest.approx(gate.std)
    assert other.update(3.0) == gate.update(3.0) and other.last_z == pytest.approx(gate.last_z)
    gate.reset()
    assert gate.t == 0 and gate.ph.n == 0


@pytest.mark.parametrize("kwargs, name", [
    (dict(delta=-1), "delta"), (dict(threshold=0), "threshold"), (dict(min_instances=0), "min_instances"),
    (dict(alpha=1.5), "alpha"), (dict(mode="sideways"), "mode"),
])
def test_page_hinkley_bad_input(kwargs, name):
    with pytest.raises(ValueError, match=name):
        PageHinkley(**kwargs)


def test_gate_bad_input():
    with pytest.raises(ValueError, match="ema_rate"):
        EntropyShiftDetector(ema_rate=0)
    with pytest.raises(ValueError, match="entropy"):
        EntropyShiftDetector().update(float("nan"))
