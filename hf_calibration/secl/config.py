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
    burst_size: int = field(default=50, metadata={"help": "B: questions in a calibration burst after an alarm (paper)."})
    num_distractors: int = field(default=4, metadata={
        "help": "K: distractors for P(True)Norm (paper). MCQA uses the other options (at most K); open-ended "
                "answers use K deduplicated beam-search alternatives."})
    tau_n: float = field(default=DEFAULT_TAU_N, metadata={
        "help": "τ_n of P(True)Norm = softmax(P(True)/τ_n) (reconstruction; kept: 0.1 and 0.5 did not change SECL's "
                "Brier decisively on a development split, examples/secl_target_study.py, docs/secl_results.md; "
                "0.05 spreads c* for the consolidation schedule, see consolidation_epochs)."})
    alpha_step: float = field(default=1.0, metadata={
        "help": "α_step of the directional target ĉ = c + α_step·clip(c* − c, −δ, δ) (reconstruction; scales the "
                "step as δ does, so only δ was varied on the development split)."})
    delta: float = field(default=0.2, metadata={
        "help": "δ: the clip of the directional step (reconstruction; kept: 0.1 and 0.4 did not change SECL's Brier "
                "decisively on a development split, and with replay δ = 1 (no clip) ranked as 0.2 did, ΔAUROC "
                "−0.005 [−0.031, +0.021]; docs/secl_results.md)."})
    n_bins: int = field(default=10, metadata={"help": "Equal-width confidence bins of the bin gate (reconstruction)."})
    bin_gate_width: int = field(default=0, metadata={
        "help": "Skip the update when |bin(c) − bin(c*)| ≤ this many bins (paper: 1). Default 0, chosen on a "
                "development stream (docs/secl_results.md): at 1, 8 of the 50 start-burst questions of HaluEval "
                "QA-LM passed (4 percent of the domain trained, below the paper's 6-26 percent); at 0, 31 of 50 would."})
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
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "v_proj"], metadata={
        "help": "Projections that get LoRA adapters (paper: query and value)."})
    target_layers: list[int] | None = field(default=None, metadata={
        "help": "Layer indices with adapters (default: none given, the upper half of the layers, "
                "'intermediate-to-late' as the paper says; the exact layers are a reconstruction)."})
    adapter_scope: str = field(default="confidence", metadata={
        "help": "Where the LoRA adapter acts. 'confidence' (product default, docs/methods.md): only on the follow-up turn "
                "that reads the verbalized confidence; answers, their beam-search alternatives and the P(True)Norm "
                "teacher are computed with it off, so accuracy is the base model's by construction and the teacher "
                "does not drift with the student. 'all' (the paper, Hedna et al. 2026): the adapter also shapes the "
                "answers and the teacher; on the four-domain streams of Qwen2.5-Coder-0.5B and SmolLM2 it ranked no "
                "better within domains and changed answers (Qwen's MMLU STEM accuracy −0.06; docs/secl_results.md), "
                "and with the consolidation schedule on Qwen's QA-LM its final adapter ranked 0.247 below "
                "'confidence''s (docs/secl_results.md, section 3c), so 'confidence' stays the default.",
        "choices": list(ADAPTER_SCOPES)})
    learning_rate: float = field(default=1e-3, metadata={"help": "AdamW learning rate of the adapters (reconstruction)."})
    steps_per_update: int = field(default=1, metadata={
        "help": "AdamW steps per accepted question (reconstruction: the paper takes one gradient step). With a "
                "replay buffer each step is on a minibatch: the question and up to replay_batch_size earlier ones. "
                "Default 1, kept by the schedule study (experiments/secl_schedule.py, docs/secl_results.md): 4 with "
                "replay ranks better still but costs about 10 forward passes per question, above the paper's 4.6; "
                "consolidation_epochs buys the steps within it."})
    replay_size: int = field(default=0, metadata={
        "help": "Replay buffer: how many burst questions (their answer's cache and pseudo-label c*) are kept for "
                "the update steps and the consolidation epochs (which bursts' questions: replay_scope). 0 (the "
                "paper's one step on the current question, nothing kept) turns replay and consolidation off; a "
                "replayed question's target is recomputed from its current confidence, ĉ = c + α_step·clip(c* − c, "
                "−δ, δ). Default 0 (see consolidation_epochs for why the schedule the study picked is opt-in); 50 "
                "with replay_batch_size 7, steps_per_update 4, restate 'option_text' and tau_n 0.05 ranks better "
                "still (SmolLM2 QA-LM: AUROC 0.74 against 0.60), at about 10 passes per question."})
    replay_scope: str = field(default="burst", metadata={
        "help": "Which questions the replay buffer keeps: 'burst' (the buffer is emptied when a burst opens, so "
                "replay and consolidation train on the open burst's questions only) or 'stream' (kept across "
                "bursts, the oldest dropped once replay_size are kept: each consolidation, and each update step "
                "when replay_batch_size > 0, also draws earlier bursts' questions, their targets recomputed from "
                "their own c*, so a later burst where the teacher ranks poorly need not overwrite what an earlier "
                "one taught; needs replay_size > 0, and above burst_size for a consolidation to see an earlier burst: "
                "2 x burst_size keeps the last two). Extension, not in the paper "
                "(docs/methods.md, 'consolidation'). Default 'burst': measured on two bursts only (SmolLM2, QA-LM then summarization-LM, answers fixed), "
                "'stream' kept the first domain's held-out AUROC at 0.746 against 0.601 (+0.145 [+0.014, +0.277]) "
                "for twice the second consolidation's passes (docs/secl_results.md, 'A second burst after the first'); on "
                "SmolLM2's four-domain stream (replay_size 100) the adapter it ends with ranks QA-LM at 0.714 against "
                "0.525, but the rehearsed bursts' higher level is carried into the next domain (MMLU STEM Brier +0.120 "
                "above the constant's against +0.010; docs/secl_results.md, 'The four-domain stream with the earlier "
                "bursts rehearsed').",
        "choices": list(REPLAY_SCOPES)})
    replay_batch_size: int = field(default=4, metadata={
        "help": "Earlier questions drawn (uniformly, without replacement, seeded) from the replay buffer "
                "for each update step, beside the current question (used only when replay_size > 0). Each costs "
                "one forward pass with its backward per step (reconstruction). 0: the steps take the current "
                "question alone, as the paper's, and the buffer serves only consolidation_epochs (the study's "
                "pick)."})
    consolidation_epochs: int = field(default=0, metadata={
        "help": "Epochs over the replay buffer when a burst ends (its last question is read): every kept question, "
                "in seeded random minibatches of consolidation_batch_size, the target recomputed as for replay "
                "(docs/methods.md, 'consolidation'; extension, not in the paper). Costs epochs x buffer forward "
                "passes with their backward, once per burst; needs replay_size > 0. Default 0 (opt-in). The "
                "schedule study's pick (docs/secl_results.md): 3 epochs, consolidation_batch_size 1, replay_size 50, "
                "replay_batch_size 0, restate 'option_text', tau_n 0.05 (SmolLM2 QA-LM AUROC 0.60 against 0.46 with "
                "one step per question); on the four-domain stream see consolidation_lr_scheduler."})
    consolidation_batch_size: int = field(default=1, metadata={
        "help": "Questions per AdamW step of the consolidation epochs (measured: the same passes in minibatches of "
                "1, 2 and 8 ranked the development stream at AUROC 0.70, 0.61 and 0.58; AdamW's step is about the "
                "learning rate whatever the batch, so smaller batches move further; docs/secl_results.md)."})
    consolidation_lr_scheduler: str = field(default="constant", metadata={
        "help": "Learning rate over the consolidation's steps: 'constant' (learning_rate throughout) or 'linear' "
                "(torch's LinearLR from learning_rate down to 0 at the last step; the update steps keep "
                "learning_rate). With minibatches of one question the last steps of a constant rate set the "
                "confidence level the burst ends with (docs/secl_results.md, 'Where the consolidation leaves the "
                "level'); a decaying rate averages them. Measured on SmolLM2's four-domain stream with the "
                "consolidation schedule (docs/secl_results.md, 'The decaying consolidation rate on the four-domain "
                "stream'): 'linear' removed the level the constant rate carried into the next domain (MMLU STEM Brier "
                "+0.010 above the constant's against +0.271) and ranked best within domains (ΔAUROC +0.087 against "
                "+0.062 constant, +0.010 one-step), ECE −35 % (one-step −44 %) and Brier as the one-step default's. Default 'constant' (the rate as "
                "studied): on Qwen's four-domain stream the schedule with 'linear' failed the rule set for a default "
                "(ECE −33 % < 56 %, 4.76 passes per question > 4.6, MMLU STEM Brier +0.064 above the constant's; "
                "QA-LM AUROC 0.769 against 0.740 verbalized, Brier below the constant's; docs/secl_results.md, "
                "'four-domain stream with the decaying consolidation rate', on Qwen).",
        "choices": list(CONSOLIDATION_LR_SCHEDULES)})
    confidence_loss: str = field(default="mse", metadata={
        "help": "The update steps' loss against the target ĉ: 'mse' (c − ĉ)², the paper's; 'kl' the KL divergence "
                "from the distribution with mass on the two values of 0, 0.1, …, 1 around ĉ (mean ĉ) to the read's "
                "distribution over those values, whose gradient stays when the read puts all its mass on one "
                "number, where MSE's vanishes (docs/methods.md, 'SECL: the confidence loss'; extension, not in the "
                "paper). Default 'mse' (measured, docs/secl_results.md sections 2 and 3c): on Qwen2.5-Coder-0.5B's "
                "QA-LM 'kl' learned offline what MSE learned (held-out AUROC 0.917 against 0.910) and online, with the "
                "consolidation schedule, ranked as MSE did on both seeds (after the burst +0.014 and +0.034, "
                "undecided) with a lower Brier after the burst (−0.031, −0.015); the one-step default and the "
                "four-domain stream were not run with it, so it is opt-in.",
        "choices": list(CONFIDENCE_LOSSES)})
    burst_confidence: str = field(default="verbalized", metadata={
        "help": "The confidence returned for a question inside a burst: 'verbalized' the student's read (the "
                "paper's: every question gets the verbalized confidence of the adapter the questions before it "
                "left); 'teacher' the pseudo-label c* (P(True)Norm at tau_n) SECL has just computed for that "
                "question to train on, at no extra forward pass. Outside bursts, and for training (bin gate, "
                "target, replay), the verbalized read is used either way: the option changes what is returned, "
                "nothing that is learnt (docs/methods.md, 'SECL: the confidence returned in a burst'; extension, "
                "not in the paper). Default 'verbalized', by a rule written before the test runs "
                "(docs/secl_results.md, 'c* returned inside the burst'): on Qwen2.5-Coder-0.5B's QA-LM 'teacher' "
                "ranks the one-step default's stream at 0.891 / 0.881 (seeds 0 / 1) against 0.670 / 0.663, within "
                "0.05 of the offline ceiling 0.910, with a lower Brier, but its ECE is the teacher's and rises by "
                "0.08 (decisively); on SmolLM2's four-domain stream within domains ΔAUROC +0.017 [-0.008, +0.040], "
                "Brier unchanged (-0.002 [-0.005, +0.002]). Use it to rank answers or to score them by Brier.",
        "choices": list(BURST_CONFIDENCES)})
    restate: str = field(default="option_text", metadata={
        "help": "What the confidence turn's '{answer}' restates: 'option_text' for multiple choice the chosen option "
                "as 'A. <option text>' (as diagnose and the P(True) teacher restate it; answers naming no option keep "
                "their decoded text); 'answer' the decoded answer, e.g. the bare letter 'A'. Default 'option_text' "
                "(since 2026-12-03; docs/secl_results.md, 'Qwen-0.5B's four-domain stream, one step per "
                "question, the option text restated'): on Qwen-0.5B's four-domain test stream it met the rule set "
                "before the run against the bare letter (within domains SECL AUROC 0.612 against 0.562, ECE cut 70 "
                "percent, Brier 0.004 above the constants, 3.92 passes per question); on SmolLM2's four-domain stream it "
                "is slightly worse than the bare letter but within the bounds set before the run (AUROC 0.477 "
                "against 0.496, ECE cut 35 against 44 percent, Brier 0.020 against 0.015 above the constants; "
                "docs/secl_results.md, 'SmolLM2's four-domain stream, one step per question, the option text "
                "restated'). A linear probe reads correctness at that position at AUROC "
                "0.88 with it, 0.69 with the bare letter; the consolidation schedule needs it (see "
                "consolidation_epochs).",
        "choices": list(RESTATEMENTS)})
    confidence_template: str = field(default=CONFIDENCE_TEMPLATE, metadata={
        "help": "Follow-up turn asking for the 0-10 confidence; must contain '{answer}' (measured wording)."})
    p_true_template: str = field(default=P_TRUE_TEMPLATE, metadata={
        "help": "Follow-up turn asking whether the answer is correct; must contain '{answer}'."})
    prompt_format: str = field(default="auto", metadata={
        "help": "How prompts are formatted: 'chat', 'plain' or 'auto' (chat when the tokenizer has a template).",
        "choices": list(PROMPT_FORMATS)})
    answer_max_chars: int = field(default=200, metadata={
        "help": "Longer answers are restated in the follow-up turns by their last characters (where the final "
                "answer of a worked solution is)."})
    distractor_max_new_tokens: int = field(default=32, metadata={
        "help": "Length of the beam-search alternatives for open-ended answers."})

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
