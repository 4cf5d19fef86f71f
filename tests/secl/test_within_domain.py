"""The stream's within-domain paired differences (``evaluation.stream.within_domain_difference``) on hand-made records."""

import numpy as np
import pytest

from hf_calibration.evaluation.stream import within_domain_difference
from tests.secl.stream_records import level_shift_stream as _level_shift_stream


def test_within_domain_auroc_leaves_out_a_domain_without_one():
    recs = _level_shift_stream()
    for r in recs[100:]:
        r["correct"] = r["secl_correct"] = True  # "hard" all right: no AUROC there
    d = within_domain_difference(recs, n_resamples=50)
    alone = within_domain_difference(recs[:100], n_resamples=50)
    assert np.isnan(d["per_domain"]["hard"])
    assert [d[k] for k in ("value", "low", "high")] == [alone[k] for k in ("value", "low", "high")]
    for r in recs[:100]:
        r["correct"] = r["secl_correct"] = False
    assert np.isnan(within_domain_difference(recs, n_resamples=50)["value"])
    with pytest.raises(ValueError, match="metric: must be one of"):
        within_domain_difference(recs, metric="nll")


@pytest.mark.filterwarnings("ignore:TemperatureScaler")
def test_each_signal_reports_the_ece_it_would_show_if_calibrated():
    """A read constant at c in a domain of n = 100: its calibrated null is |k/n − c|, k ~ Binomial(100, c), summed by
    hand; "easy" (80 % right at 0.8) is calibrated (ECE 0, p = 1), "hard" (20 % right at 0.5) is not (ECE 0.3, no
    draw reaches it: p = 1 / (1 + draws))."""
    from scipy.stats import binom

    from hf_calibration.evaluation.stream import format_stream_summary, summarize_stream

    summary = summarize_stream(_level_shift_stream(), n_resamples=2000, signals=("verbalized", "secl"))
    k = np.arange(101)
    for domain, c, p in (("easy", 0.8, 1.0), ("hard", 0.5, 1 / 2001)):
        row = summary[domain]["signals"]["secl"]
        exact = float(np.sum(binom.pmf(k, 100, c) * np.abs(k / 100 - c)))
        assert row["ece_if_calibrated"]["value"] == pytest.approx(exact, abs=0.003)
        assert row["ece_if_calibrated"]["low"] <= exact <= row["ece_if_calibrated"]["high"]
        assert row["p_calibrated"] == pytest.approx(p)
    assert "ECE if calibrated" in format_stream_summary(summary)
