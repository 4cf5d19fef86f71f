"""Negative Log-Likelihood: an `evaluate` wrapper around `hf_calibration.metrics.negative_log_likelihood`.

The math lives in the hf-calibration library (`hf_calibration/metrics`, which must be installed);
this module only adapts `evaluate`'s predictions/references columns to it.
"""

import datasets
import evaluate

from hf_calibration.metrics import negative_log_likelihood
from hf_calibration.metrics.evaluate_features import CheckedInputs, calibration_features, module_inputs

_CITATION = """\
@inproceedings{guo2017calibration,
  title={On Calibration of Modern Neural Networks},
  author={Guo, Chuan and Pleiss, Geoff and Sun, Yu and Weinberger, Kilian Q.},
  booktitle={International Conference on Machine Learning (ICML)},
  year={2017}
}
"""

_DESCRIPTION = """\
Mean negative log-likelihood (log loss, nats) of the true label; binary cross-entropy for
confidences against correctness.

    NLL = -(1/n) sum_i log p_{i, y_i}   (probabilities clipped to [eps, 1 - eps], eps = 2.2e-16)
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (list of float, or list of list of float): confidences in [0, 1] of shape (n,),
        or probability vectors of shape (n, K) whose rows sum to 1. (n, 2) is K = 2 classes.
    references (list of int): 0/1 correctness for confidences, labels in [0, K) for probability vectors.
Returns:
    negative_log_likelihood (float)
Raises:
    ValueError / TypeError naming the argument and the first offending value (NaN, values outside
    [0, 1], rows not summing to 1, labels out of range, length mismatch, ...).
Examples:
    >>> import evaluate
    >>> # From a clone of hf-calibration; a pushed Space loads as evaluate.load("<user>/negative_log_likelihood").
    >>> metric = evaluate.load("metrics/negative_log_likelihood")

    Confidences with 0/1 correctness:

    >>> results = metric.compute(predictions=[0.9, 0.8, 0.3, 1.0], references=[1, 0, 1, 1])
    >>> print(round(results["negative_log_likelihood"], 4))
    0.7297

    Probability vectors with integer labels (multiclass NLL):

    >>> results = metric.compute(predictions=[[0.8, 0.2], [0.3, 0.7], [0.6, 0.4]], references=[0, 1, 1])
    >>> print(round(results["negative_log_likelihood"], 4))
    0.4987
"""

_FEATURES = calibration_features()


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class NegativeLogLikelihood(CheckedInputs, evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=_FEATURES,
            reference_urls=["https://arxiv.org/abs/1706.04599"],
        )

    def _compute(self, predictions, references):
        y_true, y_prob = module_inputs(predictions, references)
        value = negative_log_likelihood(y_true, y_prob)
        return {"negative_log_likelihood": value}
