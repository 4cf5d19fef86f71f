"""The decisive SECL comparison's baseline rows from a baseline pass's reads (issue 51 item 2; the rule:
docs/secl_results.md, section "The decisive comparison: does SECL beat using its teacher directly?").

    python -m experiments.secl_decisive outputs/secl_drift_signals/reads.jsonl [--output report.json]

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

from hf_calibration.modeling.prompts import LETTERS

ROWS = ("norm_p_true", "verbalized", "option_prob_platt")
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


def main(argv=None) -> dict:
    from hf_calibration.cli import script_parser

    ap = script_parser("python -m experiments.secl_decisive", __doc__.splitlines()[0])
    ap.add_argument("reads", type=Path, help="one JSON line per question (module docstring)")
    ap.add_argument("--labelled", type=int, default=50, help="questions in the calibrator's labelled sample")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-resamples", type=int, default=1000)
    ap.add_argument("--output", type=Path, default=None, help="write the report's JSON here")
    args = ap.parse_args(argv)
    if not args.reads.is_file():
        ap.error(f"reads: no file {args.reads}")
    records = []
    for line in args.reads.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:  # a line cut by a run killed mid-write
            continue
    if not 2 <= args.labelled < len(records) - 2:
        ap.error(f"--labelled: must be between 2 and {len(records) - 3} for {len(records)} questions, got "
                 f"{args.labelled}")
    rep = table(records, labelled=args.labelled, seed=args.seed, n_resamples=args.n_resamples)
    print(format_table(rep))
    if args.output is not None:
        args.output.write_text(json.dumps(rep, indent=1))
    return rep


if __name__ == "__main__":
    main()
