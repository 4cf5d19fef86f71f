"""Options of the CALM experiment (``python -m experiments calm``): ``CALMExperimentConfig`` and its constants.

The methods of the table (``TABLE_METHODS``) are the rows of the CALM tables: the untrained model, temperature
scaling, SFT, label smoothing, CFT, CALM (``bome``, the trainer method of the BOME solver) and its ablations.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from hf_calibration.calm.bome import UPPER_GRADIENTS
from hf_calibration.calm.config import BOME_OPTIMIZERS, ENTROPY_DOMAINS
from hf_calibration.data import MCQA_DATASETS, parse_domains
from hf_calibration.errors import ParameterError, renamed_parameters
from hf_calibration.jobs.common import check_choice, check_int, check_positive_number

from experiments.common import MAX_SEED

TABLE_METHODS = ("uncalibrated", "ts", "sft", "label_smoothing", "cft", "bome", "iterate", "regularization", "scalar")
# the methods that train a logit adjustment with the entropy term (--entropy-domain applies to these)
ENTROPY_METHODS = ("bome", "iterate", "regularization", "scalar")
MMLU_OOD = "mmlu:humanities,mmlu:social_sciences,mmlu:other,gpqa,halueval_qa"
OTHER_OOD = "mmlu:stem,halueval_qa"
PHASES = ("all", "train", "report")
SELECTION_RULES = ("conf_ece", "cw_ece", "nll", "last")
OPEN_ENDED = ("off", "also", "only")
# The open-ended setting (experiments.calm_open): its domains (training domain first) and methods.
OPEN_ENDED_DOMAINS = ("halueval_qa_open", "gsm8k_open")
OPEN_ENDED_METHODS = ("uncalibrated", "ts", "sft", "bome")
# Upper bounds of the open-ended generation sizes (a typo like 5000 samples would run for days, not fail).
MAX_OPEN_SAMPLES = 100
MAX_OPEN_NEW_TOKENS = 1024
# Options that act only with open_ended "also" or "only".
OPEN_OPTIONS = ("open_domains", "open_samples", "open_max_new_tokens", "open_equivalence")


@dataclass(kw_only=True)
class CALMExperimentConfig:
    """Options of the calm experiment besides ``ExperimentConfig``'s (model, training domain, seed, scoring
    batch size, device, bootstrap resamples, output folder). The defaults are the recorded Qwen run: sized so nine
    methods fit in about an hour on one idle CPU core (≈ 2 s per scored question, ≈ 20 s per SFT step, the
    bilevel methods up to 2.5× that): seven trainings of 8 steps (one pass over S_T), eight scorings of the
    validation, test and OOD sets; too small for the intervals to separate methods. That run kept the last step;
    the checkpoint selection added since (``select_by``, ``select_every``: 4 scorings of the 20 validation
    questions per trained method, ≈ 160 s each) makes the same sizes ≈ 20 min longer. CALM's settings (η, inner
    steps, learning rates, optimizer) are BOME's and the recorded run's: in the sensitivity runs of
    docs/calm_results.md (SmolLM2, HaluEval QA-LM; η 0.9 and α's rate 5e-3 at three seeds, the rest at one) neither
    η 0.9, T = 3, α learning rate 0.5 or 5e-3, the vocabulary entropy domain nor BOME's SGD step (five learning-rate
    pairs, plain and momentum: unstable at α's rate ≥ 0.05, too slow to learn at 5e-3) beat TS out of domain or kept
    95 % of SFT's accuracy, and on Qwen (three seeds) α's rate 5e-3 keeps more accuracy (84 % of SFT's against
    71 %) but is further above TS out of domain, so they stay. Checked at construction: ParameterError naming the
    field."""

    phase: str = field(default="all", metadata={
        "help": "train (score every method not scored yet), report (the table from the scores) or all.",
        "choices": list(PHASES)})
    methods: list[str] = field(default_factory=lambda: list(TABLE_METHODS), metadata={
        "help": "Methods to train and score.", "choices": list(TABLE_METHODS)})
    ood_domains: str | None = field(default=None, metadata={
        "help": f"Comma-separated OOD sets (default: {MMLU_OOD} for an MMLU domain, else {OTHER_OOD})."})
    n_train: int = field(default=32, metadata={"help": "Questions in S_T."})
    extra_train: int = field(default=0, metadata={
        "help": "Questions added to S_T from the HaluEval task of a length-matched training domain "
                "(halueval_<task>_lm) that are outside its length-matched set: half with the right answer the "
                "longer of the two, half the shorter, so picking the shorter answer is right on exactly half "
                "(experiments.calm.length_balanced_extra; docs/calm_results.md). The other splits do not change. "
                "Default 0: none."})
    n_calibration: int = field(default=32, metadata={"help": "Questions in S_V (labels unused)."})
    n_validation: int = field(default=20, metadata={"help": "Questions in the labelled validation split."})
    n_test: int = field(default=30, metadata={"help": "Questions in the in-domain test split."})
    n_ood: int = field(default=20, metadata={"help": "Questions per OOD set."})
    max_steps: int = field(default=8, metadata={"help": "Optimizer steps per trained method."})
    train_batch_size: int = field(default=4, metadata={"help": "Training batch size."})
    lora_r: int = field(default=8, metadata={"help": "LoRA rank on the attention projections."})
    learning_rate: float = field(default=1e-3, metadata={"help": "Learning rate of the LoRA weights (θ)."})
    alpha_learning_rate: float = field(default=5e-2, metadata={"help": "Learning rate of the logit adjustment (α)."})
    inner_learning_rate: float = field(default=1e-2, metadata={"help": "ξ_in of BOME's inner steps."})
    inner_steps: int = field(default=1, metadata={"help": "T: BOME's inner steps."})
    eta: float = field(default=0.5, metadata={"help": "η in (0, 1] of BOME's control barrier φ (CALMConfig.eta)."})
    bome_optimizer: str = field(default="trainer", metadata={
        "help": "Optimizer of 'bome' and 'scalar' (CALMConfig.bome_optimizer): 'trainer' (AdamW, as the other "
                "methods), or BOME's own step 'sgd' / 'sgd_momentum' (momentum 0.9), which needs learning rates of "
                "SGD's scale.", "choices": list(BOME_OPTIMIZERS)})
    upper_gradient: str = field(default="all", metadata={
        "help": "CALMConfig.upper_gradient of 'bome' and 'scalar': 'all' (∇f on α and the LoRA weights, BOME) or "
                "'adjustment' (∇f on α only; the LoRA weights move only along the lower-level constraint).",
        "choices": list(UPPER_GRADIENTS)})
    entropy_domain: str = field(default="options", metadata={
        "help": "CALMConfig.entropy_domain of 'bome' (and its variants): 'options' = L_tr and H over the option "
                "letters at the answer position (the default, the multiple-choice setting's), 'vocab' = over the "
                "full next-token distribution, with α covering the whole vocabulary (the open-ended setting's "
                "form, here a sensitivity variant).", "choices": list(ENTROPY_DOMAINS)})
    balance_gold: bool = field(default=True, metadata={
        "help": "Every option letter gold equally often in each set (each split balanced on its own)."})
    select_by: str = field(default="conf_ece", metadata={
        "help": "Checkpoint kept for every trained method: the lowest conf-ECE, cw-ECE (15 bins) or NLL on the "
                "labelled validation split among steps select_every, 2·select_every, … and the last (the rule needs "
                "labels, so it reads the validation split, not S_V); 'last': the last step.",
        "choices": list(SELECTION_RULES)})
    open_ended: str = field(default="off", metadata={
        "help": "The open-ended generative setting (generative CALM on free-form answers) with Semantic ECE: 'also' after "
                "the multiple-choice table, into <output_dir>/open_ended/, 'only' that one, 'off' (default). Its "
                "methods are those of --methods among uncalibrated, ts, sft and bome, with the same split sizes and "
                "training options.", "choices": list(OPEN_ENDED)})
    open_domains: str = field(default="halueval_qa_open,gsm8k_open", metadata={
        "help": "Open-ended domains: the training domain first, then the OOD ones (halueval_qa_open, gsm8k_open)."})
    open_samples: int = field(default=5, metadata={"help": "Answers sampled per question for the semantic "
                                                           "confidence (open-ended setting; at most 100)."})
    open_max_new_tokens: int = field(default=16, metadata={"help": "Tokens per generated open-ended answer (at most 1024)."})
    open_equivalence: str = field(default="lexical", metadata={
        "help": "When two open-ended answers (and an answer and the reference) mean the same: 'lexical' (SQuAD "
                "normalisation or the same number) or 'embedding' (all-MiniLM-L6-v2 cosine ≥ 0.9).",
        "choices": ["lexical", "embedding"]})
    seeds: str | None = field(default=None, metadata={
        "help": "Comma-separated training seeds (e.g. 0,1,2): each seed draws its own splits and trains every "
                "method into <output_dir>/seed_<s>/, and the table summarises them (mean and range over seeds, "
                "paired CALM − TS / − SFT pooled over seeds, the claim check on the pooled intervals; with "
                "--open-ended, the Sem-ECE claim pooled over the seeds too). Default: the one --seed, into "
                "<output_dir>."})
    select_every: int = field(default=2, metadata={
        "help": "k: evaluate and save a checkpoint every k optimizer steps (and at the last) for select_by. Each "
                "evaluation scores the validation split once."})

    def __post_init__(self):
        check_choice(self.phase, "phase", PHASES)
        if not self.methods or any(m not in TABLE_METHODS for m in self.methods):
            raise ParameterError("methods", self.methods,
                                 f"must be one or more of {', '.join(TABLE_METHODS)}, got {self.methods!r}")
        for name in ("n_train", "n_calibration", "n_validation", "n_test", "n_ood", "max_steps", "train_batch_size",
                     "lora_r"):
            check_int(getattr(self, name), name)
        check_int(self.inner_steps, "inner_steps", minimum=0)
        check_int(self.extra_train, "extra_train", minimum=0)
        check_choice(self.select_by, "select_by", SELECTION_RULES)
        check_choice(self.bome_optimizer, "bome_optimizer", BOME_OPTIMIZERS)
        check_choice(self.upper_gradient, "upper_gradient", UPPER_GRADIENTS)
        check_choice(self.entropy_domain, "entropy_domain", ENTROPY_DOMAINS)
        check_int(self.select_every, "select_every")
        for name in ("learning_rate", "alpha_learning_rate", "inner_learning_rate"):
            check_positive_number(getattr(self, name), name)
        check_positive_number(self.eta, "eta")
        if self.eta > 1:
            raise ParameterError("eta", self.eta, f"must be in (0, 1], got {self.eta!r}")
        if self.seeds is not None:
            self.seed_list()
        if self.open_ended is False:  # YAML reads a bare `off` as false
            self.open_ended = "off"
        check_choice(self.open_ended, "open_ended", OPEN_ENDED)
        check_choice(self.open_equivalence, "open_equivalence", ("lexical", "embedding"))
        for name, most in (("open_samples", MAX_OPEN_SAMPLES), ("open_max_new_tokens", MAX_OPEN_NEW_TOKENS)):
            check_int(getattr(self, name), name)
            if getattr(self, name) > most:
                raise ParameterError(name, getattr(self, name), f"must be at most {most}, got {getattr(self, name)!r}")
        domains = [d.strip() for d in str(self.open_domains).split(",")]
        if len(domains) < 1 or any(d not in OPEN_ENDED_DOMAINS for d in domains) or len(set(domains)) != len(domains):
            raise ParameterError("open_domains", self.open_domains, f"must be distinct names among "
                                 f"{', '.join(OPEN_ENDED_DOMAINS)}, training domain first, got {self.open_domains!r}")
        if self.open_ended == "off":
            defaults = {f.name: f.default for f in fields(self)}
            for name in OPEN_OPTIONS:
                if getattr(self, name) != defaults[name]:
                    raise ParameterError(name, getattr(self, name), f"acts only on the open-ended setting, which "
                                         f"{{open_ended}} off leaves out; give --open-ended also or only, or drop "
                                         f"{{{name}}}", related=("open_ended",))
        if self.open_ended != "off" and not set(self.methods) & set(OPEN_ENDED_METHODS):
            raise ParameterError("methods", self.methods, f"the open-ended setting runs {', '.join(OPEN_ENDED_METHODS)}; "
                                 f"none is among {{methods}} {' '.join(self.methods)}", related=("open_ended",))
        if self.ood_domains is not None:
            with renamed_parameters(domains="ood_domains"):
                parse_domains(self.ood_domains, tuple(MCQA_DATASETS))

    def seed_list(self) -> list[int] | None:
        """``seeds`` as distinct integers ≥ 0 (None when not given); ParameterError naming ``seeds``."""
        if self.seeds is None:
            return None
        parts = [p.strip() for p in str(self.seeds).split(",") if p.strip()]
        if (not parts or not all(p.isascii() and p.isdigit() and int(p) <= MAX_SEED for p in parts)
                or len(set(map(int, parts))) != len(parts)):
            raise ParameterError("seeds", self.seeds, f"must be distinct integers in [0, 2**32 - 1] separated by "
                                 f"commas, got {self.seeds!r}")
        return [int(p) for p in parts]

    def ood_specs(self, train_domain: str) -> list[str]:
        """The OOD domains for a model trained on ``train_domain``."""
        text = self.ood_domains or (MMLU_OOD if train_domain.startswith("mmlu") else OTHER_OOD)
        return [d.strip() for d in text.split(",")]
