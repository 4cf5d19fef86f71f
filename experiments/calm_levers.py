"""Issue 51 item 5: the CALM levers never tried on Qwen, as a grid of ``python -m experiments calm`` runs, and the
rule's verdict (docs/calm_results.md, "The CALM levers on Qwen: the rule").

    python -m experiments.calm_levers run --output-dir outputs/calm_levers [--settings a,b] [--seeds 0]
    python -m experiments.calm_levers report --output-dir outputs/calm_levers [--seeds 1,2,3]

``run`` trains and scores each setting × seed into ``<output-dir>/<setting>/seed_<s>/`` one after the other; every
run resumes (the calm experiment keeps each scored method), so the command is simply given again after a stop. The
settings with 48 training questions share the splits of ``defaults`` and read its base-model and SFT scores
(copied, as ``experiments.calm_sensitivity`` does; where ``defaults`` has not scored them, they are scored there
first, without its CALM). ``train_272`` (the rule's ``train_480`` amended: HaluEval QA has too few length-balanced
questions for 480, docs/calm_results.md) adds 224 length-balanced questions to the same 48 (``--extra-train``), so it
reads ``defaults``' base-model scores and trains its own SFT.
``report`` prints, per setting, the three intervals of the rule pooled over the seeds given (and the OOD sets,
equal weights): CALM − base model and CALM − TS out-of-domain conf-ECE, CALM − 0.95·SFT in-domain accuracy, with
each method's OOD conf-ECE, AUROC and Brier and the constant-accuracy reference beside them.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# The sizes of the rule (docs/calm_results.md): the Qwen confirmation's, with 200 test questions per split.
COMMON = ["--models", "qwen", "--datasets", "halueval_qa_lm", "--ood-domains", "halueval_dialogue_lm,mmlu:stem",
          "--n-calibration", "48", "--n-validation", "36", "--n-test", "200", "--n-ood", "200", "--select-every", "8"]
SGD = ["--bome-optimizer", "sgd_momentum", "--learning-rate", "0.02", "--alpha-learning-rate", "0.005"]
BASELINES = ("uncalibrated", "sft")
METHODS = ("uncalibrated", "ts", "sft", "bome")


class Setting(NamedTuple):
    """One row of the screen: the calm experiment's extra options, its training questions and optimizer steps, and
    the methods whose scores it reads from ``defaults`` (same splits; ``copy_baselines``) instead of scoring them."""

    extra: list[str]
    n_train: int
    steps: int
    shares: tuple[str, ...] = BASELINES


# order = run order; a setting that trains on more questions (train_272) shares only the base model's scores, as
# its SFT trains on its own larger S_T
SETTINGS = {
    "defaults": Setting([], 48, 24, shares=()),
    "sgd": Setting(SGD, 48, 24),
    "upper_adjustment": Setting(["--upper-gradient", "adjustment"], 48, 24),
    "sgd_upper_adjustment": Setting(SGD + ["--upper-gradient", "adjustment"], 48, 24),
    "sgd_inner5": Setting(SGD + ["--inner-steps", "5"], 48, 24),
    "eta_0.1": Setting(["--eta", "0.1"], 48, 24),
    "eta_1": Setting(["--eta", "1.0"], 48, 24),
    "train_272": Setting(["--extra-train", "224"], 48, 68, shares=("uncalibrated",)),
}


def command(setting: str, seed: int, folder: Path, methods=METHODS) -> list[str]:
    """The ``python -m experiments`` argument list of one setting × seed, scoring ``methods``."""
    s = SETTINGS[setting]
    # a setting reads the scores copied from defaults back (Setting.shares) and trains the rest
    return ["calm", *COMMON, "--n-train", str(s.n_train), "--max-steps", str(s.steps), *s.extra,
            "--methods", *methods, "--seed", str(seed), "--output-dir", str(folder)]


def copy_baselines(out: Path, setting: str, seed: int) -> int:
    """Copy the scores of ``defaults`` (same splits) that ``setting`` shares (``Setting.shares``) into its folder;
    where ``defaults`` has not scored them yet (a setting run before it, or on a new machine), score those methods
    there first, and only those (no CALM, and no SFT for a setting that trains its own). → the exit code of that run
    (0 when nothing had to run)."""
    shared = SETTINGS[setting].shares
    if not shared:
        return 0
    source, target = out / "defaults" / f"seed_{seed}" / "scores", out / setting / f"seed_{seed}" / "scores"
    from experiments.calm import _scored_file

    if not all(_scored_file(source.parent, b, "npz").is_file() for b in shared):
        from experiments.cli import main as experiments

        code = experiments(command("defaults", seed, source.parent, methods=shared))
        if code:
            return code
    target.mkdir(parents=True, exist_ok=True)
    for f in source.iterdir():
        if f.name.split(".")[0] in shared and not (target / f.name).exists():
            shutil.copy2(f, target / f.name)
    return 0


def run(out: Path, settings: list[str], seeds: list[int]) -> int:
    from experiments.cli import main as experiments

    for seed in seeds:
        for setting in settings:
            folder = out / setting / f"seed_{seed}"
            code = copy_baselines(out, setting, seed) or experiments(command(setting, seed, folder))
            if code:
                return code
    return 0


def rule_verdict(minus_base: dict, minus_ts: dict, minus_sft_share: dict) -> str:
    """The rule's verdict from its three intervals (``{"low", "high"}``): "held" when CALM − base and CALM − TS lie
    wholly below 0 and CALM − 0.95·SFT accuracy wholly above 0, "not held" when any lies wholly on the other side,
    else "undecided"."""
    from hf_calibration.metrics import interval_verdict

    # interval_verdict: True = on the claim's side, False = wholly on the other side, None = contains 0
    held = [interval_verdict(minus_base), interval_verdict(minus_ts), interval_verdict(minus_sft_share, held_when="above")]
    return "held" if all(h is True for h in held) else "not held" if False in held else "undecided"


def summarize(folders: list[Path], *, n_resamples: int) -> dict:
    """One setting's row over its seed folders: the rule's three pooled intervals (from the saved scores) and,
    averaged over the seeds, the OOD metrics and references each seed's calm run saved in its report.json."""
    from experiments.calm import method_probabilities, read_scored
    from experiments.calm_claims import ACCURACY_SHARE, pooled_difference

    ood = [k for k in json.loads((folders[0] / "run.json").read_text())["sizes"] if k not in
           ("train", "calibration", "validation", "id_test")]
    runs = [method_probabilities(read_scored(f)[0], ("id_test", *ood)) for f in folders]
    saved = [json.loads((f / "report.json").read_text()) for f in folders]
    kw = dict(n_resamples=n_resamples, seed=0)
    row = {"seeds": [f.name for f in folders], "n_ood": int(sum(len(r[1][s]) for r in runs for s in ood))}
    for b in ("uncalibrated", "ts"):
        row[f"bome − {b}"] = pooled_difference(runs, ood, "bome", b, **kw)
    row["bome − 0.95·sft"] = pooled_difference(runs, ["id_test"], "bome", "sft", key="accuracy",
                                               share=ACCURACY_SHARE, **kw)
    row["verdict"] = rule_verdict(row["bome − uncalibrated"], row["bome − ts"], row["bome − 0.95·sft"])
    for m in ("uncalibrated", "ts", "sft", "bome"):
        row[m] = {f"ood_{k}": float(np.mean([r["ood_mean"][m][k] for r in saved])) for k in ("conf_ece", "auroc", "brier")}
        row[m]["id_accuracy"] = float(np.mean([r["tables"][m]["id_test"]["accuracy"]["value"] for r in saved]))
    # the constant-accuracy reference: confidence = the base model's validation accuracy on every OOD question
    row["constant_ood_conf_ece"] = float(np.mean([r["references"][s]["constant_accuracy"]["conf_ece"]["value"]
                                                  for r in saved for s in ood]))
    return row


def report(out: Path, settings: list[str], seeds: list[int], *, n_resamples: int) -> int:
    from experiments.common import format_interval

    print("| setting | seeds | n OOD | OOD conf-ECE CALM (base, TS, SFT; constant) | OOD AUROC CALM (base) | "
          "OOD Brier CALM (base) | CALM − base OOD conf-ECE | CALM − TS | ID acc CALM / SFT | CALM − 0.95·SFT acc | "
          "verdict |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    rows = {}
    for setting in settings:
        folders = [out / setting / f"seed_{s}" for s in seeds if (out / setting / f"seed_{s}" / "scores").is_dir()]
        try:
            row = rows[setting] = summarize(folders, n_resamples=n_resamples) if folders else None
        except (KeyError, ValueError, OSError) as exc:  # a setting not scored yet: report the others
            print(f"| {setting} | not complete ({type(exc).__name__}: {exc}) |||||||||")
            continue
        if row is None:
            continue
        b, u, t, s = row["bome"], row["uncalibrated"], row["ts"], row["sft"]
        print(f"| {setting} | {', '.join(row['seeds'])} | {row['n_ood']} | {b['ood_conf_ece']:.3f} "
              f"({u['ood_conf_ece']:.3f}, {t['ood_conf_ece']:.3f}, {s['ood_conf_ece']:.3f}; "
              f"{row['constant_ood_conf_ece']:.3f}) | {b['ood_auroc']:.3f} ({u['ood_auroc']:.3f}) | "
              f"{b['ood_brier']:.3f} ({u['ood_brier']:.3f}) | {format_interval(row['bome − uncalibrated'])} | "
              f"{format_interval(row['bome − ts'])} | {b['id_accuracy']:.3f} / {s['id_accuracy']:.3f} | "
              f"{format_interval(row['bome − 0.95·sft'])} | {row['verdict']} |")
    (out / "report.json").write_text(json.dumps(rows, indent=2, default=float) + "\n")
    return 0


def main(argv=None) -> int:
    from hf_calibration.cli import script_parser

    parser = script_parser("python -m experiments.calm_levers", __doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["run", "report"])
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated, of " + ", ".join(SETTINGS))
    parser.add_argument("--seeds", default="0", help="comma-separated training seeds (default 0: the screen)")
    parser.add_argument("--n-resamples", type=int, default=1000)
    args = parser.parse_args(argv)
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    bad = [s for s in settings if s not in SETTINGS]
    if bad or not settings:
        parser.error(f"--settings: unknown setting {bad[0] if bad else args.settings!r}; "
                     f"choose among {', '.join(SETTINGS)}")
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
        if not seeds or min(seeds) < 0:
            raise ValueError
    except ValueError:
        parser.error(f"--seeds: must be integers ≥ 0 separated by commas, got {args.seeds!r}")
    out = Path(args.output_dir)
    if args.action == "report" and not out.is_dir():  # nothing to report: say so, before writing report.json there
        parser.error(f"--output-dir: no folder {args.output_dir!r} (report reads what run wrote there)")
    if args.action == "run":
        return run(out, settings, seeds)
    return report(out, settings, seeds, n_resamples=args.n_resamples)


if __name__ == "__main__":
    sys.exit(main())
