"""The decisive SECL comparison from a baseline pass's reads and, where they exist, the SECL stream job's records
(issue 51 item 2; the rule: docs/secl_results.md, section "The decisive comparison: does SECL beat using its
teacher directly?").

    python -m experiments.secl_decisive outputs/secl_drift_signals/reads.jsonl [--output report.json]
    python -m experiments.secl_decisive --run READS RECORDS [--run READS RECORDS …] [--output report.json]

With ``--run`` (one pair per seed: the reads of ``experiments.secl_drift_signals`` and the ``records.jsonl`` of
``hf-calibration secl`` on the same stream and seed, without ``--burst-at-start``) the SECL rows are added: (1) the
confidence SECL returned, (2) the final adapter's read (``secl_final``) on the questions no update step trained on
(never pooled with the others), (b) P(True)Norm on the questions SECL's gate put in a burst and the verbalized read
elsewhere; and the paired within-domain differences row 1 − (a) and row 2 − (a) in AUROC and Brier (strata: domain ×
seed, n-weighted; 95 % stratified bootstrap), with the rule's verdict. The two files are matched question by
question (domain, position within the domain) and must hold the same answers.

Reads one line per question with ``domain``, ``correct``, ``parsed`` (the option letter the answer names, or
null), ``verbalized``, ``norm_p_true``, ``option_probs`` and ``passes`` (``experiments.secl_drift_signals`` writes
them; a stream job's records have all but ``option_probs``). Rows: (a) P(True)Norm directly, (c) the verbalized
read, (d) the probability of the answer's option letter Platt-scaled (``posthoc.PlattScaler``) on a labelled sample
of ``--labelled`` questions drawn uniformly (seed ``--seed``) from the stream, and the constant equal to each
domain's accuracy; every row on the other questions only. Per domain AUROC, ECE (10 equal-width bins), Brier −
the domain constant's Brier, each with a 95 % bootstrap interval, and passes per question. The SECL rows (1, 2)
and row (b) need a SECL pass of the same stream without a forced burst (not read here).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from experiments.common import by_domain_position, read_jsonl
from hf_calibration.modeling.prompts import LETTERS

ROWS = ("norm_p_true", "verbalized", "option_prob_platt")
SECL_ROWS = ("secl", "secl_held_out", "teacher_in_bursts")
# passes per question of the option probability: it is the answer's first generated token's distribution, so the
# generation the answer needs anyway reads it (1 pass, the generation itself)
OPTION_PROB_PASSES = 1


def answer_option_prob(record: dict) -> float:
    """The next-token probability of the option letter the answer names; 0 when it names none (judged wrong)."""
    letter = record.get("parsed")
    if letter is None or letter not in LETTERS or LETTERS.index(letter) >= len(record["option_probs"]):
        return 0.0
    return float(record["option_probs"][LETTERS.index(letter)])


def rows_for(records: list[dict], *, labelled: int, seed: int) -> tuple[dict, np.ndarray]:
    """{row: (n,) confidences on the questions outside the labelled sample}, and those questions' indices."""
    from hf_calibration.posthoc import PlattScaler

    rng = np.random.default_rng(seed)
    fit = np.sort(rng.choice(len(records), size=labelled, replace=False))
    rest = np.setdiff1d(np.arange(len(records)), fit)
    y = np.array([bool(r["correct"]) for r in records])
    opt = np.clip(np.array([answer_option_prob(r) for r in records]), 1e-6, 1 - 1e-6)
    platt = PlattScaler().fit(opt[fit], y[fit].astype(int))
    conf = {"norm_p_true": np.array([r["norm_p_true"] for r in records], dtype=float)[rest],
            "verbalized": np.array([r["verbalized"] for r in records], dtype=float)[rest],
            "option_prob_platt": np.asarray(platt.transform(opt[rest]), dtype=float)}
    return conf, rest


def table(records: list[dict], *, labelled: int, seed: int, n_resamples: int) -> dict:
    from hf_calibration.metrics import calibration_report

    conf, rest = rows_for(records, labelled=labelled, seed=seed)
    kept = [records[i] for i in rest]
    out = {"n_labelled": labelled, "seed": seed, "domains": {}}
    for d in dict.fromkeys(r["domain"] for r in kept):
        idx = np.array([k for k, r in enumerate(kept) if r["domain"] == d])
        y = np.array([int(kept[k]["correct"]) for k in idx])
        acc = float(y.mean())
        row = {"n": int(len(idx)), "accuracy": acc, "constant_brier": acc * (1 - acc)}
        for name in ROWS:
            c = np.clip(conf[name][idx], 0, 1)
            rep = calibration_report(y, c, n_bins=10, n_resamples=n_resamples, seed=seed)
            passes = (OPTION_PROB_PASSES if name == "option_prob_platt"
                      else float(np.mean([kept[k]["passes"][name] for k in idx])))
            row[name] = {"auroc": rep["auroc"], "ece": rep["conf_ece"],
                         "brier_minus_constant": {k: (v - acc * (1 - acc) if k in ("value", "low", "high") else v)
                                                  for k, v in rep["brier"].items()},
                         "passes": passes}
        out["domains"][d] = row
    return out


def _cell(m: dict) -> str:
    return f"{m['value']:.3f} [{m['low']:.3f}, {m['high']:.3f}]"


def format_table(rep: dict) -> str:
    lines = [f"Labelled sample for the calibrator: {rep['n_labelled']} questions (seed {rep['seed']}), left out of "
             "every row. Brier − constant: the interval is the Brier's shifted by the domain constant's.", "",
             "| domain | n | acc | row | AUROC | ECE (constant: 0) | Brier − constant | passes/q |",
             "|---|---|---|---|---|---|---|---|"]
    for d, row in rep["domains"].items():
        for name in ROWS:
            r = row[name]
            lines.append(f"| {d} | {row['n']} | {row['accuracy']:.3f} | {name} | {_cell(r['auroc'])} | "
                         f"{_cell(r['ece'])} | {r['brier_minus_constant']['value']:+.3f} | {r['passes']:.2f} |")
    return "\n".join(lines) + "\n"


def joined(reads: list[dict], records: list[dict]) -> list[dict]:
    """The stream job's records (stream order) with each question's ``option_probs`` and ``parsed`` from the reads
    (matched by domain and position within it). ValueError when a question is missing or its answer differs."""
    by = {(r["domain"], r["index"]): r for r in reads}
    out = []
    for (domain, k), rec in by_domain_position(records).items():  # dicts keep the records' stream order
        read = by.get((domain, k))
        if read is None or read["answer"].strip() != rec["answer"].strip():
            raise ValueError(f"records: question {k} of {domain} has no read with the same answer (reads "
                             f"{None if read is None else read['answer']!r}, records {rec['answer']!r})")
        out.append({**rec, "option_probs": read["option_probs"], "parsed": read["parsed"]})
    return out


def secl_confidences(records: list[dict]) -> dict:
    """{row: ((n,) confidence, (n,) passes, (n,) bool: the questions the row is reported on)} of the SECL rows."""
    n = len(records)
    burst = np.array([bool(r.get("burst")) for r in records])
    trained = np.array([bool(r.get("updated")) for r in records])
    verbal_passes = np.array([r["passes"]["verbalized"] for r in records], dtype=float)
    return {
        "secl": (np.array([r["secl"] for r in records], dtype=float),
                 np.array([r["passes"]["secl"] for r in records], dtype=float), np.ones(n, dtype=bool)),
        # the adapter the stream ended with, read like the verbalized baseline (1 generation + the read, no burst)
        "secl_held_out": (np.array([r["secl_final"] for r in records], dtype=float), verbal_passes, ~trained),
        "teacher_in_bursts": (np.where(burst, [r["norm_p_true"] for r in records], [r["verbalized"] for r in records]),
                              np.where(burst, [r["passes"]["norm_p_true"] for r in records], verbal_passes),
                              np.ones(n, dtype=bool)),
    }


def secl_table(runs: list[list[dict]], *, labelled: int, seed: int, n_resamples: int) -> dict:
    """Per seed and domain the SECL rows (AUROC, ECE, Brier − constant, passes) on the questions outside each run's
    labelled sample, and the within-domain differences row 1 − (a), row 2 − (a) pooled over the seeds."""
    from hf_calibration.metrics import calibration_report
    from hf_calibration.metrics.paired import interval_verdict, paired_strata_difference

    out = {"seeds": [], "differences": {}}
    strata = {"secl": [], "secl_held_out": []}
    cost = {name: ([], []) for name in strata}  # passes per question of the row and of (a), same questions
    for records in runs:
        _, rest = rows_for(records, labelled=labelled, seed=seed)
        rows = secl_confidences(records)
        per = {}
        for d in dict.fromkeys(records[i]["domain"] for i in rest):
            dom = np.array([i for i in rest if records[i]["domain"] == d])
            y = np.array([int(records[i]["correct"]) for i in dom])
            a = np.clip(np.array([records[i]["norm_p_true"] for i in dom], dtype=float), 0, 1)
            per[d] = {}
            for name in SECL_ROWS:
                conf, passes, keep = (v[dom] for v in rows[name])
                yk, ck = y[keep], np.clip(conf[keep], 0, 1)
                acc = float(yk.mean())
                rep = calibration_report(yk, ck, n_bins=10, n_resamples=n_resamples, seed=seed)
                per[d][name] = {"n": int(keep.sum()), "accuracy": acc, "auroc": rep["auroc"], "ece": rep["conf_ece"],
                                "brier_minus_constant": rep["brier"]["value"] - acc * (1 - acc),
                                "passes": float(passes[keep].mean())}
                if name in strata:  # against (a) on the same questions
                    strata[name].append(((yk, ck), (yk, a[keep])))
                    cost[name][0].append(passes[keep])
                    cost[name][1].append(np.array([records[i]["passes"]["norm_p_true"] for i in dom])[keep])
        out["seeds"].append(per)
    for name, pairs in strata.items():
        out["differences"][name] = {}
        for metric in ("auroc", "brier"):
            diff = paired_strata_difference(pairs, metric=metric, weights="size", n_resamples=n_resamples,
                                            seed=seed)
            out["differences"][name][metric] = {k: diff[k] for k in ("value", "low", "high")}
        row_passes, a_passes = (float(np.concatenate(c).mean()) for c in cost[name])
        out["differences"][name]["passes"] = {"row": row_passes, "norm_p_true": a_passes}
        brier = interval_verdict(out["differences"][name]["brier"], held_when="below")
        auroc = out["differences"][name]["auroc"]
        out["differences"][name]["verdict"] = (
            "beats (a)" if brier is True and auroc["low"] >= -0.02 and row_passes <= a_passes else
            "(a) is better" if brier is False and interval_verdict(auroc, held_when="above") is False else "undecided")
    return out


def format_secl(rep: dict) -> str:
    """The SECL rows per domain, one line per row and run (``run`` i: the i-th ``--run`` pair given, not the stream's
    seed), and the pooled differences with the verdicts."""
    lines = ["| domain | row | run | n | acc | AUROC | ECE | Brier − constant | passes/q |",
             "|---|---|---|---|---|---|---|---|---|"]
    for seed, per in enumerate(rep["seeds"]):
        for d, rows in per.items():
            for name in SECL_ROWS:
                r = rows[name]
                lines.append(f"| {d} | {name} | {seed} | {r['n']} | {r['accuracy']:.3f} | {_cell(r['auroc'])} | "
                             f"{_cell(r['ece'])} | {r['brier_minus_constant']:+.3f} | {r['passes']:.2f} |")
    lines += ["", "| difference (within domains, pooled over the runs) | AUROC | Brier | passes/q (row, (a)) | verdict |",
              "|---|---|---|---|---|"]
    for name, d in rep["differences"].items():
        lines.append(f"| {name} − (a) | {_cell(d['auroc'])} | {_cell(d['brier'])} | {d['passes']['row']:.2f}, "
                     f"{d['passes']['norm_p_true']:.2f} | {d['verdict']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    from hf_calibration.cli import script_parser

    ap = script_parser("python -m experiments.secl_decisive", __doc__.splitlines()[0])
    ap.add_argument("reads", type=Path, nargs="?", help="one JSON line per question (module docstring)")
    ap.add_argument("--run", nargs=2, type=Path, action="append", metavar=("READS", "RECORDS"), default=[],
                    help="a seed's reads and its SECL stream job's records.jsonl (repeat per seed)")
    ap.add_argument("--labelled", type=int, default=50, help="questions in the calibrator's labelled sample")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-resamples", type=int, default=1000)
    ap.add_argument("--output", type=Path, default=None, help="write the report's JSON here")
    args = ap.parse_args(argv)
    if (args.reads is None) == (not args.run):
        ap.error("reads: give a reads file, or --run READS RECORDS (one per seed), not both")
    for path in [args.reads] if args.reads is not None else [p for pair in args.run for p in pair]:
        if not path.is_file():
            ap.error(f"reads: no file {path}")
    if args.reads is not None:
        records = read_jsonl(args.reads)
        if not 2 <= args.labelled < len(records) - 2:
            ap.error(f"--labelled: must be between 2 and {len(records) - 3} for {len(records)} questions, got "
                     f"{args.labelled}")
        rep = table(records, labelled=args.labelled, seed=args.seed, n_resamples=args.n_resamples)
        print(format_table(rep))
    else:
        try:
            runs = [joined(read_jsonl(reads), read_jsonl(records)) for reads, records in args.run]
        except ValueError as err:
            ap.error(str(err))
        rep = {"baseline": [table(r, labelled=args.labelled, seed=args.seed, n_resamples=args.n_resamples)
                            for r in runs],
               "secl": secl_table(runs, labelled=args.labelled, seed=args.seed, n_resamples=args.n_resamples)}
        for base in rep["baseline"]:
            print(format_table(base))
        print(format_secl(rep["secl"]))
    if args.output is not None:
        args.output.write_text(json.dumps(rep, indent=1, default=float))
    return rep


if __name__ == "__main__":
    main()
