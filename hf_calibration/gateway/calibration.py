"""The calibrator that maps a raw confidence signal to the calibrated value, with its provenance, swapped
atomically on reload (``--calibrator FILE``: a ``fit-posthoc`` output; docs/gateway.md).

A calibrator file records what it was fitted on (``"fitted_on": {"signal", "model", ...}``, written by
``fit-posthoc``); the gateway refuses a file fitted on another signal or another model, and one without that
record (it cannot be checked). ``CalibratorSlot.reload`` reads the file again and swaps the new calibrator in
as one reference assignment: a request reads ``slot.current`` once and uses that calibrator throughout, so no
answer mixes two versions; a file that fails the checks leaves the old one in place.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hf_calibration.errors import ParameterError


@dataclass(frozen=True)
class Calibrator:
    """One loaded calibrator: ``kind`` (``"identity"`` or a ``posthoc.CALIBRATORS`` method), ``version`` (the
    first 12 hex digits of the file's SHA-256; ``"none"`` for identity), ``fitted_on`` (the file's provenance),
    ``path`` and the fitted object (None for identity)."""

    kind: str
    version: str
    fitted_on: dict | None = None
    path: str | None = None
    fitted: object = field(default=None, repr=False)

    def __call__(self, raw: float) -> float:
        """The calibrated value in [0, 1] of a raw signal value in [0, 1]."""
        if self.fitted is None:
            return float(min(1.0, max(0.0, raw)))
        out = float(np.asarray(self.fitted.transform(np.array([raw], dtype=np.float64))).reshape(-1)[0])
        return min(1.0, max(0.0, out))

    def describe(self) -> dict:
        return {"kind": self.kind, "version": self.version, "fitted_on": self.fitted_on}


IDENTITY = Calibrator("identity", "none")


def load_checked(path, *, signal: str, model: str) -> Calibrator:
    """The calibrator in ``path`` after checking that it was fitted on ``signal`` for ``model``.

    Raises ParameterError naming ``calibrator``, in one line: a file that cannot be read or is not a saved
    calibrator, a calibrator on option logits (temperature/vector scaling map logits, not one confidence), one
    without ``fitted_on`` (fitted before fit-posthoc recorded it: fit it again), or one fitted on another signal
    or another model."""
    from hf_calibration.posthoc import load_calibrator

    name = str(path)
    try:
        content = Path(path).read_bytes()
        payload = json.loads(content)
        fitted = load_calibrator(path)
    except (OSError, ValueError) as err:
        raise ParameterError("calibrator", name, f"{name!r} cannot be used: {' '.join(str(err).split())}") from None
    if fitted.input_kind != "confidence":
        raise ParameterError("calibrator", name, f"{name!r} is a {fitted.method} calibrator of option logits; the "
                             "gateway maps one confidence value: fit platt, isotonic or histogram")
    fitted_on = payload.get("fitted_on")
    if not isinstance(fitted_on, dict) or "signal" not in fitted_on or "model" not in fitted_on:
        raise ParameterError("calibrator", name, f"{name!r} does not say which signal and model it was fitted on "
                             "(no 'fitted_on'); fit it again with this version's fit-posthoc")
    if fitted_on["signal"] != signal:
        raise ParameterError("calibrator", name, f"{name!r} was fitted on the signal {fitted_on['signal']!r}, the "
                             f"gateway's is {signal!r} (--signal)", related=("signal",))
    if fitted_on["model"] != model:
        raise ParameterError("calibrator", name, f"{name!r} was fitted on the model {fitted_on['model']!r}, the "
                             f"gateway serves {model!r} (--model)", related=("model",))
    return Calibrator(fitted.method, hashlib.sha256(content).hexdigest()[:12], fitted_on, name, fitted)


class CalibratorSlot:
    """The calibrator in use: ``current`` (read once per answer) and ``reload()`` (atomic swap)."""

    def __init__(self, path, *, signal: str, model: str):
        self.path, self.signal, self.model = path, signal, model
        self._lock = threading.Lock()
        self.current = IDENTITY if path is None else load_checked(path, signal=signal, model=model)

    def reload(self) -> Calibrator:
        """Read ``path`` again; the new calibrator replaces the old one at once (the old stays on any error,
        which is raised: ParameterError naming ``calibrator``). Returns the calibrator now in use."""
        if self.path is None:
            return self.current
        with self._lock:
            new = load_checked(self.path, signal=self.signal, model=self.model)
            self.current = new
        return new
