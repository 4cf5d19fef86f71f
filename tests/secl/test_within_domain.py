"""The stream's within-domain paired differences (``secl.stream.within_domain_difference``) on hand-made records."""

import numpy as np
import pytest

from hf_calibration.secl.stream import within_domain_difference
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
