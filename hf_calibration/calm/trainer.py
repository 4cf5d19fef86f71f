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

from hf_calibration.calm.bome import bome_direction, bome_lambda, bome_terms
from hf_calibration.calm.config import CALMConfig
from hf_calibration.calm.logit_adjustment import (
    ADJUSTMENT_WEIGHTS_NAME,
    CALMModel,
    LogitAdjustment,
    adjust_logits,
    lm_head_vocab_size,
    peft_checkpointing_warning_silenced,
)

ALPHA_PREFIX = "logit_adjustment."
# CFT's bin accuracies in a checkpoint: training state (like the optimizer's), not part of the saved model.
CFT_STATE_NAME = "cft_state.safetensors"
_NEEDS_CALIBRATION = ("bome", "iterate", "regularization", "scalar")
_ZERO3_PIN = -1  # DeepSpeed submodule ids are >= 0


class _LossAt(torch.autograd.Function):
    """A loss of the live model evaluated at given parameter values, with its first-order gradient precomputed.

    ``forward(trainer, value, alpha_names, theta_names, reduce, *alpha_values, *theta_values)``: the live
    trainable θ temporarily hold ``theta_values`` (their ``.data`` is swapped, so the modules, and
    DeepSpeed ZeRO-3's hooks on them, see the same parameter objects; ``torch.func.functional_call``
    would put plain tensors in their place, which ZeRO-3 cannot fetch), ``value(alpha)`` is evaluated
    and differentiated with ``torch.autograd.grad`` w.r.t. the inputs that require grad, and the data
    are restored. With ``reduce`` the θ gradients are averaged over processes before they are stored.
    ``backward`` returns the stored gradients times the incoming scalar gradient (first order only).
    """

    @staticmethod
    def forward(ctx, trainer, value, alpha_names, theta_names, reduce, *values):
        alpha = dict(zip(alpha_names, values[:len(alpha_names)]))
        theta = dict(zip(theta_names, values[len(alpha_names):]))
        live = trainer._parameters()[1]
        alpha_in = {n: a.detach().requires_grad_(a.requires_grad) for n, a in alpha.items()}
        wrt = [alpha_in[n] for n, a in alpha.items() if a.requires_grad] + \
              [live[n] for n, t in theta.items() if t.requires_grad]
        held = {n: live[n].data for n, t in theta.items() if t is not live[n]}
        try:
            for n in held:
                live[n].data = theta[n].detach()
            with torch.enable_grad():
                out = value(alpha_in)
                grads = list(torch.autograd.grad(out, wrt, allow_unused=True)) if wrt else []
        finally:
            for n, data in held.items():
                live[n].data = data
        grads = [torch.zeros_like(w) if g is None else g for g, w in zip(grads, wrt)]
        n_alpha = sum(a.requires_grad for a in alpha.values())
        if reduce:
            trainer._all_reduce_mean(dict(enumerate(grads[n_alpha:])))
        ctx.wants = [v.requires_grad for v in values]
        ctx.save_for_backward(*grads)
        return out.detach()

    @staticmethod
    def backward(ctx, grad_out):
        grads = iter(ctx.saved_tensors)
        return (None,) * 5 + tuple(grad_out * next(grads) if want else None for want in ctx.wants)


class CALMTrainer(SFTTrainer):
    """Supervised fine-tuning with a learned logit adjustment trained by first-order bilevel optimisation.

    Jin, Wang, Dai, Xiao, Hou, "Beyond Post-Hoc Temperature Scaling: Bilevel Optimization for LLM
    Calibration" (arXiv 2608.07419): the lower level fits θ (LoRA or all weights) by the cross-entropy
    L_tr of the adjusted distribution on ``train_dataset`` (S_T); the upper level maximises the
    entropy H of the adjusted distribution on ``calibration_dataset`` (S_V, no labels used). Each
    optimizer step is the BOME update of ``hf_calibration.calm.bome`` over u = (α, θ); the ablations
    and baselines of ``CALMConfig.method`` share the same data path, so one config runs the paper's
    whole comparison.

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
    TypeError when ``args`` is not a ``CALMConfig``.

    Logged per step (train): ``lower_loss`` (L_tr), ``residual_q``, ``bome_lambda``, ``calibration_entropy``
    (H on S_V), ``mean_temperature``; at evaluation: ``eval_accuracy``, ``eval_conf_ece``, ``eval_cw_ece``,
    ``eval_mean_confidence``.

    Distributed training (``accelerate launch``: DDP, DeepSpeed ZeRO-2/3; see docs/distributed.md).
    BOME needs whole gradients before the step (λ is a ratio of inner products over all parameters), so
    the per-batch pieces come from ``torch.autograd.grad`` and are reduced explicitly, not by DDP's or
    DeepSpeed's backward hooks:

    - every inner-step gradient ∇_θ L(α, θ̃) is averaged over processes before the inner step (a
      ``_LossAt`` evaluation of L_tr), so θ̃ is the same on every rank and equals the θ̃ of
      one process holding the whole global batch;
    - ∇f, ∇q (both parameter groups, α and θ, alike) and q are summed over gradient-accumulation
      micro-batches (each scaled by 1/steps) and averaged over processes (``_all_reduce_mean``, one
      collective) before λ, so λ and the direction ∇f + λ∇q are computed from the global batch and are
      identical on every rank;
    - the direction is then handed to the engine as the gradient of the linear surrogate
      ``Σ_p ⟨stopgrad(direction_p), p⟩`` through ``accelerator.backward``, once per optimizer step.
      Its gradient is exactly the direction, and the DDP optimizer / the DeepSpeed engine (which owns
      the gradients and partitions them under ZeRO) then clips and steps as for any loss; averaging an
      identical direction over ranks leaves it unchanged, so α and θ stay identical on every rank.

    The per-rank batch must have the same number of scored positions on every rank for the mean over
    processes to equal the global-batch mean (true for MCQA, one answer letter per example).
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
        if args is None:
            name = model if isinstance(model, str) else model.config._name_or_path
            args = CALMConfig(f"{str(name).split('/')[-1]}-CALM")
        if not isinstance(args, CALMConfig):
            raise TypeError(f"args: must be a CALMConfig, got {type(args).__name__}")
        if calibration_dataset is None and args.method in _NEEDS_CALIBRATION:
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
        self._setup_calm(calibration_dataset, compute_metrics)

    # ---- construction ------------------------------------------------------------------------

    def _setup_calm(self, calibration_dataset, compute_metrics):
        from hf_calibration.modeling import option_token_ids

        args, tok = self.args, self._tokenizer
        inner = self.model
        head = inner.get_output_embeddings().weight
        vocab = lm_head_vocab_size(inner)
        self._options = args.entropy_domain == "options"
        if self._options:
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
            if coverage == "options":
                if not self._options:
                    variants = option_token_ids(tok, args.num_options)
                    token_ids = [t for v in variants for t in v]
                else:
                    token_ids = self._variant_ids.tolist()
            else:
                token_ids = None
        adjustment = LogitAdjustment(vocab, token_ids, mode=args.adjustment_mode,
                                     parameterization=args.temperature_parameterization).to(head.device)
        adjustment.requires_grad_(args.trains_alpha)
        self.model = self.model_wrapped = CALMModel(inner, adjustment)
        # α index of every token id (−1: not covered), for applying α to gathered columns.
        index = torch.full((vocab,), -1, dtype=torch.long)
        covered = torch.arange(vocab) if token_ids is None else torch.tensor(token_ids, dtype=torch.long)
        index[covered] = torch.arange(len(covered))
        self._alpha_index = index.to(head.device)
        if self._options:
            self._check_option_targets(self.train_dataset, "train_dataset")
            self._variant_ids = self._variant_ids.to(head.device)
            self._variant_letter = self._variant_letter.to(head.device)
            self._letter_of = self._letter_of.to(head.device)
        self.calibration_dataset = None
        if calibration_dataset is not None:
            self.calibration_dataset = self._prepare_calibration(calibration_dataset)
        if compute_metrics is None and self._options:
            self.compute_metrics = self._calibration_metrics
        self._buffers: dict[str, dict[str, torch.Tensor]] = {}
        self._micro_step = 0
        self._cft_bin_accuracy = None

    def _check_option_targets(self, dataset, name):
        from hf_calibration.modeling import LETTERS

        highest = 0
        for i, labels in enumerate(dataset["labels"]):
            first = next((t for t in labels[1:] if t != -100), None)
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
        optimizer_cls, optimizer_kwargs = self.get_optimizer_cls_and_kwargs(self.args, calm)
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

    def _log_probs(self, raw, alpha):
        """Log-probabilities of the adjusted distribution: (N, K) over options or (N, V) over the vocabulary."""
        rho = alpha.get(ALPHA_PREFIX + "rho", self._calm.logit_adjustment.rho)
        shift = alpha.get(ALPHA_PREFIX + "shift", self._calm.logit_adjustment.shift)
        param = self.args.temperature_parameterization
        if self._options:
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
        if self._options:
            letters = torch.stack(
                [torch.logsumexp(adjusted[:, self._variant_letter == k], dim=1) for k in range(self.args.num_options)],
                dim=1,
            )
            return torch.log_softmax(letters, dim=1)
        return torch.log_softmax(adjusted, dim=1)

    def _targets(self, target_ids):
        return self._letter_of[target_ids] if self._options else target_ids

    def _cross_entropy(self, log_probs, targets):
        nll = -log_probs.gather(1, targets[:, None]).squeeze(1)
        eps = self.args.label_smoothing_factor
        if eps > 0:  # label smoothing over the same distribution (options or vocabulary)
            nll = (1 - eps) * nll - eps * log_probs.mean(dim=1)
        return nll.mean()

    @staticmethod
    def _entropy(log_probs):
        return -(log_probs.exp() * log_probs).sum(dim=1)

    def _at(self, value, reduce=False):
        """``value(alpha)`` (a loss at the live parameters) as a function ``(alpha, theta) -> loss`` of both groups.

        At the live θ without reduction this is a plain autograd graph; otherwise ``_LossAt`` evaluates it
        at ``theta`` and (``reduce``) averages its θ gradient over processes.
        """
        def loss(alpha, theta):
            live = self._parameters()[1]
            if not reduce and all(t is live[n] for n, t in theta.items()):
                return value(alpha)
            return _LossAt.apply(self, value, tuple(alpha), tuple(theta), reduce, *alpha.values(), *theta.values())

        return loss

    def _lower_loss(self, batch, mean_over_processes=False):
        def value(alpha):
            raw, target_ids, _ = self._scored_logits(batch)
            return self._cross_entropy(self._log_probs(raw, alpha), self._targets(target_ids))

        return self._at(value, reduce=mean_over_processes and self.accelerator.num_processes > 1)

    def _upper_loss(self, batch):
        def value(alpha):
            raw, _, _ = self._scored_logits(batch)
            return -self._entropy(self._log_probs(raw, alpha)).mean()

        return self._at(value)

    # ---- calibration batches: a pure function of the step, so resuming replays them -------------

    def _calibration_batch(self):
        data = self.calibration_dataset
        size = self.args.calibration_batch_size or self.args.per_device_train_batch_size
        counter = self.state.global_step * self.args.gradient_accumulation_steps + self._micro_step
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

    # ---- the training step ------------------------------------------------------------------

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """L_tr of the adjusted distribution (used for evaluation; training goes through ``training_step``)."""
        raw, target_ids, _ = self._scored_logits(inputs)
        loss = self._cross_entropy(self._log_probs(raw, {}), self._targets(target_ids))
        return (loss, None) if return_outputs else loss

    def training_step(self, model, inputs, num_items_in_batch=None):
        model.train()
        if hasattr(self.optimizer, "train") and callable(self.optimizer.train):
            self.optimizer.train()
        inputs = self._prepare_inputs(inputs)
        alpha, theta = self._parameters()
        args = self.args
        scale = 1.0 / getattr(self, "current_gradient_accumulation_steps", args.gradient_accumulation_steps)
        method = args.method
        logs = {}
        with self.maybe_activation_offload_context:
            if method in ("bome", "scalar"):
                terms = bome_terms(self._lower_loss(inputs, mean_over_processes=True),
                                   self._upper_loss(self._calibration_batch()), alpha, theta,
                                   inner_steps=args.inner_steps, inner_learning_rate=args.inner_learning_rate)
                self._accumulate("grad_f", terms.grad_f, scale)
                self._accumulate("grad_q", terms.grad_q, scale)
                self._accumulate("q", {"q": terms.q}, scale)
                lower, logs["residual_q"], logs["calibration_entropy"] = terms.lower, terms.q, -terms.upper
            else:
                if method == "iterate":
                    lower, total, params = self._iterate_loss(inputs, alpha, theta, logs)
                else:
                    lower = self._lower_loss(inputs)(alpha, theta)
                    total, params = lower, {**theta, **alpha}
                if method == "regularization":
                    upper = self._upper_loss(self._calibration_batch())(alpha, theta)
                    logs["calibration_entropy"] = -upper.detach()
                    total = lower + args.regularization_beta * upper
                elif method == "cft":
                    total = (1 - args.cft_weight) * lower + args.cft_weight * args.cft_coefficient * self._cft_term(inputs)
                grads = torch.autograd.grad(total, list(params.values()), allow_unused=True)
                self._accumulate("grad", {n: torch.zeros_like(p) if g is None else g
                                          for (n, p), g in zip(params.items(), grads)}, scale)
        logs["lower_loss"] = lower.detach()
        for key, value in logs.items():
            self._metrics["train"][key].append(self.accelerator.gather_for_metrics(value.reshape(1)).mean().item())
        if self.accelerator.sync_gradients:
            self._backward_direction(alpha, theta)
            self._micro_step = 0
        else:
            self._micro_step += 1
        return (lower.detach() * scale).to(self.args.device)

    def _iterate_loss(self, inputs, alpha, theta, logs):
        """method='iterate': optimizer steps alternate, a θ step on L_tr then an α step on −H (SPEC §1 ablation).

        Even optimizer steps differentiate L_tr w.r.t. θ only; odd steps differentiate −H on a calibration
        batch w.r.t. α only, at the θ the previous step produced. The resting group's ``.grad`` stays None,
        so the optimizer skips it (no momentum, no weight decay): each step moves one group. L_tr of the
        training batch is still evaluated on α steps (no gradient), so ``loss`` is L_tr at every step.
        Returns (L_tr, the loss to differentiate, the parameters it is differentiated with respect to).
        """
        if self.state.global_step % 2 == 0:
            lower = self._lower_loss(inputs)(alpha, theta)
            return lower, lower, theta
        with torch.no_grad():
            lower = self._lower_loss(inputs)(alpha, theta)
        upper = self._upper_loss(self._calibration_batch())(alpha, theta)
        logs["calibration_entropy"] = -upper.detach()
        return lower, upper, alpha

    def _accumulate(self, key, grads, scale):
        buf = self._buffers.setdefault(key, {})
        for n, g in grads.items():
            g = g.detach() * scale
            buf[n] = g if n not in buf else buf[n] + g

    def _all_reduce_mean(self, tensors: dict) -> dict:
        """Mean over processes of every tensor, in place, with one collective (a no-op on one process).

        The gradients come from ``torch.autograd.grad``, so neither DDP nor DeepSpeed averaged them.
        """
        if self.accelerator.num_processes > 1 and tensors:
            import torch.distributed as dist

            values = list(tensors.values())
            flat = torch.cat([t.reshape(-1).float() for t in values])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            flat /= self.accelerator.num_processes
            for t, part in zip(values, flat.split([t.numel() for t in values])):
                t.copy_(part.view_as(t))
        return tensors

    def _backward_direction(self, alpha, theta):
        """Reduce the accumulated pieces, form the update direction and backpropagate it as a surrogate loss."""
        args = self.args
        buffers, self._buffers = self._buffers, {}
        if "grad" in buffers:
            direction = self._all_reduce_mean(buffers["grad"])
        else:
            pieces = self._all_reduce_mean({**{("f", n): g for n, g in buffers["grad_f"].items()},
                                            **{("q", n): g for n, g in buffers["grad_q"].items()},
                                            ("q", None): buffers["q"]["q"].reshape(1)})
            grad_f = {n: pieces[("f", n)] for n in buffers["grad_f"]}
            grad_q = {n: pieces[("q", n)] for n in buffers["grad_q"]}
            lam = bome_lambda(grad_f, grad_q, pieces[("q", None)][0], eta=args.eta, phi_rule=args.phi_rule,
                              epsilon=args.bome_epsilon)
            direction = bome_direction(grad_f, grad_q, lam)
            self._metrics["train"]["bome_lambda"].append(float(lam))
        self._metrics["train"]["mean_temperature"].append(float(self._calm.logit_adjustment.temperature.detach().mean()))
        params = {**theta, **alpha}
        # d/dp Σ⟨stopgrad(d), p⟩ = d exactly: the engine receives ∇f + λ∇q as the gradient of a loss, so
        # gradient scaling (fp16), ZeRO's gradient partitioning, clipping and the step stay the engine's.
        # Parameters without a direction (the resting group of method='iterate') get no gradient at all.
        surrogate = sum((direction[n].to(p.dtype).detach() * p).sum() for n, p in params.items() if n in direction)
        kwargs = {"scale_wrt_gas": False} if self.accelerator.distributed_type == DistributedType.DEEPSPEED else {}
        self.accelerator.backward(surrogate, **kwargs)

    # ---- CFT (Xiao et al. ICML 2025) ----------------------------------------------------------

    def _cft_term(self, batch):
        """Mean over the batch of (max-conf − bin acc)² + Σ_non-max (p − (1 − bin acc)/(K − 1))²."""
        if self._cft_bin_accuracy is None or (self._micro_step == 0 and self.state.global_step > 0
                                              and self.state.global_step % self.args.cft_refresh_steps == 0):
            self._cft_bin_accuracy = self._cft_bin_accuracies()
        raw, target_ids, _ = self._scored_logits(batch)
        probs = self._log_probs(raw, {}).exp()
        conf, pred = probs.max(dim=1)
        bins = self.args.cft_num_bins
        b = torch.clamp((conf.detach() * bins).long(), max=bins - 1)
        acc = self._cft_bin_accuracy.to(conf.device)[b]
        k = probs.shape[1]
        target = ((1 - acc) / (k - 1))[:, None]
        non_max = torch.ones_like(probs, dtype=torch.bool).scatter_(1, pred[:, None], False)
        term = (conf - acc) ** 2 + ((probs - target) ** 2 * non_max).sum(dim=1)
        return term.mean()

    @torch.no_grad()
    def _cft_bin_accuracies(self):
        """Accuracy per equal-width confidence bin from a pass over the training data (bin centre if empty).

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
            b = torch.clamp((conf * bins).long(), max=bins - 1).cpu()
            hits.index_add_(0, b, (pred == self._targets(target_ids)).float().cpu())
            counts.index_add_(0, b, torch.ones_like(b, dtype=torch.float))
        if self.accelerator.num_processes > 1:
            both = torch.stack([hits, counts]).to(self.accelerator.device)
            hits, counts = self.accelerator.reduce(both, reduction="sum").cpu()
        self.model.train(was_training)
        centres = (torch.arange(bins) + 0.5) / bins
        return torch.where(counts > 0, hits / counts.clamp(min=1), centres)

    # ---- evaluation ---------------------------------------------------------------------------

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad():
            raw, target_ids, _ = self._scored_logits(inputs)
            log_probs = self._log_probs(raw, {})
            targets = self._targets(target_ids)
            loss = self._cross_entropy(log_probs, targets)
        if prediction_loss_only or not self._options:
            return loss, None, None
        return loss, log_probs.exp(), targets

    def _calibration_metrics(self, prediction):
        from hf_calibration.metrics import classwise_ece, expected_calibration_error

        probs = np.asarray(prediction.predictions, dtype=np.float64)
        labels = np.asarray(prediction.label_ids).astype(int)
        n_bins = self.args.eval_num_bins
        return {
            "accuracy": float((probs.argmax(1) == labels).mean()),
            "mean_confidence": float(probs.max(1).mean()),
            "conf_ece": float(expected_calibration_error(labels, probs, n_bins=n_bins)),
            "cw_ece": float(classwise_ece(labels, probs, n_bins=n_bins)),
        }

    # ---- saving, loading, resuming -------------------------------------------------------------

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

    def _load_calm_weights(self, folder):
        from safetensors.torch import load_file

        calm = self._calm
        folder = Path(folder)
        adapter = folder / "adapter_model.safetensors"
        if adapter.is_file():
            from peft import set_peft_model_state_dict

            set_peft_model_state_dict(calm.model, load_file(str(adapter)))
        else:
            calm.model.load_state_dict(load_file(str(folder / "model.safetensors")), strict=False)
        calm.logit_adjustment.load_state_dict(load_file(str(folder / ADJUSTMENT_WEIGHTS_NAME)), strict=False)

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        if not (Path(resume_from_checkpoint) / ADJUSTMENT_WEIGHTS_NAME).is_file():
            raise ValueError(f"resume_from_checkpoint: {resume_from_checkpoint!r} has no {ADJUSTMENT_WEIGHTS_NAME}")
        self._load_calm_weights(resume_from_checkpoint)

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if self._cft_bin_accuracy is not None and self.args.should_save:
            from safetensors.torch import save_file
            from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

            folder = Path(self._get_output_dir(trial=trial)) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            save_file({"bin_accuracy": self._cft_bin_accuracy.contiguous()}, str(folder / CFT_STATE_NAME))

    def _load_optimizer_and_scheduler(self, checkpoint):
        # Called on every resume, whatever the backend (DDP, DeepSpeed, one process), after the weights.
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None or self.args.method != "cft":
            return
        from safetensors.torch import load_file

        path = Path(checkpoint) / CFT_STATE_NAME
        if not path.is_file():
            raise ValueError(f"resume_from_checkpoint: {str(checkpoint)!r} has no {CFT_STATE_NAME}, the CFT bin "
                             "accuracies every method='cft' checkpoint holds; without them the run would not continue "
                             "as it began")
        accuracy = load_file(str(path))["bin_accuracy"]
        if accuracy.shape != (self.args.cft_num_bins,):
            raise ValueError(f"cft_num_bins: the checkpoint's CFT state has {accuracy.numel()} bins, "
                             f"got cft_num_bins={self.args.cft_num_bins}")
        self._cft_bin_accuracy = accuracy

    def _load_best_model(self):
        self._load_calm_weights(self.state.best_model_checkpoint)

    def _write_model_card(self, output_dir):
        """TRL's model card (method, paper, citation) plus the CALM config and the last measured eval metrics."""
        card_path = Path(self.args.output_dir) / "README.md"  # where TRL writes its card
        self.create_model_card(model_name=Path(output_dir).name)
        if not card_path.is_file():
            return
        text = card_path.read_text(encoding="utf-8")
        keys = ("method", "inner_steps", "inner_learning_rate", "eta", "phi_rule", "bome_epsilon", "alpha_learning_rate",
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
