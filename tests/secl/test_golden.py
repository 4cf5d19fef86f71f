"""SECL's records on the golden run (``tests/secl/golden.py``) equal the recorded ones (issue 48, item 6).

Exactly: the answers, the gate's alarms and bursts, the bin-gate and update decisions, the distractor counts and
the forward passes (integers and decisions). Within a derived tolerance (tests/conftest.py's policy): the float
reads, which another CPU kind (or a refactor that reorders a sum) computes with other rounding. For SmolLM2
(L = 30 layers, d = 576) logits |z| ≲ 30 carry about sqrt(L·d)·eps·|z| = sqrt(17280)·1.19e-7·30 ≈ 4.7e-4 of
rounding, and a confidence c = Σ p_k v_k (or P(True), c* over probabilities) moves by at most max|Δz| per read:
``READ_ATOL = 1e-3`` (as ``test_mixin.test_real_model_confidences_equal_two_uncached_passes``). c* = softmax over
P(True)/τ_n moves by at most 2·READ_ATOL/τ_n. After an update the adapters took AdamW steps on residuals that
differ by these read errors; AdamW's step is normalised by the gradient's scale, so at first order the adapters
and every later read differ by the read tolerance again (tests/serving/test_secl_service.py): ``2·READ_ATOL``,
and the final reads too. The decisions compared exactly are consequences of the reads only where no read lies
within its tolerance of a bin edge; the issue asks for them exactly, so a flip on another CPU kind fails here
naming the question (the recorded run's closest read lies 1.1e-3 from a bin edge: re-record on the reference
machine rather than widen anything).
"""

from __future__ import annotations

import json

import pytest

from tests.secl.golden import EXACT, FIXTURE, SETTINGS, run_golden

READ_ATOL = 1e-3


@pytest.fixture(scope="module")
def golden():
    return json.loads(FIXTURE.read_text(encoding="utf-8"))


def test_golden_run_is_not_trivial(golden):
    """The recorded run exercises the burst, the bin gate both ways, updates that move the confidence by far more
    than the tolerance, questions after the burst and its consolidation."""
    stream = golden["stream"]
    assert golden["counters"]["updates"] >= 2 and golden["counters"]["skipped_by_bin_gate"] >= 2
    assert any(not r["in_burst"] for r in stream)
    assert max(abs(r["confidence_after"] - r["confidence"]) for r in stream) > 50 * READ_ATOL
    assert golden["counters"]["forward_passes"] > sum(r["forward_passes"] for r in stream[:1])


def test_golden_run_reproduced(golden):
    from hf_calibration.secl import SECLConfig

    tau = SECLConfig(**SETTINGS).tau_n
    got = run_golden()
    assert got["counters"] == golden["counters"]
    for i, (g, w) in enumerate(zip(got["stream"], golden["stream"], strict=True)):
        for key in EXACT:
            assert g[key] == w[key], (i, key)
        for key, atol in (("verbalized", 2 * READ_ATOL), ("confidence", 2 * READ_ATOL),
                          ("confidence_after", 2 * READ_ATOL), ("p_true", READ_ATOL),
                          ("norm_p_true", 2 * READ_ATOL / tau), ("target", 2 * READ_ATOL), ("entropy", READ_ATOL)):
            if w[key] is None:
                assert g[key] is None, (i, key)
            else:
                assert g[key] == pytest.approx(w[key], abs=atol), (i, key)
    assert got["final"] == pytest.approx(golden["final"], abs=2 * READ_ATOL)
