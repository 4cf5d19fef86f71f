"""Classwise ECE: an `evaluate` wrapper around `hf_calibration.metrics.classwise_ece`.

The math lives in the hf-calibration library (`hf_calibration/metrics`, which must be installed);
this module only adapts `evaluate`'s predictions/references columns to it.
"""

import datasets
import evaluate

from hf_calibration.metrics import classwise_ece
from hf_calibration.metrics.evaluate_features import CheckedInputs, calibration_features, module_inputs

_CITATION = """\
@inproceedings{nixon2019measuring,
  title={Measuring Calibration in Deep Learning},
  author={Nixon, Jeremy and Dusenberry, Michael W. and Zhang, Linchuan and Jerfel, Ghassen and Tran, Dustin},
  booktitle={CVPR Workshops},
  year={2019}
}

@inproceedings{kumar2019verified,
  title={Verified Uncertainty Calibration},
  author={Kumar, Ananya and Liang, Percy and Ma, Tengyu},
  booktitle={Advances in Neural Information Processing Systems (NeurIPS)},
  year={2019}
}
"""

_DESCRIPTION = """\
Classwise expected calibration error (cw-ECE): each class's probability binned against its
indicator, averaged over classes (Nixon et al. 2019).

    cw-ECE = (1/K) sum_k sum_b (n_bk / n) * |mean(1[y = k])_bk - mean(p_k)_bk|
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (list of list of float): probability vectors of shape (n, K), K >= 2, rows summing to 1.
    references (list of int): labels in [0, K).
    n_bins (int, default 15): equal-width bins per class, 1 to max(n, 15) (at most one bin per prediction).
Returns:
    classwise_ece (float)
Raises:
    ValueError / TypeError naming the argument and the first offending value (NaN, values outside
    [0, 1], rows not summing to 1, labels out of range, length mismatch, ...).
Examples:
    >>> import evaluate
    >>> # From a clone of hf-calibration; a pushed Space loads as evaluate.load("<user>/classwise_ece").
    >>> metric = evaluate.load("metrics/classwise_ece")

    Probability vectors with integer labels:

    >>> results = metric.compute(predictions=[[0.8, 0.2], [0.3, 0.7], [0.6, 0.4]], references=[0, 1, 1])
    >>> print(round(results["classwise_ece"], 4))
    0.3667
"""

_FEATURES = calibration_features(("probabilities",))


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class ClasswiseECE(CheckedInputs, evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=_FEATURES,
            reference_urls=["https://arxiv.org/abs/1904.01685"],
        )

    def _compute(self, predictions, references, n_bins=15):
        y_true, y_prob = module_inputs(predictions, references)
        value = classwise_ece(y_true, y_prob, n_bins=n_bins)
        return {"classwise_ece": value}
