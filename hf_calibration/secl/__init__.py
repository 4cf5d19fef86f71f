"""SECL: label-free test-time self-calibration of verbalized confidence (SPEC §2), and the confidence
signals it shares with ``hf-calibration diagnose``."""

from hf_calibration.secl.confidence import (
    CONFIDENCE_TEMPLATE,
    P_TRUE_TEMPLATE,
    ConfidenceTokens,
    MCQASignals,
    SignalResult,
    dinco_score,
    mcqa_signals,
    norm_p_true,
    p_true,
    verbalized_confidence,
)

__all__ = [
    "CONFIDENCE_TEMPLATE",
    "P_TRUE_TEMPLATE",
    "ConfidenceTokens",
    "MCQASignals",
    "SignalResult",
    "dinco_score",
    "mcqa_signals",
    "norm_p_true",
    "p_true",
    "verbalized_confidence",
]
