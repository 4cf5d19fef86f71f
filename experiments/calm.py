"""The calm experiment: CALM with LoRA against the paper's baselines and ablations on the same splits (Wang et
al., CALM; the method in docs/methods.md); run by ``run_experiment`` with ``name="calm"`` (``python -m experiments
calm``).

Train on one domain (an MMLU group such as ``mmlu:stem``, or ``halueval_qa_lm``, ``halueval_qa``, ``gpqa``):
S_T for training, S_V (labels unused) for the entropy, a labelled validation split (post-hoc TS fitting, the
constant-accuracy reference), an in-domain test split; out of domain: ``ood_domains`` (default for an MMLU
group: the other MMLU categories, GPQA-Diamond and HaluEval QA; for a HaluEval or GPQA domain: MMLU STEM and
full HaluEval QA). ``balance_gold`` balances the gold position across letters in every set. Every method
starts from the same base model and sees the same data in the same order.

Every trained method keeps the checkpoint chosen by one rule (``select_by``, ``select_every``): every k optimizer
steps and at the last, the model is scored on the labelled validation split and the step with the lowest value
(conf-ECE by default) is restored before scoring. The rule needs labels, so it reads the validation split (labelled,
for checkpoint selection and post-hoc fitting; TS is fitted on the same split), not S_V, whose labels CALM never
uses. The untrained model is not a candidate (it is the ``uncalibrated`` row).

Seeds (``seeds="0,1,2"``): each seed draws its own splits and trains every method into ``<output>/seed_<s>/``;
``seeds.md`` gives the mean and range over seeds and CALM − TS / − SFT pooled over seeds by a stratified paired
bootstrap (``metrics.stratified_bootstrap``: each seed's questions resampled on their own). Every report ends
with a claim check against the paper (``calm_claims.calm_claim_check``): OOD conf-ECE below TS and below SFT,
in-domain accuracy at least 95 % of SFT's, and, with ``open_ended`` (``experiments.calm_open``: generative CALM on
free-form answers, Semantic ECE), the lowest mean Semantic-ECE out of domain.

Two phases, so a long run can be resumed: ``train`` writes ``<output>/scores/<method>.npz`` (option
log-scores per split) and skips methods already scored, and keeps each trained method in
``<output>/runs/<method>/trained`` as soon as its training ends, so a run stopped while scoring scores that model
instead of training again; a run stopped while training goes on from the method's last checkpoint (every
``select_every`` steps); ``report`` builds the table (``report.md``,
``report.json``, ``items.jsonl``, reliability diagrams ``reliability_<split>.png``) from them.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import warnings
import zipfile
from dataclasses import asdict
from pathlib import Path

import numpy as np

from hf_calibration import modeling
from hf_calibration.data import MCQA_DATASETS, balance_gold, domain_key, load_mcqa, parse_domains
from hf_calibration.data.loaders import right_answer_sides
from hf_calibration.errors import ParameterError, ParameterWarning
from hf_calibration.jobs.common import check_output_dir, progress_line

from experiments.calm_claims import calm_claim_check, paired_comparisons
from experiments.calm_config import ENTROPY_METHODS, TABLE_METHODS, CALMExperimentConfig
from experiments.calm_open import run_open_ended
from experiments.common import (IN_DOMAIN_SPLITS, RUN_FIELDS, check_same_run, format_claim_check, format_interval,
                                method_label, pair_label)


def load_domain(spec: str, *, limit=None, seed=0, balance_gold=False):
    """The MCQA rows of one domain of ``data.parse_domains`` (``mmlu:<categories or subjects, '+'-joined>`` or
    a ``load_mcqa`` name)."""
    [(name, subjects)] = parse_domains(spec, tuple(MCQA_DATASETS))
    return load_mcqa(name, subjects=subjects, limit=limit, seed=seed, balance_gold=balance_gold)


def length_balanced_extra(train_domain: str, n: int, *, seed: int = 0):
    """``n`` questions of the HaluEval task of ``train_domain`` (``halueval_<task>_lm``) outside its length-matched
    set: all n/2 drawn (``seed``) from those whose right answer is the longer of the two, n/2 from those whose right
    answer is the shorter, so "pick the shorter answer" is right on exactly half (the full sets' shortcut,
    docs/methods.md "Evaluation protocol"); unlike the length-matched set, the two answers' lengths may differ by
    more than ``data.LENGTH_MATCH_RATIO``. Rows as ``load_mcqa`` gives them (gold position drawn with ``seed``).
    ParameterError naming ``extra_train`` when ``train_domain`` is not a length-matched HaluEval set, ``n`` is odd,
    or n/2 exceeds the questions with the right answer the longer."""
    from datasets import Dataset

    task = train_domain.removeprefix("halueval_").removesuffix("_lm")
    if not (train_domain.startswith("halueval_") and train_domain.endswith("_lm")):
        raise ParameterError("extra_train", n, f"{{extra_train}} needs a length-matched HaluEval training domain "
                             f"(halueval_<task>_lm), got {train_domain!r}")
    if n % 2:
        raise ParameterError("extra_train", n, f"must be even (half with the right answer the longer), got {n}")
    matched_set = load_mcqa(train_domain, seed=seed)
    matched = set(matched_set["question"])
    rest = [r for r in load_mcqa(f"halueval_{task}", seed=seed) if r["question"] not in matched]
    shorter, longer, _ = right_answer_sides([r["choices"][r["answer"]] for r in rest],
                                            [r["choices"][1 - r["answer"]] for r in rest])
    if n // 2 > len(longer):
        raise ParameterError("extra_train", n, f"asks for {n // 2} questions of halueval_{task} outside "
                             f"{train_domain!r} with the right answer the longer; there are {len(longer)}, so "
                             f"{{extra_train}} is at most {2 * len(longer)}")
    rng = np.random.default_rng(seed)
    chosen = [*rng.choice(longer, n // 2, replace=False), *rng.choice(shorter, n // 2, replace=False)]
    return Dataset.from_list([rest[i] for i in sorted(int(i) for i in chosen)], features=matched_set.features)


def build_splits(train_domain: str, config: CALMExperimentConfig, *, seed: int = 0) -> dict:
    """S_T, S_V, validation, ID test (disjoint, from ``train_domain``; S_T with ``config.extra_train`` questions of
    ``length_balanced_extra`` added) and the OOD sets (keyed by ``data.domain_key``); with ``balance_gold`` each
    split is balanced on its own (a balanced whole splits into letter-skewed parts: the gold letter's share would
    differ between the training and the test data).
    ParameterError naming the split sizes when they ask for more questions than the domain has."""
    domain = load_domain(train_domain, seed=seed).shuffle(seed=seed)
    sizes = [config.n_train, config.n_calibration, config.n_validation, config.n_test]
    if sum(sizes) > len(domain):
        raise ParameterError("n_train", config.n_train, f"{{n_train}}/{{n_calibration}}/{{n_validation}}/{{n_test}}: "
                             f"{sizes} sum to more than the {len(domain)} questions of {train_domain!r}",
                             related=("n_calibration", "n_validation", "n_test"))
    bounds = np.cumsum([0] + sizes)
    splits = {n: domain.select(range(bounds[i], bounds[i + 1])) for i, n in enumerate(IN_DOMAIN_SPLITS)}
    if config.extra_train:
        from datasets import concatenate_datasets

        extra = length_balanced_extra(train_domain, config.extra_train, seed=seed)
        splits["train"] = concatenate_datasets([splits["train"], extra]).shuffle(seed=seed)
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


def method_folder(out: Path, method: str) -> Path:
    """``out/runs/<method>``: the method's Trainer checkpoints and, once training ends, its ``trained`` folder."""
    return out / "runs" / method


def last_checkpoint(folder: Path) -> tuple[int, Path] | None:
    """(step, folder) of the ``checkpoint-<step>`` folder of ``folder`` with the highest step among those the Trainer
    finished writing (``trainer_state.json`` is written after the weights, optimizer, scheduler and CFT's bin state:
    ``CALMTrainer._save_optimizer_and_scheduler``), else None.
    ``transformers.trainer_utils.get_last_checkpoint`` would also return a folder a kill left half written."""
    done = [(int(p.name.split("-")[1]), p) for p in folder.glob("checkpoint-*")
            if p.name.split("-")[1].isdigit() and (p / "trainer_state.json").is_file()]
    return max(done) if done else None


def train_method(method: str, splits, config: CALMExperimentConfig, *, model_name: str, out: Path, seed: int,
                 device: str, tokenizer, callbacks=None, resume: bool = True):
    """Train one method of ``TABLE_METHODS`` (not "uncalibrated" or "ts") with LoRA (``calm.default_lora_config``)
    on ``splits["train"]`` (S_V: ``splits["calibration"]``, labels unused) from a fresh copy of ``model_name``,
    keeping the checkpoint of ``config.select_by`` → (the trained model in eval mode, its info: option count,
    seconds, the training log, the selection and CALM's mean temperature). ``callbacks``: extra ``Trainer``
    callbacks. A training stopped midway left its checkpoints (every ``select_every`` steps) in
    ``out/runs/<method>``; with ``resume`` (the default) it goes on from the last one
    (``Trainer.train(resume_from_checkpoint=...)``: weights, α, optimizer, scheduler, RNG and the selection's
    evaluations so far), and ``resumed_from_step`` in the info says so; ``resume=False`` removes them and starts at
    step 0."""
    from hf_calibration.calm import CALMConfig, CALMTrainer, default_lora_config, mcqa_to_prompt_completion

    model, _ = modeling.load_model(model_name)
    runs = method_folder(out, method)
    # the entropy and L_tr read these letters only (K = 2 for HaluEval)
    num_options = len(splits["train"][0]["choices"])
    training = CALMConfig(
        output_dir=str(runs), method="sft" if method == "label_smoothing" else method,
        max_steps=config.max_steps, per_device_train_batch_size=config.train_batch_size,
        learning_rate=config.learning_rate, alpha_learning_rate=config.alpha_learning_rate,
        inner_steps=config.inner_steps, num_options=num_options, inner_learning_rate=config.inner_learning_rate,
        eta=config.eta, entropy_domain=config.entropy_domain if method in ENTROPY_METHODS else "options",
        label_smoothing_factor=0.1 if method == "label_smoothing" else 0.0, lr_scheduler_type="constant",
        warmup_steps=0, bf16=False, activation_checkpointing=False, report_to="none",
        logging_steps=10, seed=seed, use_cpu=modeling.resolve_device(device) == "cpu", max_length=None,
        disable_tqdm=True, dataset_num_proc=None, **_selection_kwargs(config),
        bome_optimizer=config.bome_optimizer if method in ("bome", "scalar") else "trainer",
        upper_gradient=config.upper_gradient if method in ("bome", "scalar") else "all",
    )
    train = mcqa_to_prompt_completion(splits["train"], tokenizer)
    calibration = mcqa_to_prompt_completion(splits["calibration"], tokenizer).remove_columns("completion")
    validation = None if config.select_by == "last" else mcqa_to_prompt_completion(splits["validation"], tokenizer)
    peft = default_lora_config(config.lora_r)
    trainer = CALMTrainer(model, args=training, train_dataset=train, calibration_dataset=calibration,
                          eval_dataset=validation, processing_class=tokenizer, peft_config=peft, callbacks=callbacks)
    if not resume:
        for stale in runs.glob("checkpoint-*"):
            shutil.rmtree(stale)
    first_step, checkpoint = (last_checkpoint(runs) if resume else None) or (0, None)
    start = time.perf_counter()
    # ends with the selected checkpoint restored (CALMTrainer._load_best_model)
    trainer.train(resume_from_checkpoint=None if checkpoint is None else str(checkpoint))
    seconds = time.perf_counter() - start
    trainer.model.eval()
    logs = [e for e in trainer.state.log_history if "lower_loss" in e]
    return trainer.model, {"num_options": num_options, "train_seconds": seconds, "resumed_from_step": first_step,
                           "seconds_per_step": seconds / max(config.max_steps - first_step, 1), "log": logs,
                           "selection": _selection_info(trainer, config),
                           "mean_temperature": float(trainer.model.logit_adjustment.temperature.detach().mean())}


TRAINED_INFO = "train_info.json"


def trained_folder(out: Path, method: str) -> Path:
    """``out/runs/<method>/trained``: the method's finished training (``trained_or_train``)."""
    return method_folder(out, method) / "trained"


def kept_training(out: Path, method: str, *, overwrite: bool = False) -> Path | None:
    """``out/runs/<method>/trained`` when it holds a finished training to score (never with ``overwrite``), else
    None. Raises ParameterError naming ``output_dir`` when the folder is there without its ``train_info.json``."""
    folder = trained_folder(out, method)
    if overwrite or not folder.is_dir():
        return None
    if not (folder / TRAINED_INFO).is_file():
        raise ParameterError("output_dir", str(out), f"{str(folder)!r} has no {TRAINED_INFO}; remove the folder "
                             f"to train {method} again, or give {{overwrite}}", related=("overwrite",))
    return folder


def trained_or_train(method: str, splits, config: CALMExperimentConfig, *, model_name: str, out: Path, seed: int,
                     device: str, tokenizer, overwrite: bool = False):
    """``train_method``'s (model, info), kept in ``out/runs/<method>/trained`` (the selected model as
    ``CALMModel.save_pretrained`` writes it, and the info as ``train_info.json``) as soon as training ends, so a run
    stopped while scoring resumes by scoring that folder instead of training again. The folder is written under a
    temporary name and renamed whole: it is either complete or absent. ``overwrite`` trains again."""
    from hf_calibration.calm import CALMModel

    folder = kept_training(out, method, overwrite=overwrite)
    if folder is not None:
        info = json.loads((folder / TRAINED_INFO).read_text())
        base, _ = modeling.load_model(model_name, device=device)  # a fresh copy: PEFT adapts it in place
        model = CALMModel.from_pretrained(folder, base_model=base)
        model.eval()
        return model, {**info, "trained_in_an_earlier_run": True}
    model, info = train_method(method, splits, config, model_name=model_name, out=out, seed=seed, device=device,
                               tokenizer=tokenizer, resume=not overwrite)
    folder = trained_folder(out, method)
    partial = folder.with_name(".trained.partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.rmtree(folder, ignore_errors=True)
    model.save_pretrained(partial)
    (partial / TRAINED_INFO).write_text(json.dumps(info, indent=2, default=float) + "\n")
    os.replace(partial, folder)
    return model, info


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
    for method in TABLE_METHODS:
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
    ood = [k for k in splits if k not in IN_DOMAIN_SPLITS]
    base = tokenizer = None  # loaded at the first method that needs work: a report-only rerun loads no model
    methods = list(config.methods)
    if "ts" in methods and "uncalibrated" not in methods:  # TS is fitted on the uncalibrated scores
        methods.insert(0, "uncalibrated")
    for method in methods:  # a broken kept training is refused before any model loads
        if method not in scores and method not in ("uncalibrated", "ts"):
            kept_training(out, method, overwrite=overwrite)
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
            model, info = trained_or_train(method, splits, config, model_name=model_name, out=out, seed=seed,
                                           device=device, tokenizer=tokenizer, overwrite=overwrite)
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
    for method in TABLE_METHODS:
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


def report(out: Path, scores: dict, infos: dict, ood: list, *, header: str, n_resamples: int,
           seed: int, open_row: tuple | None = None) -> tuple[dict, str]:
    """The table of every scored method on the ID test and each OOD set (with the constant references fitted on
    the validation split), the OOD mean and the wall times → (results, Markdown text); writes ``report.md``,
    ``report.json``, ``items.jsonl`` and ``reliability_<split>.png`` into ``out``. Method ids stay the results'
    keys; the tables name them by ``common.method_label`` (CALM for "bome")."""
    from hf_calibration.reporting.reports import format_table, mcqa_report, references, write_json

    kw = dict(n_resamples=n_resamples, seed=seed)
    probs, labels = method_probabilities(scores, ("validation", "id_test", *ood))
    table = {m: {name: mcqa_report(labels[name], p, **kw) for name, p in per_split.items()}
             for m, per_split in probs.items()}
    results = {"tables": table, "references": {}}
    lines = [header + "\n"]
    for name in ("id_test", *ood):
        signals = {method_label(m): table[m][name] for m in table}
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
    results["ood_mean"] = ood_mean = {
        m: {key: float(np.mean([table[m][s][key]["value"] for s in ood]))
            for key in ("accuracy", "conf_ece", "cw_ece", "smece", "brier", "auroc")} for m in table}
    lines += [f"### OOD mean (unweighted over the {len(ood)} OOD sets; point estimates)", "", "```",
              "method           acc    conf-ECE  cw-ECE  smECE  Brier  AUROC"]
    for m, v in ood_mean.items():
        lines.append(f"{method_label(m):<16} {v['accuracy']:.3f}  {v['conf_ece']:.3f}     {v['cw_ece']:.3f}   "
                     f"{v['smece']:.3f}  {v['brier']:.3f}  {v['auroc']:.3f}")
    lines += ["```", ""]
    results["paired"] = paired_comparisons(probs, labels, ("id_test", *ood), **kw)
    if results["paired"]:
        lines += ["### paired bootstrap: CALM against TS and SFT on the same questions", "",
                  "| split | comparison | Δ conf-ECE | Δ accuracy |", "|---|---|---|---|"]
        for name, per_pair in results["paired"].items():
            for pair, d in per_pair.items():
                lines.append(f"| {name} | {pair_label(*pair.split(' − '))} | "
                             + " | ".join(format_interval(d[k]) for k in ("conf_ece", "accuracy")) + " |")
        lines.append("")
    checks, results["claim_evidence"] = calm_claim_check([(probs, labels)], list(ood), open_row=open_row, **kw)
    results["claims"] = [{"claim": c, "held": h, "evidence": e} for c, h, e in checks]
    lines += ["### claim check (this seed)", "", format_claim_check(checks), ""]
    lines += _curves_and_timing(results, table, infos)
    text = "\n".join(lines)
    _write_items_and_diagrams(out, probs, labels, ood)
    (out / "report.md").write_text(text)
    write_json(out / "report.json", results)
    return results, text


def _curves_and_timing(results: dict, table: dict, infos: dict) -> list[str]:
    """The report's validation curves and wall times (adds ``results["timing"]``)."""
    lines = []
    curves = {m: i["selection"]["validation_curve"] for m, i in infos.items()
              if "validation_curve" in i.get("selection", {})}
    if curves:
        lines += ["### validation curve (loss = the training cross-entropy on the validation split; * = kept)", "",
                  "```"] + [f"{method_label(m):<16} " + "  ".join(
                      f"{p['step']}: {p['loss']:.3f}{'*' if p['step'] == infos[m]['selection']['selected_step'] else ''}"
                      for p in c) for m, c in curves.items()] + ["```", ""]
    scored_as = {m: "uncalibrated" if m == "ts" else m for m in table}  # TS reuses the uncalibrated scores
    timing = {m: infos[scored_as[m]] for m in table if scored_as[m] in infos}
    results["timing"] = {m: {k: v for k, v in t.items() if k != "log"} for m, t in timing.items()}
    return lines + ["### wall time", "", "```"] + [
        f"{method_label(m):<16} total {t['wall_seconds']:.0f} s" + (
            f", {t['seconds_per_step']:.2f} s/step, mean τ {t['mean_temperature']:.3f}" if "seconds_per_step" in t
            else "") for m, t in timing.items()] + ["```", ""]


def _write_items_and_diagrams(out: Path, probs: dict, labels: dict, ood: list) -> None:
    """``items.jsonl`` (every question's answer, per method prediction and confidence) and the top-label
    reliability diagrams ``reliability_<split>.png`` of the test splits."""
    from hf_calibration.reporting.plotting import plot_reliability_diagrams
    from hf_calibration.reporting.reports import write_jsonl

    items = []
    for name in ("validation", "id_test", *ood):
        if name != "validation":
            panels = {method_label(m): ((probs[m][name].argmax(1) == labels[name]).astype(int), probs[m][name].max(1))
                      for m in probs}
            fig = plot_reliability_diagrams(panels, n_bins=10, title=f"{name}: top-label reliability per method",
                                            panel_size=(3.6, 3.8))
            fig.savefig(out / f"reliability_{name}.png", dpi=90, bbox_inches="tight")
        for i, label in enumerate(labels[name]):
            items.append({"split": name, "index": i, "answer": int(label),
                          **{f"{m}_prediction": int(probs[m][name][i].argmax()) for m in probs},
                          **{f"{m}_confidence": float(probs[m][name][i].max()) for m in probs}})
    write_jsonl(out / "items.jsonl", items)


def check_output_folders(out: Path) -> None:
    """A file in the way of the output folder or its ``scores``/``runs`` is found now, not when the first
    method's scores are saved; ParameterError naming ``output_dir``."""
    for folder in (out, out / "scores", out / "runs"):
        check_output_dir(folder)


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
