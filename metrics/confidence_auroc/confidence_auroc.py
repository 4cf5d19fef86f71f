"""Confidence AUROC: an `evaluate` wrapper around `hf_calibration.metrics.confidence_auroc`.

The math lives in the hf-calibration library (`hf_calibration/metrics`, which must be installed);
this module only adapts `evaluate`'s predictions/references columns to it.
"""

import datasets
import evaluate

from hf_calibration.metrics import confidence_auroc
from hf_calibration.metrics.evaluate_features import CheckedInputs, calibration_features, module_inputs

_CITATION = """\
@inproceedings{hendrycks2017baseline,
  title={A Baseline for Detecting Misclassified and Out-of-Distribution Examples in Neural Networks},
  author={Hendrycks, Dan and Gimpel, Kevin},
  booktitle={International Conference on Learning Representations (ICLR)},
  year={2017}
}
"""

_DESCRIPTION = """\
AUROC of the confidence as a score separating correct from wrong predictions (0.5 = no information
about correctness).

    AUROC = P(conf of a random correct prediction > conf of a random wrong one), ties count 1/2
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (list of float, or list of list of float): confidences in [0, 1] of shape (n,),
        or probability vectors of shape (n, K) whose rows sum to 1. (n, 2) is K = 2 classes.
    references (list of int): 0/1 correctness for confidences, labels in [0, K) for probability vectors.
Returns:
    confidence_auroc (float): NaN, with a warning naming y_true, when all predictions are correct or all wrong.
Raises:
    ValueError / TypeError naming the argument and the first offending value (NaN, values outside
    [0, 1], rows not summing to 1, labels out of range, length mismatch, ...).
Examples:
    >>> import evaluate
    >>> # From a clone of hf-calibration; a pushed Space loads as evaluate.load("<user>/confidence_auroc").
    >>> metric = evaluate.load("metrics/confidence_auroc")

    Confidences with 0/1 correctness:

    >>> results = metric.compute(predictions=[0.9, 0.8, 0.3, 1.0], references=[1, 0, 1, 1])
    >>> print(round(results["confidence_auroc"], 4))
    0.6667

    Probability vectors with integer labels (top-label confidence and correctness):

    >>> results = metric.compute(predictions=[[0.8, 0.2], [0.3, 0.7], [0.6, 0.4]], references=[0, 1, 1])
    >>> print(round(results["confidence_auroc"], 4))
    1.0
"""

_FEATURES = calibration_features()


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class ConfidenceAUROC(CheckedInputs, evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=_FEATURES,
            reference_urls=["https://arxiv.org/abs/1610.02136"],
        )

    def _compute(self, predictions, references):
        y_true, y_prob = module_inputs(predictions, references)
        value = confidence_auroc(y_true, y_prob)
        return {"confidence_auroc": value}
