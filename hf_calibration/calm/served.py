"""A CALM artifact at serve time: its LoRA served by vLLM, its logit adjustment applied here to the served
option log-probabilities (docs/serving.md).

The adjustment is z'_y = z_y / τ_y + l_y on raw logits z (``logit_adjustment``). A server returns log-probabilities
z_y − L, with the log-normaliser L unknown; (z_y − L)/τ + l_y = z'_y − L/τ differs from z'_y by one constant per
prompt when every covered token has the same τ, so any softmax over covered tokens (the option probabilities) is
exact. Per-token temperatures make the shift depend on y, which log-probabilities cannot undo: those raise.
"""

from __future__ import annotations

import numpy as np

from hf_calibration.errors import ParameterError


def served_adjustment(adjustment, name: str = "logit_adjustment"):
    """The ``adjust`` callable of ``modeling.score_mcqa`` for a fitted ``LogitAdjustment``.

    Returns ``f(token_ids, logprobs (n, m)) → (n, m)``, adjusting the columns of covered ids. Raises
    ParameterError naming ``name`` when the temperatures differ between covered tokens, or when a token read
    for an option is not covered while others are (the option softmax would mix adjusted and raw values).
    """
    tau = adjustment.temperature.detach().double().cpu().numpy()
    if tau.size > 1 and not np.allclose(tau, tau[0], rtol=0, atol=0):
        raise ParameterError(name, adjustment.mode, "per-token temperatures τ_y cannot be applied to served "
                             "log-probabilities (the log-normaliser the server divides out would be scaled "
                             "differently per token); serve this model in process or use a scalar-τ artifact")
    covered = None if adjustment.token_ids is None else adjustment.token_ids.tolist()
    shift = None if adjustment.shift is None else adjustment.shift.detach().double().cpu().numpy()
    t = float(tau.reshape(-1)[0])

    def adjust(token_ids, logprobs):
        ids = list(token_ids)
        if covered is None:
            cols = list(range(len(ids)))
            pos = ids
        else:
            where = {tok: j for j, tok in enumerate(covered)}
            cols = [j for j, tok in enumerate(ids) if tok in where]
            if len(cols) not in (0, len(ids)):
                raise ParameterError(name, adjustment.mode, f"covers some read tokens but not others ({ids})")
            pos = [where[ids[j]] for j in cols]
        out = np.array(logprobs, dtype=np.float64, copy=True)
        out[:, cols] = out[:, cols] / t + (0.0 if shift is None else shift[pos])
        return out

    return adjust
