"""What ECE a calibrated read shows on a SECL stream's domains: each signal's ECE against its consistency-resampling
null (the ECE the same confidences show when they are perfectly calibrated; docs/methods.md, "Consistency
resampling").

    python -m experiments.secl_ece_floor outputs/secl_qwen05_4domains_linear/records.jsonl [--domain halueval_qa_lm]

Reads the ``records.jsonl`` of ``hf-calibration secl`` (fields ``domain``, ``correct``, ``secl_correct`` where the
adapter can change answers, and the signals ``verbalized``, ``secl``, ``secl_final``, ``norm_p_true``) and prints,
per domain and signal: n, accuracy, the confidences' mean and standard deviation, AUROC, the plug-in ECE (15
equal-width bins, the tables' ECE), the debiased ECE (Kumar et al. 2019), the calibrated null's mean and 95 % range
and the one-sided p-value of "calibrated". The last column is the ECE a cut of ``--target-cut`` (issue 30: 56 %)
below the verbalized ECE asks for, and where it lies in the signal's null (the share of calibrated draws at or below
it): a target below nearly every calibrated draw cannot be told from noise at this n.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

SIGNALS = ("verbalized", "secl", "secl_final", "norm_p_true")


def floor_rows(records: list[dict], *, target_cut: float = 0.56, n_resamples: int = 2000, seed: int = 0) -> list[dict]:
    """One dict per (domain, signal) present on every question of the domain: n, accuracy, mean, sd, auroc, ece,
    ece_debiased, null_mean, null_low, null_high, p_value, target_ece, target_quantile (share of the null ≤
    target_ece). SECL's signals are scored on SECL's answers (``secl_correct``) where the records have them."""
    from hf_calibration.metrics import confidence_auroc, consistency_resampling, expected_calibration_error

    rows = []
    for domain in dict.fromkeys(r["domain"] for r in records):
        items = [r for r in records if r["domain"] == domain]
        base_y = np.array([bool(r["correct"]) for r in items], dtype=float)
        verbalized_ece = expected_calibration_error(base_y, np.array([r["verbalized"] for r in items], float))
        target = (1.0 - target_cut) * verbalized_ece
        own = all("secl_correct" in r for r in items)
        for signal in SIGNALS:
            if any(r.get(signal) is None for r in items):
                continue
            p = np.array([r[signal] for r in items], dtype=float)
            y = np.array([bool(r["secl_correct"]) for r in items], float) if signal.startswith("secl") and own \
                else base_y
            res, null = consistency_resampling(expected_calibration_error, p, y, n_resamples=n_resamples, seed=seed,
                                               return_draws=True)
            rows.append(dict(
                domain=domain, signal=signal, n=len(items), accuracy=float(y.mean()), mean=float(p.mean()),
                sd=float(p.std()), auroc=float(confidence_auroc(y, p)) if 0 < y.sum() < len(y) else float("nan"),
                ece=res.observed, ece_debiased=float(expected_calibration_error(y, p, debiased=True)),
                null_mean=res.null_mean, null_low=res.low, null_high=res.high, p_value=res.p_value,
                target_ece=float(target), target_quantile=float(np.mean(null <= target)),
            ))
    return rows


def _p(value: float) -> str:
    return "< 0.001" if value < 0.001 else f"{value:.3f}"


def format_rows(rows: list[dict], target_cut: float) -> str:
    lines = ["| domain | signal | n | acc | mean conf | sd | AUROC | ECE | debiased ECE | ECE if calibrated: mean "
             f"[95 % range] | p (calibrated) | ECE {target_cut:.0%} below verbalized | share of calibrated draws ≤ it |",
             "|---" * 13 + "|"]
    for r in rows:
        lines.append(
            f"| {r['domain']} | {r['signal']} | {r['n']} | {r['accuracy']:.3f} | {r['mean']:.2f} | {r['sd']:.3f} | "
            f"{r['auroc']:.3f} | {r['ece']:.3f} | {r['ece_debiased']:.3f} | {r['null_mean']:.3f} "
            f"[{r['null_low']:.3f}, {r['null_high']:.3f}] | {_p(r['p_value'])} | {r['target_ece']:.3f} | "
            f"{r['target_quantile']:.3f} |")
    return "\n".join(lines)


REQUIRED = ("domain", "correct", "verbalized")


def read_records(path: Path) -> list[dict]:
    """The records of ``path`` (JSON lines), checked for what :func:`floor_rows` reads; ValueError naming the line
    and the field otherwise."""
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"records: {path} line {number} is not JSON ({err.msg})") from None
        if not isinstance(record, dict):
            raise ValueError(f"records: {path} line {number} is not a JSON object: {line[:60]!r}")
        missing = [k for k in REQUIRED if k not in record]
        if missing:
            raise ValueError(f"records: {path} line {number} has no field {missing[0]!r} (a stream run's "
                             "records.jsonl has domain, correct, verbalized and the SECL signals)")
        for key in SIGNALS:
            value = record.get(key)
            if value is None and key != "verbalized":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
                raise ValueError(f"records: {path} line {number}: {key} must be a confidence in [0, 1], got {value!r}")
        records.append(record)
    if not records:
        raise ValueError(f"records: {path} holds no records")
    return records


def main(argv=None) -> list[dict]:
    from hf_calibration.cli import script_parser

    ap = script_parser("python -m experiments.secl_ece_floor", __doc__.splitlines()[0])
    ap.add_argument("records", type=Path, help="a stream run's records.jsonl")
    ap.add_argument("--domain", default=None, help="only this domain's questions")
    ap.add_argument("--target-cut", type=float, default=0.56, help="the ECE cut asked for, in (0, 1) (default 0.56)")
    ap.add_argument("--n-resamples", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if not args.records.is_file():
        ap.error(f"records: no file {args.records}")
    if not 0 < args.target_cut < 1:
        ap.error(f"--target-cut: must be in (0, 1), got {args.target_cut}")
    if args.n_resamples < 1:
        ap.error(f"--n-resamples: must be ≥ 1, got {args.n_resamples}")
    if args.seed < 0:
        ap.error(f"--seed: must be ≥ 0, got {args.seed}")
    try:
        records = read_records(args.records)
    except ValueError as err:
        ap.error(str(err))
    records = [r for r in records if args.domain is None or r["domain"] == args.domain]
    if not records:
        ap.error(f"--domain: no question of domain {args.domain!r} in {args.records}")
    partial = sorted({r["domain"] for r in records if "secl_correct" in r}
                     & {r["domain"] for r in records if "secl_correct" not in r})
    if partial:
        ap.error(f"records: secl_correct is on some questions of {partial[0]!r} and not on others; SECL's rows "
                 "would mix two passes' answers")
    rows = floor_rows(records, target_cut=args.target_cut, n_resamples=args.n_resamples, seed=args.seed)
    print(format_rows(rows, args.target_cut))
    for domain in dict.fromkeys(r["domain"] for r in records):
        shown = {row["signal"] for row in rows if row["domain"] == domain}
        left = [k for k in SIGNALS if k not in shown and any(r.get(k) is not None for r in records
                                                                if r["domain"] == domain)]
        if left:
            print(f"({domain}: {', '.join(left)} left out: missing on some of its questions)")
    return rows


if __name__ == "__main__":
    main()
