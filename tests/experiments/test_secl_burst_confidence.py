"""experiments/secl_burst_confidence.py on hand-made records: c* replaces the read on the burst's questions only,
the AUROC against scikit-learn's, c* of a schedule folder recomputed by hand at the schedule's τ_n, and bad input
exits 2 with one line."""

import json

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from experiments import secl_burst_confidence as study


def _records(rng, n=60, domains=("a", "b")):
    out = []
    for d in domains:
        for i in range(n):
            burst = i < n // 3
            y = int(rng.random() < 0.6)
            out.append({"domain": d, "correct": y, "secl_correct": y, "verbalized": float(rng.random()),
                        "secl": float(rng.random()), "burst": burst, "norm_p_true": float(rng.random()),
                        "secl_norm_p_true": float(0.2 + 0.6 * y) if burst else None})
    return out


def test_c_star_replaces_the_read_in_the_burst_only():
    records = _records(np.random.default_rng(0))
    groups = study.stream_rows(records)
    a = [r for r in records if r["domain"] == "a"]
    mixed = [r["secl_norm_p_true"] if r["burst"] else r["secl"] for r in a]
    np.testing.assert_array_equal(groups["a"]["secl_teacher_in_burst"], mixed)
    summary = study.summarize(groups, n_resamples=50)
    y = [r["secl_correct"] for r in a]
    assert summary["groups"]["a"]["secl_teacher_in_burst"]["auroc"]["value"] == pytest.approx(roc_auc_score(y, mixed))
    assert summary["groups"]["a"]["secl_read"]["auroc"]["value"] == pytest.approx(
        roc_auc_score(y, [r["secl"] for r in a]))
    # c* here separates the burst's answers perfectly: the mixed read ranks better within each domain
    assert summary["within"]["auroc"]["value"] > 0
    assert summary["groups"]["a"]["in_burst"] == pytest.approx(1 / 3)


def test_a_run_made_with_teacher_reads_its_verbalized_field():
    records = _records(np.random.default_rng(1), domains=("a",))
    for r in records:
        r["secl_verbalized"], r["secl"] = r["secl"], (r["secl_norm_p_true"] if r["burst"] else r["secl"])
    groups = study.stream_rows(records)
    np.testing.assert_array_equal(groups["a"]["secl_read"], [r["secl_verbalized"] for r in records])


def test_schedule_folder_c_star_by_hand(tmp_path):
    rng = np.random.default_rng(2)
    base = [{"correct": int(rng.random() < 0.5), "verbalized": float(rng.random()),
             "p_true_options": [float(rng.random()), float(rng.random())]} for _ in range(20)]
    (tmp_path / "baseline_seed0.jsonl").write_text("".join(json.dumps(b) + "\n" for b in base))
    rows = {"secl": [float(rng.random()) for _ in base], "burst": [i < 8 for i in range(20)]}
    results = [{"seed": 0, "schedule": "s", "config": {"tau_n": 0.05}, "rows": rows,
                "answers_differing_from_baseline": 0},
               {"seed": 0, "schedule": "changed", "config": {"tau_n": 0.05}, "rows": rows,
                "answers_differing_from_baseline": 3}]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in results))
    groups = study.schedule_rows(tmp_path)
    assert list(groups) == ["seed 0, s"]  # the schedule whose answers moved is left out
    g = groups["seed 0, s"]
    for i, b in enumerate(base):
        p0, p1 = b["p_true_options"]
        hand = np.exp(p0 / 0.05) / (np.exp(p0 / 0.05) + np.exp(p1 / 0.05))
        assert g["teacher"][i] == pytest.approx(hand, rel=1e-9)
        assert g["secl_teacher_in_burst"][i] == pytest.approx(hand if i < 8 else rows["secl"][i], rel=1e-9)
    out = study.main([str(tmp_path), "--n-resamples", "20"])
    assert (tmp_path / "burst_confidence.md").exists() and "seed 0, s" in out["groups"]


@pytest.mark.parametrize("make, message", [
    (lambda p: p / "missing.jsonl", "does not exist"),
    (lambda p: p, "has no results.jsonl"),
])
def test_bad_source_exits_2(tmp_path, capsys, make, message):
    with pytest.raises(SystemExit) as e:
        study.main([str(make(tmp_path))])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and "Traceback" not in "".join(err)


def test_per_group_difference_is_each_groups_own():
    """With one group the over-the-groups difference is that group's, and each group's point value is the
    difference of its own two AUROCs (scikit-learn)."""
    groups = study.stream_rows(_records(np.random.default_rng(4)))
    summary = study.summarize(groups, n_resamples=30)
    for name, g in groups.items():
        hand = roc_auc_score(g["y"], g["secl_teacher_in_burst"]) - roc_auc_score(g["y"], g["secl_read"])
        assert summary["groups"][name]["delta_auroc"]["value"] == pytest.approx(hand)
    one = study.summarize({"a": groups["a"]}, n_resamples=30)
    assert one["within"]["auroc"]["value"] == pytest.approx(one["groups"]["a"]["delta_auroc"]["value"])


def test_brier_minus_constant_by_hand():
    groups = study.stream_rows(_records(np.random.default_rng(5), domains=("a",)))
    g, row = groups["a"], study.summarize(groups, n_resamples=30)["groups"]["a"]
    acc = g["y"].mean()
    for s in ("secl_read", "secl_teacher_in_burst"):
        hand = np.mean((g[s] - g["y"]) ** 2) - acc * (1 - acc)  # the constant's Brier is acc(1 - acc)
        assert row[f"{s}_brier_minus_constant"]["value"] == pytest.approx(hand)
