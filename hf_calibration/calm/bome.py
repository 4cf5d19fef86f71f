"""First-order bilevel update (BOME; Ye, Liu, Wright, Stone, Liu, NeurIPS 2022) as used by CALM (docs/methods.md, 'CALM: BOME step').

Problem: min_α f(α, θ) s.t. θ ∈ argmin L(α, ·). With u = (α, θ), one outer step:

1. θ̃ ← θ (detached); T steps θ̃ ← θ̃ − ξ_in ∇_θ L(α, θ̃).
2. q(u) = L(α, θ) − L(α, θ̃) with θ̃ held constant, so ∇_θ q = ∇_θ L(α, θ) and
   ∇_α q = ∇_α L(α, θ) − ∇_α L(α, θ̃).
3. ∇f at u.
4. λ = max((φ − ⟨∇f, ∇q⟩) / (‖∇q‖² + ε), 0), φ = η‖∇q‖² ("eta_grad_norm") or η·q ("eta_value").
5. direction d = ∇f + λ∇q; the optimizer takes the step. BOME's step is u ← u − ξ·d, which lowers q at first
   order by ξ·⟨d, ∇q⟩ ≥ ξ·φ; ``CALMConfig.bome_optimizer`` 'sgd' / 'sgd_momentum' take it (plain or heavy-ball,
   as BOME's code), while Adam rescales each coordinate and can turn that decrease into an increase.

Only first-order gradients are taken (``torch.autograd.grad`` without ``create_graph``). The first
inner step reuses ∇_θ L(α, θ) from step 2, and L(α, θ̃) is differentiated w.r.t. α only, so with α at
the output layer its backward never enters the network.

The step is not linear in the batch: θ̃ moves along ∇_θ L of the batch given, and λ is a ratio of inner
products. So L and f must be the losses of the whole batch of one optimizer step; terms computed per
micro-batch (each with its own θ̃ and λ) and then summed are not the terms of the whole batch.
``CALMTrainer`` passes losses over every micro-batch of the accumulation window on every process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

Params = dict[str, torch.Tensor]
# which parameters the upper-level gradient ∇f covers (bome_terms' upper_gradient)
UPPER_GRADIENTS = ("all", "adjustment")


@dataclass
class BOMETerms:
    """The pieces of one BOME step for the batch its losses cover.

    grad_f, grad_q : dict name → tensor (same shapes as the parameters); q : 0-d tensor;
    lower, upper : 0-d tensors, L(α, θ) and f(α, θ) (detached, for logging).
    """

    grad_f: Params
    grad_q: Params
    q: torch.Tensor
    lower: torch.Tensor
    upper: torch.Tensor


def _grad(loss: torch.Tensor, params: Params) -> Params:
    grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
    return {n: torch.zeros_like(p) if g is None else g for (n, p), g in zip(params.items(), grads)}


def bome_terms(
    lower_loss: Callable[[Params, Params], torch.Tensor],
    upper_loss: Callable[[Params, Params], torch.Tensor],
    alpha: Params,
    theta: Params,
    *,
    inner_steps: int,
    inner_learning_rate: float,
    upper_gradient: str = "all",
) -> BOMETerms:
    """∇f, ∇q and q at u = (α, θ) for one optimizer step's batch (steps 1–3 above).

    Parameters
    ----------
    lower_loss, upper_loss : callables ``(alpha, theta) -> 0-d tensor``
        L (e.g. mean cross-entropy on S_T) and f (e.g. minus the mean entropy on S_V) of the whole batch of
        the step (module docstring), evaluated at the given parameter tensors, differentiable w.r.t. those
        that require grad (the trainer closes over its micro-batches and evaluates them at other θ by
        swapping the parameters' data).
    alpha, theta : dict name → tensor requiring grad (the live parameters).
    inner_steps : int ≥ 0, T.  inner_learning_rate : float > 0, ξ_in.
    upper_gradient : "all" (default) or "adjustment"
        Which parameters ∇f covers. "all": ∇_α f and ∇_θ f (BOME). "adjustment": ∇_α f only, ∇_θ f set to 0, so θ
        moves only along λ∇_θ q (the lower-level constraint) and f's backward stays at the output layer when α
        sits there (docs/methods.md, 'CALM: BOME step'). ValueError on any other value.
    """
    if upper_gradient not in UPPER_GRADIENTS:
        raise ValueError(f"upper_gradient: must be one of {UPPER_GRADIENTS}, got {upper_gradient!r}")
    both = {**alpha, **theta}
    lower = lower_loss(alpha, theta)
    g_lower = _grad(lower, both)
    alpha_const = {n: p.detach() for n, p in alpha.items()}
    tilde = {n: p.detach() for n, p in theta.items()}
    for step in range(inner_steps):
        if step == 0:  # ∇_θ L at θ̃ = θ is already known
            g_inner = {n: g_lower[n] for n in theta}
        else:
            tilde = {n: t.requires_grad_(True) for n, t in tilde.items()}
            g_inner = _grad(lower_loss(alpha_const, tilde), tilde)
        tilde = {n: (tilde[n] - inner_learning_rate * g_inner[n]).detach() for n in theta}
    lower_tilde = lower_loss(alpha, tilde)
    g_alpha_tilde = _grad(lower_tilde, alpha) if alpha else {}
    grad_q = {n: g_lower[n] - g_alpha_tilde[n] if n in alpha else g_lower[n] for n in both}
    upper = upper_loss(alpha, theta)
    if upper_gradient == "adjustment":
        grad_f = {**(_grad(upper, alpha) if alpha else {}), **{n: torch.zeros_like(p) for n, p in theta.items()}}
    else:
        grad_f = _grad(upper, both)
    return BOMETerms(
        grad_f=grad_f, grad_q=grad_q, q=(lower - lower_tilde).detach(),
        lower=lower.detach(), upper=upper.detach(),
    )


def bome_lambda(grad_f: Params, grad_q: Params, q: torch.Tensor, *, eta: float, phi_rule: str,
                epsilon: float) -> torch.Tensor:
    """λ = max((φ − ⟨∇f, ∇q⟩) / (‖∇q‖² + ε), 0) over all parameters (step 4), as a 0-d float64 tensor."""
    dot = sum((grad_f[n].double() * grad_q[n].double()).sum() for n in grad_q)
    norm_sq = sum(grad_q[n].double().pow(2).sum() for n in grad_q)
    if phi_rule == "eta_grad_norm":
        phi = eta * norm_sq
    elif phi_rule == "eta_value":
        phi = eta * q.double()
    else:
        raise ValueError(f"phi_rule: must be 'eta_grad_norm' or 'eta_value', got {phi_rule!r}")
    return torch.clamp((phi - dot) / (norm_sq + epsilon), min=0.0)


def bome_direction(grad_f: Params, grad_q: Params, lam: torch.Tensor) -> Params:
    """∇f + λ∇q (step 5), in each gradient's dtype."""
    return {n: grad_f[n] + lam.to(grad_f[n].dtype) * grad_q[n] for n in grad_f}
