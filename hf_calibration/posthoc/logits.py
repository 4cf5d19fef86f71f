"""Temperature and vector scaling on option logits (Guo et al., ICML 2017, §4.2), and the logits processor that
applies a fitted temperature inside ``model.generate``. docs/methods.md, "Post-hoc calibrators"."""

from __future__ import annotations

import warnings

import numpy as np
import torch
from scipy.special import log_softmax, softmax
from transformers import LogitsProcessor

from hf_calibration.errors import ParameterError, ParameterTypeError
from hf_calibration.metrics.validation import check_labels, to_numpy
from hf_calibration.posthoc.base import (_LOG_TEMPERATURE_BOUNDS, _check_int_param, _check_logits, _check_real_param, _lbfgs,
                                        _PosthocCalibrator, _short)


# --------------------------------------------------------------------------------------------------
# Multiclass: temperature and vector scaling on logits
# --------------------------------------------------------------------------------------------------
class TemperatureScaler(_PosthocCalibrator):
    """Temperature scaling (Guo et al., ICML 2017, §4.2): ``p = softmax(z / T)`` with one scalar T > 0.

    T minimises the mean negative log-likelihood of the labels on the fitting set. The optimiser
    is L-BFGS-B over log T (so T stays positive) with the analytic gradient
    ``d NLL / d log T = -(1/T) * mean_i (E_{p_i}[z_i] - z_{i,y_i})``; log T is bounded to
    [-10, 10]. When the NLL keeps falling as T -> 0 (every argmax correct) the fit stops where the
    loss is flat to float precision, at a small T. Scaling does not change the argmax, so accuracy
    is unchanged.

    Parameters
    ----------
    max_iter : int, default 100
        L-BFGS iteration cap; a ``ConvergenceWarning`` is raised when it is reached.
    init_temperature : float, default 1.0
        Starting T (> 0).

    Attributes
    ----------
    temperature_ : float
        Fitted T; T > 1 softens (less confident), T < 1 sharpens.

    ``input_kind = "logits"``: ``fit(logits, labels)`` with logits (n, K), K >= 2, and integer
    labels (n,) in [0, K); ``transform(logits)`` returns probabilities (n, K) summing to 1.
    """

    method = "temperature"
    input_kind = "logits"
    _state_attrs = ("temperature_",)

    def __init__(self, *, max_iter=100, init_temperature=1.0):
        self.max_iter = max_iter
        self.init_temperature = init_temperature

    def fit(self, logits, labels):
        """Fit T on ``logits`` (n, K) and ``labels`` (n,); returns ``self``.

        Raises ``TypeError`` for non-numeric input and ``ValueError`` for a wrong shape, K < 2,
        NaN/inf logits, labels outside [0, K) or of a different length, or bad hyperparameters.
        """
        _check_int_param(self.max_iter, "max_iter", 1)
        _check_real_param(self.init_temperature, "init_temperature", positive=True)
        z = _check_logits(logits)
        y = check_labels(labels, z.shape[0], z.shape[1], name="labels", rows="logits").astype(np.int64)
        z_true = z[np.arange(z.shape[0]), y]

        def nll_and_grad(params):
            inv_t = np.exp(-params[0])
            scaled = z * inv_t
            log_p = log_softmax(scaled, axis=1)
            nll = -np.mean(log_p[np.arange(z.shape[0]), y])
            expected_z = np.sum(np.exp(log_p) * z, axis=1)
            grad = -inv_t * np.mean(expected_z - z_true)
            return nll, np.array([grad])

        lo, hi = _LOG_TEMPERATURE_BOUNDS
        x0 = np.clip(np.log(float(self.init_temperature)), lo, hi)
        (log_t,) = _lbfgs(nll_and_grad, np.array([x0]), max_iter=self.max_iter,
                          name="TemperatureScaler", bounds=[_LOG_TEMPERATURE_BOUNDS])
        self.temperature_ = float(np.exp(log_t))
        if log_t >= hi or log_t <= lo:
            # At the upper bound the NLL still falls as T grows: the logits rank the labels no better
            # than chance on this data, and TS collapses every prediction to the uniform 1/K.
            warnings.warn(
                f"TemperatureScaler: the fitted temperature {self.temperature_:.4g} sits at the bound "
                f"exp({log_t:+.0f}); the NLL is monotone in T on these logits "
                + ("(no information about the labels: the output is ~uniform)" if log_t >= hi else "(every argmax is right)"),
                RuntimeWarning,
                stacklevel=2,
            )
        return self

    def _state_from_json(self, state):
        super()._state_from_json(state)
        if not self.temperature_ > 0:
            raise ValueError(f"saved temperature calibrator has temperature_={self.temperature_!r}; it must be > 0")

    def transform(self, logits):
        """Calibrated probabilities ``softmax(logits / temperature_)``, shape (n, K), float64."""
        self._check_is_fitted()
        return softmax(_check_logits(logits) / self.temperature_, axis=1)


class VectorScaler(_PosthocCalibrator):
    """Vector scaling (Guo et al., ICML 2017, §4.2): ``p = softmax(z * w + b)``, w, b in R^K.

    Fitted by L-BFGS on ``mean NLL + l2 * (||w - 1||^2 + ||b||^2)`` with the analytic gradient,
    starting from the identity (w = 1, b = 0); the penalty pulls towards the identity, so a huge
    ``l2`` leaves the logits unchanged. w is unconstrained (it may change the argmax, unlike
    temperature scaling). Softmax ignores a common shift of b, so the fitted b is centred to
    mean 0 (with ``l2 > 0`` the optimum already is).

    Parameters
    ----------
    l2 : float, default 0.0
        Penalty strength (≥ 0).
    max_iter : int, default 1000
        L-BFGS iteration cap; a ``ConvergenceWarning`` is raised when it is reached.

    Attributes
    ----------
    coef_ : ndarray (K,)
        Per-class multiplier w.
    intercept_ : ndarray (K,)
        Per-class bias b.

    ``input_kind = "logits"``: ``fit(logits, labels)`` as :class:`TemperatureScaler`;
    ``transform`` requires the same K as ``fit``.
    """

    method = "vector"
    input_kind = "logits"
    _state_attrs = ("coef_", "intercept_")

    def __init__(self, *, l2=0.0, max_iter=1000):
        self.l2 = l2
        self.max_iter = max_iter

    def fit(self, logits, labels):
        """Fit w, b on ``logits`` (n, K) and ``labels`` (n,); returns ``self``.

        Raises as :meth:`TemperatureScaler.fit`, and ``ValueError`` for ``l2 < 0``.
        """
        _check_real_param(self.l2, "l2", positive=False)
        _check_int_param(self.max_iter, "max_iter", 1)
        l2 = float(self.l2)
        z = _check_logits(logits)
        n, k = z.shape
        y = check_labels(labels, n, k, name="labels", rows="logits").astype(np.int64)
        onehot = np.zeros_like(z)
        onehot[np.arange(n), y] = 1.0

        def loss_and_grad(params):
            w, b = params[:k], params[k:]
            log_p = log_softmax(z * w + b, axis=1)
            residual = (np.exp(log_p) - onehot) / n  # d mean-NLL / d adjusted logits
            loss = -np.sum(log_p * onehot) / n + l2 * (np.sum((w - 1.0) ** 2) + np.sum(b**2))
            grad_w = np.sum(residual * z, axis=0) + 2.0 * l2 * (w - 1.0)
            grad_b = np.sum(residual, axis=0) + 2.0 * l2 * b
            return loss, np.concatenate([grad_w, grad_b])

        x0 = np.concatenate([np.ones(k), np.zeros(k)])
        params = _lbfgs(loss_and_grad, x0, max_iter=self.max_iter, name="VectorScaler")
        self.coef_ = params[:k].copy()
        self.intercept_ = params[k:] - params[k:].mean()
        return self

    def option_counts(self) -> list[int] | None:
        """One weight per option: the K of ``coef_`` (whatever ``n_options_`` says)."""
        return [int(np.asarray(self.coef_).shape[0])] if hasattr(self, "coef_") else super().option_counts()

    def transform(self, logits):
        """Calibrated probabilities ``softmax(logits * coef_ + intercept_)``, shape (n, K), float64."""
        self._check_is_fitted()
        z = _check_logits(logits)
        if z.shape[1] != self.coef_.shape[0]:
            raise ParameterError(
                "logits", logits, f"has K={z.shape[1]} columns but this VectorScaler was fitted with "
                f"K={self.coef_.shape[0]}"
            )
        return softmax(z * self.coef_ + self.intercept_, axis=1)




# --------------------------------------------------------------------------------------------------
# Generation
# --------------------------------------------------------------------------------------------------
class TemperatureScalingLogitsProcessor(LogitsProcessor):
    """Divide next-token scores by a temperature inside ``model.generate``.

    With ``token_ids=None`` every score is divided by ``temperature`` (the same as transformers'
    ``TemperatureLogitsWarper``, but usable with greedy decoding and composable with a fitted
    :class:`TemperatureScaler`). With ``token_ids`` (e.g. the MCQA option-letter tokens) only those
    columns change, scaled about their maximum m: ``m + (s − m) / T``; all others pass through
    unchanged. The softmax restricted to the options then equals ``TemperatureScaler.transform`` of the
    option logits (it is invariant to the shift m), and the top option keeps its score, so greedy decoding
    picks the same option it would without calibration instead of a non-option token (dividing the option
    scores alone by T > 1 pulled them towards 0, below words such as "False").

    Parameters
    ----------
    temperature : float
        T > 0 and finite; ``ValueError`` otherwise, ``TypeError`` if not a real number.
    token_ids : sequence of int, 1-D tensor or None
        Non-negative vocabulary ids; checked against the vocabulary size (the last dimension of
        ``scores``) at call time, where an id >= vocabulary size raises ``ValueError``.

    ``__call__(input_ids, scores)``: scores (batch, vocab) float tensor → new tensor, same shape
    and dtype; the input is not modified.
    """

    supports_continuous_batching = True  # element-wise over the last dimension

    def __init__(self, temperature, token_ids=None):
        if isinstance(temperature, torch.Tensor) and temperature.numel() == 1:
            temperature = temperature.item()
        _check_real_param(temperature, "temperature", positive=True)
        self.temperature = float(temperature)
        if token_ids is None:
            self.token_ids = None
            return
        ids = to_numpy(token_ids, "token_ids")
        if ids.ndim != 1 or ids.size == 0:
            raise ParameterError("token_ids", token_ids, f"must be a non-empty 1-D sequence of ints, got {_short(token_ids)}")
        if not np.issubdtype(ids.dtype, np.integer):
            raise ParameterTypeError("token_ids", token_ids, f"must be integers, got dtype {ids.dtype} ({_short(token_ids)})")
        if (ids < 0).any():
            raise ParameterError("token_ids", token_ids, f"must be ≥ 0, got {int(ids[ids < 0][0])}")
        self.token_ids = torch.as_tensor(np.unique(ids), dtype=torch.long)

    @classmethod
    def from_scaler(cls, scaler, token_ids=None):
        """Build the processor from a fitted :class:`TemperatureScaler` (its ``temperature_``)."""
        if not isinstance(scaler, TemperatureScaler):
            raise ParameterTypeError("scaler", scaler, f"must be a TemperatureScaler, got {type(scaler).__name__}")
        scaler._check_is_fitted()
        return cls(scaler.temperature_, token_ids=token_ids)

    def __call__(self, input_ids, scores):
        if self.token_ids is None:
            return scores / self.temperature
        vocab_size = scores.shape[-1]
        too_big = self.token_ids >= vocab_size
        if too_big.any():
            raise ParameterError(
                "token_ids", self.token_ids.tolist(), f"contains {self.token_ids[too_big].tolist()}, outside the "
                f"vocabulary of size {vocab_size} (last dimension of {{scores}})", related=("scores",)
            )
        ids = self.token_ids.to(scores.device)
        processed = scores.clone()
        chosen = scores[..., ids]
        top = chosen.max(dim=-1, keepdim=True).values
        processed[..., ids] = top + (chosen - top) / self.temperature
        return processed

    def __repr__(self):
        ids = None if self.token_ids is None else self.token_ids.tolist()
        return f"{type(self).__name__}(temperature={self.temperature!r}, token_ids={ids!r})"
