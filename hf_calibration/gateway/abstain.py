"""Selective prediction with a risk guarantee: the confidence threshold above which the gateway answers, chosen by
Learn-then-Test (Angelopoulos, Bates, Candès, Jordan & Lei, "Learn then Test: Calibrating Predictive Algorithms to
Achieve Risk Control", 2021; docs/methods.md, "Gateway: abstention by Learn-then-Test").

Risk: the error rate among answered questions, R(λ) = P(wrong | c ≥ λ). Each threshold λ_j of a fixed grid
(``grid`` evenly spaced values in (0, 1], chosen before any data is seen) has the null hypothesis H_j: R(λ_j) > α,
tested with a p-value of the n_j calibration answers with c ≥ λ_j (given n_j, i.i.d. draws from the answered
distribution), of which k_j are wrong:

- ``binomial`` (exact for a 0/1 loss): p_j = P(Binomial(n_j, α) ≤ k_j) (1 when n_j = 0);
- ``hoeffding_bentkus``: p_j = min(exp(−n_j·h(min(k_j/n_j, α), α)), e·P(Binomial(n_j, α) ≤ k_j)),
  h(a, b) = a·log(a/b) + (1 − a)·log((1 − a)/(1 − b)) (LTT, Proposition 3's bound for bounded losses).

The family-wise error is controlled by ``bonferroni`` (reject H_j when p_j ≤ δ/|grid|; the default: every p-value
is valid given its own n_j alone, so the guarantee is exact) or ``fixed_sequence`` (from the highest λ down, reject
while p_j ≤ δ, stop at the first that is not; more power when the risk falls with λ). Fixed-sequence testing skips
the thresholds with fewer than n_min = ⌈log δ / log(1 − α)⌉ answers, which no p-value could reject even without an
error; that start depends on the unlabelled confidences, a deviation from LTT's order fixed in advance
(docs/methods.md). The lowest rejected threshold is returned (largest coverage). Then
P(R(λ̂) > α) ≤ δ over the draw of the calibration set (LTT, Theorem 1). When none is rejected the gateway
abstains on every answer (λ̂ = +inf).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.stats import binom

from hf_calibration.errors import ParameterError

P_VALUES = ("binomial", "hoeffding_bentkus")
PROCEDURES = ("bonferroni", "fixed_sequence")


@dataclass(frozen=True)
class AbstentionRule:
    """``abstain(c)`` is ``c < threshold``. alpha, delta: the guarantee P(R(threshold) > alpha) ≤ delta;
    n: calibration answers; coverage: share of them answered; p_value: the method."""

    threshold: float
    alpha: float
    delta: float
    n: int
    coverage: float
    p_value: str

    def abstain(self, confidence: float) -> bool:
        return not confidence >= self.threshold

    def describe(self) -> dict:
        return {"threshold": None if math.isinf(self.threshold) else self.threshold, "alpha": self.alpha,
                "delta": self.delta, "n": self.n, "coverage": self.coverage, "p_value": self.p_value}


def _p_values(n: np.ndarray, k: np.ndarray, alpha: float, method: str) -> np.ndarray:
    tail = binom.cdf(k, n, alpha)
    if method == "binomial":
        return tail
    r = np.minimum(k / n, alpha)
    with np.errstate(divide="ignore", invalid="ignore"):
        h = np.where(r > 0, r * np.log(r / alpha), 0.0) + (1 - r) * np.log((1 - r) / (1 - alpha))
    return np.minimum(np.exp(-n * h), math.e * tail)


def learn_then_test(confidence, correct, *, alpha: float, delta: float, p_value: str = "binomial",
                    procedure: str = "bonferroni", grid: int = 50) -> AbstentionRule:
    """The threshold of the module docstring from calibration confidences (n,) in [0, 1] and correctness (n,)
    bool. alpha in (0, 1): the risk bound; delta in (0, 1): the allowed probability of exceeding it; grid ≥ 1:
    thresholds k/grid, k = 1..grid.

    Raises ParameterError naming ``alpha``, ``delta``, ``p_value``, ``procedure``, ``grid`` or ``confidence``
    (empty, mismatched lengths, values outside [0, 1] or NaN)."""
    for name, value in (("alpha", alpha), ("delta", delta)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
            raise ParameterError(name, value, f"must be a number in (0, 1), got {value!r}")
    for name, value, known in (("p_value", p_value, P_VALUES), ("procedure", procedure, PROCEDURES)):
        if value not in known:
            raise ParameterError(name, value, f"must be one of {', '.join(known)}, got {value!r}")
    if isinstance(grid, bool) or not isinstance(grid, int) or grid < 1:
        raise ParameterError("grid", grid, f"must be a positive integer, got {grid!r}")
    c = np.asarray(confidence, dtype=np.float64).reshape(-1)
    y = np.asarray(correct, dtype=bool).reshape(-1)
    if c.size == 0 or c.size != y.size or not np.all((c >= 0) & (c <= 1)):
        raise ParameterError("confidence", f"{c.size} values", f"need as many confidences in [0, 1] as labels, got "
                             f"{c.size} confidences and {y.size} labels (all in [0, 1], no NaN)")
    thresholds = np.arange(grid, 0, -1) / grid  # high to low
    answered = c[None, :] >= thresholds[:, None]
    n_j = answered.sum(axis=1)
    k_j = (answered & ~y[None, :]).sum(axis=1)
    p = np.where(n_j > 0, _p_values(np.maximum(n_j, 1).astype(float), k_j.astype(float), float(alpha), p_value), 1.0)
    if procedure == "bonferroni":
        rejected = p <= delta / grid
    else:  # thresholds too high to hold n_min answers cannot be rejected even with no error: they are skipped
        n_min = math.ceil(math.log(delta) / math.log(1 - alpha))
        tested = n_j >= n_min
        rejected = np.zeros(grid, dtype=bool)
        rejected[tested] = np.cumprod(p[tested] <= delta).astype(bool)
    if not rejected.any():
        return AbstentionRule(math.inf, float(alpha), float(delta), int(c.size), 0.0, p_value)
    j = int(np.flatnonzero(rejected)[-1])
    return AbstentionRule(float(thresholds[j]), float(alpha), float(delta), int(c.size), float(n_j[j] / c.size),
                          p_value)


def read_labelled(path, signal: str, *, parameter: str = "abstain_calibration") -> tuple[np.ndarray, np.ndarray]:
    """(confidence (n,), correct (n,) bool) from a JSONL file of labelled answers: one object a line with
    ``correct`` (bool) and the signal's value in [0, 1] under the signal's name (``p_true``, …: diagnose's
    signals.jsonl). Only the option probability is also read from ``confidence`` (where evaluate's predictions.jsonl
    holds it): a file without the named signal's values is refused, so that a calibrator is never recorded as fitted
    on a signal it did not see. Raises ParameterError naming ``parameter`` (the option the file came from) with the
    file and line."""
    name = str(path)
    keys = (signal, "confidence") if signal == "option_probability" else (signal,)
    wanted = " or ".join(repr(k) for k in keys)
    conf, ok = [], []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise ParameterError(parameter, name, f"{name!r} cannot be read ({err})") from None
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            raise ParameterError(parameter, name, f"{name!r} line {lineno} is not JSON") from None
        value = next((rec[k] for k in keys if k in rec), None) if isinstance(rec, dict) else None
        if not isinstance(rec, dict) or not isinstance(rec.get("correct"), bool) or isinstance(value, bool) or \
                not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise ParameterError(parameter, name, f"{name!r} line {lineno} needs 'correct' (true/false) and "
                                 f"{wanted} in [0, 1] (the values of the signal {signal!r})")
        conf.append(float(value))
        ok.append(rec["correct"])
    if len(conf) < 2:
        raise ParameterError(parameter, name, f"{name!r} holds {len(conf)} labelled answers; need more")
    return np.array(conf), np.array(ok, dtype=bool)
