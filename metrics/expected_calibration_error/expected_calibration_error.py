"""Expected Calibration Error: an `evaluate` wrapper around `hf_calibration.metrics.expected_calibration_error`.

The math lives in the hf-calibration library (`hf_calibration/metrics`, which must be installed);
this module only adapts `evaluate`'s predictions/references columns to it.
"""

import datasets
import evaluate

from hf_calibration.metrics import expected_calibration_error
from hf_calibration.metrics.evaluate_features import CheckedInputs, calibration_features, module_inputs

_CITATION = """\
@inproceedings{guo2017calibration,
  title={On Calibration of Modern Neural Networks},
  author={Guo, Chuan and Pleiss, Geoff and Sun, Yu and Weinberger, Kilian Q.},
  booktitle={International Conference on Machine Learning (ICML)},
  year={2017}
}

@inproceedings{naeini2015obtaining,
  title={Obtaining Well Calibrated Probabilities Using Bayesian Binning},
  author={Naeini, Mahdi Pakdaman and Cooper, Gregory and Hauskrecht, Milos},
  booktitle={AAAI Conference on Artificial Intelligence},
  year={2015}
}

@inproceedings{kumar2019verified,
  title={Verified Uncertainty Calibration},
  author={Kumar, Ananya and Liang, Percy and Ma, Tengyu},
  booktitle={Advances in Neural Information Processing Systems (NeurIPS)},
  year={2019}
}
"""

_DESCRIPTION = """\
Binned expected calibration error (ECE / RMSCE / MCE) of the top-label confidence, with equal-width
or equal-mass bins and the debiased estimator of Kumar et al. 2019.

    ECE = sum_b (n_b / n) * |acc_b - conf_b|   (norm='l1'; 'l2' gives RMSCE, 'max' gives MCE)
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (list of float, or list of list of float): confidences in [0, 1] of shape (n,),
        or probability vectors of shape (n, K) whose rows sum to 1. (n, 2) is K = 2 classes.
    references (list of int): 0/1 correctness for confidences, labels in [0, K) for probability vectors.
    n_bins (int, default 15): number of bins, 1 to max(n, 15) (at most one bin per prediction); 15 follows
        Guo et al. 2017.
    binning (str, default "uniform"): "uniform" (equal width; c = 1.0 in the last bin) or "quantile" (equal mass).
    norm (str, default "l1"): "l1" (ECE), "l2" (RMSCE) or "max" (MCE).
    debiased (bool, default False): debiased estimator of Kumar et al. 2019 (l1 or l2).
Returns:
    expected_calibration_error (float)
Raises:
    ValueError / TypeError naming the argument and the first offending value (NaN, values outside
    [0, 1], rows not summing to 1, labels out of range, length mismatch, ...).
Examples:
    >>> import evaluate
    >>> # From a clone of hf-calibration; a pushed Space loads as evaluate.load("<user>/expected_calibration_error").
    >>> metric = evaluate.load("metrics/expected_calibration_error")

    Confidences with 0/1 correctness:

    >>> results = metric.compute(predictions=[0.9, 0.8, 0.3, 1.0], references=[1, 0, 1, 1])
    >>> print(round(results["expected_calibration_error"], 4))
    0.4

    Probability vectors with integer labels (top-label confidence and correctness):

    >>> results = metric.compute(predictions=[[0.8, 0.2], [0.3, 0.7], [0.6, 0.4]], references=[0, 1, 1])
    >>> print(round(results["expected_calibration_error"], 4))
    0.3667
"""

_FEATURES = calibration_features()


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class ExpectedCalibrationError(CheckedInputs, evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=_FEATURES,
            reference_urls=["https://arxiv.org/abs/1706.04599", "https://arxiv.org/abs/1909.10155"],
        )

    def _compute(self, predictions, references, n_bins=15, binning="uniform", norm="l1", debiased=False):
        y_true, y_prob = module_inputs(predictions, references)
        value = expected_calibration_error(
            y_true, y_prob, n_bins=n_bins, binning=binning, norm=norm, debiased=debiased
        )
        return {"expected_calibration_error": value}
