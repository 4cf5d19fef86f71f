"""SECL's served records on the golden run (``tests/serving/golden_served.py``: ``tests/secl/golden.py``'s stream through
``SECLService`` and the real vLLM server) equal the ones recorded before the one-read-path redesign (issue 48, item 6).

Exactly: the answers, the gate's alarms and bursts, the bin-gate and update decisions, the distractor counts, the
forward passes and the served adapter each read was made with. Within a derived tolerance: the float reads, here
served against served (the same server, other request interleavings, so other batch shapes in vLLM's CPU kernels):
each log-probability moves by at most the conftest's ``LOGPROB_ATOL`` ε. As ``test_secl_service.py`` derives: the
verbalized confidence by ≤ 2ε (``CONF_ATOL``), P(True) by ≤ ε/2 (held to ε), c* by ≤ 2ε/τ_n; after an update the
adapters differ at first order by the read tolerance again (AdamW normalises its step), so every later confidence
and the final reads by ≤ 2·CONF_ATOL. The gate's input, the entropy over the top-k outcomes, moves by
ε·Σ p|1 + log p| ≤ ε·(1 + log(k + 1)) ≤ 5ε for k = 20. As in the in-process golden test, a decision compared
exactly flips only where a read lies within its tolerance of a bin edge; then re-record rather than widen.
"""

from __future__ import annotations

import json
import math
import uuid

import pytest

from tests.serving.conftest import LOGPROB_ATOL
from tests.serving.golden_served import EXACT, FIXTURE, adapter_version, run_golden_served

CONF_ATOL = 2 * LOGPROB_ATOL
ENTROPY_ATOL = LOGPROB_ATOL * (1 + math.log(21))


@pytest.fixture(scope="module")
def golden():
    return json.loads(FIXTURE.read_text(encoding="utf-8"))


def test_served_golden_run_is_not_trivial(golden):
    """The recorded served run updates, skips by the bin gate, moves the confidence far beyond the tolerance and
    reads with new adapter versions after the updates."""
    stream = golden["stream"]
    assert golden["counters"]["updates"] >= 2 and golden["counters"]["skipped_by_bin_gate"] >= 1
    assert max(abs(r["confidence_after"] - r["confidence"]) for r in stream) > 50 * CONF_ATOL
    assert stream[0]["adapter"] is None and stream[-1]["adapter"] is not None


def test_served_golden_run_reproduced(served, golden, tmp_path):
    from hf_calibration.secl import SECLConfig
    from tests.secl.golden import SETTINGS

    tau = SECLConfig(**SETTINGS).tau_n
    got = run_golden_served(served, tmp_path, name=f"golden{uuid.uuid4().hex[:8]}")  # a name new to the server
    assert {k: got["counters"][k] for k in golden["counters"]} == golden["counters"]
    for i, (g, w) in enumerate(zip(got["stream"], golden["stream"], strict=True)):
        for key in EXACT:
            assert g[key] == w[key], (i, key)
        assert adapter_version(g["adapter"]) == adapter_version(w["adapter"]), i
        for key, atol in (("verbalized", 2 * CONF_ATOL), ("confidence", 2 * CONF_ATOL),
                          ("confidence_after", 2 * CONF_ATOL), ("p_true", LOGPROB_ATOL),
                          ("norm_p_true", 2 * LOGPROB_ATOL / tau), ("target", 2 * CONF_ATOL),
                          ("entropy", ENTROPY_ATOL)):
            if w[key] is None:
                assert g[key] is None, (i, key)
            else:
                assert g[key] == pytest.approx(w[key], abs=atol), (i, key)
    assert got["final"] == pytest.approx(golden["final"], abs=2 * CONF_ATOL)
