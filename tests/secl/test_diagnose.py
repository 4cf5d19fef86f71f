"""The generation–discrimination verdict on synthetic signals, and the diagnose CLI."""


import numpy as np
import pytest

from hf_calibration.secl.diagnose import generation_discrimination_gap


def synthetic(seed=0, n=400):
    rng = np.random.default_rng(seed)
    correct = rng.random(n) < 0.4
    # an informative, calibrated discriminative signal: P(correct | c) = c
    informative = np.clip(rng.beta(2, 3, n), 0.01, 0.99)
    correct_inf = rng.random(n) < informative
    overconfident_flat = np.clip(0.85 + 0.03 * rng.standard_normal(n), 0, 1)
    return correct, correct_inf, informative, overconfident_flat, rng


def test_planted_gap_helps():
    _, correct, informative, flat, _ = synthetic()
    gap = generation_discrimination_gap(correct, flat, informative, n_resamples=200, seed=0)
    assert gap["verdict"] == "helps" and gap["secl_expected_to_help"]
    assert gap["delta_auroc"]["low"] > 0 and gap["delta_ece"]["high"] < 0
    assert "expected to help" in gap["explanation"]


def test_level_only_when_norm_is_uninformative():
    correct, _, _, flat, rng = synthetic(1)
    level = np.clip(correct.mean() + 0.02 * rng.standard_normal(len(correct)), 0, 1)  # right level, no ranking
    gap = generation_discrimination_gap(correct, flat, level, n_resamples=200, seed=0)
    assert gap["verdict"] == "level only" and not gap["secl_expected_to_help"]


def test_no_gap_does_not_help():
    _, correct, informative, _, rng = synthetic(2)
    twin = np.clip(informative + 0.01 * rng.standard_normal(len(informative)), 0, 1)
    gap = generation_discrimination_gap(correct, informative, twin, n_resamples=200, seed=0)
    assert gap["verdict"] == "does not help" and not gap["secl_expected_to_help"]


def test_gap_bad_input():
    with pytest.raises(ValueError, match="n_resamples"):
        generation_discrimination_gap([0, 1], [0.5, 0.5], [0.5, 0.5], n_resamples=0)
    with pytest.raises(ValueError, match="shapes"):
        generation_discrimination_gap([0, 1], [0.5], [0.5, 0.5])


def test_ranking_only_when_norm_ranks_but_is_miscalibrated():
    _, correct, informative, _, _ = synthetic(3)
    constant = np.full(len(correct), correct.mean())  # perfectly calibrated level, no ranking
    shifted = np.clip(informative + 0.2, 0, 1)  # ranks well, too confident
    gap = generation_discrimination_gap(correct, constant, shifted, n_resamples=200, seed=0)
    assert gap["verdict"] == "ranking only" and gap["secl_expected_to_help"] is None
