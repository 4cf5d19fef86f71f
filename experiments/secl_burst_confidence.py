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
question) and the constant-accuracy reference; then, within domains (``secl.stream.within_domain_difference``'s
weighting, stratified paired bootstrap), c*-in-burst − read for AUROC, ECE and Brier. Prints the report and writes
it, with the numbers as JSON, beside the input (``--output``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from experiments.secl_learnability import format_interval as _ci, metric_row as _metric_row
from experiments.secl_learnability import paired_difference as _paired
from experiments.secl_learnability import read_results as _read

SIGNALS = ("verbalized", "secl_read", "secl_teacher_in_burst", "teacher", "constant")
NAMES = {"verbalized": "verbalized (baseline)", "secl_read": "SECL, the read (burst_confidence 'verbalized')",
         "secl_teacher_in_burst": "SECL, c* in the burst (burst_confidence 'teacher')",
         "teacher": "c* = P(True)Norm (every question)", "constant": "constant accuracy"}
DELTAS = {"auroc": "auroc", "ece": "conf_ece", "brier": "brier"}


def stream_rows(records: list[dict]) -> dict:
    """``hf-calibration secl`` records → {domain: {"y", "burst", signal: values}}; SECL's signals against SECL's
    answers (``secl_correct``), the verbalized baseline and c* of every question against the baseline's."""
    out = {}
    for domain in dict.fromkeys(r["domain"] for r in records):
        rs = [r for r in records if r["domain"] == domain]
        read = np.array([r.get("secl_verbalized", r["secl"]) for r in rs], dtype=float)
        burst = np.array([bool(r["burst"]) for r in rs])
        c_star = np.array([r["secl_norm_p_true"] if b else np.nan for r, b in zip(rs, burst)], dtype=float)
        out[domain] = {"y": np.array([r["secl_correct"] for r in rs], dtype=int),
                       "y_baseline": np.array([r["correct"] for r in rs], dtype=int), "burst": burst,
                       "verbalized": np.array([r["verbalized"] for r in rs], dtype=float), "secl_read": read,
                       "secl_teacher_in_burst": np.where(burst, c_star, read),
                       "teacher": np.array([r["norm_p_true"] for r in rs], dtype=float)}
    return out


def schedule_rows(folder: Path, schedules: list[str] | None = None) -> dict:
    """A ``secl_schedule`` folder → {"seed <s>, <schedule>": rows as ``stream_rows``'s}, c* recomputed at each
    schedule's τ_n from the baseline's ``p_true_options``; schedules whose answers differ from the baseline's are
    left out (their teacher is not the baseline's)."""
    from hf_calibration.secl.confidence import norm_p_true

    out = {}
    for r in _read(folder / "results.jsonl"):
        if (schedules and r["schedule"] not in schedules) or r.get("answers_differing_from_baseline", 0):
            continue
        base = _read(folder / f"baseline_seed{r['seed']}.jsonl")
        width = max(len(b["p_true_options"]) for b in base)
        pt = np.array([b["p_true_options"] + [np.nan] * (width - len(b["p_true_options"])) for b in base])
        c_star = norm_p_true(pt, tau=r["config"]["tau_n"])[:, 0]
        burst = np.array(r["rows"]["burst"], dtype=bool)
        read = np.array(r["rows"]["secl"], dtype=float)
        y = np.array([b["correct"] for b in base], dtype=int)
        out[f"seed {r['seed']}, {r['schedule']}"] = {
            "y": y, "y_baseline": y, "burst": burst, "verbalized": np.array([b["verbalized"] for b in base]),
            "secl_read": read, "secl_teacher_in_burst": np.where(burst, c_star, read), "teacher": c_star}
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
    for label, metric in DELTAS.items():
        strata = [((g["y"], g["secl_teacher_in_burst"]), (g["y"], g["secl_read"])) for g in groups.values()]
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


def _jsonable(x):
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    return float(x) if isinstance(x, (np.floating, float)) else x


def main(argv=None) -> dict:
    from hf_calibration.cli import script_parser

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
    out.with_suffix(".json").write_text(json.dumps(_jsonable(summary), indent=1) + "\n", encoding="utf-8")
    print(report)
    return summary


if __name__ == "__main__":
    main()
