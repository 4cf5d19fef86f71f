"""A stream of questions from several domains run through SECL, with the baselines on the same answers.

Two passes over the same stream with the same model:

1. **baseline pass** (``baseline_pass``; ``secl_update=False``, identity adapter): the answer, its
   verbalized confidence, P(True) of the answer, P(True)Norm over the answer and its distractors (MCQA: the
   other options, each shown as "B. <option text>"; open-ended: beam-search alternatives) and the
   DINCO-style score (``confidence.dinco_score`` with the answer's length-normalised sequence probability as
   the self-consistency term); ``p_true_options`` keeps P(True) of the answer, then of each distractor, so
   P(True)Norm can be recomputed at another τ_n (``examples/secl_target_study.py``);
2. **SECL pass** (``secl_pass``; adapter, gate and counters reset first): the same prompts through
   ``generate`` with SECL on; the SECL confidence of a question is the verbalized confidence returned by
   ``generate`` for it (read before the update it may trigger, with the adapter that earlier questions
   produced). Its fields are ``secl``, ``secl_answer``, ``burst``, … A second SECL pass with the other
   adapter scope (``SECLConfig.adapter_scope``) writes the same fields under ``secl_<scope>``
   (``secl_field``), so one stream can report both.

Supervised references (labels): Platt scaling and temperature scaling of the baseline verbalized
confidence, fitted by 2-fold cross-fitting over the stream (each half calibrated by a fit on the other).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass

import numpy as np
import torch

from hf_calibration.data import MCQA_DATASETS, OPEN_QA_DATASETS, parse_domains
from hf_calibration.errors import ParameterError, renamed_parameters
from hf_calibration.modeling.prompts import LETTERS, build_prompt, first_option_letter, format_mcqa
from hf_calibration.reports import format_claim_check  # noqa: F401  (re-exported: the table of claim_check)
from hf_calibration.secl.confidence import SIGNAL_NAMES

MCQA_DOMAINS = tuple(MCQA_DATASETS)
OPEN_DOMAINS = tuple(OPEN_QA_DATASETS)
GSM8K_INSTRUCTION = "Reply with the final number only."


@dataclass
class StreamItem:
    """One question of the stream. ``gold``: option index (MCQA) or the final number as text (open)."""

    domain: str
    prompt_ids: list
    gold: object
    kind: str  # "mcqa" or "open"
    n_options: int = 0
    choices: list | None = None  # MCQA: the option texts in letter order (P(True) is asked about them)


def parse_stream(stream: str) -> list[tuple[str, str | None]]:
    """"mmlu:humanities,gsm8k,halueval_qa" → [("mmlu", "humanities"), ("gsm8k", None), ("halueval_qa", None)]:
    ``data.parse_domains`` over the stream's domains (``MCQA_DOMAINS + OPEN_DOMAINS``), MMLU subjects or
    categories '+'-joined (``mmlu:stem+other``). Raises ParameterError naming ``stream``."""
    with renamed_parameters(domains="stream"):
        return parse_domains(stream, MCQA_DOMAINS + OPEN_DOMAINS)


def build_stream(tokenizer, stream: str, *, limit_per_domain: int, seed: int = 0, prompt_format: str = "auto",
                 balance_gold: bool = False, context: int | None = None, reserve: int = 0,
                 on_overflow: str = "truncate") -> list:
    """The stream's items, domain after domain, ``limit_per_domain`` each (seeded sample).

    balance_gold : passed to ``load_mcqa`` (every option letter gold equally often in each MCQA domain).
    context, reserve, on_overflow : each prompt plus ``reserve`` tokens (the answer and follow-up turns) fitted
        to ``context`` tokens by ``modeling.context.fit_to_context`` (None: not checked).
    Raises ParameterError naming ``stream``, ``limit_per_domain`` or (``on_overflow="error"``) ``on_overflow``.
    """
    from hf_calibration.data import load_mcqa, load_open_qa
    from hf_calibration.modeling.context import fit_to_context

    if isinstance(limit_per_domain, bool) or not isinstance(limit_per_domain, int) or limit_per_domain < 1:
        raise ParameterError("limit_per_domain", limit_per_domain,
                             f"must be a positive integer, got {limit_per_domain!r}")
    items = []
    for name, subjects in parse_stream(stream):
        label = name if subjects is None else f"{name}:{subjects.replace(',', '+')}"
        if name in MCQA_DOMAINS:
            rows = list(load_mcqa(name, subjects=subjects, limit=limit_per_domain, seed=seed, balance_gold=balance_gold))
            user = [lambda q, c=row["choices"]: format_mcqa(q, c) for row in rows]
        else:
            rows = list(load_open_qa(name, limit=limit_per_domain, seed=seed))
            user = [lambda q: f"{q.strip()}\n{GSM8K_INSTRUCTION}"] * len(rows)
        fit = fit_to_context(tokenizer, [r["question"] for r in rows], limit=context, reserve=reserve,
                             build=lambda i, q: build_prompt(tokenizer, user[i](q), prompt_format=prompt_format),
                             on_overflow=on_overflow)
        for i, question in zip(fit.kept, fit.texts):
            row = rows[i]
            ids = tokenizer.encode(build_prompt(tokenizer, user[i](question), prompt_format=prompt_format),
                                   add_special_tokens=False)
            if name in MCQA_DOMAINS:
                items.append(StreamItem(label, ids, int(row["answer"]), "mcqa", len(row["choices"]),
                                        list(row["choices"])))
            else:
                items.append(StreamItem(label, ids, str(row["final_answer"]), "open"))
    return items


def judge(item: StreamItem, text: str) -> tuple[str, bool]:
    """(parsed answer, correct) of a generated answer text.

    MCQA: the first standalone option letter in the first 40 characters ("C", "C. …", "The answer is C");
    open-ended: the last number in the text (``extract_final_number``) compared numerically.
    """
    from hf_calibration.data.loaders import extract_final_number

    if item.kind == "mcqa":
        letter = first_option_letter(text)
        k = LETTERS.index(letter) if letter is not None and LETTERS.index(letter) < item.n_options else -1
        return (LETTERS[k] if k >= 0 else ""), k == item.gold
    number = extract_final_number(text)
    return ("" if number is None else str(number)), number is not None and _same_number(number, item.gold)


def _same_number(a, b) -> bool:
    try:
        return abs(float(str(a).replace(",", "")) - float(str(b).replace(",", ""))) < 1e-6
    except ValueError:
        return str(a).strip() == str(b).strip()


def _generate(model, item: StreamItem, *, max_new_tokens: int, update: bool) -> dict:
    ids = torch.tensor([item.prompt_ids], device=next(model.parameters()).device)
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
        return_dict_in_generate=True, output_scores=True, secl_choices=[item.choices], secl_update=update,
        pad_token_id=model.secl_tokenizer.pad_token_id,
    )
    record = dict(model.secl_records[0])
    answer = out.sequences[0, len(item.prompt_ids):].tolist()
    stop = model.secl_stop_ids()
    length = next((j for j, t in enumerate(answer) if t in stop), len(answer))
    steps = torch.stack([s[0].float() for s in out.scores[: max(length, 1)]])
    logp = torch.log_softmax(steps, dim=-1)
    chosen = torch.tensor(answer[: max(length, 1)])
    record["consistency"] = float(torch.exp(logp[torch.arange(len(chosen)), chosen].mean()))
    record["answer_ids"] = answer[:length]
    record["text"] = model.secl_tokenizer.decode(answer[:length], skip_special_tokens=True)
    record["cache"] = getattr(out, "cache", None)
    return record


def run_stream(model, items: list, *, max_new_tokens: int = 8, burst_at_start: bool = False,
               progress: bool = True, baseline_only: bool = False) -> list[dict]:
    """Both passes (module docstring) over ``items`` with a SECL model; one record per item.

    burst_at_start : open a burst at the first question of the SECL pass, treating the start of the
        stream as a shift (the entropy gate cannot fire during its warm-up).
    baseline_only : run the baseline pass alone (records then lack the SECL fields; summarise them
        with ``summarize_stream(..., signals=BASELINE_ROWS)``).
    """
    records = baseline_pass(model, items, max_new_tokens=max_new_tokens, progress=progress)
    if not baseline_only:
        secl_pass(model, items, records, max_new_tokens=max_new_tokens, burst_at_start=burst_at_start,
                  progress=progress)
    return records


def baseline_pass(model, items: list, *, max_new_tokens: int = 8, progress: bool = True) -> list[dict]:
    """The baseline pass (module docstring) with the identity adapter: one record per item."""
    from tqdm.auto import tqdm

    from hf_calibration.secl.confidence import dinco_score

    records = []
    model.reset_calibration()
    for item in tqdm(items, desc="baseline pass", disable=not progress, unit="q"):
        start = time.perf_counter()
        r = _generate(model, item, max_new_tokens=max_new_tokens, update=False)
        # the P(True) reads continue generate's prompt cache (identity adapter: the teacher's weights), so the
        # prompt runs once per question, not twice
        label = model.secl_pseudo_label(item.prompt_ids, r["answer_ids"], choices=item.choices,
                                        prompt_cache=r.pop("cache"))
        parsed, correct = judge(item, r["text"])
        gen_passes = r["forward_passes"]  # generation + verbalized reads
        records.append({
            "domain": item.domain, "n_options": item.n_options, "answer": r["text"], "parsed": parsed, "correct": bool(correct),
            "verbalized": r["confidence"], "verbalized_greedy": r["verbalized_greedy"], "entropy": r["entropy"],
            "p_true": float(label["p_true"][0]), "norm_p_true": label["norm_p_true"],
            "p_true_options": [float(v) for v in label["p_true"]],
            "dinco": float(dinco_score(label["p_true"][None], np.array([0]), np.array([r["consistency"]]))[0]),
            "n_distractors": label["n_distractors"],
            "passes": {"verbalized": gen_passes, "p_true": 2,
                       "norm_p_true": 1 + label["forward_passes"], "dinco": 1 + label["forward_passes"]},
            "baseline_seconds": time.perf_counter() - start,
        })
    return records


# A SECL pass's fields; those of the pass with the model's own adapter scope keep the names they always had.
SECL_PASS_FIELDS = ("answer", "correct", "confidence_after", "alarm", "burst", "updated", "skipped_by_bin_gate",
                    "p_true", "norm_p_true", "target", "seconds")
_UNPREFIXED = ("alarm", "burst", "updated", "skipped_by_bin_gate", "target")


def secl_key(scope: str | None, own_scope: str) -> str:
    """The record key of a SECL pass: "secl" for the model's own adapter scope (or None), "secl_<scope>" else."""
    return "secl" if scope in (None, own_scope) else f"secl_{scope}"


def secl_field(key: str, name: str) -> str:
    """The record field ``name`` (one of ``SECL_PASS_FIELDS``) of the SECL pass ``key``: "secl_answer", "burst",
    "secl_all_answer", "secl_all_burst", …"""
    return name if key == "secl" and name in _UNPREFIXED else f"{key}_{name}"


@contextlib.contextmanager
def _adapter_scope(model, scope: str | None):
    own = model.secl_config
    if scope is not None:
        model.secl_config = dataclasses.replace(own, adapter_scope=scope)
    try:
        yield
    finally:
        model.secl_config = own


def secl_pass(model, items: list, records: list[dict], *, scope: str | None = None, max_new_tokens: int = 8,
              burst_at_start: bool = False, progress: bool = True) -> dict:
    """One SECL pass over ``items`` (module docstring), from the identity adapter with a fresh gate and counters;
    adds its fields to ``records`` (from ``baseline_pass``) and returns its counters.

    scope : the pass's ``SECLConfig.adapter_scope``; None → the model's own. The fields are named by
    ``secl_key`` / ``secl_field``. The model keeps its own config afterwards; its adapter, gate and counters are
    this pass's.
    """
    from tqdm.auto import tqdm

    key = secl_key(scope, model.secl_config.adapter_scope)
    with _adapter_scope(model, scope):
        model.reset_calibration(counters=True)
        if burst_at_start:
            model.start_burst()
        for item, rec in zip(tqdm(items, desc=f"SECL pass ({model.secl_config.adapter_scope})", disable=not progress,
                                  unit="q"), records):
            start = time.perf_counter()
            r = _generate(model, item, max_new_tokens=max_new_tokens, update=True)
            parsed, correct = judge(item, r["text"])
            values = {"answer": r["text"], "correct": bool(correct), "confidence_after": r["confidence_after"],
                      "alarm": r["alarm"], "burst": r["in_burst"], "updated": r["updated"],
                      "skipped_by_bin_gate": r["skipped_by_bin_gate"], "p_true": r["p_true"],
                      "norm_p_true": r["norm_p_true"], "target": r["target"], "seconds": time.perf_counter() - start}
            rec[key] = r["confidence"]
            rec.update({secl_field(key, name): values[name] for name in SECL_PASS_FIELDS})
            rec["passes"][key] = r["forward_passes"]
    return dict(model.secl_counters)


def _cross_fit(conf: np.ndarray, correct: np.ndarray, method: str, seed: int) -> np.ndarray:
    """2-fold cross-fitted Platt or temperature scaling of a binary confidence."""
    from hf_calibration.posthoc import PlattScaler, TemperatureScaler, log_odds

    rng = np.random.default_rng(seed)
    fold = rng.permutation(len(conf)) % 2
    out = np.empty(len(conf))
    for f in (0, 1):
        fit, apply = fold != f, fold == f
        if len(set(correct[fit].tolist())) < 2:
            out[apply] = correct[fit].mean()  # one class in the fitting half: its frequency is the best constant
            continue
        if method == "platt":
            out[apply] = PlattScaler().fit(conf[fit], correct[fit]).transform(conf[apply])
        else:
            def logits(c):  # binary logits (0, log-odds), unclipped: answers near 1 keep their order
                return np.stack([np.zeros_like(c), log_odds(c)], axis=1)

            scaler = TemperatureScaler().fit(logits(conf[fit]), correct[fit].astype(int))
            out[apply] = scaler.transform(logits(conf[apply]))[:, 1]
    return out


SIGNAL_ROWS = ("verbalized", "p_true", "norm_p_true", "dinco", "secl", "platt", "temperature")
BASELINE_ROWS = ("verbalized", "p_true", "norm_p_true", "dinco", "platt", "temperature")


def signal_rows(secl_keys: tuple = ("secl",)) -> tuple:
    """``SIGNAL_ROWS`` with the rows of these SECL passes (``secl_key``) where "secl" stands."""
    i = SIGNAL_ROWS.index("secl")
    return SIGNAL_ROWS[:i] + tuple(secl_keys) + SIGNAL_ROWS[i + 1:]


def summarize_stream(records: list[dict], *, n_resamples: int = 1000, seed: int = 0,
                     signals: tuple = SIGNAL_ROWS, n_bins: int = 15, binning: str = "uniform", norm: str = "l1") -> dict:
    """Per domain and overall: a calibration report per signal (+ passes/q), the references, SECL shares.

    signals : which rows to report; ``BASELINE_ROWS`` for records of ``run_stream(baseline_only=True)``; a second
        SECL pass's key (``secl_key``, e.g. "secl_all") adds its row. Each SECL row is scored against its own
        pass's answers. The shares of the "secl" pass (in burst, trained, bin-gate skips, alarms, accuracy
        change) sit beside "signals"; another pass's under its key.
    n_bins, binning, norm : the binned metrics' options (``calibration_report``), references included.

    Each SECL pass's ``paired`` holds ``paired_differences`` against the verbalized confidence; with several
    domains, the overall one also holds the within-domain differences of ``within_domain_difference``
    (``WITHIN_DOMAIN``'s keys), which ``claim_check`` reads for the overall AUROC and Brier claims.
    """
    from hf_calibration.metrics import calibration_report
    from hf_calibration.reports import references

    secl_keys = [s for s in signals if s == "secl" or s.startswith("secl_")]
    correct_all = np.array([r["correct"] for r in records], dtype=int)
    verbal_all = np.array([r["verbalized"] for r in records])
    platt = _cross_fit(verbal_all, correct_all, "platt", seed)
    temp = _cross_fit(verbal_all, correct_all, "temperature", seed)
    domains = list(dict.fromkeys(r["domain"] for r in records))
    out = {}
    for name in domains + ["overall"]:
        idx = np.array([i for i, r in enumerate(records) if name == "overall" or r["domain"] == name])
        sub = [records[i] for i in idx]
        y = correct_all[idx]
        y_pass = {key: np.array([r[secl_field(key, "correct")] for r in sub], dtype=int) for key in secl_keys}
        reports = {}
        for sig in signals:
            if sig == "platt":
                conf, yy, passes = platt[idx], y, np.mean([r["passes"]["verbalized"] for r in sub])
            elif sig == "temperature":
                conf, yy, passes = temp[idx], y, np.mean([r["passes"]["verbalized"] for r in sub])
            else:
                conf = np.array([r[sig] for r in sub])
                yy = y_pass.get(sig, y)
                passes = np.mean([r["passes"][sig] for r in sub])
            report = calibration_report(yy, conf, n_bins=n_bins, binning=binning, norm=norm, n_resamples=n_resamples,
                                        seed=seed)
            report["forward_passes"] = float(passes)
            reports[sig] = report
        k = max(r["n_options"] for r in sub)
        refs = references(y.astype(bool), max(k, 1), n_bins=n_bins, binning=binning, norm=norm,
                          n_resamples=n_resamples, seed=seed)
        if k == 0:  # open-ended: no 1/K reference
            del refs["constant_1/K"]
        out[name] = {"n": len(sub), "signals": reports, "references": refs}
        for key in secl_keys:
            shares = {
                "share_in_burst": float(np.mean([r[secl_field(key, "burst")] for r in sub])),
                "share_trained": float(np.mean([r[secl_field(key, "updated")] for r in sub])),
                "skipped_by_bin_gate": int(sum(r[secl_field(key, "skipped_by_bin_gate")] for r in sub)),
                "alarms": int(sum(r[secl_field(key, "alarm")] for r in sub)),
                "accuracy_change_secl": float(y_pass[key].mean() - y.mean()),
            }
            shares["paired"] = paired_differences(y_pass[key], np.array([r[key] for r in sub]), y,
                                                  np.array([r["verbalized"] for r in sub]), n_resamples=n_resamples,
                                                  seed=seed, n_bins=n_bins, binning=binning, norm=norm)
            if key == "secl":
                out[name].update(shares)
            else:
                out[name][key] = shares
    if len(domains) > 1:
        for key in secl_keys:
            overall = out["overall"] if key == "secl" else out["overall"][key]
            for metric, name in WITHIN_DOMAIN.items():
                overall["paired"][name] = within_domain_difference(records, key, metric=metric,
                                                                   n_resamples=n_resamples, seed=seed,
                                                                   n_bins=n_bins, binning=binning, norm=norm)
    return out


WITHIN_DOMAIN = {"ece": "delta_ece_within_domains",
                 "auroc": "delta_auroc_within_domains",
                 "brier_vs_constant": "delta_brier_vs_constant_within_domains"}


def within_domain_difference(records: list[dict], key: str = "secl", *, metric: str = "auroc",
                             n_resamples: int = 1000, seed: int = 0, n_bins: int = 15, binning: str = "uniform",
                             norm: str = "l1") -> dict:
    """A paired difference of the SECL pass ``key`` computed within each domain of ``records`` and averaged over the
    domains with weights n_domain / n; interval: ``metrics.stratified_bootstrap`` (each domain's questions
    resampled on their own, the same draw for both terms). → ``{"value", "low", "high", "per_domain": {domain:
    value}, "baseline"}``, ``baseline`` the same weighted mean of the second term alone (the verbalized ECE or
    AUROC, the constant's Brier), so that ``-value / baseline`` is the relative change over the domains.

    metric : "ece": conf-ECE(SECL) − conf-ECE(verbalized) under the ECE options ``n_bins``, ``binning``, ``norm``
        (``metrics.expected_calibration_error``), each against its own pass's answers;
        "auroc": AUROC(SECL) − AUROC(verbalized), each against its own pass's answers;
        "brier_vs_constant": Brier(SECL) − Brier(constant = the SECL answers' accuracy in that domain), the
        per-domain form of ``paired_differences``' ``delta_brier_vs_constant``.

    Pooled over a stream, each rewards a level shift between domains of different accuracy: lowering every
    confidence on a domain whose answers are mostly wrong raises the pooled AUROC and beats the one pooled
    constant without ranking any answer better within a domain, and the pooled ECE bins answers of different
    domains together. The paper's claims are about what a confidence tells within a domain, so the overall claim
    check reads these. A domain where a term is undefined (AUROC with all answers right or all wrong) is left out
    of the mean (its ``per_domain`` value is NaN), and a resample where a kept domain has none is skipped; with no
    such domain (or resample) left, value, interval and baseline are NaN."""
    from hf_calibration.metrics import brier_score, confidence_auroc, expected_calibration_error, stratified_bootstrap

    if metric not in WITHIN_DOMAIN:
        raise ValueError(f"metric: must be one of {sorted(WITHIN_DOMAIN)}, got {metric!r}")
    domains = list(dict.fromkeys(r["domain"] for r in records))
    strata = []
    for d in domains:
        sub = [r for r in records if r["domain"] == d]
        y_secl = np.array([r[secl_field(key, "correct")] for r in sub], dtype=int)
        strata.append((y_secl, np.array([r[key] for r in sub], dtype=float),
                       np.array([r["correct"] for r in sub], dtype=int),
                       np.array([r["verbalized"] for r in sub], dtype=float),
                       np.full(len(sub), y_secl.mean())))

    def terms(k, idx):
        ys, cs, yv, cv, const = (a[idx] for a in strata[k])
        if metric == "ece":
            return (expected_calibration_error(ys, cs, n_bins=n_bins, binning=binning, norm=norm),
                    expected_calibration_error(yv, cv, n_bins=n_bins, binning=binning, norm=norm))
        if metric == "auroc":  # NaN where a pass's answers are all right or all wrong
            return confidence_auroc(ys, cs), confidence_auroc(yv, cv)
        return brier_score(ys, cs), brier_score(ys, const)

    def statistic(k, idx):
        first, second = terms(k, idx)
        return first - second

    whole = {d: terms(k, np.arange(len(strata[k][0]))) for k, d in enumerate(domains)}
    per_domain = {d: a - b for d, (a, b) in whole.items()}
    kept = [d for d in domains if np.isfinite(per_domain[d])]
    strata = [st for st, d in zip(strata, domains) if d in kept]
    sizes = [len(st[0]) for st in strata]
    try:
        if not strata:
            raise ValueError("no domain has the difference")
        est, low, high = stratified_bootstrap(statistic, sizes, weights=sizes, n_resamples=n_resamples, seed=seed)
        baseline = float(np.average([whole[d][1] for d in kept], weights=sizes))
    except ValueError:  # no domain, or no resample, where the difference is defined
        est = low = high = baseline = float("nan")
    return {"value": est, "low": low, "high": high, "per_domain": per_domain, "baseline": baseline}


def paired_differences(y_secl, secl, y_verbal, verbal, *, n_resamples: int = 1000, seed: int = 0, n_bins: int = 15,
                       binning: str = "uniform", norm: str = "l1") -> dict:
    """SECL against the verbalized confidence on the same questions, paired bootstrap (``metrics.paired_bootstrap``,
    the same resampled questions for both): ``delta_ece`` (conf-ECE under the ECE options), ``delta_auroc``,
    ``delta_brier`` = SECL − verbalized, and ``delta_brier_vs_constant`` = Brier(SECL) − Brier(constant = the SECL
    answers' accuracy on all n), each ``{"value", "low", "high"}`` (95 %). ``y_*``: (n,) 0/1 correctness of each
    pass's answers; ``secl``, ``verbal``: (n,) confidences in [0, 1]."""
    from hf_calibration.metrics import brier_score, confidence_auroc, expected_calibration_error, paired_bootstrap

    y_secl, y_verbal = np.asarray(y_secl).astype(int), np.asarray(y_verbal).astype(int)
    options = dict(n_resamples=n_resamples, seed=seed)

    def entry(metric, a, b, y_b=y_verbal, **kwargs):
        value, low, high = paired_bootstrap(metric, y_secl, a, y_b, b, metric_kwargs=kwargs or None, **options)
        return {"value": value, "low": low, "high": high}

    return {
        "delta_ece": entry(expected_calibration_error, secl, verbal, n_bins=n_bins, binning=binning, norm=norm),
        "delta_auroc": entry(confidence_auroc, secl, verbal),
        "delta_brier": entry(brier_score, secl, verbal),
        "delta_brier_vs_constant": entry(brier_score, secl, np.full(len(secl), y_secl.mean()), y_b=y_secl),
    }


# The paper's claims (Hedna et al. 2026) where the generation–discrimination gap exists, and the budget.
ECE_CUT = 0.56
TRAINED_SHARE = (0.06, 0.26)
PASS_BUDGET = 4.6


def claim_check(domain: dict, key: str = "secl") -> list[tuple[str, bool | None, str]]:
    """The paper's claims on one domain's summary (``summarize_stream``) for the SECL pass ``key``: a list of
    (claim, held, evidence). held is True/False, or None when the interval does not decide. Rules: ECE at least
    56 % below verbalized (point estimate, and the paired ΔECE interval below 0); within-domain AUROC not below
    verbalized (held unless the paired ΔAUROC interval lies below 0); Brier below the constant-accuracy Brier
    (paired interval below 0: held; above 0: not; else undecided) — for the overall summary of several domains
    all three read ``within_domain_difference`` (the ECE cut is then −ΔECE over the verbalized ECE, both
    n-weighted means over the domains), not the pooled ECE and AUROC and the one pooled constant; accuracy unchanged
    (the pass's answers against the baseline's); 6–26 % of the questions trained; at most 4.6 forward passes per
    question."""
    s = domain["signals"]
    shares = domain if key == "secl" else domain[key]
    p = shares["paired"]
    # over a stream of several domains: the within-domain differences (within_domain_difference); a summary
    # written before the ECE one existed keeps the pooled ECE
    within = WITHIN_DOMAIN["auroc"] in p
    within_ece = WITHIN_DOMAIN["ece"] in p
    if within_ece:
        d_ece = p[WITHIN_DOMAIN["ece"]]
        verb = d_ece["baseline"]
        cut = -d_ece["value"] / verb if verb > 0 else float("nan")
    else:
        verb, ece = s["verbalized"]["conf_ece"]["value"], s[key]["conf_ece"]["value"]
        cut = (verb - ece) / verb if verb > 0 else float("nan")
        d_ece = p["delta_ece"]
    d_auc = p[WITHIN_DOMAIN["auroc"]] if within else p["delta_auroc"]
    d_brier = p[WITHIN_DOMAIN["brier_vs_constant"]] if within else p["delta_brier_vs_constant"]

    def interval(d):
        return f"{d['value']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"

    def decided(d):  # below 0 → True, above 0 → False, else None
        return True if d["high"] < 0 else False if d["low"] > 0 else None

    ece_held = bool(cut >= ECE_CUT and d_ece["high"] < 0) if np.isfinite(cut) else None
    if ece_held is False and d_ece["low"] <= 0 <= d_ece["high"] and cut >= ECE_CUT:
        ece_held = None
    auc_held = None if not np.isfinite(d_auc["value"]) else d_auc["high"] >= 0
    passes = s[key]["forward_passes"]
    trained = shares["share_trained"]
    change = shares["accuracy_change_secl"]
    return [
        ("ECE ≥ 56 % below verbalized", ece_held,
         f"cut {cut:+.0%}; " + ("within-domain ΔECE (mean over domains) " if within_ece else "paired ΔECE ")
         + interval(d_ece)),
        ("AUROC not below verbalized", auc_held,
         f"{'within-domain ΔAUROC (mean over domains)' if within else 'paired ΔAUROC'} {interval(d_auc)}"),
        ("Brier below the constant-accuracy Brier", decided(d_brier),
         f"{'within-domain ΔBrier vs each domain constant (mean over domains)' if within else 'paired ΔBrier'} "
         f"{interval(d_brier)}"),
        ("accuracy unchanged", change == 0.0, f"change {change:+.3f}"),
        ("6–26 % of the questions trained", TRAINED_SHARE[0] <= trained <= TRAINED_SHARE[1], f"{trained:.1%}"),
        ("≤ 4.6 forward passes per question", passes <= PASS_BUDGET, f"{passes:.2f}"),
    ]


STREAM_COLUMNS = (
    ("accuracy", "acc"), ("mean_confidence", "conf"), ("conf_ece", "ECE"), ("brier", "Brier"),
    ("auroc", "AUROC"), ("forward_passes", "passes/q"),
)


def format_stream_summary(summary: dict) -> str:
    from hf_calibration.reports import format_table

    def shares(name, p):
        return (f"{name}: in burst {p['share_in_burst']:.0%}, trained on {p['share_trained']:.0%}, bin-gate skips "
                f"{p['skipped_by_bin_gate']}, alarms {p['alarms']}, accuracy change {p['accuracy_change_secl']:+.3f}")

    blocks = []
    for domain, s in summary.items():
        rows = {SIGNAL_NAMES[k]: v for k, v in s["signals"].items()}
        rows.update({f"ref: {k}": v for k, v in s["references"].items()})
        passes = ([shares("SECL", s)] if "share_in_burst" in s else []) + [
            shares(SIGNAL_NAMES[k], s[k]) for k in s["signals"] if k.startswith("secl_")]
        header = "; ".join([f"[{domain}] n={s['n']}", *passes])
        blocks.append(header + "\n" + format_table(rows, columns=STREAM_COLUMNS))
    return "\n\n".join(blocks)
