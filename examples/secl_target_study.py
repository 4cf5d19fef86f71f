"""SECL's target settings (τ_n, δ, α_step) and bin-gate width from a development stream (issue 16, item 4).

    .venv/bin/python examples/secl_target_study.py --output-dir outputs/secl_targets     # SmolLM2, 150 QA-LM

Development split: ``--stream`` (default length-matched HaluEval QA-LM, the domain where SmolLM2's P(True)Norm
ranks its answers far better than its verbalized confidence) drawn with ``--seed`` 0, gold letters balanced;
the test streams of docs/secl_results.md use seed 1. A burst opens at the first question (as in
``python -m experiments secl``), so SECL trains during the first ``burst_size`` questions and the later ones are read with
the adapter those produced.

1. **Baseline pass** (``evaluation.stream.baseline_pass``, identity adapter): each answer, its verbalized confidence c
   and P(True) of every candidate (``p_true_options``). Saved to ``baseline.jsonl``; a rerun with the same
   model, stream, seed and size reads it back.
2. **Teacher, offline.** c*(τ_n) = P(True)Norm at each τ_n of ``TAU_GRID``, recomputed from the saved P(True)s
   (``secl.confidence.norm_p_true``): its Brier score, ECE and mean (its AUROC does not depend on τ_n), and how
   many burst questions each bin-gate width would let through, given the baseline c (the gate's input at the
   first burst question; later ones see the adapted c, which the SECL passes below count).
3. **SECL passes** (``evaluation.stream.secl_pass``, adapter scope "confidence", so every pass gives the same answers):
   the current defaults and each one-at-a-time variant of ``VARIANTS``. For each: ECE, Brier and AUROC of the
   SECL confidence over the split and over the questions after the burst, the share trained, and the paired
   bootstrap difference of Brier against the defaults' pass on the same questions.

**Choice rule, fixed before the run:** a variant replaces a default only if its Brier over the split is lower
than the defaults' with the paired 95 % interval entirely below 0 (Brier: a proper score, so it rewards both
calibration and ranking; ECE alone can be lowered by a level shift). Otherwise the defaults stay and the table
says the study could not separate them.

Writes ``baseline.jsonl``, ``targets.json`` (every number) and ``targets.md`` into ``--output-dir``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TAU_GRID = (0.05, 0.1, 0.2, 0.3, 0.5, 1.0)
GATE_WIDTHS = (0, 1, 2)
VARIANTS = {"tau_n=0.1": {"tau_n": 0.1}, "tau_n=0.5": {"tau_n": 0.5}, "delta=0.1": {"delta": 0.1},
            "delta=0.4": {"delta": 0.4}}


def padded(rows: list[list[float]]) -> np.ndarray:
    """(n, K_max) P(True)s, NaN where a question has fewer candidates (``norm_p_true`` gives those 0)."""
    width = max(len(r) for r in rows)
    return np.array([list(r) + [np.nan] * (width - len(r)) for r in rows], dtype=np.float64)


def scores(y: np.ndarray, conf: np.ndarray) -> dict:
    from hf_calibration.metrics import brier_score, confidence_auroc, expected_calibration_error

    return {"n": int(len(y)), "accuracy": float(y.mean()), "mean_confidence": float(conf.mean()),
            "ece": float(expected_calibration_error(y, conf)), "brier": float(brier_score(y, conf)),
            "auroc": float(confidence_auroc(y, conf)) if 0 < y.sum() < len(y) else None}


def teacher_study(records: list[dict], *, burst: int, n_bins: int) -> list[dict]:
    """Step 2 of the module docstring: c*(τ_n) for each τ_n of TAU_GRID."""
    from hf_calibration.secl.confidence import norm_p_true
    from hf_calibration.secl.mixin import bin_gate_passes

    y = np.array([r["correct"] for r in records], dtype=int)
    c = np.array([r["verbalized"] for r in records])
    p = padded([r["p_true_options"] for r in records])
    rows = []
    for tau in TAU_GRID:
        star = norm_p_true(p, tau=tau)[:, 0]
        gate = {w: int(sum(bin_gate_passes(float(a), float(b), n_bins=n_bins, width=w)
                           for a, b in zip(c[:burst], star[:burst]))) for w in GATE_WIDTHS}
        rows.append({"tau_n": tau, **scores(y, star), "gate_passes_of_burst": gate})
    return rows


def main(argv=None):
    from hf_calibration.cli import script_parser

    p = script_parser("python examples/secl_target_study.py", __doc__.splitlines()[0])
    p.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    p.add_argument("--stream", default="halueval_qa_lm")
    p.add_argument("--per-domain", type=int, default=150, help="questions per domain of the development split")
    p.add_argument("--seed", type=int, default=0, help="the development split's seed (test streams: 1)")
    p.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS),
                   help="which one-at-a-time variants to run beside the defaults")
    p.add_argument("--burst-size", type=int, default=None, help="default: SECLConfig's burst_size")
    p.add_argument("--n-resamples", type=int, default=1000)
    p.add_argument("--output-dir", default="outputs/secl_targets")
    args = p.parse_args(argv)
    if args.per_domain < 2:
        p.error(f"--per-domain: must be at least 2, got {args.per_domain}")

    import torch

    from hf_calibration import modeling
    from hf_calibration.metrics import brier_score, paired_bootstrap
    from hf_calibration.secl import SECLConfig, apply_secl
    from hf_calibration.modeling.streams import build_stream
    from hf_calibration.evaluation.stream import baseline_pass, secl_pass

    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    defaults = SECLConfig() if args.burst_size is None else SECLConfig(burst_size=args.burst_size)
    model, tokenizer = modeling.load_model(args.model, device="cpu")
    torch.manual_seed(args.seed)
    model = apply_secl(model, tokenizer, defaults)
    items = build_stream(tokenizer, args.stream, limit_per_domain=args.per_domain, seed=args.seed,
                         balance_gold=True, prompt_format=defaults.prompt_format)
    key = {"model": args.model, "stream": args.stream, "per_domain": args.per_domain, "seed": args.seed}
    saved = out / "baseline.jsonl"
    lines = saved.read_text().splitlines() if saved.exists() else []
    if lines and json.loads(lines[0]) == key and len(lines) == 1 + len(items):
        records = [json.loads(line) for line in lines[1:]]
        print(f"baseline pass: read {saved}", flush=True)
    else:
        start = time.perf_counter()
        records = baseline_pass(model, items)
        saved.write_text("\n".join(json.dumps(r) for r in [key, *records]) + "\n")
        print(f"baseline pass: {time.perf_counter() - start:.0f} s", flush=True)

    burst = defaults.burst_size
    if len(items) <= burst:
        p.error(f"--per-domain: the split has {len(items)} questions, not more than the burst ({burst}); "
                "questions after the burst are needed")
    teacher = teacher_study(records, burst=burst, n_bins=defaults.n_bins)
    y = np.array([r["correct"] for r in records], dtype=int)
    settings = {"defaults": {}, **{name: VARIANTS[name] for name in args.variants}}
    passes = {}
    for name, change in settings.items():
        fields = [{"passes": {}} for _ in records]
        model.set_secl_config(dataclasses.replace(defaults, **change))
        start = time.perf_counter()
        counters = secl_pass(model, items, fields, burst_at_start=True)
        seconds = time.perf_counter() - start
        conf = np.array([f["secl"] for f in fields])
        answers_same = all(f["secl_answer"] == r["answer"] for f, r in zip(fields, records))
        passes[name] = {"change": change, "counters": counters, "seconds": round(seconds, 1),
                        "answers_as_baseline": answers_same, "confidence": conf.tolist(),
                        "split": scores(y, conf), "after_burst": scores(y[burst:], conf[burst:])}
        print(f"{name}: {seconds:.0f} s, {counters['updates']} updates, Brier {passes[name]['split']['brier']:.4f}",
              flush=True)
    model.set_secl_config(defaults)
    base = np.array(passes["defaults"]["confidence"])
    for name, row in passes.items():
        if name == "defaults":
            continue
        d = paired_bootstrap(brier_score, y, np.array(row["confidence"]), y, base, n_resamples=args.n_resamples)
        row["delta_brier_vs_defaults"] = {"value": d.estimate, "low": d.low, "high": d.high}
    better = [n for n, r in passes.items() if n != "defaults" and r["delta_brier_vs_defaults"]["high"] < 0]
    chosen = min(better, key=lambda n: passes[n]["delta_brier_vs_defaults"]["value"]) if better else "defaults"
    verbal = np.array([r["verbalized"] for r in records])
    report = {**key, "burst": burst, "defaults": {k: getattr(defaults, k) for k in
                                                  ("tau_n", "alpha_step", "delta", "bin_gate_width", "n_bins",
                                                   "burst_size", "learning_rate")},
              "verbalized": scores(y, verbal), "teacher": teacher, "passes": passes, "chosen": chosen}
    (out / "targets.json").write_text(json.dumps(report, indent=1))

    name = args.model.split("/")[-1]
    md = [f"# SECL target settings on a development split ({name})", "",
          f"{args.stream}, {len(items)} questions, seed {args.seed}, burst over the first {burst}; defaults "
          + ", ".join(f"{k} {v}" for k, v in report["defaults"].items()) + ".", "",
          f"Verbalized confidence (baseline): accuracy {report['verbalized']['accuracy']:.3f}, ECE "
          f"{report['verbalized']['ece']:.3f}, Brier {report['verbalized']['brier']:.4f}, AUROC "
          f"{report['verbalized']['auroc'] or float('nan'):.3f}; constant-accuracy Brier "
          f"{y.mean() * (1 - y.mean()):.4f}.", "",
          "## Teacher c* = P(True)Norm at each τ_n (offline, from the baseline pass)", "",
          "| τ_n | mean c* | ECE | Brier | AUROC | burst questions the gate passes, width " +
          " / ".join(map(str, GATE_WIDTHS)) + " |", "|---|---|---|---|---|---|"]
    for t in teacher:
        md.append(f"| {t['tau_n']:g} | {t['mean_confidence']:.3f} | {t['ece']:.3f} | {t['brier']:.4f} | "
                  f"{t['auroc'] or float('nan'):.3f} | "
                  + " / ".join(str(t["gate_passes_of_burst"][w]) for w in GATE_WIDTHS) + f" of {burst} |")
    md += ["", "## SECL passes (scope confidence; answers as the baseline's in every pass)", "",
           "| setting | updates | ECE | Brier | AUROC | ECE after burst | Brier after burst | AUROC after burst | "
           "ΔBrier vs defaults [95 %] | s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for n, r in passes.items():
        d = r.get("delta_brier_vs_defaults")
        cell = "—" if d is None else f"{d['value']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}]"
        s, a = r["split"], r["after_burst"]
        md.append(f"| {n} | {r['counters']['updates']} | {s['ece']:.3f} | {s['brier']:.4f} | "
                  f"{s['auroc'] or float('nan'):.3f} | {a['ece']:.3f} | {a['brier']:.4f} | "
                  f"{a['auroc'] or float('nan'):.3f} | {cell} | {r['seconds']:.0f} |")
    md += ["", f"Choice rule (module docstring): **{chosen}**"
           + (" (no variant's Brier is decisively below the defaults')." if chosen == "defaults" else ".")]
    (out / "targets.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
