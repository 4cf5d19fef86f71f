"""experiments/secl_served.compare (issue 51 item 4's analysis) on a hand-made pair of streams: its per-domain
AUROC and Brier are sklearn's, and the paired served − in-process difference is exactly 0 where the two returned
confidences agree, whatever they do on a question answered differently."""

import numpy as np
import pytest
from sklearn.metrics import brier_score_loss, roc_auc_score

from experiments.secl_served import compare

RNG = np.random.default_rng(0)


def streams(n=12):
    served, records = [], []
    for d in ("qa", "mmlu"):
        correct = RNG.integers(0, 2, n)
        correct[:2] = (0, 1)  # both classes in every domain
        conf = RNG.uniform(0, 1, n)
        for i in range(n):
            served.append({"domain": d, "answer": f"{d}{i}", "correct": bool(correct[i]), "confidence": float(conf[i]),
                           "updated": i < 2, "in_burst": i < 3, "alarm": i == 0, "passes": 3, "final": float(conf[i]),
                           "final_passes": 2, "entropy_gap": 0.1})
            records.append({"domain": d, "answer": f"{d}{i}", "correct": bool(correct[i]), "secl": float(conf[i]),
                            "norm_p_true": float(1 - conf[i]), "secl_final": float(conf[i]), "updated": i < 2,
                            "burst": i < 3, "alarm": i == 0, "passes": {"secl": 3, "norm_p_true": 3, "verbalized": 2}})
    return served, records


def test_rows_are_sklearn_and_an_agreeing_stream_differs_by_zero():
    served, records = streams()
    rep = compare(served, records, n_resamples=50, seed=0)
    assert rep["n"] == 24 and rep["same_answer"] == 24
    for d in ("qa", "mmlu"):
        y = np.array([int(s["correct"]) for s in served if s["domain"] == d])
        c = np.array([s["confidence"] for s in served if s["domain"] == d])
        row = rep["domains"][d]["served_returned"]
        assert row["auroc"]["value"] == pytest.approx(roc_auc_score(y, c), abs=1e-12)
        assert row["brier_minus_constant"] == pytest.approx(brier_score_loss(y, c) - y.mean() * (1 - y.mean()), abs=1e-12)
        # the teacher's row reads the in-process records: 1 − c ranks exactly the other way
        assert rep["domains"][d]["norm_p_true"]["auroc"]["value"] == pytest.approx(1 - roc_auc_score(y, c), abs=1e-12)
        assert rep["gate"][d]["served_alarms"] == 1 and rep["gate"][d]["served_burst_questions"] == 3
        assert rep["domains"][d]["served_student_held_out"]["n"] == 10  # the 2 updated questions left out
    for metric in ("auroc", "brier"):
        assert (rep["differences"][metric]["value"], rep["differences"][metric]["low"],
                rep["differences"][metric]["high"]) == (0.0, 0.0, 0.0)
        held = rep["differences"]["student_held_out"][metric]
        assert (held["value"], held["low"], held["high"]) == (0.0, 0.0, 0.0)


def test_the_served_student_against_p_true_norm_is_the_n_weighted_sklearn_difference():
    # the teacher's read is 1 − c: per domain the AUROC difference is AUROC(c) − AUROC(1 − c) and the Brier
    # difference Brier(c) − Brier(1 − c), on the 10 held-out questions (the 2 updated ones left out)
    served, records = streams()
    rep = compare(served, records, n_resamples=50, seed=0)
    auroc, brier = [], []
    for d in ("qa", "mmlu"):
        held = [s for s in served if s["domain"] == d and not s["updated"]]
        y = np.array([int(s["correct"]) for s in held])
        c = np.array([s["final"] for s in held])
        auroc.append(roc_auc_score(y, c) - roc_auc_score(y, 1 - c))
        brier.append(brier_score_loss(y, c) - brier_score_loss(y, 1 - c))
    got = rep["differences"]["served_student_held_out_minus_a"]
    assert got["auroc"]["value"] == pytest.approx(np.mean(auroc), abs=1e-12)  # equal sizes: the plain mean
    assert got["brier"]["value"] == pytest.approx(np.mean(brier), abs=1e-12)
    assert got["auroc"]["low"] <= got["auroc"]["value"] <= got["auroc"]["high"]


def test_a_question_answered_differently_is_left_out_of_the_paired_difference():
    served, records = streams()
    served[5] = {**served[5], "answer": "something else", "confidence": 0.999}
    rep = compare(served, records, n_resamples=50, seed=0)
    assert rep["same_answer"] == 23
    assert rep["differences"]["brier"]["value"] == 0.0 and rep["differences"]["auroc"]["value"] == 0.0


def test_a_served_question_without_a_record_is_refused():
    served, records = streams()
    with pytest.raises(SystemExit, match="--analyse: 1 served questions have no in-process record"):
        compare(served, [r for i, r in enumerate(records) if i != 23], n_resamples=10, seed=0)
