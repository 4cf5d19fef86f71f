"""SECL: label-free test-time self-calibration of verbalized confidence (docs/methods.md, 'SECL'), and the confidence
signals it shares with ``hf-calibration diagnose``.

- ``confidence``: verbalized confidence, P(True), P(True)Norm, the DINCO-style score (one home).
- ``drift``: Page-Hinkley and the EMA-standardised entropy gate.
- ``config`` / ``mixin``: ``SECLConfig`` and ``SECLGenerationMixin`` (``apply_secl``, ``SECLModel``).
- ``diagnose``: the generation–discrimination gap and whether SECL can help a model.
- ``state`` / ``step``: one stream's ``SECLState`` and the per-question ``secl_step`` that every driver calls.
- ``service``: SECL beside a server, one state per named stream.
(The stream evaluation protocol, ``hf-calibration secl``'s passes and summary, is ``hf_calibration.evaluation.stream``.)
"""

from hf_calibration.secl.config import SECLConfig
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
from hf_calibration.secl.diagnose import diagnose, generation_discrimination_gap
from hf_calibration.secl.drift import EntropyShiftDetector, PageHinkley
from hf_calibration.runtime.lazy import lazy_getattr

# the mixin needs transformers' generation stack: imported on first use, so that reading SECLConfig (the command
# line's --help) stays fast
_LAZY = {name: "hf_calibration.secl.mixin" for name in ("SECLGenerateOutput", "SECLGenerationMixin", "SECLModel",
                                                        "apply_secl")}

__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = [
    "CONFIDENCE_TEMPLATE",
    "P_TRUE_TEMPLATE",
    "ConfidenceTokens",
    "EntropyShiftDetector",
    "MCQASignals",
    "PageHinkley",
    "SECLConfig",
    "SECLGenerateOutput",
    "SECLGenerationMixin",
    "SECLModel",
    "SignalResult",
    "apply_secl",
    "diagnose",
    "dinco_score",
    "generation_discrimination_gap",
    "mcqa_signals",
    "norm_p_true",
    "p_true",
    "verbalized_confidence",
]
