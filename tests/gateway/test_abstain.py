"""Learn-then-Test abstention (gateway.abstain): p-values against a hand computation, and the guarantee
P(risk of the chosen threshold > alpha) ≤ delta checked over many calibration draws from real scored data.

The data (tests/gateway/data/, README there): SmolLM2-135M-Instruct's signals on 300 HaluEval QA questions,
scored by ``hf-calibration diagnose`` through vLLM. The pool is taken as the population: a calibration set is
drawn from it i.i.d. (with replacement), so the procedure's assumption holds exactly, and the risk of the chosen
threshold is the pool's own error rate among the answers at or above it, computed exactly (no test-set noise).
Each draw violates with probability p ≤ delta, independently, so the number of violations in T draws is at most
Binomial(T, delta) in distribution; the test fails when it exceeds that law's 1 − 1e-4 quantile (the slack: a
correct procedure fails this test with probability ≤ 1e-4)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import binom

from hf_calibration.errors import ParameterError
from hf_calibration.gateway.abstain import learn_then_test, read_labelled

DATA = Path(__file__).parent / "data" / "smollm2_halueval_qa" / "signals.jsonl"
DRAWS, CAL_SIZE = 1000, 150


def test_binomial_p_values_by_hand():
    # 40 answers all right at 0.9, 10 wrong at 0.3; alpha 0.1, delta 0.1, grid of 10 (thresholds 1.0 … 0.1).
    c = np.r_[np.full(40, 0.9), np.full(10, 0.3)]
    y = np.r_[np.ones(40, bool), np.zeros(10, bool)]
    rule = learn_then_test(c, y, alpha=0.1, delta=0.1, grid=10)
    # λ = 0.9 .. 0.4: n = 40, k = 0, p = 0.9**40 = 0.0148 ≤ 0.1/10 fails (0.0148 > 0.01): Bonferroni rejects none
    assert math.isinf(rule.threshold) and rule.coverage == 0.0
    rule = learn_then_test(c, y, alpha=0.1, delta=0.2, grid=10)  # 0.0148 ≤ 0.02: λ = 0.9 … 0.4 rejected
    assert rule.threshold == pytest.approx(0.4) and rule.coverage == pytest.approx(0.8)
    # fixed-sequence: n_min = ceil(log 0.1 / log 0.9) = 22; λ = 0.9 is the first tested, p = 0.0148 ≤ 0.1
    rule = learn_then_test(c, y, alpha=0.1, delta=0.1, grid=10, procedure="fixed_sequence")
    assert rule.threshold == pytest.approx(0.4)
    # at λ = 0.3: n = 50, k = 10, p = P(Bin(50, 0.1) ≤ 10) ≈ 0.99: not rejected, so 0.3 is never chosen
    assert binom.cdf(10, 50, 0.1) > 0.9


def test_hoeffding_bentkus_is_at_least_the_binomial_p_value_bound():
    c = np.r_[np.full(60, 0.8), np.full(40, 0.2)]
    y = np.r_[np.r_[np.ones(57, bool), np.zeros(3, bool)], np.zeros(40, bool)]
    hb = learn_then_test(c, y, alpha=0.15, delta=0.1, p_value="hoeffding_bentkus")
    exact = learn_then_test(c, y, alpha=0.15, delta=0.1)
    # Hoeffding's bound and e·tail both lie above the binomial tail, so HB rejects a subset: never more answers
    assert hb.threshold >= exact.threshold


@pytest.mark.parametrize("kwargs, name", [({"alpha": 0}, "alpha"), ({"delta": 1.5}, "delta"),
                                          ({"p_value": "wilson"}, "p_value"), ({"grid": 0}, "grid")])
def test_bad_arguments_name_the_parameter(kwargs, name):
    with pytest.raises(ParameterError) as err:
        learn_then_test([0.5, 0.6], [True, False], **{"alpha": 0.1, "delta": 0.1, **kwargs})
    assert err.value.parameter == name


def _auroc(c, y):
    from sklearn.metrics import roc_auc_score

    return roc_auc_score(y, c)


@pytest.mark.parametrize("signal, alpha, delta, procedure", [("norm_p_true", 0.2, 0.1, "bonferroni"),
                                                              ("p_true", 0.3, 0.2, "fixed_sequence")])
def test_the_guarantee_holds_over_calibration_draws_of_real_data(signal, alpha, delta, procedure):
    c, y = read_labelled(DATA, signal)
    assert len(c) >= 200 and _auroc(c, y) > 0.6  # the signal ranks: the threshold has something to choose
    rng = np.random.default_rng(0)
    violations, coverage = 0, []
    for _ in range(DRAWS):
        idx = rng.integers(0, len(c), CAL_SIZE)
        rule = learn_then_test(c[idx], y[idx], alpha=alpha, delta=delta, procedure=procedure)
        answered = c >= rule.threshold
        risk = float(np.mean(~y[answered])) if answered.any() else 0.0
        violations += risk > alpha
        coverage.append(answered.mean())
    bound = binom.ppf(1 - 1e-4, DRAWS, delta)
    assert violations <= bound, f"{violations} of {DRAWS} draws exceed alpha {alpha} (allowed {bound:.0f})"
    assert np.mean(coverage) > 0.05  # not the vacuous rule that abstains on everything


def test_read_labelled_names_the_file_and_line(tmp_path):
    bad = tmp_path / "labels.jsonl"
    bad.write_text(json.dumps({"correct": True, "p_true": 0.4}) + "\n" + json.dumps({"correct": 1}) + "\n")
    with pytest.raises(ParameterError, match="line 2") as err:
        read_labelled(bad, "p_true")
    assert err.value.parameter == "abstain_calibration"


def test_read_labelled_takes_confidence_for_the_option_probability_only(tmp_path):
    """evaluate's predictions.jsonl holds the option probability under ``confidence``: read for that signal, refused
    for another (a calibrator would be recorded as fitted on a signal it never saw), naming the given option."""
    path = tmp_path / "predictions.jsonl"
    path.write_text("".join(json.dumps({"correct": c, "confidence": v}) + "\n"
                            for c, v in ((True, 0.9), (False, 0.4), (True, 0.7))))
    conf, correct = read_labelled(path, "option_probability")
    assert conf.tolist() == [0.9, 0.4, 0.7] and correct.tolist() == [True, False, True]
    with pytest.raises(ParameterError, match="'p_true'") as err:
        read_labelled(path, "p_true", parameter="predictions")
    assert err.value.parameter == "predictions"
