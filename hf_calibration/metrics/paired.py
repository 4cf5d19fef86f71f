"""Paired comparisons of two confidences on the same questions, and the verdict of their intervals.

``paired_differences``: one set of questions, paired bootstrap (``paired_bootstrap``: the same resampled
questions for both terms). ``paired_strata_difference``: a difference computed within each stratum (a domain, a
training seed, a (seed, domain) pair) and averaged over the strata, interval from ``stratified_bootstrap`` (each
stratum's questions resampled on their own, the same draw for both terms). ``interval_verdict``: whether an
interval of a difference decides its sign.
"""

from __future__ import annotations

import warnings

import numpy as np

from hf_calibration.errors import ParameterError, ParameterWarning
from hf_calibration.metrics.bootstrap import paired_bootstrap, stratified_bootstrap
from hf_calibration.metrics.ece import expected_calibration_error
from hf_calibration.metrics.scores import brier_score, confidence_auroc

STRATUM_METRICS = ("conf_ece", "accuracy", "auroc", "brier")
VERDICT_SIDES = ("below", "above")

__all__ = ["STRATUM_METRICS", "interval_verdict", "paired_differences", "paired_strata_difference"]


def interval_verdict(interval: dict, *, held_when: str = "below") -> bool | None:
    """Whether an interval ``{"low", "high"}`` of a difference decides its sign: with ``held_when="below"``, True
    when it lies wholly below 0, False when wholly above 0, None (undecided) when it contains 0; ``"above"``
    the other way round (True wholly above 0). A NaN bound decides nothing (None).

    >>> interval_verdict({"low": -0.3, "high": -0.1}), interval_verdict({"low": -0.1, "high": 0.2})
    (True, None)
    >>> interval_verdict({"low": 0.02, "high": 0.1}, held_when="above")
    True
    """
    if held_when not in VERDICT_SIDES:
        raise ParameterError("held_when", held_when, f"must be one of {', '.join(VERDICT_SIDES)}, got {held_when!r}")
    low, high = (interval["low"], interval["high"]) if held_when == "below" else (-interval["high"], -interval["low"])
    return True if high < 0 else False if low > 0 else None


def paired_differences(y_a, conf_a, y_b, conf_b, *, n_resamples: int = 1000, seed: int = 0, n_bins: int = 15,
                       binning: str = "uniform", norm: str = "l1") -> dict:
    """Confidence a against confidence b on the same n questions, paired bootstrap (``paired_bootstrap``, the same
    resampled questions for both): ``delta_ece`` (conf-ECE under ``n_bins``, ``binning``, ``norm``),
    ``delta_auroc``, ``delta_brier`` = a − b, and ``delta_brier_vs_constant`` = Brier(a) − Brier(constant = the
    accuracy of a's answers on all n), each ``{"value", "low", "high"}`` (95 %).

    y_a, y_b : (n,) 0/1 correctness of the answers each confidence is about (two passes may answer differently).
    conf_a, conf_b : (n,) confidences in [0, 1].
    """
    y_a, y_b = np.asarray(y_a).astype(int), np.asarray(y_b).astype(int)
    options = dict(n_resamples=n_resamples, seed=seed)

    def entry(metric, a, b, y_second=y_b, **kwargs):
        value, low, high = paired_bootstrap(metric, y_a, a, y_second, b, metric_kwargs=kwargs or None, **options)
        return {"value": value, "low": low, "high": high}

    return {
        "delta_ece": entry(expected_calibration_error, conf_a, conf_b, n_bins=n_bins, binning=binning, norm=norm),
        "delta_auroc": entry(confidence_auroc, conf_a, conf_b),
        "delta_brier": entry(brier_score, conf_a, conf_b),
        "delta_brier_vs_constant": entry(brier_score, conf_a, np.full(len(conf_a), y_a.mean()), y_second=y_a),
    }


def _term(metric: str, y, conf, ece_options: dict) -> float:
    if metric == "conf_ece":
        return expected_calibration_error(y, conf, **ece_options)
    if metric == "accuracy":
        return float(np.mean(y))
    if metric == "auroc":  # NaN where the answers are all right or all wrong: the strata's weights handle it
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ParameterWarning)
            return confidence_auroc(y, conf)
    return brier_score(y, conf)


def paired_strata_difference(strata: list, *, metric: str = "conf_ece", share: float = 1.0, weights: str = "equal",
                             n_resamples: int = 1000, seed: int = 0, n_bins: int = 15, binning: str = "uniform",
                             norm: str = "l1") -> dict:
    """metric(a) − ``share`` · metric(b) within each stratum, averaged over the strata.

    strata : list of ``((y_a, conf_a), (y_b, conf_b))``, one pair of (n_k,) arrays (0/1 correctness, confidence
        in [0, 1]) per stratum, both about the same n_k questions.
    metric : "conf_ece" (under ``n_bins``, ``binning``, ``norm``), "accuracy" (the mean of y; the confidences are
        unused), "auroc" or "brier" (``confidence_auroc``, ``brier_score``).
    weights : "equal" (each stratum 1 / number of strata) or "size" (n_k / n).

    Interval: ``stratified_bootstrap`` (95 %). A stratum where the difference is undefined on all its questions
    (AUROC with all answers right or all wrong) is left out of the mean and of the resampling; a resample where a
    kept stratum has none is skipped; with no stratum (or no resample) left, value, interval and baseline are NaN.

    → ``{"value", "low", "high", "per_stratum", "baseline"}``: ``per_stratum`` the difference on each stratum's
    questions, in order (NaN where undefined); ``baseline`` the same weighted mean of metric(b) alone over the
    kept strata (so that ``-value / baseline`` is the relative change).
    """
    if metric not in STRATUM_METRICS:
        raise ParameterError("metric", metric, f"must be one of {', '.join(STRATUM_METRICS)}, got {metric!r}")
    if weights not in ("equal", "size"):
        raise ParameterError("weights", weights, f"must be 'equal' or 'size', got {weights!r}")
    ece_options = dict(n_bins=n_bins, binning=binning, norm=norm)
    strata = [tuple((np.asarray(y).astype(int), np.asarray(c, dtype=float)) for y, c in pair) for pair in strata]

    def terms(pair, idx):
        (ya, ca), (yb, cb) = pair
        return _term(metric, ya[idx], ca[idx], ece_options), _term(metric, yb[idx], cb[idx], ece_options)

    whole = [terms(pair, np.arange(len(pair[0][0]))) for pair in strata]
    per_stratum = [a - share * b for a, b in whole]
    kept = [k for k, v in enumerate(per_stratum) if np.isfinite(v)]
    sizes = [len(strata[k][0][0]) for k in kept]

    def statistic(j, idx):
        a, b = terms(strata[kept[j]], idx)
        return a - share * b

    try:
        if not kept:
            raise ValueError("no stratum has the difference")
        w = sizes if weights == "size" else None
        est, low, high = stratified_bootstrap(statistic, sizes, weights=w, n_resamples=n_resamples, seed=seed)
        baseline = float(np.average([whole[k][1] for k in kept], weights=w))
    except ValueError:  # no stratum, or no resample, where the difference is defined
        est = low = high = baseline = float("nan")
    return {"value": est, "low": low, "high": high, "per_stratum": per_stratum, "baseline": baseline}
