"""Proper scores (Brier, NLL) and selective-prediction scores (AUROC, AUPRC, AURC) of the confidence."""

from __future__ import annotations

import warnings

import numpy as np

from hf_calibration.errors import ParameterWarning
from hf_calibration.metrics.registry import register
from hf_calibration.metrics.validation import Inputs, prepare
from hf_calibration.metrics.binning import prepared_top_label

_NLL_EPS = float(np.finfo(np.float64).eps)  # probabilities are clipped to [eps, 1 - eps], as scikit-learn


def _mean(values: np.ndarray, weights) -> np.ndarray:
    """Mean of per-item values: (1,) or, for (R, n) resample counts, (R,)."""
    if weights is None:
        return np.atleast_1d(values.mean())
    return weights @ values / weights.sum(axis=1)


def _brier_impl(inputs: Inputs, weights) -> np.ndarray:
    y, p = inputs.y_true, inputs.y_prob.astype(np.float64)
    if p.ndim == 1:
        per_item = (p - y) ** 2
    else:
        # sum_k (p_k - 1[y = k])^2 = sum_k p_k^2 - 2 p_y + 1
        p_true = np.take_along_axis(p, y[:, None].astype(np.intp), axis=1)[:, 0]
        per_item = np.einsum("ij,ij->i", p, p) - 2.0 * p_true + 1.0
    return _mean(per_item, weights)


def brier_score(y_true, y_prob) -> float:
    r"""Brier score (Brier 1950): mean squared error of the probability vector.

    Multiclass, for (n, K) probabilities: :math:`\frac{1}{n}\sum_i\sum_k (p_{ik} - 1[y_i = k])^2`,
    in [0, 2]. Binary, for (n,) confidences with 0/1 outcomes: :math:`\frac{1}{n}\sum_i (c_i - y_i)^2`,
    in [0, 1]. An (n, 2) array is multiclass with K = 2, whose score is twice the binary score of
    its second column (scikit-learn's ``brier_score_loss`` with ``scale_by_half=False``).

    Parameters
    ----------
    y_true, y_prob
        As :func:`hf_calibration.metrics.expected_calibration_error`.

    Returns
    -------
    float

    Raises
    ------
    ValueError, TypeError
        As :func:`hf_calibration.metrics.expected_calibration_error`.

    Examples
    --------
    >>> round(brier_score([1, 0], [0.8, 0.4]), 6)
    0.1
    >>> round(brier_score([0, 1], [[0.8, 0.2], [0.4, 0.6]]), 6)
    0.2
    """
    return float(_brier_impl(prepare(y_true, y_prob), None)[0])


def _nll_impl(inputs: Inputs, weights) -> np.ndarray:
    y, p = inputs.y_true, inputs.y_prob
    if p.ndim == 1:
        prob_of_outcome = np.where(y == 1, p, 1.0 - p)
    else:
        prob_of_outcome = np.take_along_axis(p, y[:, None].astype(np.intp), axis=1)[:, 0].astype(np.float64)
    return _mean(-np.log(np.clip(prob_of_outcome, _NLL_EPS, 1.0 - _NLL_EPS)), weights)


def negative_log_likelihood(y_true, y_prob) -> float:
    r"""Mean negative log-likelihood (cross-entropy, log loss) of the true label, in nats.

    Multiclass: :math:`-\frac{1}{n}\sum_i \log p_{i,y_i}`; binary (for (n,) confidences):
    :math:`-\frac{1}{n}\sum_i [y_i\log c_i + (1-y_i)\log(1-c_i)]`. Probabilities are clipped to
    [eps, 1 - eps] with eps = 2.2e-16 (float64), as scikit-learn's ``log_loss``, so the value is
    finite (at most 36.04).

    Parameters
    ----------
    y_true, y_prob
        As :func:`hf_calibration.metrics.expected_calibration_error`.

    Returns
    -------
    float
        ≥ 0.

    Raises
    ------
    ValueError, TypeError
        As :func:`hf_calibration.metrics.expected_calibration_error`.

    Examples
    --------
    >>> round(negative_log_likelihood([0, 1], [[0.5, 0.5], [0.5, 0.5]]), 6)  # log 2
    0.693147
    """
    return float(_nll_impl(prepare(y_true, y_prob), None)[0])


def _ranked_groups(inputs: Inputs, weights, *, descending: bool):
    """Weighted (correct, wrong) counts per group of tied confidences, in confidence order.

    Returns two (R, G) arrays (R = 1 without weights).
    """
    conf, correct = prepared_top_label(inputs)
    order = np.argsort(-conf if descending else conf, kind="stable")
    c = conf[order]
    starts = np.flatnonzero(np.r_[True, c[1:] != c[:-1]])
    w = np.ones((1, len(c))) if weights is None else weights[:, order]
    pos = correct[order]
    return np.add.reduceat(w * pos, starts, axis=1), np.add.reduceat(w * ~pos, starts, axis=1)


def _auroc_impl(inputs: Inputs, weights) -> np.ndarray:
    pos, neg = _ranked_groups(inputs, weights, descending=False)
    neg_below = np.cumsum(neg, axis=1) - neg
    u = np.sum(pos * (neg_below + 0.5 * neg), axis=1)  # Mann-Whitney U, ties count one half
    n_pos, n_neg = pos.sum(axis=1), neg.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n_pos * n_neg > 0, u / (n_pos * n_neg), np.nan)


def confidence_auroc(y_true, y_prob) -> float:
    """AUROC of the confidence as a score separating correct from wrong predictions.

    The probability that a random correct prediction has higher confidence than a random wrong one
    (ties count 1/2): the Mann-Whitney statistic, equal to scikit-learn's
    ``roc_auc_score(correct, confidence)``. 0.5 means the confidence carries no information about
    correctness, however well calibrated its level is (docs/methods.md, 'AUROC and AURC').

    Parameters
    ----------
    y_true, y_prob
        As :func:`hf_calibration.metrics.expected_calibration_error` (top-label confidence and
        correctness).

    Returns
    -------
    float
        In [0, 1]; NaN when all predictions are correct or all are wrong (AUROC undefined), with a
        ``ParameterWarning`` naming ``y_true`` that says so (as scikit-learn's ``roc_auc_score`` warns).

    Raises
    ------
    ValueError, TypeError
        As :func:`hf_calibration.metrics.expected_calibration_error`.

    Examples
    --------
    >>> confidence_auroc([1, 0, 1, 0], [0.9, 0.8, 0.7, 0.1])
    0.75
    """
    inputs = prepare(y_true, y_prob)
    value = float(_auroc_impl(inputs, None)[0])
    if np.isnan(value):
        correct = prepared_top_label(inputs)[1]
        state = "correct" if correct[0] else "wrong"
        warnings.warn(ParameterWarning("y_true", None, f"confidence_auroc: all {inputs.n} predictions are {state} "
                                       f"(one class in {{y_true}}), so AUROC is undefined; returned nan"),
                      stacklevel=2)
    return value


def _auprc_impl(inputs: Inputs, weights) -> np.ndarray:
    pos, neg = _ranked_groups(inputs, weights, descending=True)
    tp, fp = np.cumsum(pos, axis=1), np.cumsum(neg, axis=1)
    n_pos = tp[:, -1:]
    with np.errstate(invalid="ignore", divide="ignore"):
        precision = np.where(tp + fp > 0, tp / (tp + fp), 0.0)
        ap = np.sum(pos / n_pos * precision, axis=1)
    return np.where(n_pos[:, 0] > 0, ap, np.nan)


def confidence_auprc(y_true, y_prob) -> float:
    r"""Average precision of the confidence for retrieving the correct predictions.

    :math:`\mathrm{AP} = \sum_t (R_t - R_{t-1}) P_t` over the distinct confidence thresholds t
    (step-wise, no interpolation), equal to scikit-learn's
    ``average_precision_score(correct, confidence)``. Its chance level is the accuracy.

    Parameters
    ----------
    y_true, y_prob
        As :func:`hf_calibration.metrics.expected_calibration_error`.

    Returns
    -------
    float
        In [0, 1]; NaN when no prediction is correct.

    Raises
    ------
    ValueError, TypeError
        As :func:`hf_calibration.metrics.expected_calibration_error`.

    Examples
    --------
    >>> round(confidence_auprc([1, 0, 1, 0], [0.9, 0.8, 0.7, 0.1]), 6)
    0.833333
    """
    return float(_auprc_impl(prepare(y_true, y_prob), None)[0])


def _aurc_impl(inputs: Inputs, weights) -> np.ndarray:
    correct, wrong = _ranked_groups(inputs, weights, descending=True)
    size = correct + wrong
    total = int(round(size[0].sum()))
    harmonic = np.concatenate([[0.0], np.cumsum(1.0 / np.arange(1, total + 1))])
    before = np.rint(np.cumsum(size, axis=1) - size).astype(np.intp)  # predictions ranked above the group
    errors_before = np.cumsum(wrong, axis=1) - wrong
    span = harmonic[before + np.rint(size).astype(np.intp)] - harmonic[before]  # sum_{j=1..s} 1/(a+j)
    # sum over the group's coverages a+j (j = 1..s) of the expected risk (A + j e/s) / (a + j)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_group = errors_before * span + wrong - np.where(size > 0, wrong * before / size, 0.0) * span
    return per_group.sum(axis=1) / total


def aurc(y_true, y_prob) -> float:
    r"""Area under the risk–coverage curve (Geifman & El-Yaniv, NeurIPS 2017).

    Predictions are accepted in decreasing order of confidence; after accepting k of n, the selective
    risk is the error rate among them. AURC is the mean risk over the n coverages,
    :math:`\frac{1}{n}\sum_{k=1}^{n} \frac{1}{k}\sum_{i \le k} 1[\text{wrong}_{(i)}]`. Lower is
    better; its minimum for a given accuracy is reached when every correct prediction is more
    confident than every wrong one. Tied confidences are ordered at random *in expectation*: the
    value is the mean over all orders of the ties (exact, via harmonic numbers), so it does not
    depend on how a sort breaks ties.

    Parameters
    ----------
    y_true, y_prob
        As :func:`hf_calibration.metrics.expected_calibration_error`.

    Returns
    -------
    float
        In [0, 1].

    Raises
    ------
    ValueError, TypeError
        As :func:`hf_calibration.metrics.expected_calibration_error`.

    Examples
    --------
    >>> round(aurc([1, 0, 1], [0.9, 0.8, 0.7]), 6)  # risks 0, 1/2, 1/3
    0.277778
    >>> aurc([1, 0], [0.6, 0.6])  # one tie: mean of (0 + 1/2)/2 and (1 + 1/2)/2
    0.5
    """
    return float(_aurc_impl(prepare(y_true, y_prob), None)[0])


def _accuracy_impl(inputs: Inputs, weights) -> np.ndarray:
    return _mean(prepared_top_label(inputs)[1].astype(np.float64), weights)


def _mean_confidence_impl(inputs: Inputs, weights) -> np.ndarray:
    return _mean(prepared_top_label(inputs)[0], weights)


register("brier", _brier_impl, function=brier_score)
register("nll", _nll_impl, function=negative_log_likelihood)
register("auroc", _auroc_impl, function=confidence_auroc)
register("auprc", _auprc_impl, function=confidence_auprc)
register("aurc", _aurc_impl, function=aurc)
register("accuracy", _accuracy_impl)
register("mean_confidence", _mean_confidence_impl)
