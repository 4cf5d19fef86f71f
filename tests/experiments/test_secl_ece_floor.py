"""``experiments.secl_ece_floor``: ECE and AUROC by hand / scikit-learn, a constant read's calibrated null from the
binomial pmf, the target from the verbalized ECE, and SECL's rows scored on SECL's own answers."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.stats import binom
from sklearn.metrics import roc_auc_score

from experiments import secl_ece_floor as floor_module


def _records(n=100):
    rng = np.random.default_rng(0)
    y = rng.random(n) < 0.6
    return [{"domain": "qa", "correct": bool(y[i]), "secl_correct": bool(y[i]) if i % 10 else not y[i],
             "verbalized": 0.8, "secl": float(np.clip(0.6 + (0.2 if y[i] else -0.2) + 0.1 * rng.normal(), 0, 1)),
             "secl_final": 0.55, "norm_p_true": None} for i in range(n)]


def test_rows_by_hand():
    recs = _records()
    rows = {r["signal"]: r for r in floor_module.floor_rows(recs, n_resamples=4000)}
    assert set(rows) == {"verbalized", "secl", "secl_final"}  # norm_p_true missing: no row
    y = np.array([r["correct"] for r in recs], float)
    y_secl = np.array([r["secl_correct"] for r in recs], float)
    # A constant 0.8 in one bin: ECE |acc − 0.8|; its calibrated null E|k/n − 0.8|, k ~ Binomial(100, 0.8).
    verbalized = rows["verbalized"]
    assert verbalized["ece"] == pytest.approx(abs(y.mean() - 0.8))
    k = np.arange(101)
    assert verbalized["null_mean"] == pytest.approx(np.sum(binom.pmf(k, 100, 0.8) * np.abs(k / 100 - 0.8)), abs=0.003)
    assert verbalized["target_ece"] == pytest.approx(0.44 * abs(y.mean() - 0.8))
    # SECL's rows use SECL's own answers (secl_correct), the others the baseline's
    secl = [r["secl"] for r in recs]
    assert rows["secl"]["auroc"] == pytest.approx(roc_auc_score(y_secl, secl))
    assert rows["secl"]["accuracy"] == pytest.approx(y_secl.mean())
    assert rows["secl_final"]["ece"] == pytest.approx(abs(y_secl.mean() - 0.55))
    assert rows["secl"]["target_ece"] == verbalized["target_ece"]
    assert 0 <= rows["secl"]["target_quantile"] <= 1 and 0 < rows["secl"]["p_value"] <= 1


def test_command_prints_and_refuses_bad_input(tmp_path, capsys):
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _records()))
    rows = floor_module.main([str(path), "--n-resamples", "50"])
    assert len(rows) == 3 and "| qa | secl |" in capsys.readouterr().out
    recs = _records()
    bad = {"not_json.jsonl": "{oops\n", "empty.jsonl": "\n", "percent.jsonl": json.dumps({**recs[0], "secl": 55}),
           "partial.jsonl": "".join(json.dumps({k: v for k, v in r.items() if k != "secl_correct" or i}) + "\n"
                                    for i, r in enumerate(recs)),
           "no_domain.jsonl": json.dumps({k: v for k, v in recs[0].items() if k != "domain"})}
    for name, text in bad.items():
        (tmp_path / name).write_text(text)
    cases = [([str(path), "--domain", "nope"], "--domain"), ([str(path), "--target-cut", "1.5"], "--target-cut"),
             ([str(tmp_path / "missing.jsonl")], "records: no file"), ([str(path), "--seed", "-1"], "--seed"),
             ([str(tmp_path / "not_json.jsonl")], "line 1 is not JSON"),
             ([str(tmp_path / "empty.jsonl")], "holds no records"),
             ([str(tmp_path / "percent.jsonl")], "secl must be a confidence in [0, 1], got 55"),
             ([str(tmp_path / "partial.jsonl")], "secl_correct is on some questions"),
             ([str(tmp_path / "no_domain.jsonl")], "no field 'domain'")]
    for argv, message in cases:
        with pytest.raises(SystemExit) as err:
            floor_module.main(argv)
        printed = capsys.readouterr().err
        assert err.value.code == 2 and message in printed and printed.count("\n") == 1, printed
