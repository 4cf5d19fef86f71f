"""``CALMConfig``: ``trl.SFTConfig`` plus the fields of CALM's bilevel update (docs/methods.md, 'CALM').

The paper (Jin et al., arXiv 2608.07419) does not publish T, η, the learning rates or the batch
composition; the defaults below say where each comes from: "BOME" = Ye et al. NeurIPS 2022 and its code
(Cranial-XIX/BOME), "CFT" = Xiao et al. ICML 2025, "ours" = our own choice, not a measured optimum.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import SFTConfig

from hf_calibration.calm.cft import CFT_NORMALIZATIONS, CFT_TARGETS
from hf_calibration.calm.bome import UPPER_GRADIENTS
from hf_calibration.errors import ParameterError

METHODS = ("bome", "iterate", "regularization", "scalar", "sft", "cft")
PHI_RULES = ("eta_grad_norm", "eta_value")
ENTROPY_DOMAINS = ("options", "vocab")
ADJUSTMENT_TOKENS = ("auto", "options", "vocab")
SELECTION_METRICS = ("conf_ece", "cw_ece", "nll", "loss")
BOME_OPTIMIZERS = ("trainer", "sgd", "sgd_momentum")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _pinnable_accelerator() -> bool:
    """Whether torch has an accelerator whose host memory can be pinned (CUDA, XPU, …; not MPS or the CPU)."""
    import torch

    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "is_available"):
        return bool(accelerator.is_available()) and accelerator.current_accelerator().type != "mps"
    return torch.cuda.is_available()


def _bf16_available() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


@dataclass
class CALMConfig(SFTConfig):
    r"""Configuration of ``CALMTrainer``: every ``SFTConfig`` field, plus the CALM fields below.

    Validated at construction: a bad value raises ValueError naming the field and the value.
    ``select_best_by`` turns on ``load_best_model_at_end`` with ``metric_for_best_model =
    "eval_<metric>"`` (lower is better), which needs a labelled ``eval_dataset``.
    """

    # TRL 1.16's SFTConfig defaults `gradient_checkpointing` to True, a name transformers 5.24 deprecates, so every
    # SFTConfig warns though the user never wrote it. Both are None here and __post_init__ sets TRL's default under
    # the new name; a user who writes the old name still gets transformers' warning.
    activation_checkpointing: bool | None = field(
        default=None,
        metadata={"help": "Recompute activations in the backward pass to save memory (transformers' field). Default "
                  "None: True, TRL's SFTConfig default, unless gradient_checkpointing is given.",
                  "nargs": "?", "const": True},
    )
    gradient_checkpointing: bool | None = field(
        default=None,
        metadata={"help": "Deprecated alias of activation_checkpointing (transformers 5.24).", "nargs": "?", "const": True},
    )
    method: str = field(
        default="bome",
        metadata={
            "help": "Training method. 'bome': CALM, the first-order bilevel update (paper; docs/methods.md, 'CALM: BOME step'). 'iterate': "
            "the paper's alternating ablation (docs/methods.md, 'CALM: ablations': an α step on −H alternated with a θ step on L_tr, no λ "
            "coupling): even optimizer steps update θ on L_tr only, odd steps α on −H only, at the θ just updated; "
            "the resting group gets no gradient, so the optimizer leaves it untouched (one θ step per α step, θ "
            "first: ours, the paper gives no ratio; under DeepSpeed ZeRO the engine zero-fills missing gradients, "
            "so Adam momentum still moves the resting group). "
            "'regularization': single level, min L_tr − β·H over (α, θ) (paper ablation). 'scalar': 'bome' with one "
            "shared temperature and no shift (paper's 'learned TS' ablation). 'sft': L_tr only, α fixed at the "
            "identity (set label_smoothing_factor for the label-smoothing baseline). 'cft': calibration-aware "
            "fine-tuning (Xiao et al. ICML 2025), α fixed.",
            "choices": list(METHODS),
        },
    )
    inner_steps: int = field(
        default=1,
        metadata={"help": "T ≥ 0: gradient steps on L_tr from a detached copy of θ that approximate the lower-level "
                  "value function (ours: 1, the cheapest that gives a non-zero residual q; BOME's toy problems use 10)."},
    )
    inner_learning_rate: float = field(
        default=1e-2,
        metadata={"help": "ξ_in > 0: step size of the inner gradient steps, plain SGD as in BOME's code (ours)."},
    )
    eta: float = field(
        default=0.5,
        metadata={"help": "η in (0, 1] of the control barrier φ (BOME default 0.5)."},
    )
    phi_rule: str = field(
        default="eta_grad_norm",
        metadata={"help": "φ: 'eta_grad_norm' = η‖∇q‖² (BOME default) or 'eta_value' = η·q (BOME data-cleaning "
                  "variant).", "choices": list(PHI_RULES)},
    )
    bome_epsilon: float = field(
        default=1e-8,
        metadata={"help": "ε > 0 in λ = max((φ − ⟨∇f, ∇q⟩) / (‖∇q‖² + ε), 0) (ours; guards ∇q = 0)."},
    )
    bome_optimizer: str = field(
        default="trainer",
        metadata={"help": "Optimizer that applies BOME's direction d = ∇f + λ∇q (methods 'bome' and 'scalar'). "
                  "'trainer': the Trainer's (`optim`, AdamW by default), with its clipping (max_grad_norm); "
                  "Adam rescales each coordinate, so its step need not keep BOME's control-barrier property "
                  "⟨step, ∇q⟩ ≥ lr·φ (e.g. d = (10, −0.1), ∇q = (1, 20): ⟨d, ∇q⟩ = 8, Adam's first step ∝ sign(d) "
                  "gives −19). 'sgd': BOME's own step u ← u − lr·d (plain SGD, as in BOME's toy code), which keeps "
                  "it. 'sgd_momentum': heavy-ball torch.optim.SGD(momentum=bome_momentum, no dampening, no "
                  "Nesterov), as in BOME's hyper-parameter-optimisation code (Cranial-XIX/BOME, hpo/). Both SGD "
                  "variants update θ with learning_rate and α with alpha_learning_rate, with gradient clipping off "
                  "by default (max_grad_norm unset → 0): clipping rescales d to norm max_grad_norm whenever it is "
                  "longer, so the step would shrink by that factor and with it the guaranteed decrease of q (BOME's "
                  "code does not clip). weight_decay / alpha_weight_decay still add wd·u to d (keep them 0 for "
                  "BOME's exact step).", "choices": list(BOME_OPTIMIZERS)},
    )
    upper_gradient: str = field(
        default="all",
        metadata={"help": "Which parameters the upper-level gradient ∇f of methods 'bome' and 'scalar' covers. 'all': α "
                  "and θ (BOME, the default). 'adjustment': α only (∇_θ f = 0), so the LoRA weights θ move only along "
                  "λ∇_θ q, the lower-level constraint's direction, and the entropy term acts through the logit "
                  "adjustment alone (ours; docs/methods.md, 'CALM: BOME step').", "choices": list(UPPER_GRADIENTS)},
    )
    bome_momentum: float = field(
        default=0.9,
        metadata={"help": "β in [0, 1) of bome_optimizer='sgd_momentum' (BOME's hpo code: 0.9)."},
    )
    max_grad_norm: float | None = field(
        default=None,
        metadata={"help": "Gradient clipping norm (transformers' field; 0 = off). Default None: 1.0, transformers' "
                  "default, or 0 with bome_optimizer 'sgd' / 'sgd_momentum' (see bome_optimizer)."},
    )
    alpha_learning_rate: float = field(
        default=1e-2,
        metadata={"help": "Learning rate of the logit-adjustment parameters α (second optimizer parameter group; ours)."},
    )
    alpha_weight_decay: float = field(
        default=0.0,
        metadata={"help": "Weight decay of α; decay pulls α toward the identity (τ = 1, l = 0) (ours)."},
    )
    adjustment_mode: str = field(
        default="vector",
        metadata={"help": "'vector': a temperature and a shift per covered token (paper default); 'scalar': one "
                  "temperature, no shift. method='scalar' forces 'scalar'.", "choices": ["vector", "scalar"]},
    )
    temperature_parameterization: str = field(
        default="exp",
        metadata={"help": "τ = exp(ρ) or softplus(ρ + log(e − 1)); both are 1 at ρ = 0 (the paper allows either; ours: exp).",
                  "choices": ["exp", "softplus"]},
    )
    adjustment_tokens: str = field(
        default="auto",
        metadata={"help": "Token ids α covers: 'options' (every single-token variant of the option letters, e.g. 'A' "
                  "and ' A'), 'vocab' (all), or 'auto' (= entropy_domain). Ignored when adjustment_token_ids is set.",
                  "choices": list(ADJUSTMENT_TOKENS)},
    )
    adjustment_token_ids: list[int] | None = field(
        default=None,
        metadata={"help": "Explicit token ids α covers (each in [0, vocab size)); overrides adjustment_tokens."},
    )
    entropy_domain: str = field(
        default="options",
        metadata={"help": "Distribution whose cross-entropy (L_tr) and entropy (H) are used: 'options' = softmax over "
                  "the option letters at the answer position (MCQA), 'vocab' = the full next-token distribution at "
                  "every completion position (open-ended). It also sets the unit every loss term is averaged over: "
                  "the example (one answer letter each) for 'options', the completion token for 'vocab'; the mean "
                  "runs over the whole optimizer step (all gradient-accumulation micro-batches of all processes).",
                  "choices": list(ENTROPY_DOMAINS)},
    )
    num_options: int = field(
        default=4,
        metadata={"help": "K, number of option letters (A, B, …) of the MCQA data, for entropy_domain='options'."},
    )
    regularization_beta: float = field(
        default=1.0,
        metadata={"help": "β ≥ 0 of method='regularization': loss L_tr − β·H (ours)."},
    )
    calibration_batch_size: int | None = field(
        default=None,
        metadata={"help": "Calibration (S_V) examples per micro-batch; default per_device_train_batch_size, i.e. one "
                  "S_V batch per S_T batch (ours)."},
    )
    cft_weight: float = field(
        default=0.5,
        metadata={"help": "a in [0, 1] of CFT: loss (1 − a)·L_tr + a·c·calibration term (CFT code: alpha 0.5)."},
    )
    cft_coefficient: float = field(
        default=1e-3,
        metadata={"help": "c > 0 of CFT, the scale of the calibration term (CFT code: 1e-3; this project "
                  "used 1 before it followed the code)."},
    )
    cft_target: str = field(
        default="tanh",
        metadata={"help": "Target of the non-maximum option probabilities s_1 ≥ … ≥ s_{K−1} of an item whose bin has "
                  "accuracy a; each rule's targets sum to 1 − a. 'tanh': the CFT code's rank-preserving target "
                  "t_j = A·(tanh(γ·s_j) + 1), γ = ln 3 / (s_1·(1 − a)), A = (1 − a) / (Σ_j tanh(γ·s_j) + K − 1) (0 "
                  "when a = 1; the code hard-codes K = 4, K − 1 = 3 here). 'proportional': t_j = (1 − a)·s_j / Σ s, "
                  "a reconstruction from the paper's summary formula alone. 'uniform': (1 − a)/(K − 1), this project's earlier rule "
                  "(before it followed the CFT code). See hf_calibration.calm.cft.", "choices": list(CFT_TARGETS)},
    )
    cft_normalization: str = field(
        default="bin_count",
        metadata={"help": "'bin_count': each item's squared error is divided by the number of training items in its "
                  "confidence bin (from the pass over the training data) and summed over the optimizer step's batch, "
                  "as the CFT code does per batch. 'batch_mean': the mean over the step's items, this project's earlier rule "
                  "(before it followed the CFT code).", "choices": list(CFT_NORMALIZATIONS)},
    )
    cft_num_bins: int = field(
        default=10,
        metadata={"help": "Equal-width confidence bins of the CFT term (CFT code: 10)."},
    )
    cft_refresh_steps: int = field(
        default=0,
        metadata={"help": "CFT bin accuracies and counts come from a pass over the training data before the first "
                  "step; with a value k > 0 they are recomputed every k optimizer steps. 0 (default): never, as the "
                  "CFT code computes them once before training (this project once refreshed every 50)."},
    )
    select_best_by: str | None = field(
        default=None,
        metadata={"help": "Keep the checkpoint with the lowest eval value of this metric on the labelled eval_dataset "
                  "(the paper's selection rule, docs/methods.md, 'CALM: product defaults'): 'conf_ece', 'cw_ece' (eval_num_bins bins), 'nll' (of the adjusted "
                  "option distribution, unsmoothed) or 'loss' (the training cross-entropy, label-smoothed when "
                  "label_smoothing_factor > 0); None keeps the last.",
                  "choices": [None, *SELECTION_METRICS]},
    )
    eval_num_bins: int = field(
        default=15,
        metadata={"help": "Equal-width bins of the conf-ECE and cw-ECE logged at evaluation (Guo et al. 2017's 15 by default)."},
    )

    def __post_init__(self):
        if self.method not in METHODS:
            raise ParameterError("method", self.method, f"must be one of {METHODS}, got {self.method!r}")
        if not _is_int(self.inner_steps) or self.inner_steps < 0:
            raise ParameterError("inner_steps", self.inner_steps, f"must be an integer T ≥ 0, got {self.inner_steps!r}")
        if not self.inner_learning_rate > 0:
            raise ParameterError("inner_learning_rate", self.inner_learning_rate, f"must be > 0, got {self.inner_learning_rate!r}")
        if not 0 < self.eta <= 1:
            raise ParameterError("eta", self.eta, f"must lie in (0, 1], got {self.eta!r}")
        if self.phi_rule not in PHI_RULES:
            raise ParameterError("phi_rule", self.phi_rule, f"must be one of {PHI_RULES}, got {self.phi_rule!r}")
        if not self.bome_epsilon > 0:
            raise ParameterError("bome_epsilon", self.bome_epsilon, f"must be > 0, got {self.bome_epsilon!r}")
        if self.bome_optimizer not in BOME_OPTIMIZERS:
            raise ParameterError("bome_optimizer", self.bome_optimizer, f"must be one of {BOME_OPTIMIZERS}, got {self.bome_optimizer!r}")
        if self.bome_optimizer != "trainer" and self.method not in ("bome", "scalar"):
            raise ParameterError("bome_optimizer", self.bome_optimizer, f"applies to {{method}} 'bome' or 'scalar', got "
                                 f"{{method}} {self.method!r} (the other methods step with {{optim}})",
                                 related=("method", "optim"))
        if self.upper_gradient not in UPPER_GRADIENTS:
            raise ParameterError("upper_gradient", self.upper_gradient,
                                 f"must be one of {UPPER_GRADIENTS}, got {self.upper_gradient!r}")
        if self.upper_gradient != "all" and self.method not in ("bome", "scalar"):
            raise ParameterError("upper_gradient", self.upper_gradient, f"applies to {{method}} 'bome' or 'scalar', "
                                 f"got {{method}} {self.method!r}", related=("method",))
        if not 0 <= self.bome_momentum < 1:
            raise ParameterError("bome_momentum", self.bome_momentum, f"must lie in [0, 1), got {self.bome_momentum!r}")
        if self.max_grad_norm is None:
            self.max_grad_norm = 1.0 if self.bome_optimizer == "trainer" else 0.0
        self._check_adjustment()
        if self.entropy_domain not in ENTROPY_DOMAINS:
            raise ParameterError("entropy_domain", self.entropy_domain, f"must be one of {ENTROPY_DOMAINS}, got {self.entropy_domain!r}")
        if not _is_int(self.num_options) or not 2 <= self.num_options <= 10:
            raise ParameterError("num_options", self.num_options, f"must be an integer in [2, 10], got {self.num_options!r}")
        if not self.regularization_beta >= 0:
            raise ParameterError("regularization_beta", self.regularization_beta, f"must be ≥ 0, got {self.regularization_beta!r}")
        if self.calibration_batch_size is not None and (
            not _is_int(self.calibration_batch_size) or self.calibration_batch_size <= 0
        ):
            raise ParameterError("calibration_batch_size", self.calibration_batch_size, f"must be a positive integer, got {self.calibration_batch_size!r}")
        self._check_cft()
        if self.select_best_by is not None:
            if self.select_best_by not in SELECTION_METRICS:
                raise ParameterError("select_best_by", self.select_best_by, f"must be one of {SELECTION_METRICS} or None, got {self.select_best_by!r}")
            self.load_best_model_at_end = True
            self.metric_for_best_model = f"eval_{self.select_best_by}"
            self.greater_is_better = False
        if not _is_int(self.per_device_train_batch_size) or self.per_device_train_batch_size < 1:
            raise ParameterError("per_device_train_batch_size", self.per_device_train_batch_size, f"must be a positive integer, got {self.per_device_train_batch_size!r}")
        if not self.learning_rate >= 0:
            raise ParameterError("learning_rate", self.learning_rate, f"must be ≥ 0, got {self.learning_rate!r}")
        if self.activation_checkpointing is None and self.gradient_checkpointing is None:
            self.activation_checkpointing = True
        if self.bf16 is None and not self.fp16 and not _bf16_available():
            # TRL defaults bf16 to True, which transformers refuses on a machine without a bf16 GPU;
            # fall back to fp32 there instead of failing (an explicit --bf16 true still errors).
            self.bf16 = False
        if self.dataloader_pin_memory and (self.use_cpu or not _pinnable_accelerator()):
            # transformers pins by default; with no device to pin for, torch warns on every dataloader
            # ("'pin_memory' argument is set as true but no accelerator is found") and pinning does nothing.
            self.dataloader_pin_memory = False
        super().__post_init__()

    def _check_adjustment(self):
        """The logit adjustment's fields (α's optimiser, mode, parameterisation, covered tokens)."""
        if not self.alpha_learning_rate > 0:
            raise ParameterError("alpha_learning_rate", self.alpha_learning_rate, f"must be > 0, got {self.alpha_learning_rate!r}")
        if not self.alpha_weight_decay >= 0:
            raise ParameterError("alpha_weight_decay", self.alpha_weight_decay, f"must be ≥ 0, got {self.alpha_weight_decay!r}")
        if self.adjustment_mode not in ("vector", "scalar"):
            raise ParameterError("adjustment_mode", self.adjustment_mode, f"must be 'vector' or 'scalar', got {self.adjustment_mode!r}")
        if self.method == "scalar":
            self.adjustment_mode = "scalar"
        if self.temperature_parameterization not in ("exp", "softplus"):
            raise ParameterError("temperature_parameterization", self.temperature_parameterization, f"must be 'exp' or 'softplus', got {self.temperature_parameterization!r}")
        if self.adjustment_tokens not in ADJUSTMENT_TOKENS:
            raise ParameterError("adjustment_tokens", self.adjustment_tokens, f"must be one of {ADJUSTMENT_TOKENS}, got {self.adjustment_tokens!r}")
        if self.adjustment_token_ids is not None:
            if not self.adjustment_token_ids or not all(_is_int(t) and t >= 0 for t in self.adjustment_token_ids):
                raise ParameterError("adjustment_token_ids", self.adjustment_token_ids, f"must be a non-empty list of non-negative ints, got {self.adjustment_token_ids!r}")

    def _check_cft(self):
        """The CFT baseline's fields and the evaluation bins."""
        if not 0 <= self.cft_weight <= 1:
            raise ParameterError("cft_weight", self.cft_weight, f"must lie in [0, 1], got {self.cft_weight!r}")
        if not self.cft_coefficient > 0:
            raise ParameterError("cft_coefficient", self.cft_coefficient, f"must be > 0, got {self.cft_coefficient!r}")
        if self.cft_target not in CFT_TARGETS:
            raise ParameterError("cft_target", self.cft_target, f"must be one of {CFT_TARGETS}, got {self.cft_target!r}")
        if self.cft_normalization not in CFT_NORMALIZATIONS:
            raise ParameterError("cft_normalization", self.cft_normalization, f"must be one of {CFT_NORMALIZATIONS}, got {self.cft_normalization!r}")
        for name in ("cft_num_bins", "eval_num_bins"):
            value = getattr(self, name)
            if not _is_int(value) or value <= 0:
                raise ParameterError(name, value, f"must be a positive integer, got {value!r}")
        if not _is_int(self.cft_refresh_steps) or self.cft_refresh_steps < 0:
            raise ParameterError("cft_refresh_steps", self.cft_refresh_steps, f"must be an integer ≥ 0, got {self.cft_refresh_steps!r}")
