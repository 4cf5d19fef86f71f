"""A SECL stream's AUROC split at its bursts: the burst questions (read while the adapter moved, one step per
question) against those after (read with the adapter the burst, and its consolidation, left).

    python -m experiments.secl_burst_split outputs/secl_qwen_qa_lm_v2/qwen/records.jsonl [--domain halueval_qa_lm]

Reads the ``records.jsonl`` of ``hf-calibration secl`` / ``python -m experiments secl`` (fields ``correct``,
``burst``, and the signals ``verbalized``, ``secl``, ``secl_final``, ``norm_p_true``) and prints, per part, the
number of questions, the accuracy, each signal's AUROC (``hf_calibration.metrics.confidence_auroc``, 95 %
bootstrap interval) and the paired difference SECL − verbalized (``paired_bootstrap``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from experiments.secl_learnability import format_interval, metric_row, paired_difference

SIGNALS = ("verbalized", "secl", "secl_final", "norm_p_true")


def burst_split(records: list[dict], *, n_resamples: int = 1000, seed: int = 0) -> dict:
    """{part: {"n", "accuracy", signal: metric_row, "secl_minus_verbalized_auroc"}} for the parts "in burst",
    "after burst" and "all"; a part with fewer than 2 questions or a single label gets only n and accuracy."""
    from hf_calibration.metrics import confidence_auroc

    y = np.array([bool(r["correct"]) for r in records])
    burst = np.array([bool(r["burst"]) for r in records])
    out = {}
    for part, mask in (("in burst", burst), ("after burst", ~burst), ("all", np.ones_like(burst))):
        row = {"n": int(mask.sum()), "accuracy": float(y[mask].mean()) if mask.any() else float("nan")}
        if mask.sum() >= 2 and len(set(y[mask])) == 2:
            sig = {k: np.array([r[k] for r in records], dtype=float)[mask] for k in SIGNALS if k in records[0]}
            row |= {k: metric_row(y[mask], v, n_resamples=n_resamples, seed=seed) for k, v in sig.items()}
            row["secl_minus_verbalized_auroc"] = paired_difference(confidence_auroc, y[mask], sig["secl"],
                                                                   sig["verbalized"], n_resamples=n_resamples,
                                                                   seed=seed)
        out[part] = row
    return out


def format_split(split: dict) -> str:
    keys = [k for k in SIGNALS if any(k in row for row in split.values())]
    lines = ["| part | n | acc | " + " | ".join(f"AUROC {k}" for k in keys) + " | ΔAUROC SECL − verbalized |",
             "|---" * (len(keys) + 4) + "|"]
    for part, row in split.items():
        cells = [format_interval(row[k]["auroc"]) if k in row else "—" for k in keys]
        delta = format_interval(row["secl_minus_verbalized_auroc"]) if "secl_minus_verbalized_auroc" in row else "—"
        lines.append(f"| {part} | {row['n']} | {row['accuracy']:.3f} | " + " | ".join(cells) + f" | {delta} |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    from hf_calibration.cli import script_parser

    ap = script_parser("python -m experiments.secl_burst_split", __doc__.splitlines()[0])
    ap.add_argument("records", type=Path, help="a stream run's records.jsonl")
    ap.add_argument("--domain", default=None, help="only this domain's questions")
    ap.add_argument("--n-resamples", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if not args.records.is_file():
        ap.error(f"records: no file {args.records}")
    records = [json.loads(x) for x in args.records.read_text(encoding="utf-8").splitlines() if x.strip()]
    records = [r for r in records if args.domain is None or r["domain"] == args.domain]
    if not records:
        ap.error(f"--domain: no question of domain {args.domain!r} in {args.records}")
    split = burst_split(records, n_resamples=args.n_resamples, seed=args.seed)
    print(format_split(split))
    return split


if __name__ == "__main__":
    main()
