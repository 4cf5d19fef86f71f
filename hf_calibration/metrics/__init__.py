"""Calibration metrics: pure functions on numpy arrays, Python lists or torch tensors (docs/methods.md, 'Calibration metrics').

Two input forms, for every metric:

* ``y_prob`` of shape (n, K), rows summing to 1, with integer labels ``y_true`` in [0, K): the
  top-label view (confidence = max probability, correct = argmax == label) for the binned metrics,
  smECE and the ranking scores; the multiclass definitions for Brier, NLL and cw-ECE. (n, 2) is
  K = 2 classes.
* ``y_prob`` of shape (n,), confidences in [0, 1], with ``y_true`` the 0/1 correctness (the "conf"
  view, e.g. verbalised confidence or P(True)).

torch is never imported by this package unless a torch tensor is passed or
:meth:`BinnedCalibrationState.to_tensor` is called.

========================================  ==============================================================
:func:`expected_calibration_error`        ECE / RMSCE / MCE, uniform or quantile bins, debiased option
:func:`classwise_ece`                     cw-ECE (Nixon et al. 2019 SCE)
:func:`adaptive_calibration_error`        ACE: equal-mass bins, equally weighted (netcal)
:func:`smooth_ece`                        smECE (Błasiok & Nakkiran 2024; relplot)
:func:`brier_score`                       multiclass / binary Brier score
:func:`negative_log_likelihood`           NLL (log loss)
:func:`confidence_auroc`                  AUROC of confidence for correct vs wrong
:func:`confidence_auprc`                  average precision of confidence for the correct predictions
:func:`aurc`                              area under the risk–coverage curve (Geifman & El-Yaniv 2017)
:func:`reliability_diagram`               bin table (:class:`ReliabilityTable`)
:func:`top_label`                         (confidence, correct) of a prediction
:func:`uniform_bin_index`                 the equal-width bin of a confidence (the one rule used everywhere)
:func:`semantic_ece`                      Sem-ECE of open-ended answers (sampled answers grouped by meaning)
:func:`bootstrap`                         BCa (default) or percentile interval of any metric
:func:`bootstrap_interval`                the interval of given resampled values (BCa with a jackknife)
:func:`calibration_report`                every metric with bootstrap intervals, as a dict
:func:`paired_bootstrap`                  interval of metric(a) − metric(b) on the same items
:func:`stratified_bootstrap`              interval of a weighted mean over strata resampled on their own
:func:`paired_differences`                ΔECE, ΔAUROC, ΔBrier of two confidences on the same items, paired
:func:`paired_strata_difference`          a difference within each stratum, averaged, stratified interval
:func:`interval_verdict`                  whether an interval of a difference lies below / above 0
:func:`consistency_resampling`            a statistic's null distribution under calibration (Bröcker & Smith 2007)
:class:`BinnedCalibrationState`           streaming / distributed accumulator for uniform-bin metrics
:mod:`hf_calibration.metrics.registry`     where a metric registers its batched form for the bootstrap
========================================  ==============================================================
"""

from hf_calibration.metrics.binning import ReliabilityTable, reliability_diagram, top_label, uniform_bin_index
from hf_calibration.metrics.bootstrap import (BootstrapResult, bootstrap, bootstrap_interval, calibration_report,
                                              paired_bootstrap, stratified_bootstrap)
from hf_calibration.metrics.consistency import ConsistencyResult, consistency_resampling, draw_calibrated_labels
from hf_calibration.metrics.paired import interval_verdict, paired_differences, paired_strata_difference
from hf_calibration.metrics.ece import adaptive_calibration_error, classwise_ece, expected_calibration_error
from hf_calibration.metrics.scores import (
    aurc,
    brier_score,
    confidence_auprc,
    confidence_auroc,
    negative_log_likelihood,
)
from hf_calibration.metrics.semantic import semantic_confidence, semantic_confidences, semantic_ece
from hf_calibration.metrics.smooth import smooth_ece
from hf_calibration.metrics.streaming import BinnedCalibrationState

__all__ = [
    "BinnedCalibrationState",
    "BootstrapResult",
    "ConsistencyResult",
    "ReliabilityTable",
    "adaptive_calibration_error",
    "aurc",
    "bootstrap",
    "bootstrap_interval",
    "paired_bootstrap",
    "paired_differences",
    "paired_strata_difference",
    "brier_score",
    "calibration_report",
    "classwise_ece",
    "confidence_auprc",
    "confidence_auroc",
    "consistency_resampling",
    "draw_calibrated_labels",
    "expected_calibration_error",
    "interval_verdict",
    "negative_log_likelihood",
    "reliability_diagram",
    "semantic_confidence",
    "semantic_confidences",
    "semantic_ece",
    "smooth_ece",
    "stratified_bootstrap",
    "top_label",
    "uniform_bin_index",
]
