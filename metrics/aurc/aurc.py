"""AURC: an `evaluate` wrapper around `hf_calibration.metrics.aurc`.

The math lives in the hf-calibration library (`hf_calibration/metrics`, which must be installed);
this module only adapts `evaluate`'s predictions/references columns to it.
"""

import datasets
import evaluate

from hf_calibration.metrics import aurc
from hf_calibration.metrics.evaluate_features import CheckedInputs, calibration_features, module_inputs

_CITATION = """\
@inproceedings{geifman2017selective,
  title={Selective Classification for Deep Neural Networks},
  author={Geifman, Yonatan and El-Yaniv, Ran},
  booktitle={Advances in Neural Information Processing Systems (NeurIPS)},
  year={2017}
}
"""

_DESCRIPTION = """\
Area under the risk-coverage curve (Geifman & El-Yaniv 2017): mean selective risk when predictions
are accepted in decreasing order of confidence.

    AURC = (1/n) sum_k (1/k) sum_{i <= k} 1[wrong_(i)]   (decreasing confidence; ties averaged over their orders)
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (list of float, or list of list of float): confidences in [0, 1] of shape (n,),
        or probability vectors of shape (n, K) whose rows sum to 1. (n, 2) is K = 2 classes.
    references (list of int): 0/1 correctness for confidences, labels in [0, K) for probability vectors.
Returns:
    aurc (float)
Raises:
    ValueError / TypeError naming the argument and the first offending value (NaN, values outside
    [0, 1], rows not summing to 1, labels out of range, length mismatch, ...).
Examples:
    >>> import evaluate
    >>> # From a clone of hf-calibration; a pushed Space loads as evaluate.load("<user>/aurc").
    >>> metric = evaluate.load("metrics/aurc")

    Confidences with 0/1 correctness:

    >>> results = metric.compute(predictions=[0.9, 0.8, 0.3, 1.0], references=[1, 0, 1, 1])
    >>> print(round(results["aurc"], 4))
    0.1458

    Probability vectors with integer labels (top-label confidence and correctness):

    >>> results = metric.compute(predictions=[[0.8, 0.2], [0.3, 0.7], [0.6, 0.4]], references=[0, 1, 1])
    >>> print(round(results["aurc"], 4))
    0.1111
"""

_FEATURES = calibration_features()


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class AURC(CheckedInputs, evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=_FEATURES,
            reference_urls=["https://arxiv.org/abs/1705.08500"],
        )

    def _compute(self, predictions, references):
        y_true, y_prob = module_inputs(predictions, references)
        value = aurc(y_true, y_prob)
        return {"aurc": value}
