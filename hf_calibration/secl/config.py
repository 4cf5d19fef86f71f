"""``SECLConfig``: every knob of SECL with its default and where the default comes from (SPEC §2).

"paper" = stated in Hedna et al. 2026; "reconstruction" = the paper does not give it, we chose it;
"measured" = chosen from a measurement in this repository; "library" = the default of a peer library.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hf_calibration.secl.confidence import CONFIDENCE_TEMPLATE, DEFAULT_TAU_N, P_TRUE_TEMPLATE, check_template

CONFIG_NAME = "secl_config.json"


@dataclass
class SECLConfig:
    burst_size: int = field(default=50, metadata={"help": "B: questions in a calibration burst after an alarm (paper)."})
    num_distractors: int = field(default=4, metadata={
        "help": "K: distractors for P(True)Norm (paper). MCQA uses the other options (at most K); open-ended "
                "answers use K deduplicated beam-search alternatives."})
    tau_n: float = field(default=DEFAULT_TAU_N, metadata={
        "help": "τ_n of P(True)Norm = softmax(P(True)/τ_n) (reconstruction)."})
    alpha_step: float = field(default=1.0, metadata={
        "help": "α_step of the directional target ĉ = c + α_step·clip(c* − c, −δ, δ) (reconstruction)."})
    delta: float = field(default=0.2, metadata={"help": "δ: the clip of the directional step (reconstruction)."})
    n_bins: int = field(default=10, metadata={"help": "Equal-width confidence bins of the bin gate (reconstruction)."})
    bin_gate_width: int = field(default=1, metadata={
        "help": "Skip the update when |bin(c) − bin(c*)| <= this many bins (paper: 1)."})
    ema_rate: float = field(default=0.02, metadata={
        "help": "EMA rate of the entropy mean/variance used to standardise it (measured, see drift.py)."})
    ph_delta: float = field(default=0.5, metadata={
        "help": "Page-Hinkley δ on the standardised entropy (measured; river/MOA default 0.005 is for raw values)."})
    ph_threshold: float = field(default=10.0, metadata={
        "help": "Page-Hinkley λ on the standardised entropy (measured; river/MOA default 50)."})
    ph_min_instances: int = field(default=10, metadata={
        "help": "Page-Hinkley values before an alarm (measured; river/MOA default 30)."})
    warmup: int = field(default=10, metadata={"help": "Entropies that only initialise the EMA (measured)."})
    lora_r: int = field(default=8, metadata={"help": "LoRA rank (reconstruction; PEFT default 8)."})
    lora_alpha: int = field(default=16, metadata={"help": "LoRA alpha (reconstruction)."})
    target_modules: tuple = field(default=("q_proj", "v_proj"), metadata={
        "help": "Projections that get LoRA adapters (paper: query and value)."})
    target_layers: tuple | None = field(default=None, metadata={
        "help": "Layer indices with adapters; None = the upper half, 'intermediate-to-late' (paper; exact layers "
                "reconstruction)."})
    learning_rate: float = field(default=1e-3, metadata={"help": "AdamW learning rate of the adapters (reconstruction)."})
    steps_per_update: int = field(default=1, metadata={"help": "Gradient steps per accepted question (reconstruction)."})
    confidence_template: str = field(default=CONFIDENCE_TEMPLATE, metadata={
        "help": "Follow-up turn asking for the 0-10 confidence; must contain '{answer}' (measured wording)."})
    p_true_template: str = field(default=P_TRUE_TEMPLATE, metadata={
        "help": "Follow-up turn asking whether the answer is correct; must contain '{answer}'."})
    prompt_format: str = field(default="auto", metadata={
        "help": "How prompts are formatted: 'chat', 'plain' or 'auto' (chat when the tokenizer has a template)."})
    answer_max_chars: int = field(default=200, metadata={
        "help": "Longer answers are restated in the follow-up turns by their last characters (where the final "
                "answer of a worked solution is)."})
    distractor_max_new_tokens: int = field(default=32, metadata={
        "help": "Length of the beam-search alternatives for open-ended answers."})

    def __post_init__(self):
        def positive_int(name, minimum=1):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
                raise ValueError(f"{name}: must be an integer >= {minimum}, got {v!r}")

        def positive(name, upper=None):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or (upper and v > upper):
                raise ValueError(f"{name}: must be > 0{f' and <= {upper}' if upper else ''}, got {v!r}")

        for name in ("burst_size", "num_distractors", "n_bins", "ph_min_instances", "lora_r", "lora_alpha",
                     "steps_per_update", "answer_max_chars", "distractor_max_new_tokens"):
            positive_int(name)
        positive_int("warmup", 2)
        positive_int("bin_gate_width", 0)
        for name in ("tau_n", "alpha_step", "delta", "ph_threshold", "learning_rate"):
            positive(name)
        positive("ema_rate", 1.0)
        if isinstance(self.ph_delta, bool) or not isinstance(self.ph_delta, (int, float)) or self.ph_delta < 0:
            raise ValueError(f"ph_delta: must be >= 0, got {self.ph_delta!r}")
        check_template(self.confidence_template, "confidence_template")
        check_template(self.p_true_template, "p_true_template")
        if self.prompt_format not in ("auto", "chat", "plain"):
            raise ValueError(f"prompt_format: must be 'auto', 'chat' or 'plain', got {self.prompt_format!r}")
        if isinstance(self.target_modules, str) or not self.target_modules:
            raise ValueError(f"target_modules: must be a non-empty sequence of module names, got {self.target_modules!r}")
        self.target_modules = tuple(self.target_modules)
        if self.target_layers is not None:
            layers = tuple(self.target_layers)
            if not layers or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in layers):
                raise ValueError(f"target_layers: must be non-negative layer indices or None, got {self.target_layers!r}")
            self.target_layers = layers

    def layers_for(self, num_layers: int) -> list[int]:
        """The layer indices that get adapters in a model with ``num_layers`` layers."""
        if self.target_layers is None:
            return list(range(num_layers // 2, num_layers))
        bad = [i for i in self.target_layers if i >= num_layers]
        if bad:
            raise ValueError(f"target_layers: {bad} out of range for a model with {num_layers} layers")
        return list(self.target_layers)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["target_modules"] = list(self.target_modules)
        d["target_layers"] = None if self.target_layers is None else list(self.target_layers)
        return d

    def save_pretrained(self, folder) -> None:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / CONFIG_NAME).write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")

    @classmethod
    def from_pretrained(cls, folder) -> "SECLConfig":
        return cls(**json.loads((Path(folder) / CONFIG_NAME).read_text(encoding="utf-8")))
