"""What would SECL's stream score if the confidence returned inside a burst were the teacher's c*
(``SECLConfig.burst_confidence`` "teacher") instead of the student's verbalized read? Read from a finished run.

    python -m experiments.secl_burst_confidence outputs/secl_smollm2_4domains_onestep_text/records.jsonl
    python -m experiments.secl_burst_confidence outputs/secl_schedule_qwen --schedules option_text

The option changes what is returned, nothing that is learnt (tests/secl/test_burst_confidence.py: the same adapter,
gate decisions and targets), so one pass gives both streams exactly: the read (``secl_verbalized``, or ``secl`` in a
run made with the default) and the read with c* in its place on the burst's questions. c* comes from the pass's own
records (``secl_norm_p_true``) for ``hf-calibration secl``; for a ``secl_schedule`` folder from the baseline pass's
P(True) of every option at the schedule's τ_n (``p_true_options``: the teacher a "confidence"-scope pass reads, the
adapter off, on the same answers; schedules whose answers differ from the baseline's are left out).

Per domain (``--schedules``: per seed and schedule) the AUROC, ECE (15 equal-width bins) and Brier with 95 %
bootstrap intervals of: the verbalized baseline, the SECL read, the SECL read with c* in the burst, c* itself (every
question) and the constant-accuracy reference; then, within domains (``evaluation.stream.within_domain_difference``'s
weighting, stratified paired bootstrap), c*-in-burst − read for AUROC, ECE and Brier. Prints the report and writes
it, with the numbers as JSON, beside the input (``--output``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from experiments.secl_learnability import format_interval as _ci, metric_row as _metric_row
from experiments.secl_learnability import paired_difference as _paired
from experiments.secl_learnability import read_results as _read, teacher_targets as _teacher_targets

SIGNALS = ("verbalized", "secl_read", "secl_teacher_in_burst", "teacher", "constant")
NAMES = {"verbalized": "verbalized (baseline)", "secl_read": "SECL, the read (burst_confidence 'verbalized')",
         "secl_teacher_in_burst": "SECL, c* in the burst (burst_confidence 'teacher')",
         "teacher": "c* = P(True)Norm (every question)", "constant": "constant accuracy"}
DELTAS = {"auroc": "auroc", "ece": "conf_ece", "brier": "brier"}


def _group(y, y_baseline, burst, verbalized, read, c_star, teacher) -> dict:
    """One group's arrays; "secl_teacher_in_burst" is the read with c* in its place on the burst's questions."""
    burst = np.asarray(burst, dtype=bool)
    read = np.asarray(read, dtype=float)
    return {"y": np.asarray(y, dtype=int), "y_baseline": np.asarray(y_baseline, dtype=int), "burst": burst,
            "verbalized": np.asarray(verbalized, dtype=float), "secl_read": read,
            "secl_teacher_in_burst": np.where(burst, np.asarray(c_star, dtype=float), read),
            "teacher": np.asarray(teacher, dtype=float)}


def stream_rows(records: list[dict]) -> dict:
    """``hf-calibration secl`` records → {domain: {"y", "burst", signal: values}}; SECL's signals against SECL's
    answers (``secl_correct``), the verbalized baseline and c* of every question against the baseline's."""
    out = {}
    for domain in dict.fromkeys(r["domain"] for r in records):
        rs = [r for r in records if r["domain"] == domain]
        out[domain] = _group([r["secl_correct"] for r in rs], [r["correct"] for r in rs], [r["burst"] for r in rs],
                             [r["verbalized"] for r in rs], [r.get("secl_verbalized", r["secl"]) for r in rs],
                             [r["secl_norm_p_true"] if r["burst"] else np.nan for r in rs],
                             [r["norm_p_true"] for r in rs])
    return out


def schedule_rows(folder: Path, schedules: list[str] | None = None) -> dict:
    """A ``secl_schedule`` folder → {"seed <s>, <schedule>": rows as ``stream_rows``'s}, c* recomputed at each
    schedule's τ_n from the baseline's ``p_true_options`` (``secl_learnability.teacher_targets``); schedules whose
    answers differ from the baseline's are left out (their teacher is not the baseline's)."""
    baselines, out = {}, {}
    for r in _read(folder / "results.jsonl"):
        if (schedules and r["schedule"] not in schedules) or r.get("answers_differing_from_baseline", 0):
            continue
        if r["seed"] not in baselines:
            baselines[r["seed"]] = _read(folder / f"baseline_seed{r['seed']}.jsonl")
        base = baselines[r["seed"]]
        c_star = _teacher_targets(base, range(len(base)), r["config"]["tau_n"])
        y = [b["correct"] for b in base]
        out[f"seed {r['seed']}, {r['schedule']}"] = _group(y, y, r["rows"]["burst"], [b["verbalized"] for b in base],
                                                          r["rows"]["secl"], c_star, c_star)
    return out


def summarize(groups: dict, *, n_resamples: int = 1000, seed: int = 0) -> dict:
    """Per group the metric rows of ``SIGNALS``, the share of questions in the burst, the paired differences
    c*-in-burst − read (``delta_<metric>``, ``DELTAS``' names) and each one's Brier − the constant's
    (``<signal>_brier_minus_constant``); over the groups (as strata,
    weighted by size) the paired differences c*-in-burst − read of ``DELTAS``, and the ECE of the read and of
    c*-in-burst − the verbalized baseline's (``relative``: that difference over the verbalized ECE; −0.56 is issue
    30's cut)."""
    from hf_calibration.metrics import brier_score, paired_strata_difference

    kw = dict(n_resamples=n_resamples, seed=seed)
    per = {}
    for name, g in groups.items():
        acc = float(g["y"].mean())
        per[name] = {"n": len(g["y"]), "accuracy": acc, "in_burst": float(g["burst"].mean())}
        for s in SIGNALS:
            y = g["y_baseline"] if s in ("verbalized", "teacher") else g["y"]
            per[name][s] = _metric_row(y, np.full(len(y), acc) if s == "constant" else g[s], **kw)
        for s in ("secl_read", "secl_teacher_in_burst"):
            per[name][f"{s}_brier_minus_constant"] = _paired(brier_score, g["y"], g[s], np.full(len(g["y"]), acc),
                                                             **kw)
    paired = {}
    strata = [((g["y"], g["secl_teacher_in_burst"]), (g["y"], g["secl_read"])) for g in groups.values()]
    for label, metric in DELTAS.items():
        d = paired_strata_difference(strata, metric=metric, weights="size", **kw)
        paired[label] = {k: d[k] for k in ("value", "low", "high")}
        for name, stratum in zip(groups, strata):  # each group on its own
            d = paired_strata_difference([stratum], metric=metric, **kw)
            per[name][f"delta_{label}"] = {k: d[k] for k in ("value", "low", "high")}
    for s in ("secl_read", "secl_teacher_in_burst"):
        strata = [((g["y"], g[s]), (g["y_baseline"], g["verbalized"])) for g in groups.values()]
        d = paired_strata_difference(strata, metric="conf_ece", weights="size", **kw)
        paired[f"ece_{s}_minus_verbalized"] = {k: d[k] for k in ("value", "low", "high")} | {
            "relative": d["value"] / d["baseline"] if d["baseline"] else float("nan")}
    return {"groups": per, "within": paired}


def format_report(summary: dict, source: str) -> str:
    lines = [f"# The confidence returned in a burst: {source}", "",
             "| group | n | acc | in burst | signal | AUROC | ECE | Brier |", "|---|---|---|---|---|---|---|---|"]
    for name, g in summary["groups"].items():
        for s in SIGNALS:
            lines.append(f"| {name} | {g['n']} | {g['accuracy']:.3f} | {g['in_burst']:.0%} | {NAMES[s]} | "
                         f"{_ci(g[s]['auroc'])} | {_ci(g[s]['conf_ece'])} | {_ci(g[s]['brier'])} |")
    lines += ["", "c* in the burst − the read, paired, per group:", "",
              "| group | ΔAUROC | ΔECE | ΔBrier | Brier − const.: the read | Brier − const.: c* in the burst |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {name} | " + " | ".join([_ci(g[f"delta_{k}"]) for k in DELTAS] + [
        _ci(g[f"{s}_brier_minus_constant"]) for s in ("secl_read", "secl_teacher_in_burst")]) + " |"
              for name, g in summary["groups"].items()]
    w = summary["within"]
    lines += ["", "Over the groups (strata weighted by size, paired): c* in the burst − the read: "
              + ", ".join(f"Δ{k.upper() if k != 'brier' else 'Brier'} {_ci(w[k])}" for k in DELTAS) + "."]
    for s in ("secl_read", "secl_teacher_in_burst"):
        d = w[f"ece_{s}_minus_verbalized"]
        lines.append(f"ECE {NAMES[s]} − verbalized: {_ci(d)} ({d['relative']:+.0%} of the verbalized ECE).")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    from hf_calibration.cli import script_parser
    from hf_calibration.reporting.reports import write_json

    ap = script_parser("python -m experiments.secl_burst_confidence", __doc__.split("\n\n")[0])
    ap.add_argument("source", type=Path, help="records.jsonl of hf-calibration secl, or a secl_schedule folder")
    ap.add_argument("--schedules", type=lambda s: [x for x in s.split(",") if x], default=None,
                    help="for a secl_schedule folder: the schedules to read (default: all)")
    ap.add_argument("--n-resamples", type=int, default=1000)
    ap.add_argument("--output", type=Path, default=None,
                    help="report path (default: burst_confidence.md beside the records or in the folder)")
    args = ap.parse_args(argv)
    if not args.source.exists():
        ap.error(f"source: {str(args.source)!r} does not exist")
    if args.source.is_dir():
        if not (args.source / "results.jsonl").exists():
            ap.error(f"source: {str(args.source)!r} has no results.jsonl (not a secl_schedule folder)")
        groups = schedule_rows(args.source, args.schedules)
    else:
        groups = stream_rows(_read(args.source))
    if not groups:
        ap.error(f"source: nothing to read in {str(args.source)!r}"
                 + (f" for --schedules {','.join(args.schedules)}" if args.schedules else ""))
    summary = summarize(groups, n_resamples=args.n_resamples)
    report = format_report(summary, str(args.source))
    out = args.output or (args.source if args.source.is_dir() else args.source.parent) / "burst_confidence.md"
    out.write_text(report, encoding="utf-8")
    write_json(out.with_suffix(".json"), summary)
    print(report)
    return summary


if __name__ == "__main__":
    main()
