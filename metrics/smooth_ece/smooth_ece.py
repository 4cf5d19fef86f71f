"""Smooth ECE: an `evaluate` wrapper around `hf_calibration.metrics.smooth_ece`.

The math lives in the hf-calibration library (`hf_calibration/metrics`, which must be installed);
this module only adapts `evaluate`'s predictions/references columns to it.
"""

import datasets
import evaluate

from hf_calibration.metrics import smooth_ece
from hf_calibration.metrics.evaluate_features import CheckedInputs, calibration_features, module_inputs

_CITATION = """\
@inproceedings{blasiok2024smooth,
  title={Smooth {ECE}: Principled Reliability Diagrams via Kernel Smoothing},
  author={B{\\l}asiok, Jaros{\\l}aw and Nakkiran, Preetum},
  booktitle={International Conference on Learning Representations (ICLR)},
  year={2024}
}
"""

_DESCRIPTION = """\
Smooth ECE (smECE) of Błasiok & Nakkiran (ICLR 2024): kernel-smoothed calibration error with the
self-consistent bandwidth, identical to relplot.smECE.

    smECE_sigma = integral |r_sigma(t)| delta_sigma(t) dt, with sigma* solving smECE_sigma* = sigma*
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (list of float, or list of list of float): confidences in [0, 1] of shape (n,),
        or probability vectors of shape (n, K) whose rows sum to 1. (n, 2) is K = 2 classes.
    references (list of int): 0/1 correctness for confidences, labels in [0, K) for probability vectors.
    sigma (float, default None): fixed kernel bandwidth in (0, 1]; default: the fixed point.
Returns:
    smooth_ece (float)
Raises:
    ValueError / TypeError naming the argument and the first offending value (NaN, values outside
    [0, 1], rows not summing to 1, labels out of range, length mismatch, ...).
Examples:
    >>> import evaluate
    >>> # From a clone of hf-calibration; a pushed Space loads as evaluate.load("<user>/smooth_ece").
    >>> metric = evaluate.load("metrics/smooth_ece")

    Confidences with 0/1 correctness:

    >>> results = metric.compute(predictions=[0.9, 0.8, 0.3, 1.0], references=[1, 0, 1, 1])
    >>> print(round(results["smooth_ece"], 4))
    0.2704

    Probability vectors with integer labels (top-label confidence and correctness):

    >>> results = metric.compute(predictions=[[0.8, 0.2], [0.3, 0.7], [0.6, 0.4]], references=[0, 1, 1])
    >>> print(round(results["smooth_ece"], 4))
    0.1397
"""

_FEATURES = calibration_features()


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class SmoothECE(CheckedInputs, evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=_FEATURES,
            reference_urls=["https://arxiv.org/abs/2309.12236", "https://github.com/apple/ml-calibration"],
        )

    def _compute(self, predictions, references, sigma=None):
        y_true, y_prob = module_inputs(predictions, references)
        value = smooth_ece(y_true, y_prob, sigma=sigma)
        return {"smooth_ece": value}
