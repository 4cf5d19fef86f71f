"""One BOME step (SPEC §1) against a hand-derived reference on a 2-parameter toy problem.

L(α, θ) = (θ − 2α)²,  f(α, θ) = (θ − 1)² + α².  Derivatives by hand:
∂L/∂θ = 2(θ − 2α), ∂L/∂α = −4(θ − 2α), ∂f/∂α = 2α, ∂f/∂θ = 2(θ − 1).
"""

import pytest
import torch

from hf_calibration.calm import bome_direction, bome_lambda, bome_terms


def lower(a, t):
    return (t["theta"] - 2 * a["alpha"]) ** 2


def upper(a, t):
    return (t["theta"] - 1) ** 2 + a["alpha"] ** 2


def reference(alpha, theta, T, xi, eta, phi_rule, eps, upper_gradient="all"):
    d = theta - 2 * alpha
    tilde = theta
    for _ in range(T):
        tilde = tilde - xi * 2 * (tilde - 2 * alpha)
    dt = tilde - 2 * alpha
    q = d**2 - dt**2
    gq = (-4 * d + 4 * dt, 2 * d)
    gf = (2 * alpha, 2 * (theta - 1) if upper_gradient == "all" else 0.0)
    norm = gq[0] ** 2 + gq[1] ** 2
    phi = eta * norm if phi_rule == "eta_grad_norm" else eta * q
    lam = max((phi - (gf[0] * gq[0] + gf[1] * gq[1])) / (norm + eps), 0.0)
    return lam, (gf[0] + lam * gq[0], gf[1] + lam * gq[1]), q


@pytest.mark.parametrize("T", [0, 1, 3])
@pytest.mark.parametrize("phi_rule", ["eta_grad_norm", "eta_value"])
@pytest.mark.parametrize("upper_gradient", ["all", "adjustment"])
def test_one_step_matches_reference(T, phi_rule, upper_gradient):
    alpha0, theta0, xi, eta, eps, lr = 0.3, 1.5, 0.1, 0.5, 1e-8, 0.05
    a = {"alpha": torch.tensor(alpha0, dtype=torch.float64, requires_grad=True)}
    t = {"theta": torch.tensor(theta0, dtype=torch.float64, requires_grad=True)}
    terms = bome_terms(lower, upper, a, t, inner_steps=T, inner_learning_rate=xi, upper_gradient=upper_gradient)
    lam = bome_lambda(terms.grad_f, terms.grad_q, terms.q, eta=eta, phi_rule=phi_rule, epsilon=eps)
    direction = bome_direction(terms.grad_f, terms.grad_q, lam)
    ref_lam, ref_dir, ref_q = reference(alpha0, theta0, T, xi, eta, phi_rule, eps, upper_gradient)
    assert float(terms.q) == pytest.approx(ref_q, abs=1e-12)
    assert float(lam) == pytest.approx(ref_lam, rel=1e-10, abs=1e-12)
    # u ← u − ξ(∇f + λ∇q) with plain SGD
    assert alpha0 - lr * float(direction["alpha"]) == pytest.approx(alpha0 - lr * ref_dir[0], abs=1e-12)
    assert theta0 - lr * float(direction["theta"]) == pytest.approx(theta0 - lr * ref_dir[1], abs=1e-12)


def test_lambda_is_zero_when_grad_f_already_decreases_q():
    # f = 5·L: with T = 1, ξ = 0.1, d = θ − 2α: ⟨∇f, ∇q⟩ = 36 d² > φ = 0.5·4.64 d², so λ = 0.
    a = {"alpha": torch.tensor(0.3, dtype=torch.float64, requires_grad=True)}
    t = {"theta": torch.tensor(1.5, dtype=torch.float64, requires_grad=True)}
    terms = bome_terms(lower, lambda a_, t_: 5 * lower(a_, t_), a, t, inner_steps=1, inner_learning_rate=0.1)
    lam = bome_lambda(terms.grad_f, terms.grad_q, terms.q, eta=0.5, phi_rule="eta_grad_norm", epsilon=1e-8)
    assert float(lam) == 0.0
    direction = bome_direction(terms.grad_f, terms.grad_q, lam)
    assert float(direction["alpha"]) == pytest.approx(float(terms.grad_f["alpha"]))


def test_upper_gradient_must_be_known():
    a = {"alpha": torch.tensor(0.3, requires_grad=True)}
    t = {"theta": torch.tensor(1.5, requires_grad=True)}
    with pytest.raises(ValueError, match="upper_gradient.*'theta'"):
        bome_terms(lower, upper, a, t, inner_steps=1, inner_learning_rate=0.1, upper_gradient="theta")
