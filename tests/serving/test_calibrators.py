"""Post-hoc calibrators applied to served scores give the in-process calibrated probabilities.

Each calibrator is fitted on synthetic inputs (its fitted state is all that matters here), then applied to the
in-process and the served scores of the same questions. Its output moves by at most its largest slope times the
input's tolerance (conftest.py): the slope is measured on the fitted function, not on the scores.
"""

from __future__ import annotations

import numpy as np
import pytest

from hf_calibration.modeling import score_mcqa
from hf_calibration.posthoc import IsotonicCalibrator, PlattScaler, TemperatureScaler, VectorScaler
from tests.serving.conftest import LOGPROB_ATOL, PROB_ATOL
from tests.served_helpers import ROWS


@pytest.fixture(scope="module")
def both(served, smollm):
    model, tok = smollm
    return score_mcqa(model, tok, ROWS, progress=False), score_mcqa(served, tok, ROWS)


def _synthetic(seed=0, n=200, k=4):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, k)) * 2
    labels = np.array([rng.choice(k, p=np.exp(z) / np.exp(z).sum()) for z in logits])
    conf = rng.uniform(0.25, 1.0, n)
    return logits, labels, conf, (rng.uniform(size=n) < conf ** 2).astype(int)


def _slope(fn, lo=0.25, hi=1.0, n=20001):
    grid = np.linspace(lo, hi, n)
    return float(np.max(np.abs(np.diff(fn(grid)))) / (grid[1] - grid[0]))


def test_temperature_scaling(both):
    logits, labels, _, _ = _synthetic()
    ts = TemperatureScaler().fit(logits, labels)
    ref, got = both
    # softmax(z / T) is invariant to a per-question shift of z (served option_logits are log-probabilities); the
    # log-probability tolerance scales by 1/T, a probability by at most 2× the log-probability error
    np.testing.assert_allclose(ts.transform(got.option_logits), ts.transform(ref.option_logits),
                               atol=2 * LOGPROB_ATOL / min(1.0, ts.temperature_))


def test_vector_scaling_on_log_probabilities(both):
    """softmax(w·z + b) is not shift-invariant: option_logits are the options' log-probabilities in process and
    served alike, so a vector scaler agrees on both."""
    logits, labels, _, _ = _synthetic(k=4)
    vs = VectorScaler().fit(logits, labels)
    ref, got = both
    np.testing.assert_allclose(ref.option_logits, got.option_logits, atol=LOGPROB_ATOL)
    np.testing.assert_allclose(vs.transform(got.option_logits), vs.transform(ref.option_logits),
                               atol=2 * LOGPROB_ATOL * float(np.max(np.abs(vs.coef_))))


@pytest.mark.parametrize("make", [PlattScaler, IsotonicCalibrator])
def test_confidence_calibrators(both, make):
    _, _, conf, correct = _synthetic()
    cal = make().fit(conf, correct)
    ref, got = both
    np.testing.assert_allclose(cal.transform(got.confidence), cal.transform(ref.confidence),
                               atol=PROB_ATOL * _slope(cal.transform) + 1e-12)
