"""The strategies of ``CALMTrainer``: one per ``CALMConfig.method``, each turning the micro-batches of an optimizer
step into its update direction through the trainer's strategy API (``CALMTrainer``'s class docstring, "Strategy
API"). Methods and sources: docs/methods.md, "CALM".

A new method is a ``CALMStrategy`` subclass registered in ``STRATEGIES`` under the name ``CALMConfig.method``
takes; it uses only the trainer's public methods (``calm_parameters``, ``lower_value``, ``upper_value``,
``scored_logits``, ``log_probs``, ``targets``, ``window``, ``all_reduce_sum``, ``train_batches``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from hf_calibration.calm.bome import bome_direction, bome_lambda, bome_terms
from hf_calibration.calm.cft import cft_term
from hf_calibration.metrics.binning import uniform_bin_index

# CFT's bin accuracies and counts in a checkpoint: training state (like the optimizer's), not part of the saved model.
CFT_STATE_NAME = "cft_state.safetensors"


def confidence_bins(conf: torch.Tensor, n_bins: int) -> torch.Tensor:
    """Equal-width bin (N,) int64 of confidences ``conf`` (N,) in [0, 1], on ``conf``'s device.

    The library's one bin rule, ``hf_calibration.metrics.binning.uniform_bin_index`` ([k/B, (k+1)/B) with
    float64 edges; 1.0 in the last bin), applied to the exact float64 values of ``conf``, so CFT's bins are the
    bins of the ECE it is evaluated with. ``int(c * B)`` in float32 is not: float32(0.7) = 0.69999999 lies
    below the edge 0.7 but 0.69999999 * 10 rounds to 7.0 in float32.
    """
    idx = uniform_bin_index(conf.detach().double().cpu().numpy(), n_bins)
    return torch.as_tensor(idx, dtype=torch.long).reshape(conf.shape).to(conf.device)


class _LossAt(torch.autograd.Function):
    """A sum of losses of the live model evaluated at given parameter values, with its first-order gradient precomputed.

    ``forward(trainer, values, alpha_names, theta_names, reduce, *alpha_values, *theta_values)``: the live
    trainable θ temporarily hold ``theta_values`` (their ``.data`` is swapped, so the modules, and
    DeepSpeed ZeRO-3's hooks on them, see the same parameter objects; ``torch.func.functional_call``
    would put plain tensors in their place, which ZeRO-3 cannot fetch), each ``value(alpha)`` of ``values``
    (one per micro-batch of an accumulation window) is evaluated and differentiated with ``torch.autograd.grad``
    w.r.t. the inputs that require grad, one at a time so that only one micro-batch's graph is alive, and the
    values and gradients are summed; then the data are restored. With ``reduce`` the summed value and every
    gradient (α and θ) are summed over processes in one collective: each value being a partial sum already
    divided by the global item count, the result is the loss of the whole global batch, identical on every rank.
    ``backward`` returns the stored gradients times the incoming scalar gradient (first order only).
    """

    @staticmethod
    def forward(ctx, trainer, values, alpha_names, theta_names, reduce, *params):
        alpha = dict(zip(alpha_names, params[:len(alpha_names)]))
        theta = dict(zip(theta_names, params[len(alpha_names):]))
        live = trainer.calm_parameters()[1]
        alpha_in = {n: a.detach().requires_grad_(a.requires_grad) for n, a in alpha.items()}
        wrt = [alpha_in[n] for n, a in alpha.items() if a.requires_grad] + \
              [live[n] for n, t in theta.items() if t.requires_grad]
        held = {n: live[n].data for n, t in theta.items() if t is not live[n]}
        total, grads = None, [None] * len(wrt)
        try:
            for n in held:
                live[n].data = theta[n].detach()
            for value in values:
                with torch.enable_grad():
                    out = value(alpha_in)
                    parts = torch.autograd.grad(out, wrt, allow_unused=True) if wrt else ()
                total = out.detach() if total is None else total + out.detach()
                grads = [g if part is None else part if g is None else g + part for g, part in zip(grads, parts)]
        finally:
            for n, data in held.items():
                live[n].data = data
        grads = [torch.zeros_like(w) if g is None else g for g, w in zip(grads, wrt)]
        if reduce:
            trainer.all_reduce_sum({"value": total, **dict(enumerate(grads))})
        ctx.wants = [v.requires_grad for v in params]
        ctx.save_for_backward(*grads)
        return total

    @staticmethod
    def backward(ctx, grad_out):
        grads = iter(ctx.saved_tensors)
        return (None,) * 5 + tuple(grad_out * next(grads) if want else None for want in ctx.wants)


# ---- one strategy per CALMConfig.method ----------------------------------------------------------


class CALMStrategy:
    """How one ``CALMConfig.method`` turns the micro-batches of an optimizer step into its update direction.

    ``CALMTrainer`` picks the class once from the config (``STRATEGIES``) and, per optimizer step, calls
    ``start_window()``, then ``micro_batch(batch, index, alpha, theta)`` for each micro-batch of the
    gradient-accumulation window on this process, then at its last ``direction(alpha, theta)``, which returns the
    update direction (parameter name → tensor, identical on every process) and the values to log (name → 0-d
    tensor of the global batch, ``lower_loss`` = L_tr among them). The trainer hands the direction to the engine
    (``CALMTrainer.apply_direction``). ``save_state`` / ``load_state`` keep a method's own training state in
    checkpoints.

    The shared pieces are the trainer's: the scored logits, the adjusted log-probabilities, the cross-entropy
    and entropy, and each micro-batch's share of L_tr and f = −H over the window's item counts
    (``CALMTrainer.lower_value`` / ``upper_value``; class docstring of ``CALMTrainer``, "Unit of averaging").

    Class attributes: ``needs_calibration`` — S_V batches are paired with the micro-batches (the trainer then
    requires ``calibration_dataset``); ``trains_alpha`` — α is trained (otherwise it stays the identity, frozen).
    """

    needs_calibration = False
    trains_alpha = False

    def __init__(self, trainer: "CALMTrainer"):
        self.trainer = trainer

    def start_window(self) -> None:
        """A new optimizer step begins: forget the previous window's per-step state."""

    def micro_batch(self, batch: dict, index: int, alpha: dict, theta: dict) -> None:
        """Take micro-batch ``index`` of the window (its S_V batch, if any, is ``trainer.window["calibration"][index]``)."""
        raise NotImplementedError

    def direction(self, alpha: dict, theta: dict) -> tuple[dict, dict]:
        """At the window's last micro-batch: (update direction, logged values), both of the global batch."""
        raise NotImplementedError

    def save_state(self, folder: Path) -> None:
        """Write the method's own training state into checkpoint ``folder`` (main process only)."""

    def load_state(self, folder: Path) -> None:
        """Read what ``save_state`` wrote, when a run resumes from checkpoint ``folder``."""


class SummedGradientStrategy(CALMStrategy):
    """A method whose loss is a sum over items: each micro-batch's gradient is added to a buffer, and the buffer
    (gradient and logged values) is summed over processes in one collective at the window's last micro-batch."""

    def start_window(self) -> None:
        self._buffers: dict[str, dict[str, torch.Tensor]] = {}

    def loss(self, batch: dict, index: int, alpha: dict, theta: dict):
        """(L_tr, the loss to differentiate, the parameters it is differentiated with respect to, extra logs) of
        micro-batch ``index``: each value its share of the window (item sum over the window's item count)."""
        raise NotImplementedError

    def micro_batch(self, batch, index, alpha, theta) -> None:
        lower, total, params, logs = self.loss(batch, index, alpha, theta)
        grads = torch.autograd.grad(total, list(params.values()), allow_unused=True)
        self._add("grad", {n: torch.zeros_like(p) if g is None else g for (n, p), g in zip(params.items(), grads)})
        self._add("logs", {"lower_loss": lower, **logs})

    def _add(self, key, tensors):
        buf = self._buffers.setdefault(key, {})
        for n, t in tensors.items():
            t = t.detach()
            buf[n] = t if n not in buf else buf[n] + t

    def direction(self, alpha, theta) -> tuple[dict, dict]:
        """The window's gradient and logged values, summed over processes (one collective)."""
        buffers, self._buffers = self._buffers, {}
        pieces = self.trainer.all_reduce_sum({**{("grad", n): g for n, g in buffers["grad"].items()},
                                               **{("log", k): v for k, v in buffers["logs"].items()}})
        return ({n: pieces[("grad", n)] for n in buffers["grad"]},
                {k: pieces[("log", k)] for k in buffers["logs"]})


class SFTStrategy(SummedGradientStrategy):
    """method='sft': L_tr of the adjusted distribution w.r.t. θ, α fixed at the identity. With
    ``label_smoothing_factor`` > 0 (smoothing the same distribution, ``CALMTrainer._cross_entropy``) it is the
    label-smoothing baseline."""

    def loss(self, batch, index, alpha, theta):
        lower = self.trainer.lower_value(batch, self.trainer.window["train_items"])(alpha)
        return lower, lower, {**theta, **alpha}, {}


class CFTStrategy(SFTStrategy):
    """method='cft', calibration-aware fine-tuning (Xiao et al. ICML 2025): (1 − a)·L_tr + a·c·term, the term of
    ``hf_calibration.calm.cft`` (``cft_target``, ``cft_normalization``). The bin accuracies and counts come from a
    pass over the training data (``bin_statistics``) before the first step and, with
    ``cft_refresh_steps`` > 0, every that many optimizer steps, and travel in checkpoints (``CFT_STATE_NAME``).
    Logs ``cft_term``, the term of the step's whole batch."""

    def __init__(self, trainer):
        super().__init__(trainer)
        self.bin_accuracy: torch.Tensor | None = None
        self.bin_count: torch.Tensor | None = None

    def loss(self, batch, index, alpha, theta):
        lower, _, params, logs = super().loss(batch, index, alpha, theta)
        args = self.trainer.args
        term = self._term(batch, index, self.trainer.window["train_items"])
        total = (1 - args.cft_weight) * lower + args.cft_weight * args.cft_coefficient * term
        return lower, total, params, {**logs, "cft_term": term}

    def _term(self, batch, index, items):
        trainer, args = self.trainer, self.trainer.args
        step, every = trainer.state.global_step, args.cft_refresh_steps
        if self.bin_accuracy is None or (every and index == 0 and step > 0 and step % every == 0):
            self.bin_accuracy, self.bin_count = self.bin_statistics()
        raw, _, _ = trainer.scored_logits(batch)
        probs = trainer.log_probs(raw, {}).exp()
        bins = confidence_bins(probs.max(dim=1).values, args.cft_num_bins)
        return cft_term(probs, bins, self.bin_accuracy, self.bin_count, rule=args.cft_target,
                        normalization=args.cft_normalization, items=items)

    @torch.no_grad()
    def bin_statistics(self):
        """(accuracy, count), each (cft_num_bins,) float32: the accuracy (bin centre if empty) and the number of
        items of each equal-width confidence bin in a pass over the training data.

        Under several processes each one scores its shard of the data, and the hits and counts are summed
        across processes before dividing, so every rank gets the accuracies of the whole training set
        (accelerate's even batches may repeat a few examples to fill the last batch).
        """
        trainer = self.trainer
        bins = trainer.args.cft_num_bins
        hits, counts = torch.zeros(bins), torch.zeros(bins)
        was_training = trainer.model.training
        trainer.model.eval()
        for batch in trainer.train_batches():
            raw, target_ids, _ = trainer.scored_logits(batch)
            probs = trainer.log_probs(raw, {}).exp()
            conf, pred = probs.max(dim=1)
            b = confidence_bins(conf, bins).cpu()
            hits.index_add_(0, b, (pred == trainer.targets(target_ids)).float().cpu())
            counts.index_add_(0, b, torch.ones_like(b, dtype=torch.float))
        if trainer.accelerator.num_processes > 1:
            both = torch.stack([hits, counts]).to(trainer.accelerator.device)
            hits, counts = trainer.accelerator.reduce(both, reduction="sum").cpu()
        trainer.model.train(was_training)
        centres = (torch.arange(bins) + 0.5) / bins
        return torch.where(counts > 0, hits / counts.clamp(min=1), centres), counts

    def save_state(self, folder):
        if self.bin_accuracy is not None:
            from safetensors.torch import save_file

            save_file({"bin_accuracy": self.bin_accuracy.contiguous(), "bin_count": self.bin_count.contiguous()},
                      str(Path(folder) / CFT_STATE_NAME))

    def load_state(self, folder):
        from safetensors.torch import load_file

        path = Path(folder) / CFT_STATE_NAME
        if not path.is_file():
            raise ValueError(f"resume_from_checkpoint: {str(folder)!r} has no {CFT_STATE_NAME}, the CFT bin "
                             "accuracies every method='cft' checkpoint holds; without them the run would not continue "
                             "as it began")
        state = load_file(str(path))
        if "bin_count" not in state:
            raise ValueError(f"resume_from_checkpoint: the CFT state in {str(folder)!r} has no bin counts (written "
                             "by an older version); start the run again")
        accuracy = state["bin_accuracy"]
        bins = self.trainer.args.cft_num_bins
        if accuracy.shape != (bins,):
            raise ValueError(f"cft_num_bins: the checkpoint's CFT state has {accuracy.numel()} bins, "
                             f"got cft_num_bins={bins}")
        self.bin_accuracy, self.bin_count = accuracy, state["bin_count"]


class RegularizationStrategy(SFTStrategy):
    """method='regularization' (docs/methods.md, 'CALM: ablations'): single level, L_tr − β·H over (α, θ), with H on the S_V batch
    paired with each micro-batch."""

    needs_calibration = trains_alpha = True

    def loss(self, batch, index, alpha, theta):
        lower, _, params, _ = super().loss(batch, index, alpha, theta)
        window = self.trainer.window
        upper = self.trainer.upper_value(window["calibration"][index], window["calibration_items"])(alpha)
        total = lower + self.trainer.args.regularization_beta * upper
        return lower, total, params, {"calibration_entropy": -upper}


class IterateStrategy(SummedGradientStrategy):
    """method='iterate' (docs/methods.md, 'CALM: ablations'): optimizer steps alternate, a θ step on L_tr then an α step on −H.

    Even optimizer steps differentiate L_tr w.r.t. θ only; odd steps differentiate −H on a calibration
    batch w.r.t. α only, at the θ the previous step produced. The resting group gets no direction, so its
    ``.grad`` stays None and the optimizer skips it (no momentum, no weight decay): each step moves one group.
    L_tr of the training batch is still evaluated on α steps (no gradient), so ``loss`` is L_tr at every step.
    """

    needs_calibration = trains_alpha = True

    def loss(self, batch, index, alpha, theta):
        trainer, window = self.trainer, self.trainer.window
        lower_value = trainer.lower_value(batch, window["train_items"])
        if trainer.state.global_step % 2 == 0:
            lower = lower_value(alpha)
            return lower, lower, theta, {}
        with torch.no_grad():
            lower = lower_value(alpha)
        upper = trainer.upper_value(window["calibration"][index], window["calibration_items"])(alpha)
        return lower, upper, alpha, {"calibration_entropy": -upper}


class BOMEStrategy(CALMStrategy):
    """method='bome' (CALM) and 'scalar' (the same with one shared temperature): the first-order bilevel update
    ∇f + λ∇q of ``hf_calibration.calm.bome``.

    BOME is not linear in the batch (θ̃ steps along ∇_θ L_tr of the whole batch, λ is a ratio), so the window's
    micro-batches are kept and the BOME terms computed at its last one: L_tr and f are evaluated micro-batch by
    micro-batch (``_LossAt``, one graph alive at a time) and their values and gradients summed over processes in
    one collective per evaluation. θ̃, q, ∇f, ∇q and λ are then those of one process holding the whole global
    batch, identical on every rank.
    """

    needs_calibration = trains_alpha = True

    def start_window(self) -> None:
        self.batches: list[dict] = []

    def micro_batch(self, batch, index, alpha, theta) -> None:
        self.batches.append(batch)

    def direction(self, alpha, theta) -> tuple[dict, dict]:
        trainer, args = self.trainer, self.trainer.args
        window = trainer.window
        reduce = trainer.accelerator.num_processes > 1
        lower = self._at([trainer.lower_value(b, window["train_items"]) for b in self.batches], reduce)
        upper = self._at([trainer.upper_value(b, window["calibration_items"]) for b in window["calibration"]], reduce)
        terms = bome_terms(lower, upper, alpha, theta, inner_steps=args.inner_steps,
                           inner_learning_rate=args.inner_learning_rate, upper_gradient=args.upper_gradient)
        lam = bome_lambda(terms.grad_f, terms.grad_q, terms.q, eta=args.eta, phi_rule=args.phi_rule,
                          epsilon=args.bome_epsilon)
        logs = {"lower_loss": terms.lower, "residual_q": terms.q, "calibration_entropy": -terms.upper,
                "bome_lambda": lam}
        return bome_direction(terms.grad_f, terms.grad_q, lam), logs

    def _at(self, values, reduce=False):
        """The sum of ``value(alpha)`` over ``values`` (losses at the live parameters, one per micro-batch) as a
        function ``(alpha, theta) -> loss`` of both groups.

        For one value at the live θ without reduction this is a plain autograd graph; otherwise ``_LossAt``
        evaluates the values at ``theta`` one by one and (``reduce``) sums the result over processes.
        """
        trainer = self.trainer

        def loss(alpha, theta):
            live = trainer.calm_parameters()[1]
            if len(values) == 1 and not reduce and all(t is live[n] for n, t in theta.items()):
                return values[0](alpha)
            return _LossAt.apply(trainer, tuple(values), tuple(alpha), tuple(theta), reduce, *alpha.values(),
                                 *theta.values())

        return loss


STRATEGIES: dict[str, type[CALMStrategy]] = {
    "bome": BOMEStrategy, "scalar": BOMEStrategy, "iterate": IterateStrategy, "regularization": RegularizationStrategy,
    "sft": SFTStrategy, "cft": CFTStrategy,
}
