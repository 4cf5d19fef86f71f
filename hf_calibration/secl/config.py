"""``SECLConfig``: every knob of SECL with its default and where the default comes from (docs/methods.md, "SECL").

"paper" = stated in Hedna et al. 2026; "reconstruction" = the paper does not give it, we chose it;
"measured" = chosen from a measurement in this repository; "library" = the default of a peer library.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from hf_calibration.errors import ParameterError, ParameterWarning
from hf_calibration.modeling.prompts import PROMPT_FORMATS
from hf_calibration.secl.confidence import CONFIDENCE_TEMPLATE, DEFAULT_TAU_N, P_TRUE_TEMPLATE, check_template
from hf_calibration.secl.replay import CONFIDENCE_LOSSES

CONFIG_NAME = "secl_config.json"
ADAPTER_SCOPES = ("confidence", "all")
RESTATEMENTS = ("answer", "option_text")
CONSOLIDATION_LR_SCHEDULES = ("constant", "linear")
REPLAY_SCOPES = ("burst", "stream")
BURST_CONFIDENCES = ("verbalized", "teacher")


@dataclass
class SECLConfig:
    burst_size: int = field(default=50, metadata={
        "help": "B: questions in a calibration burst after an alarm, ≥ 1 (paper; docs/methods.md, 'SECL: burst')."})
    num_distractors: int = field(default=4, metadata={
        "help": "K: distractors for P(True)Norm, ≥ 1 (paper). Multiple choice uses the other options (at most K); "
                "open-ended answers use K deduplicated beam-search alternatives (docs/methods.md, 'SECL: P(True)Norm')."})
    tau_n: float = field(default=DEFAULT_TAU_N, metadata={
        "help": "τ_n > 0 of P(True)Norm = softmax(P(True)/τ_n) (reconstruction; docs/methods.md, 'SECL: P(True)Norm'; "
                "measurements: docs/secl_results.md, 'Where each SECLConfig default comes from')."})
    alpha_step: float = field(default=1.0, metadata={
        "help": "α_step > 0 of the directional target ĉ = c + α_step·clip(c* − c, −δ, δ) (reconstruction; "
                "docs/methods.md, 'SECL: directional target')."})
    delta: float = field(default=0.2, metadata={
        "help": "δ > 0, the clip of the directional step, in confidence units (reconstruction; docs/methods.md, "
                "'SECL: directional target'; measurements: docs/secl_results.md, 'Where each SECLConfig default "
                "comes from')."})
    n_bins: int = field(default=10, metadata={
        "help": "Equal-width confidence bins of the bin gate, ≥ 1 (reconstruction; docs/methods.md, 'SECL: bin gate')."})
    bin_gate_width: int = field(default=0, metadata={
        "help": "Skip the update when |bin(c) − bin(c*)| ≤ this many bins, ≥ 0 (paper: 1; the default 0 was "
                "measured: docs/secl_results.md, 'Where each SECLConfig default comes from')."})
    ema_rate: float = field(default=0.02, metadata={
        "help": "EMA rate in (0, 1] of the entropy mean and variance that standardise it (measured; docs/methods.md, "
                "'SECL: entropy gate and Page-Hinkley')."})
    ph_delta: float = field(default=0.5, metadata={
        "help": "Page-Hinkley δ ≥ 0 on the standardised entropy, in standard deviations (measured; river/MOA's "
                "default is for raw values; docs/methods.md, 'SECL: entropy gate and Page-Hinkley')."})
    ph_threshold: float = field(default=10.0, metadata={
        "help": "Page-Hinkley λ > 0 on the standardised entropy (measured; docs/methods.md, 'SECL: entropy gate and "
                "Page-Hinkley')."})
    ph_min_instances: int = field(default=10, metadata={
        "help": "Page-Hinkley values before an alarm can be raised, ≥ 1 (measured; docs/methods.md, 'SECL: entropy "
                "gate and Page-Hinkley')."})
    warmup: int = field(default=10, metadata={
        "help": "Entropies that only initialise the EMA, ≥ 2 (measured; docs/methods.md, 'SECL: entropy gate and "
                "Page-Hinkley')."})
    lora_r: int = field(default=8, metadata={"help": "LoRA rank, ≥ 1 (reconstruction; PEFT's default)."})
    lora_alpha: int = field(default=16, metadata={"help": "LoRA alpha, ≥ 1 (reconstruction)."})
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "v_proj"], metadata={
        "help": "Projections that get LoRA adapters (paper: query and value; docs/methods.md, 'SECL: LoRA "
                "placement')."})
    target_layers: list[int] | None = field(default=None, metadata={
        "help": "Layer indices with adapters (default None: the upper half of the layers, 'intermediate-to-late' as "
                "the paper says; docs/methods.md, 'SECL: LoRA placement')."})
    adapter_scope: str = field(default="confidence", metadata={
        "help": "Where the LoRA adapter acts. 'confidence' (default): only on the follow-up turn that reads the "
                "verbalized confidence; answers, their beam-search alternatives and the P(True)Norm teacher are "
                "computed with it off, so accuracy is the base model's and the teacher does not drift with the "
                "student. 'all' (the paper): the adapter also shapes the answers and the teacher (docs/methods.md, "
                "'SECL: product defaults').",
        "choices": list(ADAPTER_SCOPES)})
    learning_rate: float = field(default=1e-3, metadata={
        "help": "AdamW learning rate of the adapters, > 0 (reconstruction)."})
    steps_per_update: int = field(default=1, metadata={
        "help": "AdamW steps per accepted question, ≥ 1 (the paper takes one). With a replay buffer each step is on "
                "a minibatch: the question and up to replay_batch_size earlier ones (docs/methods.md, 'SECL: replay "
                "buffer and steps per update')."})
    replay_size: int = field(default=0, metadata={
        "help": "Burst questions (their answer's cache and pseudo-label c*) kept for the update steps and the "
                "consolidation epochs, ≥ 0; 0 (default, the paper's one step on the current question) turns replay "
                "and consolidation off. A replayed question's target is recomputed from its current confidence "
                "(docs/methods.md, 'SECL: replay buffer and steps per update')."})
    replay_scope: str = field(default="burst", metadata={
        "help": "Which questions the replay buffer keeps: 'burst' (default; emptied when a burst opens) or 'stream' "
                "(kept across bursts, the oldest dropped once replay_size are kept; needs replay_size > 0, and above "
                "burst_size for a consolidation to see an earlier burst). Extension, not in the paper "
                "(docs/methods.md, 'SECL: consolidation').",
        "choices": list(REPLAY_SCOPES)})
    replay_batch_size: int = field(default=4, metadata={
        "help": "Earlier questions drawn (uniformly, without replacement, seeded) from the replay buffer for each "
                "update step beside the current question, ≥ 0; each costs one forward and backward pass per step; "
                "used only when replay_size > 0 (docs/methods.md, 'SECL: replay buffer and steps per update')."})
    consolidation_epochs: int = field(default=0, metadata={
        "help": "Epochs over the replay buffer when a burst ends, ≥ 0: every kept question in seeded random "
                "minibatches of consolidation_batch_size, the target recomputed as for replay; costs epochs × buffer "
                "forward and backward passes once per burst; needs replay_size > 0. Default 0 (off). Extension, not "
                "in the paper (docs/methods.md, 'SECL: consolidation' and 'SECL: product defaults')."})
    consolidation_batch_size: int = field(default=1, metadata={
        "help": "Questions per AdamW step of the consolidation epochs, ≥ 1 (measured; docs/secl_results.md, 'Where "
                "each SECLConfig default comes from')."})
    consolidation_lr_scheduler: str = field(default="constant", metadata={
        "help": "Learning rate over the consolidation's steps: 'constant' (default; learning_rate throughout) or "
                "'linear' (torch's LinearLR from learning_rate down to 0 at the last step; the update steps keep "
                "learning_rate) (docs/methods.md, 'SECL: consolidation').",
        "choices": list(CONSOLIDATION_LR_SCHEDULES)})
    confidence_loss: str = field(default="mse", metadata={
        "help": "The update steps' loss against the target ĉ: 'mse' (default, the paper's) (c − ĉ)²; 'kl' the KL "
                "divergence from the two-point distribution on 0, 0.1, …, 1 with mean ĉ to the read's distribution "
                "over those values, whose gradient stays where MSE's vanishes (extension; docs/methods.md, 'SECL: "
                "the confidence loss').",
        "choices": list(CONFIDENCE_LOSSES)})
    burst_confidence: str = field(default="verbalized", metadata={
        "help": "The confidence returned for a question inside a burst: 'verbalized' (default, the paper's) the "
                "student's read; 'teacher' the pseudo-label c* (P(True)Norm at tau_n) computed for that question to "
                "train on, at no extra forward pass. Outside bursts, and for training, the verbalized read is used "
                "either way (extension; docs/methods.md, 'SECL: the confidence returned in a burst').",
        "choices": list(BURST_CONFIDENCES)})
    restate: str = field(default="option_text", metadata={
        "help": "What the confidence turn's '{answer}' restates: 'option_text' (default) for multiple choice the "
                "chosen option as 'A. <option text>' (as diagnose and the P(True) teacher restate it; answers naming "
                "no option keep their decoded text); 'answer' the decoded answer, e.g. the bare letter 'A' "
                "(docs/methods.md, 'SECL: what the confidence turn restates').",
        "choices": list(RESTATEMENTS)})
    confidence_template: str = field(default=CONFIDENCE_TEMPLATE, metadata={
        "help": "Follow-up turn asking for the 0-10 confidence; must contain '{answer}' (docs/methods.md, 'SECL: "
                "verbalized confidence')."})
    p_true_template: str = field(default=P_TRUE_TEMPLATE, metadata={
        "help": "Follow-up turn asking whether the answer is correct; must contain '{answer}' (docs/methods.md, "
                "'SECL: P(True)Norm')."})
    prompt_format: str = field(default="auto", metadata={
        "help": "How prompts are formatted: 'chat', 'plain' or 'auto' (default; chat when the tokenizer has a "
                "template).",
        "choices": list(PROMPT_FORMATS)})
    answer_max_chars: int = field(default=200, metadata={
        "help": "Characters of an answer restated in the follow-up turns, ≥ 1; longer answers keep their last "
                "characters (where the final answer of a worked solution is)."})
    distractor_max_new_tokens: int = field(default=32, metadata={
        "help": "Tokens of each beam-search alternative for open-ended answers, ≥ 1."})

    def __post_init__(self):
        """Check every field: ParameterError (a ValueError) naming the field and the value."""
        for name, check in _CHECKS.items():
            check(getattr(self, name), name)
        if self.consolidation_epochs and not self.replay_size:
            raise ParameterError("consolidation_epochs", self.consolidation_epochs,
                                 "consolidates the replay buffer, which {replay_size} 0 turns off: set {replay_size} "
                                 "> 0 (e.g. {burst_size}) or {consolidation_epochs} 0",
                                 related=("replay_size", "burst_size"))
        if self.replay_scope == "stream" and not self.replay_size:
            raise ParameterError("replay_scope", self.replay_scope,
                                 "keeps the replay buffer across bursts, which {replay_size} 0 turns off: set "
                                 "{replay_size} > 0 (e.g. a multiple of {burst_size}) or {replay_scope} 'burst'",
                                 related=("replay_size", "burst_size"))
        self._warn_without_effect()
        self.target_modules = list(self.target_modules)
        if self.target_layers is not None:
            self.target_layers = list(self.target_layers)

    def _warn_without_effect(self) -> None:
        """A ParameterWarning for each consolidation or replay option set to a value the others keep from acting."""
        if self.replay_size and not self.replay_batch_size and not self.consolidation_epochs:
            warnings.warn(ParameterWarning(
                "replay_size", self.replay_size,
                f"{{replay_size}} {self.replay_size} keeps questions nothing uses: {{replay_batch_size}} 0 and "
                "{consolidation_epochs} 0 turn off both the replay in the update steps and the consolidation; set "
                "one of them above 0, or {replay_size} 0", related=("replay_batch_size", "consolidation_epochs")),
                stacklevel=4)
        elif self.replay_scope == "stream" and self.replay_size <= self.burst_size and not self.replay_batch_size:
            warnings.warn(ParameterWarning(
                "replay_scope", self.replay_scope,
                f"{{replay_scope}} 'stream' with {{replay_size}} {self.replay_size} ≤ {{burst_size}} "
                f"{self.burst_size} and {{replay_batch_size}} 0: when a full burst ends the buffer holds only its "
                "own questions, so the consolidation is the same as with 'burst'; set {replay_size} above "
                "{burst_size} (e.g. 2 x {burst_size}) to rehearse the burst before it",
                related=("replay_size", "burst_size", "replay_batch_size")), stacklevel=4)
        defaults = {f.name: f.default for f in fields(self)}
        if not self.consolidation_epochs:
            for name in ("consolidation_batch_size", "consolidation_lr_scheduler"):
                if getattr(self, name) != defaults[name]:
                    warnings.warn(ParameterWarning(
                        name, getattr(self, name),
                        f"{{{name}}} {getattr(self, name)!r} has no effect: {{consolidation_epochs}} 0 runs no "
                        f"consolidation; set {{consolidation_epochs}} above 0 or leave {{{name}}} at "
                        f"{defaults[name]!r}", related=("consolidation_epochs",)), stacklevel=4)
        if self.replay_size and self.replay_batch_size > self.replay_size:
            warnings.warn(ParameterWarning(
                "replay_batch_size", self.replay_batch_size,
                f"{{replay_batch_size}} {self.replay_batch_size} is above {{replay_size}} {self.replay_size}: an "
                f"update step draws at most the {self.replay_size} kept questions; set {{replay_batch_size}} ≤ "
                "{replay_size}", related=("replay_size",)), stacklevel=4)
        if self.consolidation_epochs and self.consolidation_batch_size > self.replay_size > 0:
            warnings.warn(ParameterWarning(
                "consolidation_batch_size", self.consolidation_batch_size,
                f"{{consolidation_batch_size}} {self.consolidation_batch_size} is above {{replay_size}} "
                f"{self.replay_size}: each consolidation epoch is one step on all {self.replay_size} kept questions; "
                "set {consolidation_batch_size} ≤ {replay_size}", related=("replay_size",)), stacklevel=4)

    def replaced(self, **changes) -> "SECLConfig":
        """A copy with ``changes`` (``dataclasses.replace``) that does not repeat the warnings this config gave
        when it was made (a pass that reads with another ``adapter_scope`` copies the config)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ParameterWarning)
            return replace(self, **changes)

    def layers_for(self, num_layers: int) -> list[int]:
        """The layer indices that get adapters in a model with ``num_layers`` layers."""
        if self.target_layers is None:
            return list(range(num_layers // 2, num_layers))
        bad = [i for i in self.target_layers if i >= num_layers]
        if bad:
            raise ParameterError("target_layers", self.target_layers,
                                 f"{bad} out of range for a model with {num_layers} layers")
        return list(self.target_layers)

    def to_dict(self) -> dict:
        return asdict(self)

    def save_pretrained(self, folder) -> None:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / CONFIG_NAME).write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")

    @classmethod
    def from_pretrained(cls, folder) -> "SECLConfig":
        fields = json.loads((Path(folder) / CONFIG_NAME).read_text(encoding="utf-8"))
        # written before adapter_scope existed, when the adapter acted on everything: keep what it was trained as
        fields.setdefault("adapter_scope", "all")
        return cls(**fields)


def _integer(minimum: int):
    def check(v, label):
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise ParameterError(label, v, f"must be an integer ≥ {minimum}, got {v!r}")

    return check


def _number(*, lower_open: float | None = 0.0, lower_closed: float | None = None, upper: float | None = None):
    def check(v, label):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ParameterError(label, v, f"must be a finite number, got {v!r}")
        if (lower_open is not None and v <= lower_open) or (lower_closed is not None and v < lower_closed) or (
                upper is not None and v > upper):
            bound = f"> {lower_open:g}" if lower_open is not None else f"≥ {lower_closed:g}"
            raise ParameterError(label, v, f"must be a finite number {bound}"
                                 f"{f' and ≤ {upper:g}' if upper is not None else ''}, got {v!r}")

    return check


def _template(v, label):
    check_template(v, label)


def _one_of(options):
    def check(v, label):
        if v not in options:
            names = [repr(o) for o in options]
            raise ParameterError(label, v, f"must be {', '.join(names[:-1])} or {names[-1]}, got {v!r}")

    return check


def _target_modules(v, label):
    if isinstance(v, str) or not v:
        raise ParameterError(label, v, f"must be a non-empty sequence of module names, got {v!r}")


def _target_layers(v, label):
    if v is None:
        return
    layers = tuple(v)
    if not layers or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in layers):
        raise ParameterError(label, v, f"must be non-negative layer indices or None, got {v!r}")


# one check per field (ph_threshold finite, as PageHinkley needs it)
_CHECKS = {
    **dict.fromkeys(("burst_size", "num_distractors", "n_bins", "ph_min_instances", "lora_r", "lora_alpha",
                     "steps_per_update", "answer_max_chars", "distractor_max_new_tokens"), _integer(1)),
    "warmup": _integer(2),
    **dict.fromkeys(("bin_gate_width", "replay_size", "replay_batch_size", "consolidation_epochs"), _integer(0)),
    "consolidation_batch_size": _integer(1),
    "restate": _one_of(RESTATEMENTS),
    "consolidation_lr_scheduler": _one_of(CONSOLIDATION_LR_SCHEDULES),
    "replay_scope": _one_of(REPLAY_SCOPES),
    "confidence_loss": _one_of(CONFIDENCE_LOSSES),
    "burst_confidence": _one_of(BURST_CONFIDENCES),
    **dict.fromkeys(("tau_n", "alpha_step", "delta", "learning_rate"), _number()),
    "ph_threshold": _number(),
    "ema_rate": _number(upper=1.0),
    "ph_delta": _number(lower_open=None, lower_closed=0.0),
    "confidence_template": _template,
    "p_true_template": _template,
    "prompt_format": _one_of(PROMPT_FORMATS),
    "adapter_scope": _one_of(ADAPTER_SCOPES),
    "target_modules": _target_modules,
    "target_layers": _target_layers,
}
