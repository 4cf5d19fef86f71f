"""SECL's online schedule: which restatement, replay buffer and number of steps bring the stream's verbalized
confidence toward the offline ceiling of ``experiments/secl_learnability.py``?

    python -m experiments.secl_schedule --model smollm2 --output-dir outputs/secl_schedule_smollm2

One domain (default: length-matched HaluEval QA, gold letters balanced) as a stream of ``--limit`` questions with a
burst at the start (``SECLConfig.burst_size`` questions trained, then the entropy gate). Per seed the baseline
pass (``evaluation.stream.baseline_pass``, identity adapter: the answers, the verbalized confidence restating the decoded
answer, P(True)Norm) runs once and is saved; then, for every schedule, a fresh SECL model (torch seeded with the
seed, so every schedule starts from the same identity adapter) runs the SECL pass (``evaluation.stream.secl_pass``) and
every question is read again with the adapter the pass ended with (``evaluation.stream.final_adapter_pass``): the
confidence **over the stream** (each question read with the adapter the questions before it produced, what a user
of the stream gets) and **after the burst** (the final adapter on the same answers, on every question and on the
burst's, and on the questions no step trained on: ``held_out``). The schedules are ``SECLConfig`` fields
(``SCHEDULES``): the restatement, a replay buffer over the burst
with several steps per question, and consolidation (epochs over the whole burst when it ends, the one way found to
take many steps within the pass budget). On the development seed (``--dev-seed``) every
schedule runs; the rule fixed before the run picks the one with the highest AUROC over the stream among those within
the pass budget (``PASS_BUDGET`` forward passes per question) and, separately, without the budget; on the test seed
(``--test-seed``) the default and the picks run again. Each schedule's result is one line of ``results.jsonl``
(a restart skips those done; ``--phase test`` in a second process runs the default on the test seed meanwhile,
and the picks once the development schedules are all done); ``report.md`` has every table, with the constant-accuracy reference (confidence =
the stream's accuracy on every question) and paired bootstrap intervals against the verbalized baseline.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from experiments.secl_claims import PASS_BUDGET
from experiments.secl_learnability import MODEL_ALIASES, format_interval as _ci, metric_row as _metric_row
from experiments.secl_learnability import paired_difference as _paired, read_results as _read

# The base every schedule changes, pinned: SECLConfig's defaults when the study ran (the paper's one step per
# question, the decoded answer restated; restate's default is "option_text" since 2026-12-03), which "default" below
# names and the saved results and the report's paired table are keyed by.
ONE_STEP = {"restate": "answer", "replay_size": 0, "replay_batch_size": 4, "consolidation_epochs": 0, "tau_n": 0.2}
# the consolidation schedule the study picked (3 epochs over the burst, one question per step), which others vary
CONSOLIDATE3_B1 = {"restate": "option_text", "replay_size": 50, "replay_batch_size": 0, "consolidation_epochs": 3,
                   "consolidation_batch_size": 1, "tau_n": 0.05}
# name → SECLConfig fields changed from ONE_STEP; the buffer of 50 holds a whole default burst
SCHEDULES = {
    "default": {},
    "option_text": {"restate": "option_text"},
    "option_text_replay3": {"restate": "option_text", "replay_size": 50, "replay_batch_size": 3},
    "option_text_replay7_x4": {"restate": "option_text", "replay_size": 50, "replay_batch_size": 7,
                               "steps_per_update": 4},
    "option_text_replay7_x4_tau0.05": {"restate": "option_text", "replay_size": 50, "replay_batch_size": 7,
                                       "steps_per_update": 4, "tau_n": 0.05},
    "option_text_replay7_x4_unclipped": {"restate": "option_text", "replay_size": 50, "replay_batch_size": 7,
                                         "steps_per_update": 4, "delta": 1.0},
    # within the pass budget: one step per question as the paper, then epochs over the whole burst when it ends
    # (SECLConfig.consolidation_epochs; 3 epochs of a 50-question burst = 0.75 passes per question on 200)
    "option_text_consolidate3_tau0.05": {"restate": "option_text", "replay_size": 50, "replay_batch_size": 0,
                                         "consolidation_epochs": 3, "consolidation_batch_size": 8, "tau_n": 0.05},
    "option_text_consolidate3_tau0.05_lr0.005": {"restate": "option_text", "replay_size": 50, "replay_batch_size": 0,
                                                 "consolidation_epochs": 3, "consolidation_batch_size": 8,
                                                 "tau_n": 0.05, "learning_rate": 5e-3},
    # the same passes cut into more, smaller steps (AdamW's step is about lr whatever the batch): minibatches of 2
    # (75 steps instead of 21) and of 1 (150)
    "option_text_consolidate3_b2_tau0.05": {"restate": "option_text", "replay_size": 50, "replay_batch_size": 0,
                                            "consolidation_epochs": 3, "consolidation_batch_size": 2, "tau_n": 0.05},
    "option_text_consolidate3_b1_tau0.05": CONSOLIDATE3_B1,
    # the same with the adapter on the whole conversation (the paper's scope: answers and teacher move with it)
    "option_text_consolidate3_b1_tau0.05_scope_all": {**CONSOLIDATE3_B1, "adapter_scope": "all"},
    # the KL loss (SECLConfig.confidence_loss): the same steps, a gradient that stays when the read saturates
    "option_text_kl": {"restate": "option_text", "confidence_loss": "kl"},
    "option_text_consolidate3_b1_tau0.05_kl": {**CONSOLIDATE3_B1, "confidence_loss": "kl"},
    # five times the step size, which collapses the squared error's read offline (docs/secl_results.md, section 2)
    "option_text_consolidate3_b1_tau0.05_kl_lr0.005": {**CONSOLIDATE3_B1, "confidence_loss": "kl",
                                                       "learning_rate": 5e-3},
}
# the development run's schedules (the δ = 1 one is kept for a longer run: it did not fit the session's budget)
DEV_SCHEDULES = [s for s in SCHEDULES if s != "option_text_replay7_x4_unclipped"]


def summarize(baseline: list[dict], rows: dict, *, n_resamples: int, seed: int) -> dict:
    """One schedule's tables: over the stream and after the burst, against the verbalized baseline and the
    constant-accuracy reference, plus the stream's counters."""
    from hf_calibration.metrics import brier_score, confidence_auroc, expected_calibration_error

    y = [r["correct"] for r in baseline]
    acc = float(np.mean(y))
    kw = dict(n_resamples=n_resamples, seed=seed)
    verbal, teacher, const = [r["verbalized"] for r in baseline], [r["norm_p_true"] for r in baseline], [acc] * len(y)
    burst = [i for i, b in enumerate(rows["burst"]) if b]
    out = {"accuracy": acc, "secl_accuracy": float(np.mean(rows["correct"])), "n": len(y),
           "verbalized": _metric_row(y, verbal, **kw), "teacher": _metric_row(y, teacher, **kw),
           "constant": _metric_row(y, const, **kw),
           "identity_restated": _metric_row(y, rows["identity"], **kw),
           "over_stream": _metric_row(y, rows["secl"], **kw), "after_burst": _metric_row(y, rows["final"], **kw),
           "after_burst_on_burst": _metric_row([y[i] for i in burst], [rows["final"][i] for i in burst], **kw),
           "n_burst": len(burst)}
    for name in ("over_stream", "after_burst"):
        conf = rows["secl" if name == "over_stream" else "final"]
        out[f"{name}_delta_auroc"] = _paired(confidence_auroc, y, conf, verbal, **kw)
        out[f"{name}_delta_ece"] = _paired(expected_calibration_error, y, conf, verbal, **kw)
        out[f"{name}_brier_minus_constant"] = _paired(brier_score, y, conf, const, **kw)
    out["trained_share"] = float(np.mean(rows["updated"]))
    out["passes_per_question"] = float(np.mean(rows["passes"]))
    return out


def held_out(result: dict, baseline: list[dict], *, n_resamples: int) -> dict | None:
    """The questions of ``result``'s stream that no step trained on (outside the burst, never updated), read with
    the adapter the pass ended with, beside the verbalized baseline, the teacher P(True)Norm and the constant
    accuracy on the same questions (each {metric: {value, low, high}}, bootstrap seeded with the seed). These are
    held out within the stream: what the adapter learnt, not what it memorised. None when fewer than 2 remain."""
    rows = result["rows"]
    keep = [i for i, (b, u) in enumerate(zip(rows["burst"], rows["updated"])) if not b and not u]
    if len(keep) < 2:
        return None
    y = [baseline[i]["correct"] for i in keep]
    kw = dict(n_resamples=n_resamples, seed=result["seed"])
    acc = float(np.mean(y))
    return {"n": len(keep), "accuracy": acc, "final": _metric_row(y, [rows["final"][i] for i in keep], **kw),
            "verbalized": _metric_row(y, [baseline[i]["verbalized"] for i in keep], **kw),
            "teacher": _metric_row(y, [baseline[i]["norm_p_true"] for i in keep], **kw),
            "constant": _metric_row(y, [acc] * len(keep), **kw)}


def run_schedule(args, name: str, seed: int, items, baseline: list[dict]) -> dict:
    """The SECL pass of schedule ``name`` on ``items`` from a fresh SECL model, then the reads with its final
    adapter; returns the per-question values and the seconds."""
    import dataclasses

    from hf_calibration.modeling import load_model
    from hf_calibration.secl.config import SECLConfig
    from hf_calibration.secl.mixin import apply_secl
    from hf_calibration.evaluation.stream import final_adapter_pass, secl_pass

    model, tokenizer = load_model(MODEL_ALIASES.get(args.model, args.model))
    torch.manual_seed(seed)
    config = SECLConfig(**{**ONE_STEP, **SCHEDULES[name]})
    secl = apply_secl(model, tokenizer, config)
    records = [{"passes": {}, "answer_ids": r["answer_ids"]} for r in baseline]
    # the identity adapter's read with this schedule's restatement (the untrained reference of the schedule): the
    # same for every schedule with that restatement, so read once per seed and kept
    cached = args.output_dir / f"identity_seed{seed}_{config.restate}.json"
    if cached.exists():
        identity = json.loads(cached.read_text(encoding="utf-8"))
    else:
        reads = [{"secl_answer_ids": r["answer_ids"]} for r in records]
        final_adapter_pass(secl, items, reads, progress=args.progress)
        identity = [r["secl_final"] for r in reads]
        cached.write_text(json.dumps(identity) + "\n", encoding="utf-8")
    start = time.perf_counter()
    counters = secl_pass(secl, items, records, max_new_tokens=args.max_new_tokens, burst_at_start=True,
                         progress=args.progress)
    pass_seconds = time.perf_counter() - start
    final_adapter_pass(secl, items, records, progress=args.progress)
    mismatch = sum(r["secl_answer_ids"] != b["answer_ids"] for r, b in zip(records, baseline))
    return {"schedule": name, "seed": seed, "config": dataclasses.asdict(config),
            "counters": counters, "pass_seconds": pass_seconds, "answers_differing_from_baseline": mismatch,
            "rows": {"secl": [r["secl"] for r in records], "final": [r["secl_final"] for r in records],
                     "identity": identity, "correct": [r["secl_correct"] for r in records],
                     "burst": [bool(r["burst"]) for r in records], "updated": [bool(r["updated"]) for r in records],
                     "passes": [r["passes"]["secl"] for r in records]}}


def read_baseline(path: Path) -> list[dict]:
    """The baseline records saved at ``path`` (one JSON object per line)."""
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


def load_baseline(args, seed: int):
    """The stream of ``seed`` and its baseline pass (saved as ``baseline_seed<seed>.jsonl``, read back if there)."""
    from hf_calibration.modeling import load_model
    from hf_calibration.modeling.streams import build_stream
    from hf_calibration.secl.config import SECLConfig
    from hf_calibration.secl.mixin import apply_secl
    from hf_calibration.evaluation.stream import baseline_pass

    model, tokenizer = load_model(MODEL_ALIASES.get(args.model, args.model))
    items = build_stream(tokenizer, args.dataset, limit_per_domain=args.limit, seed=seed, balance_gold=True)
    path = args.output_dir / f"baseline_seed{seed}.jsonl"
    if path.exists():
        return items, read_baseline(path)
    torch.manual_seed(seed)
    secl = apply_secl(model, tokenizer, SECLConfig(**ONE_STEP))  # the verbalized baseline restates the decoded answer
    records = baseline_pass(secl, items, max_new_tokens=args.max_new_tokens, progress=args.progress)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    tmp.replace(path)
    return items, records


def pick(results: list[dict], *, budget: float | None) -> str:
    """The rule fixed before the run: the highest AUROC over the stream (ties: fewer passes per question) among
    the schedules within ``budget`` passes per question (None: all)."""
    ok = [r for r in results if budget is None or r["summary"]["passes_per_question"] <= budget]
    ok = ok or results
    return max(ok, key=lambda r: (r["summary"]["over_stream"]["auroc"]["value"],
                                  -r["summary"]["passes_per_question"]))["schedule"]


def versus_default(results: list[dict], correct_by_seed: dict, *, n_resamples: int,
                   reference: str = "default") -> list[dict]:
    """Per seed, every schedule against the ``reference`` schedule on the same questions (paired bootstrap, seeded
    with the seed): ΔAUROC and ΔBrier over the stream and after the burst. ``correct_by_seed``: seed → the
    baseline's correctness."""
    from hf_calibration.metrics import brier_score, confidence_auroc

    out = []
    for r in results:
        ref = next((d for d in results if d["seed"] == r["seed"] and d["schedule"] == reference), None)
        if ref is None or r is ref or r["seed"] not in correct_by_seed:
            continue
        y, kw = correct_by_seed[r["seed"]], dict(n_resamples=n_resamples, seed=r["seed"])
        out.append({"seed": r["seed"], "schedule": r["schedule"], **{
            f"{metric}_{key}": _paired(fn, y, r["rows"][key], ref["rows"][key], **kw)
            for metric, fn in (("auroc", confidence_auroc), ("brier", brier_score)) for key in ("secl", "final")}})
    return out


def _within_budget(results: list[dict], meta: dict) -> str:
    """The report's name for the pick within the budget; ``pick`` falls back to the best of all when no
    development schedule fits, and the report says so."""
    name = meta["pick_budget"]
    fits = any(r["seed"] == meta["dev_seed"] and r["schedule"] == name
               and r["summary"]["passes_per_question"] <= PASS_BUDGET for r in results)
    return f"**{name}**" if fits else f"none (no development schedule fits; the best of all, **{name}**, stands in)"


def format_report(results: list[dict], meta: dict, versus: list[dict] | None = None,
                  held: list[dict] | None = None) -> str:
    lines = [f"# SECL online schedules: {meta['model']} on {meta['dataset']}", "",
             f"{meta['limit']} questions per stream, a burst at the start; development seed {meta['dev_seed']}, test "
             f"seed {meta['test_seed']}. " + (
                 f"Picks on the development seed (highest AUROC over the stream): within {PASS_BUDGET} "
                 f"passes/question {_within_budget(results, meta)}, without the budget **{meta['pick_any']}**."
                 if meta.get("pick_budget") else "The development seed is still running: no pick yet."), ""]
    for seed in sorted({r["seed"] for r in results}):
        sub = [r for r in results if r["seed"] == seed]
        s0 = sub[0]["summary"]
        role = "development" if seed == meta["dev_seed"] else "test"
        lines += [f"## Seed {seed} ({role}; n = {s0['n']}, accuracy {s0['accuracy']:.3f}; references: verbalized "
                  f"AUROC {_ci(s0['verbalized']['auroc'])}, ECE {_ci(s0['verbalized']['conf_ece'])}, Brier "
                  f"{_ci(s0['verbalized']['brier'])}; teacher P(True)Norm AUROC {_ci(s0['teacher']['auroc'])}; "
                  f"constant accuracy ECE {s0['constant']['conf_ece']['value']:.3f}, Brier "
                  f"{s0['constant']['brier']['value']:.4f}, AUROC 0.5)", "",
                  "| schedule | untrained AUROC (its restatement) | AUROC over the stream | ECE over the stream | Brier over "
                  "the stream | ΔAUROC vs verbalized | ΔECE vs verbalized | Brier − constant | AUROC after the burst "
                  "(all / burst questions) | ECE after the burst | Brier after the burst | trained | passes/q | "
                  "pass s |", "|" + "---|" * 14]
        for r in sub:
            s = r["summary"]
            lines.append(
                f"| {r['schedule']} | {_ci(s['identity_restated']['auroc'])} | {_ci(s['over_stream']['auroc'])} | "
                f"{_ci(s['over_stream']['conf_ece'])} | {_ci(s['over_stream']['brier'])} | "
                f"{_ci(s['over_stream_delta_auroc'])} | {_ci(s['over_stream_delta_ece'])} | "
                f"{_ci(s['over_stream_brier_minus_constant'])} | {_ci(s['after_burst']['auroc'])} / "
                f"{_ci(s['after_burst_on_burst']['auroc'])} | {_ci(s['after_burst']['conf_ece'])} | "
                f"{_ci(s['after_burst']['brier'])} | {100 * s['trained_share']:.1f} % | "
                f"{s['passes_per_question']:.2f} | {r['pass_seconds']:.0f} |")
        lines.append("")
    if versus:
        reference = meta.get("reference", "default")
        title = "the default (the one-step schedule)" if reference == "default" else reference
        lines += [f"## Against {title} on the same seed (paired bootstrap)", "",
                  "| seed | schedule | ΔAUROC over the stream | ΔAUROC after the burst | ΔBrier over the stream | "
                  "ΔBrier after the burst |", "|---|---|---|---|---|---|"]
        lines += [f"| {v['seed']} | {v['schedule']} | {_ci(v['auroc_secl'])} | {_ci(v['auroc_final'])} | "
                  f"{_ci(v['brier_secl'])} | {_ci(v['brier_final'])} |" for v in versus]
        lines.append("")
    if held:
        lines += ["## The questions no step trained on, read with the final adapter (held out within the stream)", "",
                  "| seed | schedule | n | acc | AUROC final adapter | ECE final adapter | Brier final adapter | AUROC "
                  "verbalized | AUROC P(True)Norm | Brier const. acc. |", "|" + "---|" * 10]
        lines += [f"| {h['seed']} | {h['schedule']} | {h['n']} | {h['accuracy']:.3f} | {_ci(h['final']['auroc'])} | "
                  f"{_ci(h['final']['conf_ece'])} | {_ci(h['final']['brier'])} | {_ci(h['verbalized']['auroc'])} | "
                  f"{_ci(h['teacher']['auroc'])} | {h['constant']['brier']['value']:.3f} |" for h in held]
        lines.append("")
    return "\n".join(lines)


def parse_args(argv=None):
    from hf_calibration.cli import script_parser

    ap = script_parser("python -m experiments.secl_schedule", __doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help="an alias (smollm2, qwen), a Hub id or a local folder")
    ap.add_argument("--dataset", default="halueval_qa_lm", help="one stream domain")
    ap.add_argument("--limit", type=int, default=200, help="questions in the stream")
    ap.add_argument("--dev-seed", type=int, default=0)
    ap.add_argument("--test-seed", type=int, default=1)
    ap.add_argument("--schedules", type=lambda s: [x for x in s.split(",") if x], default=DEV_SCHEDULES,
                    help="development schedules, of: " + ", ".join(SCHEDULES))
    ap.add_argument("--phase", choices=("both", "dev", "test"), default="both",
                    help="both: the development schedules, then the default and the picks on the test seed; dev: "
                         "only the first; test: the default on the test seed, and the picks once every development "
                         "schedule is done (two processes can share the folder)")
    ap.add_argument("--reference", default="default",
                    help="the schedule the report's paired table compares every other one with (default: default)")
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--n-resamples", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-progress", dest="progress", action="store_false")
    ap.add_argument("--output-dir", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.reference not in SCHEDULES:
        ap.error(f"--reference: unknown schedule {args.reference!r}")
    unknown = [s for s in args.schedules if s not in SCHEDULES]
    if unknown or args.limit < 2:
        ap.error(f"--schedules: unknown schedule {unknown[0]!r}" if unknown else f"--limit: {args.limit} (at least 2)")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    path = args.output_dir / "results.jsonl"
    meta = {"model": args.model, "dataset": args.dataset, "limit": args.limit, "dev_seed": args.dev_seed,
            "test_seed": args.test_seed, "reference": args.reference}

    def run(seed: int, names: list[str]) -> list[dict]:
        items, baseline = load_baseline(args, seed)
        for name in names:
            if any(r["seed"] == seed and r["schedule"] == name for r in _read(path)):
                continue
            result = run_schedule(args, name, seed, items, baseline)
            result["summary"] = summarize(baseline, result["rows"], n_resamples=args.n_resamples, seed=seed)
            with path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(result) + "\n")
            (args.output_dir / "report.md").write_text(format_report(_read(path), meta), encoding="utf-8")
        return [r for r in _read(path) if r["seed"] == seed and r["schedule"] in names]

    dev = run(args.dev_seed, args.schedules) if args.phase != "test" else [
        r for r in _read(path) if r["seed"] == args.dev_seed and r["schedule"] in args.schedules]
    if {r["schedule"] for r in dev} == set(args.schedules):
        meta["pick_budget"], meta["pick_any"] = pick(dev, budget=PASS_BUDGET), pick(dev, budget=None)
    if args.phase != "dev":
        run(args.test_seed, list(dict.fromkeys(["default", meta.get("pick_budget", "default"),
                                                meta.get("pick_any", "default")])))
    results = _read(path)
    baselines = {seed: read_baseline(f) for seed in {r["seed"] for r in results}
                 if (f := args.output_dir / f"baseline_seed{seed}.jsonl").exists()}
    correct = {seed: [b["correct"] for b in rows] for seed, rows in baselines.items()}
    versus = versus_default(results, correct, n_resamples=args.n_resamples, reference=args.reference)
    held = [{"seed": r["seed"], "schedule": r["schedule"], **h} for r in results if r["seed"] in baselines
            and (h := held_out(r, baselines[r["seed"]], n_resamples=args.n_resamples))]
    (args.output_dir / "report.md").write_text(format_report(results, meta, versus, held), encoding="utf-8")
    (args.output_dir / "meta.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    return {"meta": meta, "results": results, "versus_default": versus, "held_out": held}


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
