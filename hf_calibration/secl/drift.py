"""Shift detection on the output entropy: the adaptive entropy gate of SECL (docs/methods.md, 'SECL: entropy gate and Page-Hinkley').

``PageHinkley`` is the two-sided Page-Hinkley test (Page 1954) with the semantics of river's
``drift.PageHinkley`` (running mean, optional forgetting factor α, reset after an alarm), so the two
give the same alarms on the same input. ``EntropyShiftDetector`` standardises each question's output
entropy with exponentially weighted (EMA) estimates of its mean and variance and feeds the
standardised value to Page-Hinkley: raw entropies are small and model-dependent, standardised ones are
in units of their own spread, so one threshold serves every model.
"""

from __future__ import annotations

import math

from hf_calibration.errors import ParameterError

_MODES = ("up", "down", "both")


def _check_positive(name, value, *, allow_zero=False):
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        raise ParameterError(name, value, f"must be {'≥ 0' if allow_zero else '> 0'}, got {value!r}")


class PageHinkley:
    """Two-sided Page-Hinkley test for a change in the mean of a stream.

    With x̄_t the running mean of x_1..x_t since the last reset:
    ``U_t = α·U_{t−1} + (x_t − x̄_t − δ)`` and ``L_t = α·L_{t−1} + (x_t − x̄_t + δ)``;
    alarm when ``U_t − min_{i≤t} U_i > λ`` (increase) or ``max_{i≤t} L_i − L_t > λ`` (decrease), once
    at least ``min_instances`` values were seen. After an alarm the next ``update`` starts afresh.

    Parameters
    ----------
    delta : δ ≥ 0, the magnitude of change tolerated (same units as x). river/MOA default 0.005.
    threshold : λ > 0. river/MOA default 50.
    min_instances : values before an alarm can be raised (river/MOA default 30).
    alpha : forgetting factor in (0, 1]; 1 = no forgetting (river's default is 1 − 1e-4).
    mode : "up", "down" or "both".
    """

    def __init__(self, *, delta: float = 0.005, threshold: float = 50.0, min_instances: int = 30,
                 alpha: float = 1.0, mode: str = "both"):
        _check_positive("delta", delta, allow_zero=True)
        _check_positive("threshold", threshold)
        if isinstance(min_instances, bool) or not isinstance(min_instances, int) or min_instances < 1:
            raise ParameterError("min_instances", min_instances, f"must be a positive integer, got {min_instances!r}")
        if not (isinstance(alpha, (int, float)) and 0 < alpha <= 1):
            raise ParameterError("alpha", alpha, f"must be in (0, 1], got {alpha!r}")
        if mode not in _MODES:
            raise ParameterError("mode", mode, f"must be one of {_MODES}, got {mode!r}")
        self.delta, self.threshold, self.min_instances, self.alpha, self.mode = (
            float(delta), float(threshold), min_instances, float(alpha), mode)
        self.reset()

    def reset(self) -> None:
        """Forget everything seen (state as after construction)."""
        self.n = 0
        self.mean = 0.0
        self.sum_up = 0.0
        self.sum_down = 0.0
        self.min_up = math.inf
        self.max_down = -math.inf
        self.drift_detected = False

    @property
    def statistics(self) -> tuple[float, float]:
        """(increase statistic U_t − min U, decrease statistic max L − L_t); 0 before any value."""
        if self.n == 0:
            return 0.0, 0.0
        return self.sum_up - self.min_up, self.max_down - self.sum_down

    def update(self, x: float) -> bool:
        """Add one value; return True when it raises an alarm."""
        if self.drift_detected:
            self.reset()
        x = float(x)
        if not math.isfinite(x):
            raise ParameterError("x", x, f"must be finite, got {x!r}")
        self.n += 1
        self.mean += (x - self.mean) / self.n
        dev = x - self.mean
        self.sum_up = self.alpha * self.sum_up + dev - self.delta
        self.sum_down = self.alpha * self.sum_down + dev + self.delta
        self.min_up = min(self.min_up, self.sum_up)
        self.max_down = max(self.max_down, self.sum_down)
        if self.n >= self.min_instances:
            up, down = self.statistics
            hit_up = up > self.threshold and self.mode in ("up", "both")
            hit_down = down > self.threshold and self.mode in ("down", "both")
            self.drift_detected = hit_up or hit_down
        return self.drift_detected

    def state_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("n", "mean", "sum_up", "sum_down", "min_up", "max_down",
                                                "drift_detected")}

    def load_state_dict(self, state: dict) -> None:
        for k, v in state.items():
            setattr(self, k, v)


class EntropyShiftDetector:
    """EMA-standardised output entropy watched by a two-sided Page-Hinkley test.

    For each value h_t: ``z_t = (h_t − μ_{t−1}) / σ_{t−1}``, where μ and σ² are exponentially weighted
    estimates (rate ``ema_rate``, bias-corrected as in Adam) of the entropy's mean and variance over the
    values *before* h_t; then μ, σ² are updated with h_t. The first ``warmup`` values only initialise
    μ, σ² (no test); after that z_t goes to ``PageHinkley(delta, threshold, min_instances)``.

    Parameters (defaults are our measurement on synthetic Gaussian streams, 20 seeds: no false alarm
    in 800 stationary values per seed; every 2σ step detected, after 4–16 values; about half of the
    1σ steps detected; rate 0.05 missed a third of the 2σ steps because μ adapts before the test
    accumulates)
    ----------
    ema_rate : in (0, 1], weight of a new value in μ and σ² (0.02: a time constant of 50 questions).
    delta : PH δ in σ units (0.5: shifts below about 1σ are tolerated).
    threshold : PH λ in σ units (10).
    min_instances : PH values before an alarm (10).
    warmup : values used only to initialise μ, σ² (10).
    """

    def __init__(self, *, ema_rate: float = 0.02, delta: float = 0.5, threshold: float = 10.0,
                 min_instances: int = 10, warmup: int = 10):
        if not (isinstance(ema_rate, (int, float)) and 0 < ema_rate <= 1):
            raise ParameterError("ema_rate", ema_rate, f"must be in (0, 1], got {ema_rate!r}")
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 2:
            raise ParameterError("warmup", warmup, f"must be an integer ≥ 2, got {warmup!r}")
        self.ema_rate, self.warmup = float(ema_rate), warmup
        self.ph = PageHinkley(delta=delta, threshold=threshold, min_instances=min_instances, alpha=1.0)
        self.reset()

    def reset(self) -> None:
        """Forget the stream (EMA and Page-Hinkley state)."""
        self.t = 0
        self._m = 0.0  # uncorrected EMA of h
        self._v = 0.0  # uncorrected EMA of (h − μ)²
        self.last_z = 0.0
        self.ph.reset()

    @property
    def mean(self) -> float:
        return self._m / (1 - (1 - self.ema_rate) ** self.t) if self.t else 0.0

    @property
    def std(self) -> float:
        if self.t < 2:
            return 0.0
        return math.sqrt(max(self._v / (1 - (1 - self.ema_rate) ** (self.t - 1)), 0.0))

    def update(self, entropy: float) -> bool:
        """Add one question's entropy (nats, ≥ 0); return True when a shift is detected."""
        h = float(entropy)
        if not math.isfinite(h):
            raise ParameterError("entropy", entropy, f"must be finite, got {entropy!r}")
        alarm = False
        if self.t >= self.warmup:
            self.last_z = (h - self.mean) / max(self.std, 1e-6)
            alarm = self.ph.update(self.last_z)
        if self.t >= 1:
            self._v = (1 - self.ema_rate) * self._v + self.ema_rate * (h - self.mean) ** 2
        self._m = (1 - self.ema_rate) * self._m + self.ema_rate * h
        self.t += 1
        return alarm

    def state_dict(self) -> dict:
        return {"t": self.t, "m": self._m, "v": self._v, "last_z": self.last_z, "ph": self.ph.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.t, self._m, self._v, self.last_z = state["t"], state["m"], state["v"], state["last_z"]
        self.ph.load_state_dict(state["ph"])


def gate_state_to_json(gate: EntropyShiftDetector) -> dict:
    """``gate.state_dict()`` as JSON can hold it: the Page-Hinkley extremes' ±infinity (before any value) as None."""
    state = gate.state_dict()
    state["ph"] = {k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in state["ph"].items()}
    return state


def gate_state_from_json(state: dict) -> dict:
    """The inverse of ``gate_state_to_json``: a state ``EntropyShiftDetector.load_state_dict`` takes."""
    ph = dict(state["ph"])
    ph["min_up"] = math.inf if ph["min_up"] is None else ph["min_up"]
    ph["max_down"] = -math.inf if ph["max_down"] is None else ph["max_down"]
    return {**state, "ph": ph}
