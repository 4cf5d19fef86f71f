"""BOME's own step (issue 17.4): with ``bome_optimizer='sgd'`` one optimizer step moves u = (α, θ) by exactly
−lr·d, d = ∇f + λ∇q, so the first-order decrease of q is lr·⟨d, ∇q⟩ ≥ lr·φ (BOME's control barrier); the
Trainer's AdamW, which rescales each coordinate, breaks it on the issue's example.

The toy problem lives on two coordinates of the tiny model: a = α's first ρ entry (0 at the start) and
t = 1.5 + w, w the first entry of the final RMSNorm weight (1 at the start, so t = 2.5). The trainer's L_tr and
f = −H are replaced by

    L(a, t) = 4·(t + a/8)²,    f(a, t) = 9a − 20.1t,

with T = 1 inner step of ξ_in = 0.05 and φ = η·q, η = 0.5. By hand, at a = 0, t = 2.5 (r = t + a/8 = 2.5):
∂L/∂t = 8r = 20, ∂L/∂a = r = 2.5; inner step t̃ = 2.5 − 0.05·20 = 1.5, r̃ = 1.5;
q = 4·2.5² − 4·1.5² = 16, ∇q = (∂L/∂a(a, t) − ∂L/∂a(a, t̃), ∂L/∂t) = (2.5 − 1.5, 20) = (1, 20);
∇f = (9, −20.1); φ = 0.5·16 = 8; ⟨∇f, ∇q⟩ = 9 − 402 = −393; ‖∇q‖² = 401;
λ = (8 + 393)/401 = 1; d = ∇f + λ∇q = (10, −0.1): the issue's vector, ⟨d, ∇q⟩ = 10 − 2 = 8 = φ.
Adam's first step is lr·sign(d) = lr·(1, −1) per coordinate: ⟨lr·sign(d), ∇q⟩ = lr·(1 − 20) = −19·lr < 0.
"""

import pytest
import torch

from tests.calm.test_trainer import make_trainer

U = 2.0**-24  # float32 unit roundoff
LR = 1e-2
ALPHA, THETA = "logit_adjustment.rho", "model.model.norm.weight"
GRAD_F, GRAD_Q, LAM, PHI = (9.0, -20.1), (1.0, 20.0), 1.0, 8.0
D = (10.0, -0.1)


def toy_trainer(tmp_path, tok, data, **kw):
    config = dict(method="bome", inner_steps=1, inner_learning_rate=0.05, phi_rule="eta_value", eta=0.5,
                  learning_rate=LR, alpha_learning_rate=LR, lr_scheduler_type="constant")
    trainer = make_trainer(tmp_path, tok, data, peft=False, **{**config, **kw})
    _, theta = trainer.calm_parameters()
    weight = theta[THETA]
    assert float(weight[0].detach()) == 1.0  # RMSNorm weights start at 1

    def a_of(alpha):
        return alpha.get(ALPHA, trainer.model.logit_adjustment.rho)[0]

    def lower_value(batch, items):  # evaluated at other θ by swapping the live weight's data (``_LossAt``)
        return lambda alpha: 4 * (1.5 + weight[0] + a_of(alpha) / 8) ** 2

    def upper_value(batch, items):
        return lambda alpha: 9 * a_of(alpha) - 20.1 * (1.5 + weight[0])

    trainer.lower_value, trainer.upper_value = lower_value, upper_value
    return trainer


def coordinates(trainer):
    alpha, theta = trainer.calm_parameters()
    return {n: p.detach().clone() for n, p in {**alpha, **theta}.items()}


def run(trainer, steps=1):
    trainer.args.max_steps = steps
    before = coordinates(trainer)
    trainer.train()
    return before, coordinates(trainer)


def moves(before, after):
    """(Δa, Δt) in float64 (the difference of two float32 numbers is exact there) and whether anything else moved."""
    delta = (float(after[ALPHA][0].double() - before[ALPHA][0].double()),
             float(after[THETA][0].double() - before[THETA][0].double()))
    others = [n for n in before if not torch.equal(before[n].flatten()[1:], after[n].flatten()[1:])
              or (n not in (ALPHA, THETA) and not torch.equal(before[n], after[n]))]
    return delta, others


def test_sgd_step_is_minus_lr_times_the_bome_direction(tmp_path, tiny_tokenizer, mcqa_data):
    trainer = toy_trainer(tmp_path, tiny_tokenizer, mcqa_data, bome_optimizer="sgd")
    assert trainer.args.max_grad_norm == 0.0  # no clipping: ‖d‖ ≈ 10 would have been cut to 1
    before, after = run(trainer)
    assert [e["bome_lambda"] for e in trainer.state.log_history if "bome_lambda" in e] == [pytest.approx(LAM, rel=1e-6)]
    assert [e["residual_q"] for e in trainer.state.log_history if "residual_q" in e] == [pytest.approx(16.0, rel=1e-6)]
    (da, dt), others = moves(before, after)
    assert others == []  # every other coordinate has a zero direction and stays exactly where it was
    # Tolerance per coordinate c: d_c = ∇f_c + λ∇q_c is formed in float32 from terms of size |∇f_c| + |λ∇q_c|
    # (20.1 is not a float32 number: relative error u; λ, computed in float64 from float32 inputs, is rounded to
    # float32: u; the sum: u; one spare u) → lr·4u·(|∇f_c| + |λ∇q_c|); the SGD update p − lr·d rounds once more:
    # u·(|p'| + lr·|d_c|).
    tol = [LR * 4 * U * (abs(f) + abs(LAM * q)) + U * (abs(float(p)) + LR * abs(d))
           for f, q, d, p in zip(GRAD_F, GRAD_Q, D, (after[ALPHA][0], after[THETA][0]))]
    assert da == pytest.approx(-LR * D[0], rel=0, abs=tol[0])
    assert dt == pytest.approx(-LR * D[1], rel=0, abs=tol[1])
    # the control barrier: the step lowers q at first order by lr·⟨d, ∇q⟩ = lr·φ (λ > 0 makes it tight, up to
    # ε = 1e-8 in λ's denominator: lr·φ·ε/401, far below the rounding bound)
    decrease = -(da * GRAD_Q[0] + dt * GRAD_Q[1])
    slack = tol[0] * abs(GRAD_Q[0]) + tol[1] * abs(GRAD_Q[1])
    assert decrease >= LR * PHI - slack
    assert decrease == pytest.approx(LR * PHI, rel=0, abs=slack)


def test_upper_gradient_on_the_adjustment_only(tmp_path, tiny_tokenizer, mcqa_data):
    """upper_gradient='adjustment': ∇f = (9, 0) (∂f/∂t dropped); ⟨∇f, ∇q⟩ = 9 > φ = 8, so λ = max((8 − 9)/401, 0)
    = 0 and d = (9, 0): with BOME's SGD step α moves by −9·lr and θ stays exactly where it was (with ∇f on both,
    the test above moves θ by +0.1·lr)."""
    trainer = toy_trainer(tmp_path, tiny_tokenizer, mcqa_data, bome_optimizer="sgd", upper_gradient="adjustment")
    before, after = run(trainer)
    assert [e["bome_lambda"] for e in trainer.state.log_history if "bome_lambda" in e] == [0.0]
    (da, dt), others = moves(before, after)
    assert others == [] and dt == 0.0
    # d_a = 9 exactly in float32; the update p − lr·9 rounds once: u·(|p'| + 9·lr)
    assert da == pytest.approx(-LR * 9.0, rel=0, abs=U * (abs(float(after[ALPHA][0])) + 9 * LR) + LR * U * 9)


def test_upper_gradient_is_bome_only(tmp_path, tiny_tokenizer, mcqa_data):
    from hf_calibration.calm import CALMConfig
    from hf_calibration.errors import ParameterError

    with pytest.raises(ParameterError, match="upper_gradient.*'sideways'"):
        CALMConfig(output_dir=str(tmp_path), upper_gradient="sideways", report_to="none", use_cpu=True)
    with pytest.raises(ParameterError, match="upper_gradient.*'sft'"):
        CALMConfig(output_dir=str(tmp_path), method="sft", upper_gradient="adjustment", report_to="none", use_cpu=True)


def test_trainer_adamw_breaks_the_control_barrier(tmp_path, tiny_tokenizer, mcqa_data):
    """The fault the SGD step fixes: AdamW's first step is lr·m̂/(√v̂ + eps) = lr·d/(|d| + eps) ≈ lr·sign(d) per
    coordinate (after clipping d to norm 1, which Adam's normalisation undoes), so q rises: ⟨−Δu, ∇q⟩ ≈ −19·lr."""
    trainer = toy_trainer(tmp_path, tiny_tokenizer, mcqa_data)  # bome_optimizer='trainer': AdamW, max_grad_norm 1
    assert trainer.args.bome_optimizer == "trainer" and trainer.args.max_grad_norm == 1.0
    before, after = run(trainer)
    (da, dt), _ = moves(before, after)
    decrease = -(da * GRAD_Q[0] + dt * GRAD_Q[1])
    # sign step: |Δ| = lr·|d|/(|d| + eps) with |d_t| = 0.01 after clipping and eps = 1e-8: 1e-6 relative below lr
    assert (da, dt) == (pytest.approx(-LR, rel=1e-5), pytest.approx(LR, rel=1e-5))
    assert decrease == pytest.approx(-19 * LR, rel=1e-5)
    assert decrease < 0 < LR * PHI  # q increases: the step leaves the constraint BOME's λ was chosen to keep


def test_sgd_momentum_is_heavy_ball(tmp_path, tiny_tokenizer, mcqa_data):
    """bome_optimizer='sgd_momentum' is torch.optim.SGD(momentum=β) (BOME's hpo/ code: momentum 0.9, no dampening,
    no Nesterov) over both groups: after two steps with directions d1, d2 the buffer is β·d1 + d2, so
    u2 − u0 = −lr·(d1 + β·d1 + d2)."""
    trainer = toy_trainer(tmp_path, tiny_tokenizer, mcqa_data, bome_optimizer="sgd_momentum", bome_momentum=0.9,
                          alpha_learning_rate=2 * LR)
    directions = []
    backward = trainer.apply_direction

    def record(direction, alpha, theta):
        directions.append({n: direction[n].detach().clone() for n in (ALPHA, THETA)})
        return backward(direction, alpha, theta)

    trainer.apply_direction = record
    before, after = run(trainer, steps=2)
    optimizer = trainer.optimizer.optimizer if hasattr(trainer.optimizer, "optimizer") else trainer.optimizer
    assert type(optimizer) is torch.optim.SGD
    groups = optimizer.param_groups
    assert [(g["momentum"], g["dampening"], g["nesterov"]) for g in groups] == [(0.9, 0, False)] * len(groups)
    alpha_ids = {id(p) for p in trainer.calm_parameters()[0].values()}
    assert sorted(g["lr"] for g in groups) == sorted(2 * LR if id(g["params"][0]) in alpha_ids else LR for g in groups)
    assert len(directions) == 2
    for name, lr in ((ALPHA, 2 * LR), (THETA, LR)):
        d1, d2 = (float(d[name][0]) for d in directions)
        expected = -lr * (d1 + 0.9 * d1 + d2)
        # two float32 momentum updates and two parameter updates, each rounding once: 8u of the terms' size
        tol = 8 * U * (lr * (2 * abs(d1) + abs(d2)) + abs(float(after[name][0])))
        assert float(after[name][0].double() - before[name][0].double()) == pytest.approx(expected, rel=0, abs=tol)


def test_bome_optimizer_is_checked(tmp_path):
    from tests.calm.test_trainer import make_config

    with pytest.raises(ValueError, match="bome_optimizer"):
        make_config(tmp_path, bome_optimizer="adam")
    with pytest.raises(ValueError, match=r"bome_optimizer: applies to method 'bome' or 'scalar', got method 'sft'"):
        make_config(tmp_path, method="sft", bome_optimizer="sgd")
    with pytest.raises(ValueError, match="bome_momentum"):
        make_config(tmp_path, bome_optimizer="sgd_momentum", bome_momentum=1.0)
    # an explicit clipping norm is the user's choice and is kept
    assert make_config(tmp_path, bome_optimizer="sgd", max_grad_norm=5.0).max_grad_norm == 5.0
