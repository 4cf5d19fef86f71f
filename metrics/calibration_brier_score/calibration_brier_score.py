"""Calibration Brier Score: an `evaluate` wrapper around `hf_calibration.metrics.brier_score`.

The math lives in the hf-calibration library (`hf_calibration/metrics`, which must be installed);
this module only adapts `evaluate`'s predictions/references columns to it.
"""

import datasets
import evaluate

from hf_calibration.metrics import brier_score
from hf_calibration.metrics.evaluate_features import CheckedInputs, calibration_features, module_inputs

_CITATION = """\
@article{brier1950verification,
  title={Verification of Forecasts Expressed in Terms of Probability},
  author={Brier, Glenn W.},
  journal={Monthly Weather Review},
  volume={78},
  number={1},
  pages={1--3},
  year={1950}
}
"""

_DESCRIPTION = """\
Brier score for calibration: multiclass sum_k (p_k - 1[y = k])^2 for probability vectors, binary (c
- y)^2 for confidences against correctness.

    Brier = (1/n) sum_i sum_k (p_ik - 1[y_i = k])^2   (multiclass)  |  (1/n) sum_i (c_i - y_i)^2   (binary)
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (list of float, or list of list of float): confidences in [0, 1] of shape (n,),
        or probability vectors of shape (n, K) whose rows sum to 1. (n, 2) is K = 2 classes.
    references (list of int): 0/1 correctness for confidences, labels in [0, K) for probability vectors.
Returns:
    brier_score (float)
Raises:
    ValueError / TypeError naming the argument and the first offending value (NaN, values outside
    [0, 1], rows not summing to 1, labels out of range, length mismatch, ...).
Examples:
    >>> import evaluate
    >>> # From a clone of hf-calibration; a pushed Space loads as evaluate.load("<user>/calibration_brier_score").
    >>> metric = evaluate.load("metrics/calibration_brier_score")

    Confidences with 0/1 correctness:

    >>> results = metric.compute(predictions=[0.9, 0.8, 0.3, 1.0], references=[1, 0, 1, 1])
    >>> print(round(results["brier_score"], 4))
    0.285

    Probability vectors with integer labels (multiclass Brier score):

    >>> results = metric.compute(predictions=[[0.8, 0.2], [0.3, 0.7], [0.6, 0.4]], references=[0, 1, 1])
    >>> print(round(results["brier_score"], 4))
    0.3267
"""

_FEATURES = calibration_features()


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class CalibrationBrierScore(CheckedInputs, evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=_FEATURES,
            reference_urls=["https://en.wikipedia.org/wiki/Brier_score"],
        )

    def _compute(self, predictions, references):
        y_true, y_prob = module_inputs(predictions, references)
        value = brier_score(y_true, y_prob)
        return {"brier_score": value}
