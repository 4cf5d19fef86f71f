"""The SECL stream evaluation protocol: a labelled stream of questions from several domains run through SECL, with
the baselines on the same answers, and its summary (docs/methods.md, "SECL"; docs/secl_results.md for the
measurements). It drives a ``SECLModel`` (``hf_calibration.secl``) from above; nothing in ``secl`` imports it.

Two passes over the same stream with the same model:

1. **baseline pass** (``baseline_pass``; ``secl_update=False``, identity adapter): the answer, its
   verbalized confidence, P(True) of the answer, P(True)Norm over the answer and its distractors (MCQA: the
   other options, each shown as "B. <option text>"; open-ended: beam-search alternatives) and the
   DINCO-style score (``confidence.dinco_score`` with the answer's length-normalised sequence probability as
   the self-consistency term); ``p_true_options`` keeps P(True) of the answer, then of each distractor, so
   P(True)Norm can be recomputed at another τ_n (``examples/secl_target_study.py``);
2. **SECL pass** (``secl_pass``; adapter, gate and counters reset first): the same prompts through
   ``generate`` with SECL on; the SECL confidence of a question is the confidence ``generate`` returns for it:
   the verbalized read before the update it may trigger, with the adapter that earlier questions produced
   (in a burst with ``burst_confidence`` "teacher": c*; the read stays in ``secl_verbalized``). Its fields
   are ``secl``, ``secl_answer``, ``burst``, … A second SECL pass with the other
   adapter scope (``SECLConfig.adapter_scope``) writes the same fields under ``secl_<scope>``
   (``secl_field``), so one stream can report both.

Each pass takes where to resume (``start``: what an earlier run of it finished) and a callback per finished
question (``on_record``); what keeps them between runs is the stream job's business (``jobs.stream_checkpoint``),
not this module's.

Supervised references (labels): Platt scaling and temperature scaling of the baseline verbalized
confidence, fitted by 2-fold cross-fitting over the stream (each half calibrated by a fit on the other).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hf_calibration.metrics.paired import paired_differences, paired_strata_difference
from hf_calibration.modeling.streams import StreamItem, judge
from hf_calibration.modeling.signals import SIGNAL_NAMES
from hf_calibration.secl.step import answer_length


def _generate(model, item: StreamItem, *, max_new_tokens: int, update: bool) -> dict:
    ids = torch.tensor([item.prompt_ids], device=next(model.parameters()).device)
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
        return_dict_in_generate=True, output_scores=True, secl_choices=[item.choices], secl_update=update,
        pad_token_id=model.secl_tokenizer.pad_token_id,
    )
    record = model.secl_records[0].to_dict()
    answer = out.sequences[0, len(item.prompt_ids):].tolist()
    length = answer_length(answer, model.secl_stop_ids())
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


# A pass's per-question callback (``on_record``): the question's index in the stream and what the pass made of it.
OnRecord = Callable[[int, Any], None]


def baseline_pass(model, items: list, *, max_new_tokens: int = 8, progress: bool = True,
                  start: Sequence[dict] = (), on_record: OnRecord | None = None) -> list[dict]:
    """The baseline pass (module docstring) with the identity adapter: one record per item.

    start : the records of the first ``len(start)`` items, from an earlier run of this pass (taken as they are; the
        pass goes on at the next item); at most ``len(items)``, else ValueError.
    on_record : called as ``on_record(i, record)`` once item ``i`` is done (not for those of ``start``), e.g. to
        keep it, so a run that stops can resume at its next item (``jobs.stream_checkpoint``)."""
    from tqdm.auto import tqdm

    from hf_calibration.secl.confidence import dinco_score

    records = _started(start, items)
    model.reset_calibration()
    for i, item in enumerate(tqdm(items[len(records):], desc="baseline pass", disable=not progress, unit="q",
                                  initial=len(records), total=len(items)), start=len(records)):
        begin = time.perf_counter()
        r = _generate(model, item, max_new_tokens=max_new_tokens, update=False)
        # the P(True) reads continue generate's prompt cache (identity adapter: the teacher's weights), so the
        # prompt runs once per question, not twice
        label = model.secl_pseudo_label(item.prompt_ids, r["answer_ids"], choices=item.choices,
                                        prompt_cache=r.pop("cache"))
        parsed, correct = judge(item, r["text"])
        gen_passes = r["forward_passes"]  # generation + verbalized reads
        records.append({
            "domain": item.domain, "n_options": item.n_options, "answer": r["text"], "answer_ids": r["answer_ids"],
            "parsed": parsed, "correct": bool(correct),
            "verbalized": r["confidence"], "verbalized_greedy": r["verbalized_greedy"], "entropy": r["entropy"],
            "p_true": float(label["p_true"][0]), "norm_p_true": label["norm_p_true"],
            "p_true_options": [float(v) for v in label["p_true"]],
            "dinco": float(dinco_score(label["p_true"][None], np.array([0]), np.array([r["consistency"]]))[0]),
            "n_distractors": label["n_distractors"],
            "passes": {"verbalized": gen_passes, "p_true": 2,
                       "norm_p_true": 1 + label["forward_passes"], "dinco": 1 + label["forward_passes"]},
            "baseline_seconds": time.perf_counter() - begin,
        })
        if on_record is not None:
            on_record(i, records[-1])
    return records


def _started(start: Sequence, items: list) -> list:
    """``start`` as a new list; ValueError when it covers more items than there are."""
    if len(start) > len(items):
        raise ValueError(f"start: covers {len(start)} items, more than the {len(items)} of the stream")
    return list(start)


@dataclass(frozen=True)
class SECLResume:
    """Where a SECL pass resumes (``secl_pass(start=...)``).

    done : what the pass added for each of the stream's first ``len(done)`` questions, as its ``on_record`` got it:
        ``{"fields": {record field: value}, "passes": forward passes}``.
    snapshot : the model's ``secl_snapshot()`` right after the last of them (adapter weights and SECL state:
        gate, open burst, counters, replay buffer, optimizer), put back with ``load_secl_snapshot``.
    """

    done: Sequence[dict]
    snapshot: dict


# A SECL pass's fields; those of the pass with the model's own adapter scope keep the names they always had.
SECL_PASS_FIELDS = ("answer", "answer_ids", "correct", "verbalized", "confidence_after", "alarm", "burst",
                    "updated", "skipped_by_bin_gate", "p_true", "norm_p_true", "target", "seconds")
_UNPREFIXED = ("alarm", "burst", "updated", "skipped_by_bin_gate", "target")


def secl_key(scope: str | None, own_scope: str) -> str:
    """The record key of a SECL pass: "secl" for the model's own adapter scope (or None), "secl_<scope>" else."""
    return "secl" if scope in (None, own_scope) else f"secl_{scope}"


def secl_field(key: str, name: str) -> str:
    """The record field ``name`` (one of ``SECL_PASS_FIELDS``) of the SECL pass ``key``: "secl_answer", "burst",
    "secl_all_answer", "secl_all_burst", …"""
    return name if key == "secl" and name in _UNPREFIXED else f"{key}_{name}"


def secl_pass(model, items: list, records: list[dict], *, scope: str | None = None, max_new_tokens: int = 8,
              burst_at_start: bool = False, progress: bool = True, start: SECLResume | None = None,
              on_record: OnRecord | None = None) -> dict:
    """One SECL pass over ``items`` (module docstring), from the identity adapter with a fresh gate and counters;
    adds its fields to ``records`` (from ``baseline_pass``) and returns its counters.

    scope : the pass's ``SECLConfig.adapter_scope``; None → the model's own. The fields are named by
    ``secl_key`` / ``secl_field``. The model keeps its own config afterwards; its adapter, gate and counters are
    this pass's.
    start : resume an earlier run of this pass (``SECLResume``): its questions' fields are put into ``records``, its
    snapshot into the model, and the pass goes on at the next question (no burst opened at the start then).
    on_record : called as ``on_record(i, {"fields": …, "passes": …})`` once question ``i`` is done (not for those of
    ``start``), while the model holds the pass's state after it: ``model.secl_snapshot()`` there and the ``done`` so
    far make the ``SECLResume`` of questions 0..i (``jobs.stream_checkpoint`` keeps them).
    """
    from tqdm.auto import tqdm

    key = secl_key(scope, model.secl_config.adapter_scope)
    done = _started(start.done if start is not None else (), items)
    with model.secl_scope(scope):
        model.reset_calibration(counters=True)
        if done:
            model.load_secl_snapshot(start.snapshot)
        for rec, kept in zip(records, done):
            rec.update(kept["fields"])
            rec["passes"][key] = kept["passes"]
        if burst_at_start and not done:
            model.start_burst()
        for i, (item, rec) in enumerate(zip(
                tqdm(items[len(done):], desc=f"SECL pass ({model.secl_config.adapter_scope})", disable=not progress,
                     unit="q", initial=len(done), total=len(items)), records[len(done):]), start=len(done)):
            begin = time.perf_counter()
            r = _generate(model, item, max_new_tokens=max_new_tokens, update=True)
            parsed, correct = judge(item, r["text"])
            values = {"answer": r["text"], "answer_ids": r["answer_ids"], "correct": bool(correct),
                      "verbalized": r["verbalized"], "confidence_after": r["confidence_after"],
                      "alarm": r["alarm"], "burst": r["in_burst"], "updated": r["updated"],
                      "skipped_by_bin_gate": r["skipped_by_bin_gate"], "p_true": r["p_true"],
                      "norm_p_true": r["norm_p_true"], "target": r["target"], "seconds": time.perf_counter() - begin}
            fields = {key: r["confidence"], **{secl_field(key, name): values[name] for name in SECL_PASS_FIELDS}}
            rec.update(fields)
            rec["passes"][key] = r["forward_passes"]
            if on_record is not None:
                on_record(i, {"fields": fields, "passes": r["forward_passes"]})
    return dict(model.secl_counters)


def final_adapter_pass(model, items: list, records: list[dict], *, key: str = "secl", progress: bool = True,
                       start: Sequence[float] = (), on_record: OnRecord | None = None) -> None:
    """Every question's verbalized confidence read again with the adapter the SECL pass ``key`` ended with (after
    its last burst), as field ``key + FINAL_SUFFIX`` ("secl_final"): what the calibrated model says about the same
    answers once the stream has trained it, where the pass's own ``key`` confidence is read with the adapter the
    earlier questions had produced. Run it right after ``secl_pass`` (the model still holds that pass's adapter and
    config); each read is one forward pass over the follow-up turn (two when "10" is two tokens) on the cache of
    prompt and answer, the adapter off for that cache in the "confidence" scope, no update.

    start : the reads of the first ``len(start)`` questions, made earlier with this same adapter (taken as they
        are). on_record : called as ``on_record(i, confidence)`` after each new read (not for those of ``start``)."""
    from tqdm.auto import tqdm

    kept = _started(start, items)
    with model.secl_scope(None if key == "secl" else key.removeprefix("secl_")), torch.no_grad():
        for i, (item, rec) in enumerate(zip(tqdm(items, desc="final-adapter reads", disable=not progress, unit="q"),
                                            records)):
            if i < len(kept):
                rec[key + FINAL_SUFFIX] = float(kept[i])
                continue
            answer = rec[secl_field(key, "answer_ids")]
            conf, _, _ = model.secl_verbalized(item.prompt_ids, answer,
                                               restated=model.secl_restated(answer, item.choices))
            rec[key + FINAL_SUFFIX] = float(conf[0])
            if on_record is not None:
                on_record(i, rec[key + FINAL_SUFFIX])


def cross_fit(conf: np.ndarray, correct: np.ndarray, method: str, seed: int) -> np.ndarray:
    """2-fold cross-fitted Platt (``method`` "platt") or temperature scaling (else) of a binary confidence ``conf``
    (n,) in [0, 1] against ``correct`` (n,) bool: each half calibrated by a fit on the other (folds drawn with
    ``seed``). Returns (n,) calibrated confidences."""
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
# the row of a SECL pass's final-adapter reads (``final_adapter_pass``): "secl_final", "secl_all_final"
FINAL_SUFFIX = "_final"
BASELINE_ROWS = ("verbalized", "p_true", "norm_p_true", "dinco", "platt", "temperature")


def pass_keys(signals) -> list[str]:
    """The SECL passes among the row names ``signals``: "secl" and "secl_<scope>", not their final-adapter rows."""
    return [s for s in signals if (s == "secl" or s.startswith("secl_")) and not s.endswith(FINAL_SUFFIX)]


def signal_rows(secl_keys: tuple = ("secl",)) -> tuple:
    """``SIGNAL_ROWS`` with the rows of these SECL passes (``secl_key``) where "secl" stands."""
    i = SIGNAL_ROWS.index("secl")
    return SIGNAL_ROWS[:i] + tuple(secl_keys) + SIGNAL_ROWS[i + 1:]


def calibrated_null(correct, conf, *, n_resamples: int, seed: int, **ece_options) -> dict:
    """``{"ece_if_calibrated": {value, low, high}, "p_calibrated": p}``: the ECE (with ``ece_options``) that
    ``conf`` shows when perfectly calibrated, its mean and 95 % range over ``n_resamples`` label draws, and the
    one-sided p-value of "calibrated" for the labels ``correct`` (``metrics.consistency_resampling``)."""
    from hf_calibration.metrics import consistency_resampling, expected_calibration_error

    null = consistency_resampling(expected_calibration_error, conf, correct, n_resamples=n_resamples, seed=seed,
                                  metric_kwargs=ece_options)
    return {"ece_if_calibrated": {"value": null.null_mean, "low": null.low, "high": null.high},
            "p_calibrated": null.p_value}


def summarize_stream(records: list[dict], *, n_resamples: int = 1000, seed: int = 0,
                     signals: tuple = SIGNAL_ROWS, n_bins: int = 15, binning: str = "uniform", norm: str = "l1") -> dict:
    """Per domain and overall: a calibration report per signal (+ passes/q), the references, SECL shares.

    signals : which rows to report; ``BASELINE_ROWS`` for records of ``run_stream(baseline_only=True)``; a second
        SECL pass's key (``secl_key``, e.g. "secl_all") adds its row; "secl_final" the reads of
        ``final_adapter_pass`` (scored against that pass's answers; its passes/q are what such a read costs).
        Each SECL row is scored against its own pass's answers. The shares of the "secl" pass (in burst, trained, bin-gate skips, alarms, accuracy
        change) sit beside "signals"; another pass's under its key.
    n_bins, binning, norm : the binned metrics' options (``calibration_report``), references included.

    Each signal's report also holds :func:`calibrated_null`'s ``ece_if_calibrated`` and ``p_calibrated``: at small
    n a lower ECE can be a narrower read, not a better calibrated one (docs/methods.md, "Consistency resampling").

    Each SECL pass's ``paired`` holds ``paired_differences`` against the verbalized confidence; with several
    domains, the overall one also holds the within-domain differences of ``within_domain_difference``
    (``WITHIN_DOMAIN``'s keys): a confidence's value within each domain, free of the level shift between
    domains that the pooled differences reward.
    """
    from hf_calibration.metrics import calibration_report
    from hf_calibration.reporting.reports import references

    secl_keys = pass_keys(signals)
    correct_all = np.array([r["correct"] for r in records], dtype=int)
    verbal_all = np.array([r["verbalized"] for r in records])
    platt = cross_fit(verbal_all, correct_all, "platt", seed)
    temp = cross_fit(verbal_all, correct_all, "temperature", seed)
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
                yy = y_pass.get(sig.removesuffix(FINAL_SUFFIX), y)  # a final-adapter read: its pass's answers
                passes = np.mean([r["passes"][sig] for r in sub])
            report = calibration_report(yy, conf, n_bins=n_bins, binning=binning, norm=norm, n_resamples=n_resamples,
                                        seed=seed)
            report["forward_passes"] = float(passes)
            report.update(calibrated_null(yy, conf, n_resamples=n_resamples, seed=seed, n_bins=n_bins,
                                          binning=binning, norm=norm))
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
    domains with weights n_domain / n (``metrics.paired_strata_difference``, each domain a stratum resampled on its
    own, the same draw for both terms). → ``{"value", "low", "high", "per_domain": {domain: value}, "baseline"}``,
    ``baseline`` the same weighted mean of the second term alone (the verbalized ECE or AUROC, the constant's
    Brier), so that ``-value / baseline`` is the relative change over the domains.

    metric : "ece": conf-ECE(SECL) − conf-ECE(verbalized) under the ECE options ``n_bins``, ``binning``, ``norm``,
        each against its own pass's answers; "auroc": AUROC(SECL) − AUROC(verbalized), each against its own pass's
        answers; "brier_vs_constant": Brier(SECL) − Brier(constant = the SECL answers' accuracy in that domain), the
        per-domain form of ``paired_differences``' ``delta_brier_vs_constant``.

    Pooled over a stream, each rewards a level shift between domains of different accuracy: lowering every
    confidence on a domain whose answers are mostly wrong raises the pooled AUROC and beats the one pooled
    constant without ranking any answer better within a domain, and the pooled ECE bins answers of different
    domains together. A domain where a term is undefined (AUROC with all answers right or all wrong) is left out of
    the mean (its ``per_domain`` value is NaN); with no domain left, value, interval and baseline are NaN."""
    if metric not in WITHIN_DOMAIN:
        raise ValueError(f"metric: must be one of {sorted(WITHIN_DOMAIN)}, got {metric!r}")
    domains = list(dict.fromkeys(r["domain"] for r in records))
    strata = []
    for d in domains:
        sub = [r for r in records if r["domain"] == d]
        y_secl = np.array([r[secl_field(key, "correct")] for r in sub], dtype=int)
        secl = (y_secl, np.array([r[key] for r in sub], dtype=float))
        if metric == "brier_vs_constant":
            strata.append((secl, (y_secl, np.full(len(sub), y_secl.mean()))))
        else:
            strata.append((secl, (np.array([r["correct"] for r in sub], dtype=int),
                                  np.array([r["verbalized"] for r in sub], dtype=float))))
    d = paired_strata_difference(strata, metric={"ece": "conf_ece", "auroc": "auroc"}.get(metric, "brier"),
                                 weights="size", n_resamples=n_resamples, seed=seed, n_bins=n_bins, binning=binning,
                                 norm=norm)
    return {"value": d["value"], "low": d["low"], "high": d["high"],
            "per_domain": dict(zip(domains, d["per_stratum"])), "baseline": d["baseline"]}


STREAM_COLUMNS = (
    ("accuracy", "acc"), ("mean_confidence", "conf"), ("conf_ece", "ECE"), ("brier", "Brier"),
    ("auroc", "AUROC"), ("forward_passes", "passes/q"), ("ece_if_calibrated", "ECE if calibrated"),
    ("p_calibrated", "p calibrated"),
)


def format_stream_summary(summary: dict) -> str:
    from hf_calibration.reporting.reports import format_table

    def shares(name, p):
        return (f"{name}: in burst {p['share_in_burst']:.0%}, trained on {p['share_trained']:.0%}, bin-gate skips "
                f"{p['skipped_by_bin_gate']}, alarms {p['alarms']}, accuracy change {p['accuracy_change_secl']:+.3f}")

    blocks = []
    for domain, s in summary.items():
        rows = {SIGNAL_NAMES[k]: v for k, v in s["signals"].items()}
        rows.update({f"ref: {k}": v for k, v in s["references"].items()})
        passes = ([shares("SECL", s)] if "share_in_burst" in s else []) + [
            shares(SIGNAL_NAMES[k], s[k]) for k in pass_keys(s["signals"]) if k != "secl"]
        header = "; ".join([f"[{domain}] n={s['n']}", *passes])
        blocks.append(header + "\n" + format_table(rows, columns=STREAM_COLUMNS))
    return "\n\n".join(blocks)
