"""Sensitivity of CALM to its settings: one table over calm-experiment folders that differ in one setting each,
read from their saved scores.

Each folder is a ``python -m experiments calm`` output of the same model, domain, sizes and seed (so the same
splits), with ``bome``, ``sft`` and ``uncalibrated`` scored; only CALM's setting differs. To vary only CALM, copy
the baseline folder's ``scores/uncalibrated.*`` and ``scores/sft.*`` into the new folder first: the experiment
reads them back and trains ``bome`` alone. For example (one variant; SmolLM2, the sizes of docs/calm_results.md):

    mkdir -p outputs/calm_v_eta09/scores && cp outputs/calm_smollm2/scores/{uncalibrated,sft}.* outputs/calm_v_eta09/scores/
    .venv/bin/python -m experiments calm --models smollm2 --datasets halueval_qa_lm \\
        --ood-domains halueval_dialogue_lm,mmlu:stem --methods uncalibrated ts sft bome --n-train 48 \\
        --n-calibration 48 --n-validation 36 --n-test 200 --n-ood 200 --max-steps 24 --select-every 8 \\
        --eta 0.9 --output-dir outputs/calm_v_eta09

The other variants change ``--eta``, ``--inner-steps``, ``--alpha-learning-rate``, ``--bome-optimizer`` (with
``--learning-rate``) or ``--entropy-domain vocab`` (L_tr and H over the full next-token distribution, α over the
whole vocabulary) the same way.
    .venv/bin/python -m experiments.calm_sensitivity outputs/calm_smollm2 outputs/calm_v_eta09

Columns. Development (the labelled validation split, where a setting may be chosen): CALM's conf-ECE and its
accuracy as a share of SFT's. Test (reported, never used to choose): in-domain accuracy share, mean OOD
conf-ECE, and the paired CALM − TS on the OOD sets (``calm_claims.pooled_difference``, mean over the OOD
sets, 95 % interval). A setting "beats TS out of domain while keeping 95 % of SFT's accuracy" on the test sets when
CALM − TS lies below 0 and CALM − 0.95·SFT in domain above 0 (``calm_claims.calm_claim_check``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def summarize(folder: Path, *, n_resamples: int = 1000, seed: int = 0) -> dict:
    """The row of one folder (module docstring)."""
    import numpy as np

    from experiments.calm import method_probabilities, read_scored
    from experiments.calm_claims import calm_claim_check
    from experiments.common import IN_DOMAIN_SPLITS

    run = json.loads((folder / "run.json").read_text())
    ood = [k for k in run["sizes"] if k not in IN_DOMAIN_SPLITS]
    scores, infos = read_scored(folder)
    missing = {"bome", "sft", "uncalibrated"} - set(scores)
    if missing:
        raise SystemExit(f"experiments.calm_sensitivity: error: {folder}: no scores for {', '.join(sorted(missing))}")
    probs, labels = method_probabilities(scores, ("validation", "id_test", *ood))

    def acc(m, split):
        return float(np.mean(probs[m][split].argmax(1) == labels[split]))

    def ece(m, split):
        from hf_calibration.metrics import expected_calibration_error

        return float(expected_calibration_error((probs[m][split].argmax(1) == labels[split]).astype(int),
                                                probs[m][split].max(1)))

    def share(split):  # CALM's accuracy as a share of SFT's (nan when SFT gets none right)
        return acc("bome", split) / acc("sft", split) if acc("sft", split) > 0 else float("nan")

    rows, evidence = calm_claim_check([(probs, labels)], ood, n_resamples=n_resamples, seed=seed)
    held = {claim: h for claim, h, _ in rows}
    if not ood:
        raise SystemExit(f"experiments.calm_sensitivity: error: {folder}: the run has no OOD set")
    d = evidence["bome − ts ood conf_ece"]
    config = run["config"]
    return {
        "folder": str(folder), "setting": {k: config[k] for k in ("eta", "inner_steps", "alpha_learning_rate",
                                                                   "learning_rate", "bome_optimizer", "entropy_domain")
                                  if k in config},
        "dev_conf_ece": ece("bome", "validation"), "dev_accuracy_share": share("validation"),
        "test_accuracy_share": share("id_test"),
        "test_ood_conf_ece": float(np.mean([ece("bome", s) for s in ood])),
        "test_ood_conf_ece_ts": float(np.mean([ece("ts", s) for s in ood])),
        "calm_minus_ts": d, "beats_ts": held.get("OOD conf-ECE of CALM below TS"),
        "keeps_95": held.get("in-domain accuracy of CALM ≥ 95% of SFT's"),
        "seconds_per_step": infos["bome"].get("seconds_per_step"),
        "mean_temperature": infos["bome"].get("mean_temperature"),
    }


def main(argv=None) -> int:
    from hf_calibration.cli import script_parser

    parser = script_parser("python -m experiments.calm_sensitivity", __doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", help="calm experiment output folders (same splits, one setting each)")
    parser.add_argument("--n-resamples", type=int, default=1000)
    parser.add_argument("--output", help="also write the rows as JSON here")
    args = parser.parse_args(argv)

    def fail(message: str) -> int:
        print(f"experiments.calm_sensitivity: error: {message}", file=sys.stderr)
        return 2

    if args.n_resamples < 1:
        return fail(f"--n-resamples must be a positive integer, got {args.n_resamples}")
    if args.output is not None and (not args.output or Path(args.output).is_dir()
                                    or not Path(args.output).resolve().parent.is_dir()):
        return fail(f"--output: cannot write a file at {args.output!r}")
    for f in args.folders:
        if not (Path(f) / "run.json").is_file():
            return fail(f"{f!r} is not a calm experiment folder (no run.json)")
    rows = []
    for f in args.folders:
        try:
            rows.append(summarize(Path(f), n_resamples=args.n_resamples))
        except SystemExit as exc:  # summarize's own one-line error
            print(exc.code, file=sys.stderr)
            return 2
        except (KeyError, ValueError, OSError) as exc:  # a run.json or score file that is not what the job writes
            return fail(f"{f!r}: unreadable results ({type(exc).__name__}: {exc})")
    word = {True: "yes", False: "no", None: "undecided"}
    print("| folder | setting | dev conf-ECE | dev acc / SFT | test acc / SFT | test OOD conf-ECE (TS) | "
          "CALM − TS OOD [95 %] | beats TS | keeps 95 % | s/step | mean τ |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        d = r["calm_minus_ts"]
        print(f"| {Path(r['folder']).name} | " + ", ".join(f"{k} {v}" for k, v in r["setting"].items())
              + f" | {r['dev_conf_ece']:.3f} | {r['dev_accuracy_share']:.0%} | {r['test_accuracy_share']:.0%} | "
              f"{r['test_ood_conf_ece']:.3f} ({r['test_ood_conf_ece_ts']:.3f}) | "
              f"{d['value']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}] | {word[r['beats_ts']]} | {word[r['keeps_95']]} | "
              f"{r['seconds_per_step']:.1f} | {r['mean_temperature']:.3g} |")
    if args.output:
        Path(args.output).write_text(json.dumps(rows, indent=2, default=float) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
