"""Synthetic predictions shared by the metric tests."""

import numpy as np


def make_multiclass(n: int, k: int, seed: int, concentration: float = 1.0):
    """Dirichlet probability rows (float64) and labels that cover every class."""
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.full(k, concentration), size=n)
    labels = rng.integers(0, k, size=n)
    labels[:k] = np.arange(k)
    return labels, probs


def make_binary(n: int, seed: int):
    """Confidences in (0, 1) and 0/1 outcomes drawn around them (miscalibrated on purpose)."""
    rng = np.random.default_rng(seed)
    conf = rng.beta(2.0, 1.2, size=n)
    outcome = (rng.uniform(size=n) < conf**1.5).astype(np.int64)
    return outcome, conf
