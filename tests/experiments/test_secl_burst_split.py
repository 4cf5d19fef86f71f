"""``experiments.secl_burst_split``: the parts are the records' burst flags, each AUROC is scikit-learn's on that
part, and the paired difference is the difference of the two AUROCs."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from experiments import secl_burst_split as split_module


def _records(n=40, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.random(n) < 0.5
    return [{"domain": "d" if i % 4 else "e", "correct": bool(y[i]), "burst": i < n // 2,
             **{k: float(np.clip(0.5 + (0.3 if y[i] else -0.3) * rng.random() + 0.3 * rng.normal(), 0, 1))
                for k in split_module.SIGNALS}} for i in range(n)]


def test_parts_and_aurocs_by_hand():
    recs = _records()
    split = split_module.burst_split(recs, n_resamples=50)
    y = np.array([r["correct"] for r in recs])
    for part, idx in (("in burst", range(20)), ("after burst", range(20, 40)), ("all", range(40))):
        idx = list(idx)
        assert split[part]["n"] == len(idx) and split[part]["accuracy"] == pytest.approx(y[idx].mean())
        auc = {k: roc_auc_score(y[idx], [recs[i][k] for i in idx]) for k in split_module.SIGNALS}
        for k in split_module.SIGNALS:
            assert split[part][k]["auroc"]["value"] == pytest.approx(auc[k])
        assert split[part]["secl_minus_verbalized_auroc"]["value"] == pytest.approx(auc["secl"] - auc["verbalized"])


def test_command_filters_the_domain_and_refuses_an_unknown_one(tmp_path, capsys):
    path = tmp_path / "records.jsonl"
    recs = _records()
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    split = split_module.main([str(path), "--domain", "d", "--n-resamples", "20"])
    assert split["all"]["n"] == sum(r["domain"] == "d" for r in recs)
    assert "| after burst |" in capsys.readouterr().out
    with pytest.raises(SystemExit) as err:
        split_module.main([str(path), "--domain", "nope"])
    assert err.value.code == 2 and "--domain" in capsys.readouterr().err
