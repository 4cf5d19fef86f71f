"""The open-ended part of the calm experiment: generative CALM with the entropy over the vocabulary, trained on
one open-ended domain and tested in it and on another, scored by Semantic ECE (``metrics.semantic``; the metric in
docs/methods.md).

Domains (``calm_config.OPEN_ENDED_DOMAINS``), each a question text and a reference answer:

- ``halueval_qa_open``: HaluEval QA (10,000 HotpotQA items with their Wikipedia knowledge) asked open-ended,
  "Knowledge: … Question: … Answer with a short phrase only.", reference the right answer (``right_answer``);
  HaluEval's hallucinated answer is unused.
- ``gsm8k_open``: GSM8K test problems, "… Answer with the final number only.", reference the number after '####'.
  Every answer is read as the last number it contains (``extract_final_number``; the text itself when it has
  none), before grouping and judging.

Methods (``calm_config.OPEN_ENDED_METHODS``): ``uncalibrated`` (the base model); ``ts``: the base model sampled at the temperature T
that minimises the validation split's NLL of the reference answer tokens (temperature scaling of the whole
next-token distribution, Guo et al. 2017, fitted by ``posthoc.TemperatureScaler`` on the (tokens, vocabulary)
logits); ``sft``: LoRA fine-tuning on the reference answers; ``bome``: CALM (``CALMConfig(method="bome",
entropy_domain="vocab", adjustment_tokens="vocab")``), L_tr the token cross-entropy of the reference answers and
H the entropy of the next-token distribution at every position of S_V's answers. S_V's answers are the base
model's own greedy answers (labels unused: they only say which positions the entropy is read at). Every trained
method keeps the checkpoint with the lowest validation token loss (``select_best_by="loss"``) among every
``select_every`` steps and the last, the same rule for both.

Scoring (Sem-ECE, ``metrics.semantic``): per question the greedy answer (the answer given) and ``open_samples``
answers sampled at temperature 1 (T for ``ts``), each cut at its first line; confidence = the share of the
samples in the greedy answer's group, correct = the greedy answer equivalent to the reference under the same
``open_equivalence`` (``"lexical"``: SQuAD normalisation or the same number; ``"embedding"``: all-MiniLM-L6-v2
cosine ≥ 0.9). The table gives accuracy, Sem-ECE (15 equal-width bins), Brier and AUROC of these confidences
with 95 % bootstrap intervals, the constant-accuracy reference (a constant equal to the method's validation
accuracy), and CALM − each method's Sem-ECE paired on the same questions.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

from hf_calibration import modeling
from hf_calibration.errors import ParameterError
from hf_calibration.metrics import interval_verdict, paired_strata_difference

from experiments.calm_config import OPEN_ENDED_DOMAINS, OPEN_ENDED_METHODS
from experiments.common import (IN_DOMAIN_SPLITS, RUN_FIELDS, check_same_run, format_claim_check, format_interval,
                                mean_range, method_label, pair_label)


def load_open_domain(name: str, *, limit: int | None = None, seed: int = 0) -> list[dict]:
    """Rows ``{"question", "reference"}`` of an open-ended domain (module docstring), shuffled by ``seed``, the
    first ``limit``. ParameterError naming ``open_domains`` for an unknown name."""
    from hf_calibration.runtime.offline import hub_available
    from hf_calibration.data import load_open_qa
    from hf_calibration.data.loaders import halueval_packaged_records

    if name == "halueval_qa_open":
        if not hub_available():
            records = halueval_packaged_records("qa")
        else:  # online: the Hub copy
            from datasets import load_dataset

            records = list(load_dataset("pminervini/HaluEval", "qa", split="data"))
        rows = [{"question": f"Knowledge: {r['knowledge'].strip()}\nQuestion: {r['question'].strip()}\n"
                             "Answer with a short phrase only.", "reference": r["right_answer"].strip()}
                for r in records]
    elif name == "gsm8k_open":
        rows = [{"question": f"{r['question'].strip()}\nAnswer with the final number only.",
                 "reference": r["final_answer"]} for r in load_open_qa("gsm8k")]
    else:
        raise ParameterError("open_domains", name, f"unknown open-ended domain {name!r}; known: {', '.join(OPEN_ENDED_DOMAINS)}")
    order = np.random.default_rng(seed).permutation(len(rows))
    return [rows[i] for i in order[:limit]]


def open_splits(domains: list[str], sizes: dict, *, seed: int) -> dict:
    """train / calibration / validation / id_test from ``domains[0]`` (disjoint, sizes ``sizes[split]``), and
    ``sizes["ood"]`` rows of every other domain, keyed by the domain's name."""
    need = [sizes[s] for s in IN_DOMAIN_SPLITS]
    rows = load_open_domain(domains[0], limit=sum(need), seed=seed)
    if len(rows) < sum(need):
        raise ParameterError("n_train", sizes["train"], f"{domains[0]} has {len(rows)} items, fewer than the "
                             f"{sum(need)} the splits need")
    bounds = np.cumsum([0, *need])
    splits = {s: rows[bounds[i]:bounds[i + 1]] for i, s in enumerate(IN_DOMAIN_SPLITS)}
    for d in domains[1:]:
        splits[d] = load_open_domain(d, limit=sizes["ood"], seed=seed)
    return splits


def parse_answer(domain: str, text: str) -> str:
    """The answer in a generation: its first non-empty line, stripped; for ``gsm8k_open`` the last number in it
    (the line itself when it has none)."""
    from hf_calibration.data.numbers import extract_final_number

    line = next((ln.strip() for ln in text.strip().splitlines() if ln.strip()), "")
    if domain == "gsm8k_open":
        return extract_final_number(line) or line
    return line


def generate_answers(model, tokenizer, questions: list[str], *, n_samples: int, max_new_tokens: int,
                     temperature: float = 1.0, batch_size: int = 8, seed: int = 0) -> tuple[list[str], list[list[str]]]:
    """Greedy answer and ``n_samples`` sampled answers (temperature ``temperature``, no top-k/top-p cut) per
    question, as generated text (not parsed); the chat prompt of ``modeling.prompts.build_prompt``, left-padded
    batches of ``batch_size`` prompts.

    Each batch's prompts run once (all but their last token, positions counted over real tokens as ``generate``
    counts them), and both ``generate`` calls continue from copies of that cache, the samples' repeated
    ``n_samples`` times along the batch: the same tokens as two plain ``generate`` calls with the same torch seed
    (``num_return_sequences`` expands the prompts the same way), without running each prompt ``n_samples + 1``
    times (6× faster for HaluEval's long prompts on SmolLM2)."""
    from hf_calibration.modeling.prompts import build_prompt
    from hf_calibration.modeling.cache import repeat_cache

    device = next(model.parameters()).device
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    greedy, samples = [], []
    torch.manual_seed(seed)
    common = dict(max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
    try:
        for start in range(0, len(questions), batch_size):
            prompts = [build_prompt(tokenizer, q) for q in questions[start:start + batch_size]]
            enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
            ids, mask = enc["input_ids"], enc["attention_mask"]
            width = ids.shape[1]
            with torch.no_grad():
                head = mask[:, :-1]
                cache = model(input_ids=ids[:, :-1], attention_mask=head, use_cache=True,
                              position_ids=(head.cumsum(-1) - 1).clamp(min=0), logits_to_keep=1).cache
                g = model.generate(input_ids=ids, attention_mask=mask, cache=repeat_cache(cache, 1), do_sample=False,
                                   **common)
                s = model.generate(input_ids=ids.repeat_interleave(n_samples, 0),
                                   attention_mask=mask.repeat_interleave(n_samples, 0),
                                   cache=repeat_cache(cache, n_samples), do_sample=True, temperature=temperature,
                                   top_k=0, top_p=1.0, **common)
            greedy += tokenizer.batch_decode(g[:, width:], skip_special_tokens=True)
            texts = tokenizer.batch_decode(s[:, width:], skip_special_tokens=True)
            samples += [texts[i * n_samples:(i + 1) * n_samples] for i in range(len(prompts))]
    finally:
        tokenizer.padding_side = side
    return greedy, samples


def answer_token_logits(model, tokenizer, rows: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(logits, labels): the next-token logits (tokens, vocabulary) float32 at every token of each row's reference
    answer (followed by the end-of-turn token) after its chat prompt, and the reference token ids (tokens,)."""
    from hf_calibration.modeling.prompts import build_prompt

    device = next(model.parameters()).device
    logits, labels = [], []
    for row in rows:
        prompt = tokenizer(build_prompt(tokenizer, row["question"]), add_special_tokens=False)["input_ids"]
        answer = tokenizer(row["reference"] + (tokenizer.eos_token or ""), add_special_tokens=False)["input_ids"]
        ids = torch.tensor([prompt + answer], device=device)
        with torch.no_grad():
            out = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float().cpu().numpy()
        logits.append(out)
        labels += answer
    return np.concatenate(logits), np.asarray(labels)


def fit_open_temperature(model, tokenizer, rows: list[dict]) -> float:
    """T minimising the mean NLL of the reference answer tokens of ``rows`` under softmax(logits / T)
    (``posthoc.TemperatureScaler`` on ``answer_token_logits``)."""
    from hf_calibration.posthoc import TemperatureScaler

    logits, labels = answer_token_logits(model, tokenizer, rows)
    return float(TemperatureScaler().fit(logits, labels).temperature_)


def _open_dataset(rows: list[dict], tokenizer, completions: list[str] | None = None):
    """prompt/completion rows for ``CALMTrainer``: the chat prompt and the answer (reference or ``completions``)
    followed by the end-of-turn token."""
    from datasets import Dataset

    from hf_calibration.modeling.prompts import build_prompt

    answers = completions if completions is not None else [r["reference"] for r in rows]
    return Dataset.from_list([{"prompt": build_prompt(tokenizer, r["question"]),
                               "completion": a.strip() + (tokenizer.eos_token or "")} for r, a in zip(rows, answers)])


def train_open_method(method: str, splits: dict, config, *, model_name: str, out: Path, seed: int, device: str,
                      tokenizer, calibration_answers: list[str]):
    """Train ``sft`` or ``bome`` (CALM) with LoRA on the open-ended training split → (model, info)."""
    from hf_calibration.calm import CALMConfig, CALMTrainer, default_lora_config

    model, _ = modeling.load_model(model_name)
    training = CALMConfig(
        output_dir=str(out / "runs" / method), method=method, entropy_domain="vocab", adjustment_tokens="vocab",
        max_steps=config.max_steps, per_device_train_batch_size=config.train_batch_size,
        learning_rate=config.learning_rate, alpha_learning_rate=config.alpha_learning_rate,
        inner_steps=config.inner_steps, inner_learning_rate=config.inner_learning_rate, eta=config.eta,
        lr_scheduler_type="constant", warmup_steps=0, bf16=False, activation_checkpointing=False, report_to="none",
        logging_steps=10, seed=seed, use_cpu=modeling.resolve_device(device) == "cpu", max_length=None,
        disable_tqdm=True, dataset_num_proc=None, eval_strategy="steps", eval_steps=config.select_every,
        save_strategy="steps", save_steps=config.select_every, save_total_limit=1, select_best_by="loss",
        bome_optimizer=config.bome_optimizer if method == "bome" else "trainer",
        upper_gradient=config.upper_gradient if method == "bome" else "all",
    )
    peft = default_lora_config(config.lora_r)
    trainer = CALMTrainer(model, args=training, train_dataset=_open_dataset(splits["train"], tokenizer),
                          calibration_dataset=_open_dataset(splits["calibration"], tokenizer, calibration_answers),
                          eval_dataset=_open_dataset(splits["validation"], tokenizer), processing_class=tokenizer,
                          peft_config=peft)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    trainer.model.eval()
    evaluated = [[e["step"], e["eval_loss"]] for e in trainer.state.log_history if "eval_loss" in e]
    return trainer.model, {"train_seconds": seconds, "seconds_per_step": seconds / config.max_steps,
                           "selection": {"rule": "loss", "split": "validation", "evaluated": evaluated,
                                         "selected_step": trainer.state.best_global_step}}


def _answers_file(out: Path, method: str) -> Path:
    return out / "answers" / f"{method}.json"


def open_answers(out: Path, splits: dict, config, *, train_domain: str, model_name: str, seed: int, device: str,
                 batch_size: int, overwrite: bool = False, progress: bool = True) -> dict:
    """Generate (or read back) every method's greedy and sampled answers on validation, id_test and the OOD
    domains into ``out/answers/<method>.json`` → ``{method: {"splits": {split: {"greedy", "samples"}}, ...}}``."""
    from hf_calibration.jobs.common import progress_line

    (out / "answers").mkdir(parents=True, exist_ok=True)
    scored = ["validation", "id_test", *[k for k in splits if k not in IN_DOMAIN_SPLITS]]
    done = {m: json.loads(_answers_file(out, m).read_text()) for m in OPEN_ENDED_METHODS
            if not overwrite and _answers_file(out, m).exists()}
    methods = [m for m in config.methods if m in OPEN_ENDED_METHODS]
    if "ts" in methods and "uncalibrated" not in methods:
        methods.insert(0, "uncalibrated")
    base = tokenizer = None
    for method in methods:
        if method in done:
            continue
        if config.phase == "report":
            raise ParameterError("phase", "report", f"the open-ended method {method!r} has no answers in "
                                 f"{str(out / 'answers')!r} yet; run the train phase first")
        if tokenizer is None:
            base, tokenizer = modeling.load_model(model_name, device=device)
        start = time.perf_counter()
        info, temperature, model = {}, 1.0, base
        if method == "ts":
            temperature = fit_open_temperature(base, tokenizer, splits["validation"])
            info["temperature"] = temperature
        elif method in ("sft", "bome"):
            cal = generate_answers(base, tokenizer, [r["question"] for r in splits["calibration"]], n_samples=1,
                                   max_new_tokens=config.open_max_new_tokens, batch_size=batch_size, seed=seed)[0]
            model, info = train_open_method(method, splits, config, model_name=model_name, out=out, seed=seed,
                                            device=device, tokenizer=tokenizer,
                                            calibration_answers=[parse_answer(train_domain, a) or "." for a in cal])
        per_split = {}
        for name in scored:
            if method == "ts" and "uncalibrated" in done:  # greedy answers do not depend on T
                greedy = done["uncalibrated"]["splits"][name]["greedy"]
                _, samples = generate_answers(model, tokenizer, [r["question"] for r in splits[name]],
                                              n_samples=config.open_samples, max_new_tokens=config.open_max_new_tokens,
                                              temperature=temperature, batch_size=batch_size, seed=seed)
            else:
                greedy, samples = generate_answers(model, tokenizer, [r["question"] for r in splits[name]],
                                                   n_samples=config.open_samples,
                                                   max_new_tokens=config.open_max_new_tokens, temperature=temperature,
                                                   batch_size=batch_size, seed=seed)
            per_split[name] = {"greedy": greedy, "samples": samples}
        info["wall_seconds"] = time.perf_counter() - start
        done[method] = {"splits": per_split, "info": info}
        _answers_file(out, method).write_text(json.dumps(done[method], indent=1, default=float) + "\n")
        progress_line(f"open-ended {method}: {info['wall_seconds']:.0f} s", progress)
    return done


def semantic_scores(answers: dict, splits: dict, *, domains: dict, equivalence: str) -> dict:
    """``{method: {split: (confidence, correct)}}`` from the generated answers (``metrics.semantic_confidences``
    with the greedy answer as the answer given), every answer parsed by ``parse_answer`` of its domain."""
    from hf_calibration.metrics import semantic_confidences

    out = {}
    for method, data in answers.items():
        out[method] = {}
        for name, gen in data["splits"].items():
            d = domains[name]
            refs = [r["reference"] for r in splits[name]]
            greedy = [parse_answer(d, g) for g in gen["greedy"]]
            samples = [[parse_answer(d, s) for s in row] for row in gen["samples"]]
            conf, correct = semantic_confidences(samples, refs, answers=greedy, equivalence=equivalence)
            out[method][name] = (conf, correct)
    return out


def _strata(scores: dict, a: str, b: str, splits: list) -> list:
    """((correct, confidence) of a, of b) per split, as ``metrics.paired_strata_difference`` takes them."""
    return [((scores[a][s][1], scores[a][s][0]), (scores[b][s][1], scores[b][s][0])) for s in splits]


def _pooled_open(scores: dict, a: str, b: str, splits: list, *, n_resamples: int, seed: int) -> dict:
    """Sem-ECE of method a − method b on the same questions, mean over ``splits`` (equal weights), interval from
    ``metrics.stratified_bootstrap``."""
    d = paired_strata_difference(_strata(scores, a, b, splits), n_resamples=n_resamples, seed=seed)
    return {"value": d["value"], "low": d["low"], "high": d["high"], "per_split": d["per_stratum"]}


def _accuracy_share(scores: dict, a: str, b: str, splits: list, *, n_resamples: int, seed: int,
                    share: float = 0.95) -> dict:
    """Accuracy of a − ``share`` · accuracy of b on the same questions, pooled over ``splits`` (equal weights, each
    resampled on its own: ``metrics.paired_strata_difference``) → its value, interval and per-split values,
    with "a" and "b" the two accuracies averaged over the splits."""
    d = paired_strata_difference(_strata(scores, a, b, splits), metric="accuracy", share=share,
                                 n_resamples=n_resamples, seed=seed)
    return {**d, "a": float(np.mean([scores[a][s][1].mean() for s in splits])),
            "b": float(np.mean([scores[b][s][1].mean() for s in splits]))}


def _accuracy_row(d: dict, *, over: str = "") -> tuple:
    """The claim-check row "CALM's in-domain accuracy ≥ 95 % of SFT's" from ``_accuracy_share``'s result ``d``;
    ``over`` says what the accuracies are averaged over (shown after them)."""
    return ("in-domain accuracy of CALM ≥ 95% of SFT's (open-ended)",
            interval_verdict(d, held_when="above"),
            f"CALM {d['a']:.3f} / SFT {d['b']:.3f}{over}; CALM − 0.95·SFT {format_interval(d)}")


def open_claim(scores: dict, ood: list, *, n_resamples: int, seed: int, strata_label: str | None = None) -> tuple:
    """The paper's open-ended claim, "CALM has the lowest mean Semantic-ECE cross-domain", as a claim-check row:
    held when CALM − every other method's mean OOD Sem-ECE has an interval below 0, not held when one lies
    above 0, else undecided. ``strata_label`` names what ``ood`` holds in the evidence (default "<n> OOD
    domain(s)")."""
    others = [m for m in scores if m != "bome"]
    claim = "lowest mean Semantic-ECE, open-ended cross-domain"
    if "bome" not in scores or not others or not ood:
        return claim, "not run", "needs bome, another method and an OOD domain", {}
    diffs = {m: _pooled_open(scores, "bome", m, ood, n_resamples=n_resamples, seed=seed) for m in others}
    verdicts = [interval_verdict(d) for d in diffs.values()]
    held = True if all(v is True for v in verdicts) else False if any(v is False for v in verdicts) else None
    evidence = "; ".join(f"CALM − {m} {d['value']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]" for m, d in diffs.items())
    return claim, held, f"mean over {strata_label or f'{len(ood)} OOD domain(s)'}: {evidence}", diffs


def open_report(out: Path, answers: dict, splits: dict, *, train_domain: str, equivalence: str, n_resamples: int,
                seed: int, header: str) -> tuple[dict, str, tuple]:
    """The open-ended table (module docstring) → (results, Markdown text, claim row); writes ``report.md`` and
    ``report.json`` into ``out``."""
    from hf_calibration.metrics import calibration_report
    from hf_calibration.reporting.reports import write_json

    ood = [k for k in splits if k not in IN_DOMAIN_SPLITS]
    scores = semantic_scores(answers, splits, domains=_split_domains(train_domain, ood), equivalence=equivalence)
    kw = dict(n_resamples=n_resamples, seed=seed)
    results = {"tables": {}, "paired": {}, "info": {m: a.get("info", {}) for m, a in answers.items()}}
    lines = [header, "", "| split | method | acc | Sem-ECE | Brier | AUROC | mean conf. | ref: const. = val. acc. "
             "Sem-ECE |", "|---|---|---|---|---|---|---|---|"]

    def cell(r):
        return f"{r['value']:.3f} [{r['low']:.3f}, {r['high']:.3f}]"

    for name in ("id_test", *ood):
        for m in scores:
            conf, correct = scores[m][name]
            rep = calibration_report(correct, conf, **kw)
            val_acc = float(np.mean(scores[m]["validation"][1]))
            ref = calibration_report(correct, np.full(len(correct), val_acc), **kw)["conf_ece"]
            results["tables"].setdefault(m, {})[name] = {**rep, "reference_constant_accuracy": ref,
                                                         "validation_accuracy": val_acc}
            lines.append(f"| {name} | {method_label(m)} | {cell(rep['accuracy'])} | {cell(rep['conf_ece'])} | "
                         f"{rep['brier']['value']:.3f} | {rep['auroc']['value']:.3f} | {float(np.mean(conf)):.3f} | "
                         f"{ref['value']:.3f} (val. acc. {val_acc:.3f}) |")
    lines += ["", "Paired Sem-ECE differences (the same questions; mean over the OOD domains for \"OOD mean\"):", "",
              "| split | comparison | Δ Sem-ECE [95 %] |", "|---|---|---|"]
    for m in [m for m in scores if m != "bome"] if "bome" in scores else []:
        for name, group in [(n, [n]) for n in ("id_test", *ood)] + ([("OOD mean", ood)] if len(ood) > 1 else []):
            d = _pooled_open(scores, "bome", m, group, **kw)
            results["paired"].setdefault(name, {})[f"bome − {m}"] = d
            lines.append(f"| {name} | {pair_label('bome', m)} | {format_interval(d)} |")
    claim, held, evidence, _ = open_claim(scores, ood, **kw)
    results["claim"] = {"claim": claim, "held": held, "evidence": evidence}
    checks = [(claim, held, evidence)]
    if {"bome", "sft"} <= set(scores):
        results["accuracy_share"] = d = _accuracy_share(scores, "bome", "sft", ["id_test"], **kw)
        checks.append(_accuracy_row(d))
    lines += ["", "Claim check (open-ended):", "", format_claim_check(checks)]
    timing = {m: a.get("info", {}) for m, a in answers.items()}
    lines += ["", "Wall time per method (training and generation): " + ", ".join(
        f"{m} {t.get('wall_seconds', float('nan')):.0f} s"
        + (f" ({t['seconds_per_step']:.1f} s/step)" if "seconds_per_step" in t else "")
        + (f" (T = {t['temperature']:.3f})" if "temperature" in t else "") for m, t in timing.items()), ""]
    text = "\n".join(lines)
    (out / "report.md").write_text(text)
    write_json(out / "report.json", results)
    return results, text, (claim, held, evidence)


def _open_setting(config) -> tuple[list, dict]:
    """The open-ended domains of ``config.open_domains`` (training domain first) and the split sizes
    ``open_splits`` takes."""
    domains = [d.strip() for d in config.open_domains.split(",")]
    sizes = {"train": config.n_train, "calibration": config.n_calibration, "validation": config.n_validation,
             "id_test": config.n_test, "ood": config.n_ood}
    return domains, sizes


def _split_domains(train_domain: str, ood: list) -> dict:
    """The domain each scored split is parsed and judged as: validation and id_test are the training domain's."""
    return {"validation": train_domain, "id_test": train_domain, **{d: d for d in ood}}


def _open_methods(config) -> list:
    """The open-ended methods of ``config.methods``, with the uncalibrated answers TS reads its greedy answers from."""
    return [m for m in OPEN_ENDED_METHODS if m in config.methods or (m == "uncalibrated" and "ts" in config.methods)]


def check_open_answers(folder: Path, config) -> None:
    """ParameterError naming ``phase`` when a method of ``config.methods`` (or the uncalibrated answers TS needs)
    has no saved open-ended answers in ``folder/answers``."""
    missing = [m for m in _open_methods(config) if not _answers_file(folder, m).is_file()]
    if missing:
        raise ParameterError("phase", config.phase, f"the open-ended method(s) {', '.join(missing)} have no answers "
                             f"in {str(folder / 'answers')!r} yet; run the train phase first")


def open_seeds_report(out: Path, config, seeds: list, *, model_name: str, n_resamples: int,
                      seed: int) -> tuple[dict, str, tuple]:
    """The open-ended table over training seeds, from each seed's saved answers in
    ``out/seed_<s>/open_ended/answers`` (the same splits ``run_open_ended`` drew for that seed): per split and
    method the mean and range over seeds of accuracy, Sem-ECE, Brier and AUROC; CALM − each method's Sem-ECE
    pooled over the (seed, OOD domain) strata (``metrics.paired_strata_difference``, equal weights, each
    stratum resampled on its own), the claim row of ``open_claim`` on those pooled intervals, and CALM − 0.95·SFT
    accuracy pooled over the seeds' in-domain test splits. Writes ``open_ended_seeds.md`` and
    ``open_ended_seeds.json`` into ``out`` → (results, Markdown text, claim row). ParameterError naming ``phase``
    when a seed has no answers for a method."""
    from hf_calibration.metrics import brier_score, confidence_auroc, expected_calibration_error
    from hf_calibration.reporting.reports import write_json

    domains, sizes = _open_setting(config)
    methods = _open_methods(config)
    merged, ood = {}, []
    for s in seeds:
        folder = out / f"seed_{s}" / "open_ended"
        check_open_answers(folder, config)
        splits = open_splits(domains, sizes, seed=s)
        ood = [k for k in splits if k not in IN_DOMAIN_SPLITS]
        answers = {m: json.loads(_answers_file(folder, m).read_text()) for m in methods}
        scores = semantic_scores(answers, splits, domains=_split_domains(domains[0], ood),
                                 equivalence=config.open_equivalence)
        for m in methods:
            for name, value in scores[m].items():
                merged.setdefault(m, {})[f"seed {s}/{name}"] = value
    kw = dict(n_resamples=n_resamples, seed=seed)
    lines = [f"### open-ended over seeds {', '.join(map(str, seeds))}: {model_name}, trained on {domains[0]}, OOD "
             f"{', '.join(domains[1:]) or 'none'}; mean (min–max) over the seeds; equivalence "
             f"{config.open_equivalence}; 95% bootstrap intervals ({n_resamples} resamples)", "",
             "| split | method | acc | Sem-ECE | Brier | AUROC | ref: const. = val. acc. Sem-ECE |",
             "|---|---|---|---|---|---|---|"]
    summary = {}
    for name in ("id_test", *ood):
        for m in methods:
            rows = [merged[m][f"seed {s}/{name}"] for s in seeds]
            val_acc = [float(np.mean(merged[m][f"seed {s}/validation"][1])) for s in seeds]
            vals = {"accuracy": [float(np.mean(y)) for _, y in rows],
                    "sem_ece": [expected_calibration_error(y, c) for c, y in rows],
                    "brier": [brier_score(y, c) for c, y in rows],
                    "auroc": [confidence_auroc(y, c) for c, y in rows],
                    "reference_constant_accuracy": [expected_calibration_error(y, np.full(len(y), a))
                                                    for (_, y), a in zip(rows, val_acc)]}
            summary.setdefault(name, {})[m] = vals
            lines.append(f"| {name} | {method_label(m)} | " + " | ".join(mean_range(v) for v in vals.values()) + " |")
    ood_strata = [f"seed {s}/{d}" for s in seeds for d in ood]
    claim, held, evidence, diffs = open_claim(merged, ood_strata, **kw,
                                              strata_label=f"{len(ood)} OOD domain(s) × {len(seeds)} seed(s)")
    checks = [(claim, held, evidence)]
    results = {"seeds": list(seeds), "summary": summary, "paired_ood": diffs,
               "claim": {"claim": claim, "held": held, "evidence": evidence}}
    if {"bome", "sft"} <= set(methods):
        results["accuracy_share"] = d = _accuracy_share(merged, "bome", "sft", [f"seed {s}/id_test" for s in seeds],
                                                        **kw)
        checks.append(_accuracy_row(d, over=f" (mean over {len(seeds)} seeds)"))
    lines += ["", f"Claim check (open-ended, pooled over {len(seeds)} seeds):", "", format_claim_check(checks), ""]
    text = "\n".join(lines)
    (out / "open_ended_seeds.md").write_text(text)
    write_json(out / "open_ended_seeds.json", results)
    return results, text, (claim, held, evidence)


def run_open_ended(out: Path, config, *, model_name: str, seed: int, device: str, batch_size: int,
                   n_resamples: int, overwrite: bool = False, progress: bool = True) -> tuple[dict, str, tuple]:
    """The open-ended setting into ``out`` (``<output_dir>/open_ended``): splits from ``config.open_domains``
    (training domain first), answers generated or read back, the table → (results, Markdown text, claim row)."""
    domains, sizes = _open_setting(config)
    identity = {"model": model_name, "seed": seed, "open_domains": config.open_domains,
                "open_samples": config.open_samples, "open_max_new_tokens": config.open_max_new_tokens,
                **{k: getattr(config, k) for k in RUN_FIELDS if k != "entropy_domain"}}  # always 'vocab' here
    if not overwrite:
        check_same_run(out, identity, names={"model": "models"})
    splits = open_splits(domains, sizes, seed=seed)
    methods = [m for m in config.methods if m in OPEN_ENDED_METHODS]
    if config.phase == "report":
        missing = [m for m in methods if not _answers_file(out, m).is_file()]
        if missing:
            raise ParameterError("phase", "report", f"the open-ended method(s) {', '.join(missing)} have no answers "
                                 f"in {str(out / 'answers')!r} yet; run the train phase first")
    else:
        modeling.resolve_model_path(model_name)
        out.mkdir(parents=True, exist_ok=True)
        (out / "run.json").write_text(json.dumps({**identity, "sizes": {k: len(v) for k, v in splits.items()}},
                                                 indent=2) + "\n")
    answers = open_answers(out, splits, config, train_domain=domains[0], model_name=model_name, seed=seed,
                           device=device, batch_size=batch_size, overwrite=overwrite, progress=progress)
    if config.phase == "train":
        return {}, "", ("", "not run", "")
    header = (f"### open-ended: {model_name}, trained on {domains[0]}, OOD {', '.join(domains[1:]) or 'none'}, "
              f"seed {seed}; "
              f"{config.open_samples} samples per question (temperature 1, T for ts), equivalence "
              f"{config.open_equivalence}; {config.max_steps} steps of {config.train_batch_size}, the checkpoint with "
              f"the lowest validation token loss of every {config.select_every} steps; 95% bootstrap intervals "
              f"({n_resamples} resamples)")
    results, text, claim = open_report(out, answers, splits, train_domain=domains[0],
                                       equivalence=config.open_equivalence, n_resamples=n_resamples, seed=seed,
                                       header=header)
    results["sizes"] = {k: len(v) for k, v in splits.items()}
    return results, text, claim
