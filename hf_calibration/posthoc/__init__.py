"""Post-hoc calibrators: temperature, vector, Platt, isotonic and histogram-binning scaling.

Each calibrator is a scikit-learn-style object with ``fit`` / ``transform`` / ``fit_transform``,
fitted on a labelled validation split and applied unchanged to new data. Two kinds of input exist,
named by the class attribute ``input_kind`` so that callers (the CLI) know what to feed:

- ``"logits"`` (:class:`TemperatureScaler`, :class:`VectorScaler`): option logits of shape
  (n, K) and integer labels in [0, K); ``transform`` returns probabilities of shape (n, K).
- ``"confidence"`` (:class:`PlattScaler`, :class:`IsotonicCalibrator`,
  :class:`HistogramBinningCalibrator`): a confidence c of shape (n,) and binary correctness of
  shape (n,); ``transform`` returns the calibrated probability of being correct, shape (n,), in
  [0, 1]. The constructor parameter ``input_format`` says how c is given (:data:`INPUT_FORMATS`):
  ``"probability"`` (default, c in [0, 1]), ``"log_probability"`` (log c, finite and <= 0, e.g. a
  log-softmax entry) or ``"log_odds"`` (log(c / (1 - c)), finite, e.g. the logit of P(True)). The
  log formats resolve confidences closer to 0 and 1 than float64 probabilities can (1 - 1e-20 is
  1.0 as a probability), and none of the three is clipped, so the ranking of confidences near the
  ends survives calibration (see :class:`PlattScaler` for exact 0 and 1).

Inputs may be numpy arrays, nested lists or torch tensors; outputs are numpy float64 arrays.
Hyperparameters are validated in ``fit`` (the scikit-learn convention), data in every call.

A fitted calibrator is saved as one small JSON file::

    {"format_version": 1, "method": "temperature", "params": {...}, "state": {...}}

and, when known, ``"n_options": [K, ...]``: the option counts of the questions it was fitted on (``fit-posthoc``
records them; ``evaluate --posthoc`` refuses data with another count; files without the key load, unchecked).
``params`` holds the constructor arguments and ``state`` the fitted values (plain floats and lists;
Python's float repr round-trips exactly, so a loaded calibrator reproduces the saved one's outputs
bit for bit). :func:`load_calibrator` dispatches on ``"method"`` through :data:`CALIBRATORS`.

:class:`TemperatureScalingLogitsProcessor` applies a fitted temperature inside
``model.generate``, optionally only to the option tokens.

References: Guo, Pleiss, Sun, Weinberger, "On Calibration of Modern Neural Networks", ICML 2017
(temperature and vector scaling); Platt, "Probabilistic Outputs for Support Vector Machines", 1999;
Zadrozny & Elkan, "Obtaining calibrated probability estimates from decision trees and naive
Bayesian classifiers", ICML 2001 (histogram binning); Zadrozny & Elkan, KDD 2002 (isotonic).
"""

from __future__ import annotations

import os

from sklearn.exceptions import NotFittedError

from hf_calibration.posthoc.base import FORMAT_VERSION, INPUT_FORMATS, _read_payload, log_odds
from hf_calibration.posthoc.confidence import HistogramBinningCalibrator, IsotonicCalibrator, PlattScaler
from hf_calibration.posthoc.logits import TemperatureScaler, TemperatureScalingLogitsProcessor, VectorScaler

__all__ = [
    "CALIBRATORS",
    "FORMAT_VERSION",
    "INPUT_FORMATS",
    "HistogramBinningCalibrator",
    "IsotonicCalibrator",
    "NotFittedError",
    "PlattScaler",
    "TemperatureScaler",
    "TemperatureScalingLogitsProcessor",
    "VectorScaler",
    "load_calibrator",
    "log_odds",
]

CALIBRATORS = {
    "temperature": TemperatureScaler,
    "vector": VectorScaler,
    "platt": PlattScaler,
    "isotonic": IsotonicCalibrator,
    "histogram": HistogramBinningCalibrator,
}


def load_calibrator(path):
    """Load any calibrator saved by ``save``, choosing the class from the file's ``"method"``.

    Raises ``ValueError`` for a file that is not a saved calibrator, an unknown method or an
    unsupported ``format_version``.
    """
    payload = _read_payload(path)
    if payload["method"] not in CALIBRATORS:
        raise ValueError(
            f"{os.fspath(path)!r} has unknown method {payload['method']!r}; known: {sorted(CALIBRATORS)}"
        )
    return CALIBRATORS[payload["method"]]._from_payload(payload)
