"""Supervised baselines of the SECL table keep the ranking of confidences within 1e-9 of 1."""

import numpy as np
from sklearn.metrics import roc_auc_score

from hf_calibration.evaluation.stream import cross_fit


def test_temperature_and_platt_keep_the_order_near_one():
    # A wrong answer at 0.999999 below right ones at 1 - 1e-7 … 1.0, repeated so both folds hold each value;
    # interior items on both sides. A 1e-6 clip made the five top values one value (and one score).
    rng = np.random.default_rng(0)
    top = np.array([0.999999, 1 - 1e-7, 1 - 1e-8, 1 - 1e-9, 1.0] * 4)
    top_correct = np.array([0, 1, 1, 1, 1] * 4)
    mid = rng.uniform(0.2, 0.9, 40)
    mid_correct = (rng.uniform(size=40) < mid).astype(int)
    conf, correct = np.concatenate([top, mid]), np.concatenate([top_correct, mid_correct])
    fold = np.random.default_rng(0).permutation(len(conf)) % 2  # _cross_fit's folds (same seed, same rule)
    for method in ("temperature", "platt"):
        out = cross_fit(conf, correct, method, seed=0)
        for f in (0, 1):  # each fold is mapped by one monotone function fitted on the other fold
            sel = fold == f
            ranks_raw = np.unique(conf[sel], return_inverse=True)[1]
            ranks_out = np.unique(out[sel], return_inverse=True)[1]
            np.testing.assert_array_equal(ranks_out, ranks_raw, err_msg=method)  # strictly increasing map
            assert roc_auc_score(correct[sel], out[sel]) == roc_auc_score(correct[sel], conf[sel]), method
