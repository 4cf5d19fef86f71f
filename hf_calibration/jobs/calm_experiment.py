"""The calm experiment: CALM with LoRA against the paper's baselines and ablations on the same splits
(SPEC §1, §5); run by ``run_experiment`` with ``name="calm"`` (``hf-calibration experiment calm``).

Train on one domain (an MMLU group such as ``mmlu:stem``, or ``halueval_qa_lm``, ``halueval_qa``, ``gpqa``):
S_T for training, S_V (labels unused) for the entropy, a labelled validation split (post-hoc TS fitting, the
constant-accuracy reference), an in-domain test split; out of domain: ``ood_domains`` (default for an MMLU
group: the other MMLU categories, GPQA-Diamond and HaluEval QA; for a HaluEval or GPQA domain: MMLU STEM and
full HaluEval QA). ``balance_gold`` balances the gold position across letters in every set. Every method
starts from the same base model and sees the same data in the same order.

Every trained method keeps the checkpoint chosen by one rule (``select_by``, ``select_every``): every k optimizer
steps and at the last, the model is scored on the labelled validation split and the step with the lowest value
(conf-ECE by default) is restored before scoring. The rule needs labels, so it reads the validation split (SPEC
§5: "labelled, for checkpoint selection and post-hoc fitting"; TS is fitted on the same split), not S_V, whose
labels CALM never uses. The untrained model is not a candidate (it is the ``uncalibrated`` row).

Seeds (``seeds="0,1,2"``): each seed draws its own splits and trains every method into ``<output>/seed_<s>/``;
``seeds.md`` gives the mean and range over seeds and CALM − TS / − SFT pooled over seeds by a stratified paired
bootstrap (``metrics.stratified_bootstrap``: each seed's questions resampled on their own). Every report ends
with a claim check against the paper (``claim_check``): OOD conf-ECE below TS and below SFT, in-domain accuracy
at least 95 % of SFT's, and, with ``open_ended`` (``jobs.calm_open``: generative CALM on free-form answers,
Semantic ECE), the lowest mean Semantic-ECE out of domain.

Two phases, so a long run can be resumed: ``train`` writes ``<output>/scores/<method>.npz`` (option
log-scores per split) and skips methods already scored; ``report`` builds the table (``report.md``,
``report.json``, ``items.jsonl``, reliability diagrams ``reliability_<split>.png``) from them.
"""

from __future__ import annotations

import json
import os
import time
import warnings
import zipfile
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np

from hf_calibration import modeling
from hf_calibration.calm.config import BOME_OPTIMIZERS, ENTROPY_DOMAINS
from hf_calibration.data import MCQA_DATASETS, balance_gold, domain_key, load_mcqa, parse_domains
from hf_calibration.errors import ParameterError, ParameterWarning, renamed_parameters
from hf_calibration.jobs.common import check_choice, check_int, check_output_dir, check_positive_number, progress_line

METHODS = ("uncalibrated", "ts", "sft", "label_smoothing", "cft", "bome", "iterate", "regularization", "scalar")
# the methods that train a logit adjustment with the entropy term (--entropy-domain applies to these)
CALM_METHODS = ("bome", "iterate", "regularization", "scalar")
MMLU_OOD = "mmlu:humanities,mmlu:social_sciences,mmlu:other,gpqa,halueval_qa"
OTHER_OOD = "mmlu:stem,halueval_qa"
PHASES = ("all", "train", "report")
SELECTION_RULES = ("conf_ece", "cw_ece", "nll", "last")
SPLITS = ("train", "calibration", "validation", "id_test")
OPEN_ENDED = ("off", "also", "only")
MAX_SEED = 2**32 - 1  # numpy's and the Trainer's seed range


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
    methods: list[str] = field(default_factory=lambda: list(METHODS), metadata={
        "help": "Methods to train and score.", "choices": list(METHODS)})
    ood_domains: str | None = field(default=None, metadata={
        "help": f"Comma-separated OOD sets (default: {MMLU_OOD} for an MMLU domain, else {OTHER_OOD})."})
    n_train: int = field(default=32, metadata={"help": "Questions in S_T."})
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
    entropy_domain: str = field(default="options", metadata={
        "help": "CALMConfig.entropy_domain of 'bome' (and its variants): 'options' = L_tr and H over the option "
                "letters at the answer position (the default, the multiple-choice setting's), 'vocab' = over the "
                "full next-token distribution, with α covering the whole vocabulary (the open-ended setting's "
                "form, here a sensitivity variant; issue 17.3).", "choices": list(ENTROPY_DOMAINS)})
    balance_gold: bool = field(default=True, metadata={
        "help": "Every option letter gold equally often in each set (each split balanced on its own)."})
    select_by: str = field(default="conf_ece", metadata={
        "help": "Checkpoint kept for every trained method: the lowest conf-ECE, cw-ECE (15 bins) or NLL on the "
                "labelled validation split among steps select_every, 2·select_every, … and the last (the rule needs "
                "labels, so it reads the validation split, not S_V); 'last': the last step.",
        "choices": list(SELECTION_RULES)})
    open_ended: str = field(default="off", metadata={
        "help": "The open-ended generative setting (jobs.calm_open; issue 17.5) with Semantic ECE: 'also' after "
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
        if not self.methods or any(m not in METHODS for m in self.methods):
            raise ParameterError("methods", self.methods,
                                 f"must be one or more of {', '.join(METHODS)}, got {self.methods!r}")
        for name in ("n_train", "n_calibration", "n_validation", "n_test", "n_ood", "max_steps", "train_batch_size",
                     "lora_r"):
            check_int(getattr(self, name), name)
        check_int(self.inner_steps, "inner_steps", minimum=0)
        check_choice(self.select_by, "select_by", SELECTION_RULES)
        check_choice(self.bome_optimizer, "bome_optimizer", BOME_OPTIMIZERS)
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
        from hf_calibration.jobs.calm_open import OPEN_DOMAINS, OPEN_METHODS

        domains = [d.strip() for d in str(self.open_domains).split(",")]
        if len(domains) < 1 or any(d not in OPEN_DOMAINS for d in domains) or len(set(domains)) != len(domains):
            raise ParameterError("open_domains", self.open_domains, f"must be distinct names among "
                                 f"{', '.join(OPEN_DOMAINS)}, training domain first, got {self.open_domains!r}")
        if self.open_ended == "off":
            defaults = {f.name: f.default for f in fields(self)}
            for name in OPEN_OPTIONS:
                if getattr(self, name) != defaults[name]:
                    raise ParameterError(name, getattr(self, name), f"acts only on the open-ended setting, which "
                                         f"{{open_ended}} off leaves out; give --open-ended also or only, or drop "
                                         f"{{{name}}}", related=("open_ended",))
        if self.open_ended != "off" and not set(self.methods) & set(OPEN_METHODS):
            raise ParameterError("methods", self.methods, f"the open-ended setting runs {', '.join(OPEN_METHODS)}; "
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


def load_domain(spec: str, *, limit=None, seed=0, balance_gold=False):
    """The MCQA rows of one domain of ``data.parse_domains`` (``mmlu:<categories or subjects, '+'-joined>`` or
    a ``load_mcqa`` name)."""
    [(name, subjects)] = parse_domains(spec, tuple(MCQA_DATASETS))
    return load_mcqa(name, subjects=subjects, limit=limit, seed=seed, balance_gold=balance_gold)


def build_splits(train_domain: str, config: CALMExperimentConfig, *, seed: int = 0) -> dict:
    """S_T, S_V, validation, ID test (disjoint, from ``train_domain``) and the OOD sets (keyed by
    ``data.domain_key``); with ``balance_gold`` each split is balanced on its own (a balanced whole splits into
    letter-skewed parts: the gold letter's share would differ between the training and the test data).
    ParameterError naming the split sizes when they ask for more questions than the domain has."""
    domain = load_domain(train_domain, seed=seed).shuffle(seed=seed)
    sizes = [config.n_train, config.n_calibration, config.n_validation, config.n_test]
    if sum(sizes) > len(domain):
        raise ParameterError("n_train", config.n_train, f"{{n_train}}/{{n_calibration}}/{{n_validation}}/{{n_test}}: "
                             f"{sizes} sum to more than the {len(domain)} questions of {train_domain!r}",
                             related=("n_calibration", "n_validation", "n_test"))
    bounds = np.cumsum([0] + sizes)
    splits = {n: domain.select(range(bounds[i], bounds[i + 1])) for i, n in enumerate(SPLITS)}
    if config.balance_gold:
        splits = {n: balance_gold(split, seed=seed) for n, split in splits.items()}
    for spec in config.ood_specs(train_domain):
        splits[domain_key(spec)] = load_domain(spec, limit=config.n_ood, seed=seed, balance_gold=config.balance_gold)
        if len(splits[domain_key(spec)]) < config.n_ood:
            n = len(splits[domain_key(spec)])
            warnings.warn(ParameterWarning("n_ood", config.n_ood, f"{{n_ood}} {config.n_ood} exceeds the {n} questions "
                                           f"of {spec!r}; using all {n}"), stacklevel=2)
    return splits


def _score_all(model, tokenizer, splits, batch_size: int, ood: list) -> dict:
    out = {}
    for name in ("validation", "id_test", *ood):
        s = modeling.score_mcqa(model, tokenizer, splits[name], batch_size=batch_size, progress=False)
        out[f"{name}_logits"] = s.option_logits
        out[f"{name}_labels"] = s.labels
    return out


def _selection_kwargs(config: CALMExperimentConfig) -> dict:
    """CALMConfig fields of the checkpoint rule: evaluate and save every ``select_every`` steps (the Trainer adds
    the last step), restore the lowest ``eval_<select_by>`` at the end; ``save_total_limit=1`` keeps only the best
    checkpoint on disk once training ends."""
    if config.select_by == "last":
        return {"save_strategy": "no"}
    k = config.select_every
    return {"eval_strategy": "steps", "eval_steps": k, "save_strategy": "steps", "save_steps": k,
            "save_total_limit": 1, "select_best_by": config.select_by}


def _selection_info(trainer, config: CALMExperimentConfig) -> dict:
    """The rule, every evaluated (step, value), the step restored, and the validation curve: per evaluation the
    step, the validation loss (the training cross-entropy on the validation split), NLL, conf-ECE and accuracy."""
    if config.select_by == "last":
        return {"rule": "last", "selected_step": trainer.state.global_step}
    key = f"eval_{config.select_by}"
    evaluated = [[e["step"], e[key]] for e in trainer.state.log_history if key in e]
    curve = [{"step": e["step"], **{k: e.get(f"eval_{k}") for k in ("loss", "nll", "conf_ece", "accuracy")}}
             for e in trainer.state.log_history if "eval_loss" in e]
    return {"rule": config.select_by, "split": "validation", "every": config.select_every, "evaluated": evaluated,
            "selected_step": trainer.state.best_global_step, "validation_curve": curve}


def _train_method(method: str, splits, config: CALMExperimentConfig, *, model_name: str, out: Path, seed: int,
                  device: str, tokenizer, callbacks=None):
    from hf_calibration.calm import CALMConfig, CALMTrainer, default_lora_config, mcqa_to_prompt_completion

    model, _ = modeling.load_model(model_name)
    # the entropy and L_tr read these letters only (K = 2 for HaluEval)
    num_options = len(splits["train"][0]["choices"])
    training = CALMConfig(
        output_dir=str(out / "runs" / method), method="sft" if method == "label_smoothing" else method,
        max_steps=config.max_steps, per_device_train_batch_size=config.train_batch_size,
        learning_rate=config.learning_rate, alpha_learning_rate=config.alpha_learning_rate,
        inner_steps=config.inner_steps, num_options=num_options, inner_learning_rate=config.inner_learning_rate,
        eta=config.eta, entropy_domain=config.entropy_domain if method in CALM_METHODS else "options",
        label_smoothing_factor=0.1 if method == "label_smoothing" else 0.0, lr_scheduler_type="constant",
        warmup_steps=0, bf16=False, activation_checkpointing=False, report_to="none",
        logging_steps=10, seed=seed, use_cpu=modeling.resolve_device(device) == "cpu", max_length=None,
        disable_tqdm=True, dataset_num_proc=None, **_selection_kwargs(config),
        bome_optimizer=config.bome_optimizer if method in ("bome", "scalar") else "trainer",
    )
    train = mcqa_to_prompt_completion(splits["train"], tokenizer)
    calibration = mcqa_to_prompt_completion(splits["calibration"], tokenizer).remove_columns("completion")
    validation = None if config.select_by == "last" else mcqa_to_prompt_completion(splits["validation"], tokenizer)
    peft = default_lora_config(config.lora_r)
    trainer = CALMTrainer(model, args=training, train_dataset=train, calibration_dataset=calibration,
                          eval_dataset=validation, processing_class=tokenizer, peft_config=peft, callbacks=callbacks)
    start = time.perf_counter()
    trainer.train()  # ends with the selected checkpoint restored (CALMTrainer._load_best_model)
    seconds = time.perf_counter() - start
    trainer.model.eval()
    logs = [e for e in trainer.state.log_history if "lower_loss" in e]
    return trainer.model, {"num_options": num_options, "train_seconds": seconds,
                           "seconds_per_step": seconds / config.max_steps, "log": logs,
                           "selection": _selection_info(trainer, config),
                           "mean_temperature": float(trainer.model.logit_adjustment.temperature.detach().mean())}


def _scored_file(out: Path, method: str, suffix: str) -> Path:
    """Where a method's scores (.npz) or info (.json) are; TS reuses the uncalibrated scores."""
    return out / "scores" / f"{'uncalibrated' if method == 'ts' else method}.{suffix}"


def write_npz_atomic(path: Path, arrays: dict) -> None:
    """``np.savez(path, **arrays)`` through a temporary file in the same folder and ``os.replace``: ``path`` is
    either absent or complete, never a truncated archive; a failed write removes its temporary file and re-raises."""
    tmp = path.with_name(f".{path.name}.partial")
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def read_scored(out: Path) -> tuple[dict, dict]:
    """The scores and infos of every method already scored in ``out/scores`` (a finished sub-run, read to resume)."""
    def load(method, kind, read):
        path = _scored_file(out, method, kind)
        try:
            return read(path)
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:  # truncated, missing, not JSON
            raise ParameterError("output_dir", str(out), f"{str(path)!r} is not a readable score file "
                                 f"({type(err).__name__}); remove it to score {method} again, or give "
                                 f"{{overwrite}}", related=("overwrite",)) from None

    scores, infos = {}, {}
    for method in METHODS:
        if method != "ts" and _scored_file(out, method, "npz").exists():
            scores[method] = load(method, "npz", lambda path: dict(np.load(path)))
            infos[method] = load(method, "json", lambda path: json.loads(path.read_text()))
    return scores, infos


def train_and_score(out: Path, splits, config: CALMExperimentConfig, *, model_name: str, seed: int, device: str,
                    batch_size: int, overwrite: bool = False, progress: bool = True,
                    scored: tuple | None = None) -> tuple[dict, dict]:
    """Train and score every method of ``config.methods`` not scored yet (every one with ``overwrite``) into
    ``scores/<method>.npz`` and ``.json``; → (scores, infos) of every scored method, those of earlier runs read
    back (``scored``: ``read_scored(out)`` when the caller has read it already)."""
    (out / "scores").mkdir(parents=True, exist_ok=True)
    scores, infos = ({}, {}) if overwrite else read_scored(out) if scored is None else scored
    ood = [k for k in splits if k not in SPLITS]
    base = tokenizer = None  # loaded at the first method that needs work: a report-only rerun loads no model
    methods = list(config.methods)
    if "ts" in methods and "uncalibrated" not in methods:  # TS is fitted on the uncalibrated scores
        methods.insert(0, "uncalibrated")
    for method in methods:
        if method in scores:  # checked per method, so two processes can share the list of methods
            progress_line(f"{method}: already scored", progress)
            continue
        if method == "ts":  # fitted in the report on the uncalibrated scores; nothing to train or score
            continue
        if tokenizer is None:
            base, tokenizer = modeling.load_model(model_name, device=device)
        start = time.perf_counter()  # the model load is not part of a method's wall time
        if method == "uncalibrated":
            method_scores, info = _score_all(base, tokenizer, splits, batch_size, ood), {}
        else:
            model, info = _train_method(method, splits, config, model_name=model_name, out=out, seed=seed,
                                        device=device, tokenizer=tokenizer)
            method_scores = _score_all(model, tokenizer, splits, batch_size, ood)
        info["wall_seconds"] = time.perf_counter() - start
        # the .npz marks the method scored (read_scored): written last, and whole (a temporary file renamed), so a
        # run killed in between or mid-write scores the method again instead of leaving a truncated .npz
        _scored_file(out, method, "json").write_text(json.dumps(info, indent=2, default=float) + "\n")
        write_npz_atomic(_scored_file(out, method, "npz"), method_scores)
        scores[method], infos[method] = method_scores, info
        progress_line(f"{method}: {info['wall_seconds']:.0f} s"
                      + (f" ({info['seconds_per_step']:.2f} s/step)" if "seconds_per_step" in info else ""), progress)
    return scores, infos


def _probs(logits):
    z = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(z)
    return p / p.sum(axis=1, keepdims=True)


def method_probabilities(scores: dict, splits) -> tuple[dict, dict]:
    """Option probabilities per method and split from the scores of ``train_and_score`` (TS fitted once on the
    uncalibrated validation scores), and the labels per split."""
    from hf_calibration.posthoc import TemperatureScaler

    probs, labels = {}, {}
    for method in METHODS:
        data = scores.get("uncalibrated" if method == "ts" else method)
        if data is None:
            continue
        transform = lambda z: z  # noqa: E731
        if method == "ts":
            transform = TemperatureScaler().fit(data["validation_logits"], data["validation_labels"]).transform
        probs[method] = {}
        for name in splits:
            logits = transform(np.where(np.isfinite(data[f"{name}_logits"]), data[f"{name}_logits"], -1e9))
            probs[method][name] = _probs(np.asarray(logits))
            labels[name] = data[f"{name}_labels"]
    return probs, labels


PAIRS = (("bome", "ts"), ("bome", "sft"))


def _top_label(probs: dict, labels: dict, method: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    p = probs[method][split]
    return (p.argmax(1) == labels[split]).astype(int), p.max(1)


def paired_comparisons(probs: dict, labels: dict, splits, *, n_resamples: int, seed: int) -> dict:
    """``{split: {"bome − ts": {"conf_ece": …, "accuracy": …}, "bome − sft": …}}``: paired bootstrap (the same
    resampled questions for both methods) of the top-label conf-ECE (15 equal-width bins) and of the accuracy,
    method a − method b, each ``{"value", "low", "high"}`` (95 %); the pairs of ``PAIRS`` whose methods were both
    scored. ``paired_strata_difference`` with the split as its one stratum, so a single seed's interval here and
    the pooled one of ``pooled_difference`` over that split come from the same draws."""
    out = {}
    for name in splits:
        per_pair = {}
        for a, b in PAIRS:
            if a not in probs or b not in probs:
                continue
            stratum = [(_top_label(probs, labels, a, name), _top_label(probs, labels, b, name))]
            per_pair[f"{a} − {b}"] = {}
            for key in ("conf_ece", "accuracy"):
                d = paired_strata_difference(stratum, key=key, n_resamples=n_resamples, seed=seed)
                per_pair[f"{a} − {b}"][key] = {k: d[k] for k in ("value", "low", "high")}
        if per_pair:
            out[name] = per_pair
    return out


ACCURACY_SHARE = 0.95  # the paper's claim: CALM keeps at least 95 % of SFT's in-domain accuracy


def paired_strata_difference(strata: list, *, key: str = "conf_ece", share: float = 1.0, n_resamples: int,
                             seed: int) -> dict:
    """Method a − ``share`` · method b on the same questions, averaged with equal weights over ``strata``, a list of
    ((correct_a, confidence_a), (correct_b, confidence_b)) arrays, one pair per stratum: ``key`` "conf_ece"
    (15 equal-width bins) or "accuracy". Interval: ``metrics.stratified_bootstrap`` (each stratum's questions
    resampled on their own, the same draw for a and b). → ``{"value", "low", "high", "per_stratum"}`` with the
    point value of every stratum in order."""
    from hf_calibration.metrics import expected_calibration_error, stratified_bootstrap

    def value(ya, ca):
        return expected_calibration_error(ya, ca) if key == "conf_ece" else float(np.mean(ya))

    def statistic(k, idx):
        (ya, ca), (yb, cb) = strata[k]
        return value(ya[idx], ca[idx]) - share * value(yb[idx], cb[idx])

    est, low, high = stratified_bootstrap(statistic, [len(sa[0]) for sa, _ in strata], n_resamples=n_resamples,
                                          seed=seed)
    return {"value": est, "low": low, "high": high,
            "per_stratum": [statistic(k, np.arange(len(sa[0]))) for k, (sa, _) in enumerate(strata)]}


def pooled_difference(runs: list, splits, a: str, b: str, *, key: str = "conf_ece", share: float = 1.0,
                      n_resamples: int, seed: int) -> dict:
    """``paired_strata_difference`` of the top-label (correct, confidence) of methods a and b over the strata
    (seed, split) of ``runs`` (a list of (probs, labels), one per training seed) × ``splits``, seed-major."""
    strata = [(_top_label(probs, labels, a, s), _top_label(probs, labels, b, s)) for probs, labels in runs for s in splits]
    return paired_strata_difference(strata, key=key, share=share, n_resamples=n_resamples, seed=seed)


def claim_check(runs: list, ood: list, *, n_resamples: int, seed: int,
                open_row: tuple | None = None) -> tuple[list, dict]:
    """The paper's claims (Wang et al., CALM) on ``runs`` (one (probs, labels) per training seed) → (rows for
    ``reports.format_claim_check``, the differences behind them). Each multiple-choice claim is decided by a
    pooled paired interval (``pooled_difference``, over seeds and, out of domain, the OOD sets with equal weights):
    below 0 held, above 0 not held, else undecided; accuracy: CALM − 0.95 · SFT above 0 held, below 0 not held.
    The open-ended Semantic-ECE claim is ``open_row`` (``calm_open.open_claim``'s row) when the open-ended setting
    ran, else "not run"."""
    kw = dict(n_resamples=n_resamples, seed=seed)
    methods = set(runs[0][0])
    rows, evidence = [], {}

    def interval(d):
        return f"{d['value']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"

    where = f"mean over {len(ood)} OOD set(s) × {len(runs)} seed(s)"
    for b, name in (("ts", "TS"), ("sft", "SFT")):
        claim = f"OOD conf-ECE of CALM below {name}"
        if not {"bome", b} <= methods or not ood:
            rows.append((claim, "not run", f"needs bome, {b} and an OOD set"))
            continue
        d = evidence[f"bome − {b} ood conf_ece"] = pooled_difference(runs, ood, "bome", b, **kw)
        held = True if d["high"] < 0 else False if d["low"] > 0 else None
        rows.append((claim, held, f"{where}: paired Δ {interval(d)}; per stratum "
                     + ", ".join(f"{v:+.3f}" for v in d["per_stratum"])))
    claim = f"in-domain accuracy of CALM ≥ {ACCURACY_SHARE:.0%} of SFT's"
    if {"bome", "sft"} <= methods:
        d = evidence["bome − 0.95·sft id accuracy"] = pooled_difference(runs, ["id_test"], "bome", "sft", key="accuracy",
                                                                       share=ACCURACY_SHARE, **kw)
        acc = {m: np.mean([np.mean(_top_label(p, lab, m, "id_test")[0]) for p, lab in runs]) for m in ("bome", "sft")}
        held = True if d["low"] > 0 else False if d["high"] < 0 else None
        rows.append((claim, held, f"CALM {acc['bome']:.3f} / SFT {acc['sft']:.3f} = {acc['bome'] / acc['sft']:.0%} "
                     f"(mean over {len(runs)} seed(s)); CALM − {ACCURACY_SHARE}·SFT {interval(d)}"))
    else:
        rows.append((claim, "not run", "needs bome and sft"))
    rows.append(open_row or ("lowest mean Semantic-ECE, open-ended cross-domain", "not run",
                             "the open-ended setting did not run (--open-ended also)"))
    return rows, evidence


def report(out: Path, scores: dict, infos: dict, ood: list, *, header: str, n_resamples: int,
           seed: int, open_row: tuple | None = None) -> tuple[dict, str]:
    """The table of every scored method on the ID test and each OOD set (with the constant references fitted on
    the validation split), the OOD mean and the wall times → (results, Markdown text); writes ``report.md``,
    ``report.json``, ``items.jsonl`` and ``reliability_<split>.png`` into ``out``."""
    from hf_calibration.plotting import plot_reliability_diagrams
    from hf_calibration.reports import (format_claim_check, format_table, mcqa_report, references, write_json,
                                        write_jsonl)

    kw = dict(n_resamples=n_resamples, seed=seed)
    probs, labels = method_probabilities(scores, ("validation", "id_test", *ood))
    table = {m: {name: mcqa_report(labels[name], p, **kw) for name, p in per_split.items()}
             for m, per_split in probs.items()}
    results = {"tables": table, "references": {}}
    lines = [header + "\n"]
    for name in ("id_test", *ood):
        signals = {m: table[m][name] for m in table}
        if "uncalibrated" in probs:
            k = probs["uncalibrated"][name].shape[1]
            correct = probs["uncalibrated"][name].argmax(1) == labels[name]
            val_acc = table["uncalibrated"]["validation"]["accuracy"]["value"]
            refs = references(correct, k, accuracy=val_acc, **kw)
            results["references"][name] = refs
            signals.update({f"ref: const = val acc ({val_acc:.3f})": refs["constant_accuracy"],
                            "ref: const = 1/K": refs["constant_1/K"]})
        n = next(iter(table.values()))[name]["n"]  # calibration_report's "n" is a plain int
        lines += [f"### {name} (n={n})", "", "```", format_table(signals), "```", ""]
    ood_mean = {m: {key: float(np.mean([table[m][s][key]["value"] for s in ood]))
                    for key in ("accuracy", "conf_ece", "cw_ece", "smece", "brier", "auroc")} for m in table}
    results["ood_mean"] = ood_mean
    lines += [f"### OOD mean (unweighted over the {len(ood)} OOD sets; point estimates)", "", "```",
              "method           acc    conf-ECE  cw-ECE  smECE  Brier  AUROC"]
    for m, v in ood_mean.items():
        lines.append(f"{m:<16} {v['accuracy']:.3f}  {v['conf_ece']:.3f}     {v['cw_ece']:.3f}   {v['smece']:.3f}  "
                     f"{v['brier']:.3f}  {v['auroc']:.3f}")
    lines += ["```", ""]
    results["paired"] = paired_comparisons(probs, labels, ("id_test", *ood), **kw)
    if results["paired"]:
        lines += ["### paired bootstrap: CALM (bome) against TS and SFT on the same questions", "",
                  "| split | comparison | Δ conf-ECE | Δ accuracy |", "|---|---|---|---|"]
        for name, per_pair in results["paired"].items():
            for pair, d in per_pair.items():
                lines.append(f"| {name} | {pair} | " + " | ".join(
                    f"{d[k]['value']:+.3f} [{d[k]['low']:+.3f}, {d[k]['high']:+.3f}]" for k in ("conf_ece", "accuracy"))
                    + " |")
        lines.append("")
    checks, results["claim_evidence"] = claim_check([(probs, labels)], list(ood), open_row=open_row, **kw)
    results["claims"] = [{"claim": c, "held": h, "evidence": e} for c, h, e in checks]
    lines += ["### claim check (this seed)", "", format_claim_check(checks), ""]
    curves = {m: i["selection"]["validation_curve"] for m, i in infos.items()
              if "validation_curve" in i.get("selection", {})}
    if curves:
        lines += ["### validation curve (loss = the training cross-entropy on the validation split; * = kept)", "",
                  "```"] + [f"{m:<16} " + "  ".join(
                      f"{p['step']}: {p['loss']:.3f}{'*' if p['step'] == infos[m]['selection']['selected_step'] else ''}"
                      for p in c) for m, c in curves.items()] + ["```", ""]
    scored_as = {m: "uncalibrated" if m == "ts" else m for m in table}  # TS reuses the uncalibrated scores
    timing = {m: infos[scored_as[m]] for m in table if scored_as[m] in infos}
    results["timing"] = {m: {k: v for k, v in t.items() if k != "log"} for m, t in timing.items()}
    lines += ["### wall time", "", "```"] + [
        f"{m:<16} total {t['wall_seconds']:.0f} s" + (f", {t['seconds_per_step']:.2f} s/step, mean τ "
                                                      f"{t['mean_temperature']:.3f}" if "seconds_per_step" in t else "")
        for m, t in timing.items()] + ["```", ""]
    text = "\n".join(lines)
    items = []
    for name in ("validation", "id_test", *ood):
        if name != "validation":
            panels = {m: ((probs[m][name].argmax(1) == labels[name]).astype(int), probs[m][name].max(1)) for m in probs}
            fig = plot_reliability_diagrams(panels, n_bins=10, title=f"{name}: top-label reliability per method",
                                            panel_size=(3.6, 3.8))
            fig.savefig(out / f"reliability_{name}.png", dpi=90, bbox_inches="tight")
        for i, label in enumerate(labels[name]):
            items.append({"split": name, "index": i, "answer": int(label),
                          **{f"{m}_prediction": int(probs[m][name][i].argmax()) for m in probs},
                          **{f"{m}_confidence": float(probs[m][name][i].max()) for m in probs}})
    write_jsonl(out / "items.jsonl", items)
    (out / "report.md").write_text(text)
    write_json(out / "report.json", results)
    return results, text


def check_output_folders(out: Path) -> None:
    """A file in the way of the output folder or its ``scores``/``runs`` is found now, not when the first
    method's scores are saved; ParameterError naming ``output_dir``."""
    for folder in (out, out / "scores", out / "runs"):
        check_output_dir(folder)


RUN_FIELDS = ("n_train", "n_calibration", "n_validation", "n_test", "n_ood", "max_steps", "train_batch_size", "lora_r",
              "learning_rate", "alpha_learning_rate", "inner_learning_rate", "inner_steps", "eta", "bome_optimizer",
              "entropy_domain", "balance_gold", "select_by", "select_every")


def check_same_run(out: Path, current: dict, *, names: dict | None = None) -> None:
    """A folder holding an earlier run (``out/run.json``) is resumed or reported only with the settings it was run
    with: ParameterError naming the first field of ``current`` whose stored value differs (``names`` maps a
    run.json key to the option's field name). Fields the stored run does not record are not compared."""
    path = out / "run.json"
    if not path.is_file():
        return
    try:
        stored = json.loads(path.read_text())
    except ValueError:
        raise ParameterError("output_dir", str(out), f"{str(path)!r} is not valid JSON; remove it or use another "
                             f"{{output_dir}}") from None
    flat = {**stored.get("config", {}), **{k: v for k, v in stored.items() if k != "config"}}
    for key, value in current.items():
        if key in flat and flat[key] != value:
            name = (names or {}).get(key, key)
            raise ParameterError(name, value, f"{str(out)!r} holds a run with {key} {flat[key]!r}, not {value!r}; "
                                 f"give the same settings, or another {{output_dir}}", related=("output_dir",))


def _mcq_identity(config: CALMExperimentConfig, *, model_name: str, train_domain: str, seed: int, ood: list) -> dict:
    return {"model": model_name, "train_domain": train_domain, "seed": seed, "ood": ood,
            **{k: getattr(config, k) for k in RUN_FIELDS}}


MCQ_NAMES = {"model": "models", "train_domain": "datasets", "ood": "ood_domains"}


def run_calm_experiment(out: Path, config: CALMExperimentConfig, *, model_name: str, train_domain: str, seed: int,
                        device: str, batch_size: int, n_resamples: int, overwrite: bool = False,
                        progress: bool = True) -> tuple[dict, str, dict]:
    """The calm experiment into ``out`` (module docstring) → (results, Markdown table, run info). Every check comes
    before anything is written: the splits are built (and the model resolved) before any training, the phase
    ``report`` finds every score it needs first, and a folder holding an earlier run is only resumed or reported
    with that run's settings (``check_same_run``). Methods scored by an earlier run are read back
    (``overwrite``: trained and scored again)."""
    check_output_folders(out)
    ood = [domain_key(s) for s in config.ood_specs(train_domain)]
    run = {"model": model_name, "train_domain": train_domain, "seed": seed, **asdict(config)}
    mcq = config.open_ended != "only"
    identity = _mcq_identity(config, model_name=model_name, train_domain=train_domain, seed=seed, ood=ood)
    scored = None
    if mcq and not overwrite:
        check_same_run(out, identity, names=MCQ_NAMES)
        scored = read_scored(out)  # an unreadable score file is an error before anything is written
    if mcq and config.phase == "report":
        sizes = json.loads((out / "run.json").read_text())["sizes"] if (out / "run.json").exists() else {}
        scores, infos = read_scored(out) if scored is None else scored
        if not scores:
            raise ParameterError("phase", config.phase, f"no method has been scored in {str(out / 'scores')!r} yet; "
                                 f"run the train phase first")
        missing = [name for name in ("validation", "id_test", *ood) if f"{name}_logits" not in next(iter(scores.values()))]
        if missing:
            raise ParameterError("ood_domains", config.ood_domains, f"the scores in {str(out / 'scores')!r} have no "
                                 f"{', '.join(missing)}; report with the OOD sets the run was trained with")
    elif mcq:
        splits = build_splits(train_domain, config, seed=seed)
        sizes = {k: len(v) for k, v in splits.items()}
        progress_line(f"sizes: {sizes}", progress)
        modeling.resolve_model_path(model_name)
    open_row = None
    if config.open_ended != "off":
        from hf_calibration.jobs.calm_open import run_open_ended

        open_results, open_text, open_row = run_open_ended(
            out / "open_ended", config, model_name=model_name, seed=seed, device=device, batch_size=batch_size,
            n_resamples=n_resamples, overwrite=overwrite, progress=progress)
        if not mcq:
            sizes = (open_results or {}).get("sizes", {})
            return ({"open_ended": open_results} if open_results else {}), open_text, {**run, "sizes": sizes}
    if config.phase != "report":
        out.mkdir(parents=True, exist_ok=True)
        (out / "run.json").write_text(json.dumps({**identity, "config": asdict(config), "sizes": sizes}, indent=2,
                                                 default=str) + "\n")
        scores, infos = train_and_score(out, splits, config, model_name=model_name, seed=seed, device=device,
                                        batch_size=batch_size, overwrite=overwrite, progress=progress, scored=scored)
    run["sizes"] = sizes
    if config.phase == "train":
        return {}, "", run
    selection = ("the last step" if config.select_by == "last" else
                 f"the checkpoint with the lowest validation {config.select_by} of every {config.select_every} steps")
    header = (f"{model_name}, trained on {train_domain}, seed {seed}; sizes {sizes}; {config.max_steps} steps of "
              f"{config.train_batch_size}, keeping {selection}; 95% bootstrap intervals ({n_resamples} resamples)")
    results, text = report(out, scores, infos, ood, header=header, n_resamples=n_resamples, seed=seed,
                           open_row=open_row)
    if config.open_ended == "also":
        results["open_ended"] = open_results
        text += "\n" + open_text
    return results, text, run


def _mean_range(values) -> str:
    """``mean (min–max)`` of one value per seed for the seeds tables; an undefined value (None or NaN, e.g. AUROC
    on a split where a seed got every answer wrong) is left out and the cell says over how many seeds it is, "—"
    when none is defined."""
    values = np.asarray([np.nan if v is None else v for v in values], dtype=float)
    defined = values[~np.isnan(values)]
    if len(defined) == 0:
        return "—"
    cell = (f"{defined.mean():.3f} ({defined.min():.3f}–{defined.max():.3f})" if len(defined) > 1
            else f"{defined[0]:.3f}")
    return cell if len(defined) == len(values) else f"{cell} ({len(defined)} of {len(values)} seeds)"


def seeds_report(out: Path, per_seed: dict, ood: list, *, header: str, n_resamples: int, seed: int,
                 open_row: tuple | None = None) -> tuple[dict, str]:
    """The summary over training seeds of ``per_seed`` (``{seed: report results}``, each seed's scores read back
    from ``out/seed_<s>/scores``): per split and method the mean and range over seeds of accuracy, conf-ECE, Brier
    and AUROC (and the constant-accuracy reference); CALM − TS and − SFT pooled over seeds (``pooled_difference``)
    with each seed's value; the claim check on the pooled intervals. Writes ``seeds.md`` and ``seeds.json``."""
    from hf_calibration.reports import format_claim_check, write_json

    splits = ("id_test", *ood)
    runs = [method_probabilities(read_scored(out / f"seed_{s}")[0], ("validation", *splits)) for s in per_seed]
    kw = dict(n_resamples=n_resamples, seed=seed)
    tables = [r["tables"] for r in per_seed.values()]
    methods = [m for m in tables[0] if all(m in t for t in tables)]
    lines = [header, "", f"Mean (min–max) over the {len(per_seed)} seeds {', '.join(map(str, per_seed))}; each "
             f"seed's full table is seed_<s>/report.md.", ""]
    summary = {}
    for name in splits:
        lines += [f"### {name}", "", "| method | acc | conf-ECE | Brier | AUROC |", "|---|---|---|---|---|"]
        for m in methods:
            vals = {k: [t[m][name][k]["value"] for t in tables] for k in ("accuracy", "conf_ece", "brier", "auroc")}
            summary.setdefault(name, {})[m] = vals
            lines.append(f"| {m} | " + " | ".join(_mean_range(v) for v in vals.values()) + " |")
        refs = [r["references"][name]["constant_accuracy"]["conf_ece"]["value"] for r in per_seed.values()
                if name in r.get("references", {})]
        if refs:
            lines.append(f"| ref: const. = val. acc. | | {_mean_range(refs)} | | |")
        lines.append("")
    pooled = {}
    lines += ["### paired differences pooled over seeds (stratified bootstrap, the same questions for both methods)",
              "", "| split | comparison | Δ conf-ECE [95 %] (per seed) | Δ accuracy [95 %] (per seed) |", "|---|---|---|---|"]
    for name in splits:
        for a, b in PAIRS:
            if a not in methods or b not in methods:
                continue
            d = {key: pooled_difference(runs, [name], a, b, key=key, **kw) for key in ("conf_ece", "accuracy")}
            pooled.setdefault(name, {})[f"{a} − {b}"] = d
            lines.append(f"| {name} | {a} − {b} | " + " | ".join(
                f"{v['value']:+.3f} [{v['low']:+.3f}, {v['high']:+.3f}] ("
                + ", ".join(f"{x:+.3f}" for x in v["per_stratum"]) + ")" for v in d.values()) + " |")
    checks, evidence = claim_check(runs, list(ood), open_row=open_row, **kw)
    lines += ["", f"### claim check (pooled over {len(per_seed)} seeds)", "", format_claim_check(checks), ""]
    results = {"seeds": list(per_seed), "summary": summary, "pooled": pooled,
               "claims": [{"claim": c, "held": h, "evidence": e} for c, h, e in checks], "claim_evidence": evidence}
    text = "\n".join(lines)
    (out / "seeds.md").write_text(text)
    write_json(out / "seeds.json", results)
    return results, text


def run_calm_seeds(out: Path, config: CALMExperimentConfig, *, model_name: str, train_domain: str, device: str,
                   batch_size: int, n_resamples: int, overwrite: bool = False, progress: bool = True,
                   ) -> tuple[dict, str, dict]:
    """``run_calm_experiment`` once per seed of ``config.seed_list()`` into ``out/seed_<s>/`` (each resumable as
    one run), then ``seeds_report`` and, with the open-ended setting, ``calm_open.open_seeds_report`` → (results,
    Markdown text, run info); the train phase returns no table."""
    from hf_calibration.jobs.calm_open import check_open_answers, open_seeds_report

    seeds = config.seed_list()
    mcq = config.open_ended != "only"
    if config.phase == "report":  # every seed's scores first: a missing seed must not leave the others rewritten
        for s in seeds:
            if mcq and not read_scored(out / f"seed_{s}")[0]:
                raise ParameterError("phase", config.phase, f"no method has been scored in "
                                     f"{str(out / f'seed_{s}' / 'scores')!r} yet; run the train phase first")
            if config.open_ended != "off":
                check_open_answers(out / f"seed_{s}" / "open_ended", config)
    per_seed, runs = {}, {}
    for s in seeds:
        progress_line(f"seed {s}", progress)
        per_seed[s], _, runs[s] = run_calm_experiment(out / f"seed_{s}", config, model_name=model_name,
                                                     train_domain=train_domain, seed=s, device=device,
                                                     batch_size=batch_size, n_resamples=n_resamples,
                                                     overwrite=overwrite, progress=progress)
    run = {**runs[seeds[0]], "seed": seeds, "sizes": {s: r["sizes"] for s, r in runs.items()}}
    if config.phase == "train":
        return {}, "", run
    open_row = open_results = None
    if config.open_ended != "off":  # the open-ended claim pooled over the seeds' answers
        open_results, open_text, open_row = open_seeds_report(out, config, seeds, model_name=model_name,
                                                              n_resamples=n_resamples, seed=seeds[0])
        if not mcq:
            return ({"open_ended_seeds": open_results, "per_seed": {s: {"open_ended": r.get("open_ended")}
                                                                    for s, r in per_seed.items()}},
                    open_text, run)
    ood = [domain_key(sp) for sp in config.ood_specs(train_domain)]
    header = (f"{model_name}, trained on {train_domain}, seeds {', '.join(map(str, seeds))}; sizes "
              f"{runs[seeds[0]]['sizes']} per seed; {config.max_steps} steps of {config.train_batch_size}; 95% "
              f"bootstrap intervals ({n_resamples} resamples)")
    results, text = seeds_report(out, per_seed, ood, header=header, n_resamples=n_resamples, seed=seeds[0],
                                 open_row=open_row)
    if open_results is not None:
        results["open_ended_seeds"] = open_results
        text += "\n\n" + open_text
    results["per_seed"] = {s: {k: v for k, v in r.items() if k in ("ood_mean", "timing", "claims", "open_ended")}
                           for s, r in per_seed.items()}
    return results, text, run
