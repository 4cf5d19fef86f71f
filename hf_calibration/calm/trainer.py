"""``CALMTrainer``: ``trl.SFTTrainer`` whose optimizer steps are CALM's bilevel updates (docs/methods.md, 'CALM')."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import torch
from accelerate.utils import DistributedType
from trl import SFTTrainer

from hf_calibration.runtime.versions import check_tested_versions
from hf_calibration.calm.config import CALMConfig
from hf_calibration.calm.logit_adjustment import (
    ADJUSTMENT_WEIGHTS_NAME,
    CALMModel,
    LogitAdjustment,
    adjust_logits,
    lm_head_vocab_size,
)
from hf_calibration.calm.evaluation import calibration_metrics, model_card_section
from hf_calibration.calm.strategies import STRATEGIES
from hf_calibration.runtime.distributed import quiet_deepspeed_cpu_notice
from hf_calibration.integrations.hub import peft_checkpointing_warning_silenced

ALPHA_PREFIX = "logit_adjustment."
_ZERO3_PIN = -1  # DeepSpeed submodule ids are >= 0


def _first_target(labels) -> int | None:
    """The first labelled next-token id of one tokenised example (``labels`` shifted by one, −100 = unlabelled):
    its completion's first token, or None when nothing is labelled."""
    return next((t for t in labels[1:] if t != -100), None)


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
    outside the tested range of ``hf_calibration.runtime.versions`` (opt out: ``HF_CALIBRATION_SKIP_VERSION_CHECK=1``).

    Logged once per optimizer step (train), as values of the whole global batch: ``lower_loss`` (L_tr),
    ``residual_q``, ``bome_lambda``, ``calibration_entropy`` (H on S_V), ``cft_term``, ``mean_temperature``; at
    evaluation: ``eval_accuracy``, ``eval_conf_ece``, ``eval_cw_ece``, ``eval_nll``, ``eval_mean_confidence`` over
    the option letters (with ``entropy_domain="vocab"`` only when every evaluation completion starts with an option
    letter; the letter distribution is then the adjusted vocabulary distribution at the answer position,
    renormalised over the letters' token ids).

    Unit of averaging. Every token-level term (L_tr and q, label smoothing, the entropy H, and so their gradients
    ∇f, ∇q; CFT's term with ``cft_normalization="bin_count"`` is instead a sum over the step's items, each divided
    by its bin's count in the training data) is a mean over *items*, the scored positions: with
    ``entropy_domain="options"`` one per example (the answer letter: the paper's mean over x of H(f(·|x)) and the
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
      at its last one: L_tr and f are evaluated micro-batch by micro-batch (``strategies.BOMEStrategy``, one graph alive at
      a time) and their values and gradients summed over processes in one collective per evaluation. θ̃, q, ∇f,
      ∇q and λ are then those of one process holding the whole global batch, identical on every rank;
    - the other methods are linear in the items (``SummedGradientStrategy``): each micro-batch's gradient is
      added to a buffer and the buffer is summed over processes (``all_reduce_sum``, one collective) at the
      window's last micro-batch;
    - the direction is then handed to the engine as the gradient of the linear surrogate
      ``Σ_p ⟨stopgrad(direction_p), p⟩`` through ``accelerator.backward``, once per optimizer step.
      Its gradient is exactly the direction, and the DDP optimizer / the DeepSpeed engine (which owns
      the gradients and partitions them under ZeRO) then clips and steps as for any loss; averaging an
      identical direction over ranks leaves it unchanged, so α and θ stay identical on every rank.

    Strategy API (the extension point, ``hf_calibration.calm.strategies``): a ``CALMStrategy`` reads the trainer
    through these public members only: ``calm_parameters()`` → (α, θ) dicts; ``window`` → the open optimizer
    step's item counts and S_V batches; ``lower_value(batch, items)`` / ``upper_value(batch, items)`` → functions
    of α giving the batch's share of L_tr and of f = −H; ``scored_logits(batch)``, ``log_probs(raw, alpha)``,
    ``targets(target_ids)``; ``all_reduce_sum(tensors)`` (one summing collective); ``train_batches()`` (one pass
    over S_T); ``apply_direction`` (the direction to the engine); ``letter_token_ids``, ``letter_of_variant``,
    ``letter_of_token``, ``alpha_index`` (the token tables); and ``args``, ``state``, ``accelerator``, ``model``.

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
        check_tested_versions("CALMTrainer")  # private Trainer/TRL internals below (hf_calibration.runtime.versions)
        quiet_deepspeed_cpu_notice()  # before the Trainer imports DeepSpeed (which logs its CPU fallback as a warning)
        if args is None:
            name = model if isinstance(model, str) else model.config._name_or_path
            args = CALMConfig(f"{str(name).split('/')[-1]}-CALM")
        if not isinstance(args, CALMConfig):
            raise TypeError(f"args: must be a CALMConfig, got {type(args).__name__}")
        strategy = STRATEGIES[args.method]
        if calibration_dataset is None and strategy.needs_calibration:
            raise ValueError(f"calibration_dataset: required for method={args.method!r} (S_V, the calibration set), got None")
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
        self.strategy = strategy(self)
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
        self.letter_token_ids = torch.tensor([t for v in variants for t in v], dtype=torch.long)
        self.letter_of_variant = torch.tensor([k for k, v in enumerate(variants) for _ in v], dtype=torch.long)
        letter_of = torch.full((vocab,), -1, dtype=torch.long)
        letter_of[self.letter_token_ids] = self.letter_of_variant
        self.letter_of_token = letter_of
        if args.adjustment_token_ids is not None:
            token_ids = list(args.adjustment_token_ids)
            bad = [t for t in token_ids if not 0 <= t < vocab]
            if bad:
                raise ValueError(f"adjustment_token_ids: ids must lie in [0, {vocab}) for this model, got {bad[:5]!r}")
        else:
            coverage = args.entropy_domain if args.adjustment_tokens == "auto" else args.adjustment_tokens
            token_ids = self.letter_token_ids.tolist() if coverage == "options" else None
        adjustment = LogitAdjustment(vocab, token_ids, mode=args.adjustment_mode,
                                     parameterization=args.temperature_parameterization).to(head.device)
        adjustment.requires_grad_(self.strategy.trains_alpha)
        self.model = self.model_wrapped = CALMModel(inner, adjustment)
        # α index of every token id (−1: not covered), for applying α to gathered columns.
        index = torch.full((vocab,), -1, dtype=torch.long)
        covered = torch.arange(vocab) if token_ids is None else torch.tensor(token_ids, dtype=torch.long)
        index[covered] = torch.arange(len(covered))
        self.alpha_index = index.to(head.device)
        if self._options:
            self._check_option_targets(self.train_dataset, "train_dataset")
        # 'vocab' on multiple-choice data (every evaluation completion starts with an option letter): evaluation
        # also reports the letter metrics, read from the adjusted vocabulary distribution at the answer position
        self._eval_letters = self._options or self._starts_with_letters(self.eval_dataset)
        self.letter_token_ids = self.letter_token_ids.to(head.device)
        self.letter_of_variant = self.letter_of_variant.to(head.device)
        self.letter_of_token = self.letter_of_token.to(head.device)
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
            if first is None or self.letter_of_token[first] < 0:
                text = None if first is None else self._tokenizer.decode([first])
                raise ValueError(
                    f"{name}: example {i} has completion token {text!r}, not an option letter "
                    f"{sorted(set(self._tokenizer.decode([t]) for t in self.letter_token_ids.tolist()))}; "
                    "entropy_domain='options' needs completions that start with the answer letter"
                )
            highest = max(highest, int(self.letter_of_token[first]))
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
                if first is None or self.letter_of_token[first] < 0:
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
        calm = self.calm_model
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
    def calm_model(self) -> CALMModel:
        """The ``CALMModel`` being trained, unwrapped from DDP / DeepSpeed (``trainer.model`` may be wrapped)."""
        return self.accelerator.unwrap_model(self.model, keep_torch_compile=False)

    @property
    def window(self) -> dict | None:
        """The open optimizer step (strategy API): ``train_items`` and ``calibration_items``, the item counts of
        the whole global batch (S_T and S_V) that each micro-batch's loss is divided by, and ``calibration``, the
        S_V batches paired with this process's micro-batches; None between steps."""
        return self._window

    def train_batches(self):
        """The training data once, batch by batch, prepared for the model (strategy API: e.g. CFT's pass over
        S_T for its bin accuracies)."""
        for batch in self.get_train_dataloader():
            yield self._prepare_inputs(batch)

    def calm_parameters(self):
        """(α, θ): name → parameter of the trainable logit adjustment and of the trainable model weights
        (strategy API). Under ZeRO-3 the parameters are gathered and pinned, and a partitioned one is an error."""
        theta, alpha = {}, {}
        for n, p in self.calm_model.named_parameters():
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

    def scored_logits(self, batch):
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
        calm = self.calm_model
        with self.compute_loss_context_manager():
            out = calm(**kwargs)
        logits = out.logits[rows, torch.searchsorted(keep, cols)].float()
        return logits, labels[:, 1:][scored], rows

    def log_probs(self, raw, alpha, *, options=None):
        """Log-probabilities of the adjusted distribution: (N, K) over options or (N, V) over the vocabulary
        (``options``: which of the two; default the entropy domain's)."""
        rho = alpha.get(ALPHA_PREFIX + "rho", self.calm_model.logit_adjustment.rho)
        shift = alpha.get(ALPHA_PREFIX + "shift", self.calm_model.logit_adjustment.shift)
        param = self.args.temperature_parameterization
        options = self._options if options is None else options
        if options:
            index = self.alpha_index[self.letter_token_ids]
            cols = raw.index_select(1, self.letter_token_ids)
        else:
            index = self.alpha_index
            cols = raw
        covered = index >= 0
        safe = index.clamp(min=0)
        r = rho[safe] if rho.numel() > 1 else rho.expand(safe.shape)
        r = torch.where(covered, r, torch.zeros_like(r))
        s = None if shift is None else torch.where(covered, shift[safe], torch.zeros_like(r))
        adjusted = adjust_logits(cols, r, s, param)
        if options:
            letters = torch.stack(
                [torch.logsumexp(adjusted[:, self.letter_of_variant == k], dim=1) for k in range(self.args.num_options)],
                dim=1,
            )
            return torch.log_softmax(letters, dim=1)
        return torch.log_softmax(adjusted, dim=1)

    def targets(self, target_ids):
        return self.letter_of_token[target_ids] if self._options else target_ids

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

    def lower_value(self, batch, items):
        """``alpha -> Σ_items L_tr / items``: this batch's share of the window's L_tr (a 0-d float32 tensor)."""
        def value(alpha):
            raw, target_ids, _ = self.scored_logits(batch)
            return self._cross_entropy(self.log_probs(raw, alpha), self.targets(target_ids)).sum() / items

        return value

    def upper_value(self, batch, items):
        """``alpha -> −Σ_items H / items``: this calibration batch's share of the window's f = −mean H."""
        def value(alpha):
            raw, _, _ = self.scored_logits(batch)
            return -self._entropy(self.log_probs(raw, alpha)).sum() / items

        return value

    # ---- calibration batches: a pure function of the step, so resuming replays them -------------

    def calibration_batch(self, micro_step=None):
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
        needs_calibration = self.calibration_dataset is not None and self.strategy.needs_calibration
        calibration = [self.calibration_batch(i) for i in range(len(batches))] if needs_calibration else []
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
        self.strategy.start_window()

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
        raw, target_ids, _ = self.scored_logits(inputs)
        nll = self._cross_entropy(self.log_probs(raw, {}), self.targets(target_ids))
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
        alpha, theta = self.calm_parameters()
        with self.maybe_activation_offload_context:
            self.strategy.micro_batch(inputs, self._micro_step, alpha, theta)
            if not self.accelerator.sync_gradients:
                self._micro_step += 1
                return torch.zeros((), device=self.args.device)
            direction, logs = self.strategy.direction(alpha, theta)
            self._window, self._micro_step = None, 0
            for key, value in logs.items():
                self._metrics["train"][key].append(float(value))
            self.apply_direction(direction, alpha, theta)
        return logs["lower_loss"].detach().float().to(self.args.device)

    def all_reduce_sum(self, tensors: dict) -> dict:
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

    def apply_direction(self, direction, alpha, theta):
        """Backpropagate the update direction (name → tensor) as a surrogate loss, once per optimizer step."""
        self._metrics["train"]["mean_temperature"].append(float(self.calm_model.logit_adjustment.temperature.detach().mean()))
        params = {**theta, **alpha}
        # d/dp Σ⟨stopgrad(d), p⟩ = d exactly: the engine receives ∇f + λ∇q as the gradient of a loss, so
        # gradient scaling (fp16), ZeRO's gradient partitioning, clipping and the step stay the engine's.
        # Parameters without a direction (the resting group of method='iterate') get no gradient at all.
        surrogate = sum((direction[n].to(p.dtype).detach() * p).sum() for n, p in params.items() if n in direction)
        kwargs = {"scale_wrt_gas": False} if self.accelerator.distributed_type == DistributedType.DEEPSPEED else {}
        self.accelerator.backward(surrogate, **kwargs)

    # ---- evaluation ---------------------------------------------------------------------------

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad():
            raw, target_ids, rows = self.scored_logits(inputs)
            log_probs = self.log_probs(raw, {})
            targets = self.targets(target_ids)
            loss = self._cross_entropy(log_probs, targets).mean()
            if prediction_loss_only or not self._eval_letters:
                return loss, None, None
            if self._options:
                return loss, log_probs.exp(), targets
            # 'vocab': the answer letter is each row's first scored position (rows come sorted); its letter
            # distribution is the adjusted vocabulary distribution's mass on each letter's variants, renormalised
            _, counts = torch.unique_consecutive(rows, return_counts=True)
            first = torch.cumsum(counts, 0) - counts
            letters = self.log_probs(raw[first], {}, options=True)
            return loss, letters.exp(), self.letter_of_token[target_ids[first]]

    def _calibration_metrics(self, prediction):
        return calibration_metrics(prediction, self.args.eval_num_bins)

    # ---- saving, loading, resuming -------------------------------------------------------------

    # private Trainer override: saves the CALMModel (adapter or model, and α) and the CALM model card, not the
    # Trainer's model alone
    def _save(self, output_dir=None, state_dict=None):
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        if not self.args.should_save:
            return
        os.makedirs(output_dir, exist_ok=True)
        self.calm_model.save_pretrained(output_dir, state_dict=state_dict)
        if self.processing_class is not None:
            self.processing_class.save_pretrained(output_dir)
        torch.save(self.args, os.path.join(output_dir, "training_args.bin"))
        self._write_model_card(output_dir)

    # private Trainer override: Trainer loads model.safetensors / a PEFT adapter only, not α next to it
    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        if not (Path(resume_from_checkpoint) / ADJUSTMENT_WEIGHTS_NAME).is_file():
            raise ValueError(f"resume_from_checkpoint: {resume_from_checkpoint!r} has no {ADJUSTMENT_WEIGHTS_NAME}")
        self.calm_model.load_calibration(resume_from_checkpoint)

    # private Trainer override: the save-side twin of _load_optimizer_and_scheduler, for the method's own state (CFT's
    # bin accuracies). Trainer._save_checkpoint calls it before it writes trainer_state.json, so a checkpoint with a
    # trainer_state.json (what resume tools take as finished) always holds the method's state too.
    def _save_optimizer_and_scheduler(self, output_dir):
        super()._save_optimizer_and_scheduler(output_dir)
        if self.args.should_save:
            self.strategy.save_state(Path(output_dir))

    # private Trainer override: runs on every resume and backend (DDP, DeepSpeed), so the method's own state loads here
    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None:
            self.strategy.load_state(Path(checkpoint))

    # private Trainer override: Trainer's version reloads the wrapped model's weights only, not α
    def _load_best_model(self):
        self.calm_model.load_calibration(self.state.best_model_checkpoint)

    def _write_model_card(self, output_dir):
        """TRL's model card (method, paper, citation) plus the CALM config and the last measured eval metrics."""
        card_path = Path(self.args.output_dir) / "README.md"  # where TRL writes its card
        self.create_model_card(model_name=Path(output_dir).name)
        if card_path.is_file():
            text = card_path.read_text(encoding="utf-8")
            (Path(output_dir) / "README.md").write_text(text + model_card_section(self.args, self.state.log_history),
                                                        encoding="utf-8")
