"""``CALMTrainer``: ``trl.SFTTrainer`` whose optimizer steps are CALM's bilevel updates (SPEC §1)."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np
import torch
from accelerate.utils import DistributedType
from trl import SFTTrainer

from hf_calibration._versions import check_tested_versions
from hf_calibration.calm.bome import bome_direction, bome_lambda, bome_terms
from hf_calibration.calm.cft import cft_term
from hf_calibration.calm.config import CALMConfig
from hf_calibration.calm.logit_adjustment import (
    ADJUSTMENT_WEIGHTS_NAME,
    CALMModel,
    LogitAdjustment,
    adjust_logits,
    lm_head_vocab_size,
)
from hf_calibration.hub import peft_checkpointing_warning_silenced
from hf_calibration.metrics.binning import uniform_bin_index

ALPHA_PREFIX = "logit_adjustment."
# CFT's bin accuracies and counts in a checkpoint: training state (like the optimizer's), not part of the saved model.
CFT_STATE_NAME = "cft_state.safetensors"
_ZERO3_PIN = -1  # DeepSpeed submodule ids are >= 0


def _first_target(labels) -> int | None:
    """The first labelled next-token id of one tokenised example (``labels`` shifted by one, −100 = unlabelled):
    its completion's first token, or None when nothing is labelled."""
    return next((t for t in labels[1:] if t != -100), None)


def _confidence_bins(conf: torch.Tensor, n_bins: int) -> torch.Tensor:
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
        live = trainer._parameters()[1]
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
            trainer._all_reduce_sum({"value": total, **dict(enumerate(grads))})
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
    (``CALMTrainer._backward_direction``). ``save_state`` / ``load_state`` keep a method's own training state in
    checkpoints.

    The shared pieces are the trainer's: the scored logits, the adjusted log-probabilities, the cross-entropy
    and entropy, and each micro-batch's share of L_tr and f = −H over the window's item counts
    (``CALMTrainer._lower_value`` / ``_upper_value``; class docstring of ``CALMTrainer``, "Unit of averaging").

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
        """Take micro-batch ``index`` of the window (its S_V batch, if any, is ``trainer._window["calibration"][index]``)."""
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
        pieces = self.trainer._all_reduce_sum({**{("grad", n): g for n, g in buffers["grad"].items()},
                                               **{("log", k): v for k, v in buffers["logs"].items()}})
        return ({n: pieces[("grad", n)] for n in buffers["grad"]},
                {k: pieces[("log", k)] for k in buffers["logs"]})


class SFTStrategy(SummedGradientStrategy):
    """method='sft': L_tr of the adjusted distribution w.r.t. θ, α fixed at the identity. With
    ``label_smoothing_factor`` > 0 (smoothing the same distribution, ``CALMTrainer._cross_entropy``) it is the
    label-smoothing baseline."""

    def loss(self, batch, index, alpha, theta):
        lower = self.trainer._lower_value(batch, self.trainer._window["train_items"])(alpha)
        return lower, lower, {**theta, **alpha}, {}


class CFTStrategy(SFTStrategy):
    """method='cft', calibration-aware fine-tuning (Xiao et al. ICML 2025): (1 − a)·L_tr + a·c·term, the term of
    ``hf_calibration.calm.cft`` (``cft_target``, ``cft_normalization``). The bin accuracies and counts come from a
    pass over the training data (``CALMTrainer._cft_bin_statistics``) before the first step and, with
    ``cft_refresh_steps`` > 0, every that many optimizer steps, and travel in checkpoints (``CFT_STATE_NAME``).
    Logs ``cft_term``, the term of the step's whole batch."""

    def __init__(self, trainer):
        super().__init__(trainer)
        self.bin_accuracy: torch.Tensor | None = None
        self.bin_count: torch.Tensor | None = None

    def loss(self, batch, index, alpha, theta):
        lower, _, params, logs = super().loss(batch, index, alpha, theta)
        args = self.trainer.args
        term = self._term(batch, index, self.trainer._window["train_items"])
        total = (1 - args.cft_weight) * lower + args.cft_weight * args.cft_coefficient * term
        return lower, total, params, {**logs, "cft_term": term}

    def _term(self, batch, index, items):
        trainer, args = self.trainer, self.trainer.args
        step, every = trainer.state.global_step, args.cft_refresh_steps
        if self.bin_accuracy is None or (every and index == 0 and step > 0 and step % every == 0):
            self.bin_accuracy, self.bin_count = trainer._cft_bin_statistics()
        raw, _, _ = trainer._scored_logits(batch)
        probs = trainer._log_probs(raw, {}).exp()
        bins = _confidence_bins(probs.max(dim=1).values, args.cft_num_bins)
        return cft_term(probs, bins, self.bin_accuracy, self.bin_count, rule=args.cft_target,
                        normalization=args.cft_normalization, items=items)

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
                             "before issue 17.4); start the run again")
        accuracy = state["bin_accuracy"]
        bins = self.trainer.args.cft_num_bins
        if accuracy.shape != (bins,):
            raise ValueError(f"cft_num_bins: the checkpoint's CFT state has {accuracy.numel()} bins, "
                             f"got cft_num_bins={bins}")
        self.bin_accuracy, self.bin_count = accuracy, state["bin_count"]


class RegularizationStrategy(SFTStrategy):
    """method='regularization' (SPEC §1 ablation): single level, L_tr − β·H over (α, θ), with H on the S_V batch
    paired with each micro-batch."""

    needs_calibration = trains_alpha = True

    def loss(self, batch, index, alpha, theta):
        lower, _, params, _ = super().loss(batch, index, alpha, theta)
        window = self.trainer._window
        upper = self.trainer._upper_value(window["calibration"][index], window["calibration_items"])(alpha)
        total = lower + self.trainer.args.regularization_beta * upper
        return lower, total, params, {"calibration_entropy": -upper}


class IterateStrategy(SummedGradientStrategy):
    """method='iterate' (SPEC §1 ablation): optimizer steps alternate, a θ step on L_tr then an α step on −H.

    Even optimizer steps differentiate L_tr w.r.t. θ only; odd steps differentiate −H on a calibration
    batch w.r.t. α only, at the θ the previous step produced. The resting group gets no direction, so its
    ``.grad`` stays None and the optimizer skips it (no momentum, no weight decay): each step moves one group.
    L_tr of the training batch is still evaluated on α steps (no gradient), so ``loss`` is L_tr at every step.
    """

    needs_calibration = trains_alpha = True

    def loss(self, batch, index, alpha, theta):
        trainer, window = self.trainer, self.trainer._window
        lower_value = trainer._lower_value(batch, window["train_items"])
        if trainer.state.global_step % 2 == 0:
            lower = lower_value(alpha)
            return lower, lower, theta, {}
        with torch.no_grad():
            lower = lower_value(alpha)
        upper = trainer._upper_value(window["calibration"][index], window["calibration_items"])(alpha)
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
        window = trainer._window
        reduce = trainer.accelerator.num_processes > 1
        lower = self._at([trainer._lower_value(b, window["train_items"]) for b in self.batches], reduce)
        upper = self._at([trainer._upper_value(b, window["calibration_items"]) for b in window["calibration"]], reduce)
        terms = bome_terms(lower, upper, alpha, theta, inner_steps=args.inner_steps,
                           inner_learning_rate=args.inner_learning_rate)
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
            live = trainer._parameters()[1]
            if len(values) == 1 and not reduce and all(t is live[n] for n, t in theta.items()):
                return values[0](alpha)
            return _LossAt.apply(trainer, tuple(values), tuple(alpha), tuple(theta), reduce, *alpha.values(),
                                 *theta.values())

        return loss


STRATEGIES: dict[str, type[CALMStrategy]] = {
    "bome": BOMEStrategy, "scalar": BOMEStrategy, "iterate": IterateStrategy, "regularization": RegularizationStrategy,
    "sft": SFTStrategy, "cft": CFTStrategy,
}


class CALMTrainer(SFTTrainer):
    """Supervised fine-tuning with a learned logit adjustment trained by first-order bilevel optimisation.

    Jin, Wang, Dai, Xiao, Hou, "Beyond Post-Hoc Temperature Scaling: Bilevel Optimization for LLM
    Calibration" (arXiv 2608.07419): the lower level fits θ (LoRA or all weights) by the cross-entropy
    L_tr of the adjusted distribution on ``train_dataset`` (S_T); the upper level maximises the
    entropy H of the adjusted distribution on ``calibration_dataset`` (S_V, no labels used). Each
    optimizer step is the BOME update of ``hf_calibration.calm.bome`` over u = (α, θ); the ablations
    and baselines of ``CALMConfig.method`` share the same data path, so one config runs the paper's
    whole comparison. Each method is a ``CALMStrategy`` chosen once from the config (``STRATEGIES``:
    ``BOMEStrategy`` for 'bome' and 'scalar', ``IterateStrategy``, ``RegularizationStrategy``, ``SFTStrategy``,
    ``CFTStrategy``); the training loop only calls its hooks.

    Used like ``SFTTrainer``: same ``model`` (id, ``PreTrainedModel`` or ``PeftModel``), ``peft_config``,
    datasets in prompt/completion (or text / conversational) form. After construction ``trainer.model``
    is a ``CALMModel``: the (PEFT) model plus its ``LogitAdjustment``. With ``entropy_domain="options"``
    (MCQA) the first completion token of every training example must be an option letter ("A" or " A" …);
    ``hf_calibration.calm.data.mcqa_to_prompt_completion`` builds such data.

    Parameters beyond ``SFTTrainer``'s
    ----------------------------------
    calibration_dataset : datasets.Dataset
        S_V; rows with ``prompt`` (a ``completion`` is used for positions only, never as a label).
        Required for methods 'bome', 'iterate', 'regularization', 'scalar'.

    Raises at construction (not mid-training): ValueError for a missing calibration dataset, adjustment
    token ids outside the vocabulary, or training completions that do not start with an option letter;
    TypeError when ``args`` is not a ``CALMConfig``; RuntimeError when the installed transformers or TRL is
    outside the tested range of ``hf_calibration._versions`` (opt out: ``HF_CALIBRATION_SKIP_VERSION_CHECK=1``).

    Logged once per optimizer step (train), as values of the whole global batch: ``lower_loss`` (L_tr),
    ``residual_q``, ``bome_lambda``, ``calibration_entropy`` (H on S_V), ``cft_term``, ``mean_temperature``; at
    evaluation: ``eval_accuracy``, ``eval_conf_ece``, ``eval_cw_ece``, ``eval_nll``, ``eval_mean_confidence`` over
    the option letters (with ``entropy_domain="vocab"`` only when every evaluation completion starts with an option
    letter; the letter distribution is then the adjusted vocabulary distribution at the answer position,
    renormalised over the letters' token ids).

    Unit of averaging. Every token-level term (L_tr and q, label smoothing, the entropy H, and so their gradients
    ∇f, ∇q; CFT's term with ``cft_normalization="bin_count"`` is instead a sum over the step's items, each divided
    by its bin's count in the training data) is a mean over *items*, the scored positions: with
    ``entropy_domain="options"`` one per example (the answer letter: SPEC §1's mean over x of H(f(·|x)) and the
    cross-entropy per question); with ``"vocab"`` every completion token, as transformers and TRL average a
    language-model loss. The mean runs over the whole optimizer step: every micro-batch of the
    gradient-accumulation window on every process. ``get_batch_samples`` counts the window's items (S_T, and S_V for the calibration batches paired
    with it) and sums the counts over processes in one collective, as transformers does with
    ``num_items_in_batch`` and ``average_tokens_across_devices``; each micro-batch then contributes the sum of
    its items' losses divided by that count. So micro-batch 1 × accumulation 2 and 2 processes × 1 take the step
    of one batch of 2, whatever the completion lengths. (With ``average_tokens_across_devices=False``, as in
    transformers, each process divides by its own count and the processes' means are averaged.)

    Distributed training (``accelerate launch``: DDP, DeepSpeed ZeRO-2/3; see docs/distributed.md).
    BOME needs whole gradients before the step (λ is a ratio of inner products over all parameters), so
    the per-batch pieces come from ``torch.autograd.grad`` and are reduced explicitly, not by DDP's or
    DeepSpeed's backward hooks:

    - BOME is not linear in the batch (θ̃ steps along ∇_θ L_tr of the whole batch, λ is a ratio), so
      methods 'bome' and 'scalar' (``BOMEStrategy``) keep the window's micro-batches and compute the BOME terms
      at its last one: L_tr and f are evaluated micro-batch by micro-batch (``_LossAt``, one graph alive at a
      time) and their values and gradients summed over processes in one collective per evaluation. θ̃, q, ∇f,
      ∇q and λ are then those of one process holding the whole global batch, identical on every rank;
    - the other methods are linear in the items (``SummedGradientStrategy``): each micro-batch's gradient is
      added to a buffer and the buffer is summed over processes (``_all_reduce_sum``, one collective) at the
      window's last micro-batch;
    - the direction is then handed to the engine as the gradient of the linear surrogate
      ``Σ_p ⟨stopgrad(direction_p), p⟩`` through ``accelerator.backward``, once per optimizer step.
      Its gradient is exactly the direction, and the DDP optimizer / the DeepSpeed engine (which owns
      the gradients and partitions them under ZeRO) then clips and steps as for any loss; averaging an
      identical direction over ranks leaves it unchanged, so α and θ stay identical on every rank.

    Logging goes through the Trainer (main process); checkpoints are written by the main process.
    Under ZeRO-3 ``save_model`` needs ``stage3_gather_16bit_weights_on_model_save`` (accelerate:
    ``zero3_save_16bit_model: true``) so that the full adapter and α are gathered; the trainable
    parameters (LoRA adapters, α) must stay unpartitioned, i.e. below ``stage3_param_persistence_threshold``
    (default 1e5 elements, which LoRA matrices and the option-token α are) — the frozen base model is sharded.
    """

    _tag_names = ["trl", "sft", "calm", "hf-calibration"]
    _name = "CALM"
    _paper = {
        "title": "Beyond Post-Hoc Temperature Scaling: Bilevel Optimization for LLM Calibration",
        "id": "2608.07419",
        "citation": (
            "@article{jin2026calm,\n  title={Beyond Post-Hoc Temperature Scaling: Bilevel Optimization for LLM "
            "Calibration},\n  author={Jin, Ruochen and Wang, Zhanliang and Dai, Zongyu and Xiao, Jiancong and Hou, "
            "Bojian},\n  journal={arXiv preprint arXiv:2608.07419},\n  year={2026}\n}"
        ),
    }

    def __init__(self, model, args: CALMConfig | None = None, data_collator=None, train_dataset=None,
                 eval_dataset=None, processing_class=None, calibration_dataset=None, compute_metrics=None,
                 callbacks=None, optimizers=(None, None), peft_config=None, **kwargs):
        check_tested_versions("CALMTrainer")  # private Trainer/TRL internals below (hf_calibration._versions)
        if args is None:
            name = model if isinstance(model, str) else model.config._name_or_path
            args = CALMConfig(f"{str(name).split('/')[-1]}-CALM")
        if not isinstance(args, CALMConfig):
            raise TypeError(f"args: must be a CALMConfig, got {type(args).__name__}")
        strategy = STRATEGIES[args.method]
        if calibration_dataset is None and strategy.needs_calibration:
            raise ValueError(f"calibration_dataset: required for method={args.method!r} (S_V of SPEC §1), got None")
        if calibration_dataset is not None and "prompt" not in calibration_dataset.column_names:
            raise ValueError(
                f"calibration_dataset: needs a 'prompt' column, got columns {calibration_dataset.column_names!r}"
            )
        with warnings.catch_warnings(), peft_checkpointing_warning_silenced():  # PEFT builds its model in here
            # TRL 1.16 deprecates its own label smoothing (an extra full-logit forward pass) and says so whenever
            # label_smoothing_factor > 0; CALMTrainer never uses TRL's loss, it smooths the adjusted distribution
            # itself (``_cross_entropy``), so that one message, and only it, is silenced.
            warnings.filterwarnings("ignore", message=r"`label_smoothing_factor` is deprecated in `SFTTrainer`",
                                    category=FutureWarning)
            super().__init__(model, args=args, data_collator=data_collator, train_dataset=train_dataset,
                             eval_dataset=eval_dataset, processing_class=processing_class,
                             compute_metrics=compute_metrics, callbacks=callbacks, optimizers=optimizers,
                             peft_config=peft_config, **kwargs)
        self._strategy = strategy(self)
        self._setup_calm(calibration_dataset, compute_metrics)

    # ---- construction ------------------------------------------------------------------------

    def _setup_calm(self, calibration_dataset, compute_metrics):
        from hf_calibration.modeling import option_token_ids

        args, tok = self.args, self._tokenizer
        inner = self.model
        head = inner.get_output_embeddings().weight
        vocab = lm_head_vocab_size(inner)
        self._options = args.entropy_domain == "options"
        # the option letters' token ids: the distribution of 'options', and the evaluation metrics of either domain
        variants = option_token_ids(tok, args.num_options)
        self._variant_ids = torch.tensor([t for v in variants for t in v], dtype=torch.long)
        self._variant_letter = torch.tensor([k for k, v in enumerate(variants) for _ in v], dtype=torch.long)
        letter_of = torch.full((vocab,), -1, dtype=torch.long)
        letter_of[self._variant_ids] = self._variant_letter
        self._letter_of = letter_of
        if args.adjustment_token_ids is not None:
            token_ids = list(args.adjustment_token_ids)
            bad = [t for t in token_ids if not 0 <= t < vocab]
            if bad:
                raise ValueError(f"adjustment_token_ids: ids must lie in [0, {vocab}) for this model, got {bad[:5]!r}")
        else:
            coverage = args.entropy_domain if args.adjustment_tokens == "auto" else args.adjustment_tokens
            token_ids = self._variant_ids.tolist() if coverage == "options" else None
        adjustment = LogitAdjustment(vocab, token_ids, mode=args.adjustment_mode,
                                     parameterization=args.temperature_parameterization).to(head.device)
        adjustment.requires_grad_(self._strategy.trains_alpha)
        self.model = self.model_wrapped = CALMModel(inner, adjustment)
        # α index of every token id (−1: not covered), for applying α to gathered columns.
        index = torch.full((vocab,), -1, dtype=torch.long)
        covered = torch.arange(vocab) if token_ids is None else torch.tensor(token_ids, dtype=torch.long)
        index[covered] = torch.arange(len(covered))
        self._alpha_index = index.to(head.device)
        if self._options:
            self._check_option_targets(self.train_dataset, "train_dataset")
        # 'vocab' on multiple-choice data (every evaluation completion starts with an option letter): evaluation
        # also reports the letter metrics, read from the adjusted vocabulary distribution at the answer position
        self._eval_letters = self._options or self._starts_with_letters(self.eval_dataset)
        self._variant_ids = self._variant_ids.to(head.device)
        self._variant_letter = self._variant_letter.to(head.device)
        self._letter_of = self._letter_of.to(head.device)
        self.calibration_dataset = None
        if calibration_dataset is not None:
            self.calibration_dataset = self._prepare_calibration(calibration_dataset)
        if compute_metrics is None and self._eval_letters:
            self.compute_metrics = self._calibration_metrics
        self._micro_step = 0
        self._window: dict | None = None  # the optimizer step's item counts and S_V batches (``_open_window``)

    def _check_option_targets(self, dataset, name):
        from hf_calibration.modeling import LETTERS

        highest = 0
        for i, labels in enumerate(dataset["labels"]):
            first = _first_target(labels)
            if first is None or self._letter_of[first] < 0:
                text = None if first is None else self._tokenizer.decode([first])
                raise ValueError(
                    f"{name}: example {i} has completion token {text!r}, not an option letter "
                    f"{sorted(set(self._tokenizer.decode([t]) for t in self._variant_ids.tolist()))}; "
                    "entropy_domain='options' needs completions that start with the answer letter"
                )
            highest = max(highest, int(self._letter_of[first]))
        k, n = self.args.num_options, len(dataset)
        # K larger than the data's option count is silent otherwise: H and L_tr then spread mass over letters
        # no question offers. Warn when gold letters drawn uniformly from K would almost surely (p < 1 %) have
        # reached a letter above the highest one seen.
        if highest + 1 < k and ((highest + 1) / k) ** n < 0.01:
            warnings.warn(
                f"{name}: all {n} targets are among the letters {LETTERS[0]}–{LETTERS[highest]}, but "
                f"num_options={k}: the entropy and L_tr run over {k} letters; set num_options to the questions' "
                f"option count (e.g. 2 for HaluEval QA)", UserWarning, stacklevel=3)

    def _starts_with_letters(self, datasets) -> bool:
        """Whether every example of the evaluation dataset(s) (a Dataset or a dict of them) has a completion that
        starts with an option letter."""
        if datasets is None:
            return False
        for dataset in (datasets.values() if isinstance(datasets, dict) else [datasets]):
            if "labels" not in dataset.column_names or len(dataset) == 0:
                return False
            for labels in dataset["labels"]:
                first = _first_target(labels)
                if first is None or self._letter_of[first] < 0:
                    return False
        return True

    def _prepare_calibration(self, dataset):
        # Prompt-only rows get a one-token dummy completion, so the answer position is the scored one.
        if "completion" not in dataset.column_names:
            eos = self._tokenizer.eos_token
            dataset = dataset.map(lambda row: {"completion": eos})
        dataset = dataset.select_columns(["prompt", "completion"])
        return self._prepare_dataset(dataset, self.processing_class, self.args, False, None, "calibration")

    # ---- optimizer: θ and α in two parameter groups -------------------------------------------

    def create_optimizer(self, model=None):
        if self.optimizer is not None:
            return self.optimizer
        calm = self._calm
        decay = set(self.get_decay_parameter_names(calm))
        groups = [
            {"params": [p for n, p in calm.named_parameters()
                        if p.requires_grad and not n.startswith(ALPHA_PREFIX) and n in decay],
             "weight_decay": self.args.weight_decay},
            {"params": [p for n, p in calm.named_parameters()
                        if p.requires_grad and not n.startswith(ALPHA_PREFIX) and n not in decay],
             "weight_decay": 0.0},
            {"params": [p for n, p in calm.named_parameters() if p.requires_grad and n.startswith(ALPHA_PREFIX)],
             "weight_decay": self.args.alpha_weight_decay, "lr": self.args.alpha_learning_rate},
        ]
        groups = [g for g in groups if g["params"]]
        if self.args.bome_optimizer == "trainer":
            optimizer_cls, optimizer_kwargs = self.get_optimizer_cls_and_kwargs(self.args, calm)
        else:  # BOME's own step u ← u − lr·d (Cranial-XIX/BOME: plain SGD in toy/, heavy-ball momentum 0.9 in hpo/)
            momentum = self.args.bome_momentum if self.args.bome_optimizer == "sgd_momentum" else 0.0
            optimizer_cls, optimizer_kwargs = torch.optim.SGD, {"lr": self.args.learning_rate, "momentum": momentum}
        self.optimizer = optimizer_cls(groups, **optimizer_kwargs)
        return self.optimizer

    # ---- the adjusted distribution ----------------------------------------------------------

    @property
    def _calm(self) -> CALMModel:
        return self.accelerator.unwrap_model(self.model, keep_torch_compile=False)

    def _parameters(self):
        theta, alpha = {}, {}
        for n, p in self._calm.named_parameters():
            if p.requires_grad:
                if hasattr(p, "ds_id") and not p.ds_persist:
                    raise ValueError(
                        f"stage3_param_persistence_threshold: ZeRO-3 partitions the trainable parameter {n!r} "
                        f"({p.ds_numel} elements); CALM needs the trainable parameters whole, raise the threshold "
                        "above their size (LoRA adapters are below the default 1e5)"
                    )
                if hasattr(p, "ds_id"):
                    # BOME reads θ and α outside module forwards (θ̃ = copy of θ; α applied to gathered logits):
                    # fetch them once and pin them (a submodule id no hook releases), so ZeRO-3's module hooks
                    # never partition them between forwards. They are persistent anyway (checked above).
                    if p.numel() == 0:
                        p.all_gather()
                    p.ds_active_sub_modules.add(_ZERO3_PIN)
                (alpha if n.startswith(ALPHA_PREFIX) else theta)[n] = p
        return alpha, theta

    def _scored_logits(self, batch):
        """Raw logits (N, V) float32 at the scored positions, the target ids (N,) and each one's row.

        Scored positions are those whose next token is labelled; with entropy_domain='options' only
        the first per sequence (the answer letter). Only those positions go through the LM head
        (``logits_to_keep`` with explicit indices). Uses the live parameters (``_LossAt`` evaluates at
        other values).
        """
        labels = batch["labels"]
        scored = labels[:, 1:] != -100
        if self._options:
            first = scored.int().argmax(dim=1)
            scored = torch.zeros_like(scored)
            scored[torch.arange(len(first), device=first.device), first] = True
        rows, cols = scored.nonzero(as_tuple=True)
        keep = torch.unique(cols)
        kwargs = {"input_ids": batch["input_ids"], "logits_to_keep": keep, "use_cache": False, "adjust_logits": False}
        for key in ("attention_mask", "position_ids"):
            if batch.get(key) is not None:
                kwargs[key] = batch[key]
        calm = self._calm
        with self.compute_loss_context_manager():
            out = calm(**kwargs)
        logits = out.logits[rows, torch.searchsorted(keep, cols)].float()
        return logits, labels[:, 1:][scored], rows

    def _log_probs(self, raw, alpha, *, options=None):
        """Log-probabilities of the adjusted distribution: (N, K) over options or (N, V) over the vocabulary
        (``options``: which of the two; default the entropy domain's)."""
        rho = alpha.get(ALPHA_PREFIX + "rho", self._calm.logit_adjustment.rho)
        shift = alpha.get(ALPHA_PREFIX + "shift", self._calm.logit_adjustment.shift)
        param = self.args.temperature_parameterization
        options = self._options if options is None else options
        if options:
            index = self._alpha_index[self._variant_ids]
            cols = raw.index_select(1, self._variant_ids)
        else:
            index = self._alpha_index
            cols = raw
        covered = index >= 0
        safe = index.clamp(min=0)
        r = rho[safe] if rho.numel() > 1 else rho.expand(safe.shape)
        r = torch.where(covered, r, torch.zeros_like(r))
        s = None if shift is None else torch.where(covered, shift[safe], torch.zeros_like(r))
        adjusted = adjust_logits(cols, r, s, param)
        if options:
            letters = torch.stack(
                [torch.logsumexp(adjusted[:, self._variant_letter == k], dim=1) for k in range(self.args.num_options)],
                dim=1,
            )
            return torch.log_softmax(letters, dim=1)
        return torch.log_softmax(adjusted, dim=1)

    def _targets(self, target_ids):
        return self._letter_of[target_ids] if self._options else target_ids

    def _cross_entropy(self, log_probs, targets):
        """Per-item cross-entropy (N,) of ``log_probs`` (N, C) at ``targets`` (N,), label-smoothed over the C."""
        nll = -log_probs.gather(1, targets[:, None]).squeeze(1)
        eps = self.args.label_smoothing_factor
        if eps > 0:  # label smoothing over the same distribution (options or vocabulary)
            nll = (1 - eps) * nll - eps * log_probs.mean(dim=1)
        return nll

    @staticmethod
    def _entropy(log_probs):
        return -(log_probs.exp() * log_probs).sum(dim=1)

    def _lower_value(self, batch, items):
        """``alpha -> Σ_items L_tr / items``: this batch's share of the window's L_tr (a 0-d float32 tensor)."""
        def value(alpha):
            raw, target_ids, _ = self._scored_logits(batch)
            return self._cross_entropy(self._log_probs(raw, alpha), self._targets(target_ids)).sum() / items

        return value

    def _upper_value(self, batch, items):
        """``alpha -> −Σ_items H / items``: this calibration batch's share of the window's f = −mean H."""
        def value(alpha):
            raw, _, _ = self._scored_logits(batch)
            return -self._entropy(self._log_probs(raw, alpha)).sum() / items

        return value

    # ---- calibration batches: a pure function of the step, so resuming replays them -------------

    def _calibration_batch(self, micro_step=None):
        """The S_V batch paired with micro-batch ``micro_step`` (default: the current one) of this optimizer step."""
        data = self.calibration_dataset
        size = self.args.calibration_batch_size or self.args.per_device_train_batch_size
        micro_step = self._micro_step if micro_step is None else micro_step
        counter = self.state.global_step * self.args.gradient_accumulation_steps + micro_step
        n = len(data)
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        start = (counter * world + rank) * size
        rows = []
        for g in range(start, start + size):
            epoch, pos = divmod(g, n)
            perm = np.random.default_rng([self.args.seed, epoch]).permutation(n)
            rows.append(data[int(perm[pos])])
        batch = self.data_collator([{k: r[k] for k in ("input_ids", "labels")} for r in rows])
        return self._prepare_inputs(batch)

    # ---- the optimizer step's items: counted over the accumulation window and all processes ----

    def _num_items(self, batch) -> int:
        """Scored positions of a batch: examples with a label (options) or labelled next tokens (vocab)."""
        scored = batch["labels"][:, 1:] != -100
        return int((scored.any(dim=1) if self._options else scored).sum())

    def _open_window(self, batches):
        """Start an optimizer step over ``batches`` (its micro-batches on this process): pair them with their
        calibration batches and count the items of both over all processes (one collective)."""
        needs_calibration = self.calibration_dataset is not None and self._strategy.needs_calibration
        calibration = [self._calibration_batch(i) for i in range(len(batches))] if needs_calibration else []
        counts = torch.tensor([sum(map(self._num_items, batches)), sum(map(self._num_items, calibration))],
                              dtype=torch.long, device=self.accelerator.device)
        world = self.accelerator.num_processes
        if world > 1:
            # transformers' rule: the count of all processes, or (average_tokens_across_devices=False) each
            # process's own, times the number of processes so that the sum over processes is their mean
            counts = self.accelerator.reduce(counts, reduction="sum") if self.args.average_tokens_across_devices \
                else counts * world
        train_items, calibration_items = (max(int(c), 1) for c in counts.cpu())
        self._window = {"train_items": train_items, "calibration_items": calibration_items, "calibration": calibration}
        self._micro_step = 0
        self._strategy.start_window()

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        # Trainer's hook before each optimizer step (public): CALM counts its own items, per entropy domain and
        # for S_V too, where transformers counts labelled tokens of S_T only and only for some models.
        batch_samples, _ = super().get_batch_samples(epoch_iterator, num_batches, device)
        self._open_window(batch_samples)
        return batch_samples, self._window["train_items"]

    # ---- the training step ------------------------------------------------------------------

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """L_tr of the adjusted distribution on ``inputs``: the item mean, or with ``num_items_in_batch`` the item
        sum divided by it (training goes through ``training_step``)."""
        raw, target_ids, _ = self._scored_logits(inputs)
        nll = self._cross_entropy(self._log_probs(raw, {}), self._targets(target_ids))
        loss = nll.mean() if num_items_in_batch is None else nll.sum() / num_items_in_batch
        return (loss, None) if return_outputs else loss

    def training_step(self, model, inputs, num_items_in_batch=None):
        """One micro-batch of the optimizer step that ``get_batch_samples`` opened; the update is formed at its last.

        Each loss is this micro-batch's item sum over the window's item count (class docstring). Called outside
        the Trainer's loop (no window open), ``inputs`` is a window of its own. Returns, at the window's last
        micro-batch, L_tr of the whole global batch (identical on every rank), else 0, so that the Trainer's
        logged ``loss`` is L_tr per optimizer step.
        """
        model.train()
        if hasattr(self.optimizer, "train") and callable(self.optimizer.train):
            self.optimizer.train()
        inputs = self._prepare_inputs(inputs)
        if self._window is None:
            self._open_window([inputs])
        alpha, theta = self._parameters()
        with self.maybe_activation_offload_context:
            self._strategy.micro_batch(inputs, self._micro_step, alpha, theta)
            if not self.accelerator.sync_gradients:
                self._micro_step += 1
                return torch.zeros((), device=self.args.device)
            direction, logs = self._strategy.direction(alpha, theta)
            self._window, self._micro_step = None, 0
            for key, value in logs.items():
                self._metrics["train"][key].append(float(value))
            self._backward_direction(direction, alpha, theta)
        return logs["lower_loss"].detach().float().to(self.args.device)

    def _all_reduce_sum(self, tensors: dict) -> dict:
        """Sum over processes of every tensor, in place, with one float32 collective (a no-op on one process).

        The gradients come from ``torch.autograd.grad``, so neither DDP nor DeepSpeed reduced them; they are
        already divided by the global item count, so their sum is the global batch's.
        """
        if self.accelerator.num_processes > 1 and tensors:
            import torch.distributed as dist

            values = list(tensors.values())
            flat = torch.cat([t.reshape(-1).float() for t in values])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            for t, part in zip(values, flat.split([t.numel() for t in values])):
                t.copy_(part.view_as(t))
        return tensors

    def _backward_direction(self, direction, alpha, theta):
        """Backpropagate the update direction (name → tensor) as a surrogate loss, once per optimizer step."""
        self._metrics["train"]["mean_temperature"].append(float(self._calm.logit_adjustment.temperature.detach().mean()))
        params = {**theta, **alpha}
        # d/dp Σ⟨stopgrad(d), p⟩ = d exactly: the engine receives ∇f + λ∇q as the gradient of a loss, so
        # gradient scaling (fp16), ZeRO's gradient partitioning, clipping and the step stay the engine's.
        # Parameters without a direction (the resting group of method='iterate') get no gradient at all.
        surrogate = sum((direction[n].to(p.dtype).detach() * p).sum() for n, p in params.items() if n in direction)
        kwargs = {"scale_wrt_gas": False} if self.accelerator.distributed_type == DistributedType.DEEPSPEED else {}
        self.accelerator.backward(surrogate, **kwargs)

    # ---- CFT's bin accuracies and counts (Xiao et al. ICML 2025; ``CFTStrategy``) -------------

    @torch.no_grad()
    def _cft_bin_statistics(self):
        """(accuracy, count), each (cft_num_bins,) float32: the accuracy (bin centre if empty) and the number of
        items of each equal-width confidence bin in a pass over the training data.

        Under several processes each one scores its shard of the data, and the hits and counts are summed
        across processes before dividing, so every rank gets the accuracies of the whole training set
        (accelerate's even batches may repeat a few examples to fill the last batch).
        """
        bins = self.args.cft_num_bins
        hits, counts = torch.zeros(bins), torch.zeros(bins)
        was_training = self.model.training
        self.model.eval()
        for batch in self.get_train_dataloader():
            batch = self._prepare_inputs(batch)
            raw, target_ids, _ = self._scored_logits(batch)
            probs = self._log_probs(raw, {}).exp()
            conf, pred = probs.max(dim=1)
            b = _confidence_bins(conf, bins).cpu()
            hits.index_add_(0, b, (pred == self._targets(target_ids)).float().cpu())
            counts.index_add_(0, b, torch.ones_like(b, dtype=torch.float))
        if self.accelerator.num_processes > 1:
            both = torch.stack([hits, counts]).to(self.accelerator.device)
            hits, counts = self.accelerator.reduce(both, reduction="sum").cpu()
        self.model.train(was_training)
        centres = (torch.arange(bins) + 0.5) / bins
        return torch.where(counts > 0, hits / counts.clamp(min=1), centres), counts

    # ---- evaluation ---------------------------------------------------------------------------

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad():
            raw, target_ids, rows = self._scored_logits(inputs)
            log_probs = self._log_probs(raw, {})
            targets = self._targets(target_ids)
            loss = self._cross_entropy(log_probs, targets).mean()
            if prediction_loss_only or not self._eval_letters:
                return loss, None, None
            if self._options:
                return loss, log_probs.exp(), targets
            # 'vocab': the answer letter is each row's first scored position (rows come sorted); its letter
            # distribution is the adjusted vocabulary distribution's mass on each letter's variants, renormalised
            _, counts = torch.unique_consecutive(rows, return_counts=True)
            first = torch.cumsum(counts, 0) - counts
            letters = self._log_probs(raw[first], {}, options=True)
            return loss, letters.exp(), self._letter_of[target_ids[first]]

    def _calibration_metrics(self, prediction):
        from hf_calibration.metrics import classwise_ece, expected_calibration_error, negative_log_likelihood

        probs = np.asarray(prediction.predictions, dtype=np.float64)
        labels = np.asarray(prediction.label_ids).astype(int)
        n_bins = self.args.eval_num_bins
        return {
            "accuracy": float((probs.argmax(1) == labels).mean()),
            "mean_confidence": float(probs.max(1).mean()),
            "conf_ece": float(expected_calibration_error(labels, probs, n_bins=n_bins)),
            "cw_ece": float(classwise_ece(labels, probs, n_bins=n_bins)),
            "nll": float(negative_log_likelihood(labels, probs)),
        }

    # ---- saving, loading, resuming -------------------------------------------------------------

    # private Trainer override: saves the CALMModel (adapter or model, and α) and the CALM model card, not the
    # Trainer's model alone
    def _save(self, output_dir=None, state_dict=None):
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        if not self.args.should_save:
            return
        os.makedirs(output_dir, exist_ok=True)
        self._calm.save_pretrained(output_dir, state_dict=state_dict)
        if self.processing_class is not None:
            self.processing_class.save_pretrained(output_dir)
        torch.save(self.args, os.path.join(output_dir, "training_args.bin"))
        self._write_model_card(output_dir)

    # private Trainer override: Trainer loads model.safetensors / a PEFT adapter only, not α next to it
    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        if not (Path(resume_from_checkpoint) / ADJUSTMENT_WEIGHTS_NAME).is_file():
            raise ValueError(f"resume_from_checkpoint: {resume_from_checkpoint!r} has no {ADJUSTMENT_WEIGHTS_NAME}")
        self._calm.load_calibration(resume_from_checkpoint)

    # private Trainer override: the only hook that knows the checkpoint folder, for the method's own state (CFT's
    # bin accuracies)
    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if self.args.should_save:
            from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

            folder = Path(self._get_output_dir(trial=trial)) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            self._strategy.save_state(folder)

    # private Trainer override: runs on every resume and backend (DDP, DeepSpeed), so the method's own state loads here
    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None:
            self._strategy.load_state(Path(checkpoint))

    # private Trainer override: Trainer's version reloads the wrapped model's weights only, not α
    def _load_best_model(self):
        self._calm.load_calibration(self.state.best_model_checkpoint)

    def _write_model_card(self, output_dir):
        """TRL's model card (method, paper, citation) plus the CALM config and the last measured eval metrics."""
        card_path = Path(self.args.output_dir) / "README.md"  # where TRL writes its card
        self.create_model_card(model_name=Path(output_dir).name)
        if not card_path.is_file():
            return
        text = card_path.read_text(encoding="utf-8")
        keys = ("method", "inner_steps", "inner_learning_rate", "eta", "phi_rule", "bome_epsilon", "bome_optimizer",
                "bome_momentum", "max_grad_norm", "cft_weight", "cft_coefficient", "cft_target", "cft_normalization",
                "cft_num_bins", "cft_refresh_steps", "alpha_learning_rate",
                "alpha_weight_decay", "adjustment_mode", "temperature_parameterization", "adjustment_tokens",
                "entropy_domain", "num_options", "regularization_beta", "label_smoothing_factor", "learning_rate",
                "max_steps", "num_train_epochs", "per_device_train_batch_size", "seed")
        config = {k: getattr(self.args, k) for k in keys}
        evals = [e for e in self.state.log_history if "eval_loss" in e]
        lines = [
            "", "## CALM calibration", "",
            f"Trained with `hf_calibration.calm.CALMTrainer`, method `{self.args.method}` (CALM = 'bome'; paper: "
            "[arXiv 2608.07419](https://arxiv.org/abs/2608.07419)). The logit adjustment is in "
            "`logit_adjustment.safetensors` / `logit_adjustment_config.json`; load with "
            "`hf_calibration.calm.CALMModel.from_pretrained(folder)`.", "",
            "Config:", "", "```json", json.dumps(config, indent=2, default=str), "```", "",
        ]
        if evals:
            lines += ["Last evaluation:", "", "```json", json.dumps(evals[-1], indent=2, default=str), "```", ""]
        (Path(output_dir) / "README.md").write_text(text + "\n".join(lines), encoding="utf-8")
