"""Where does SECL's consolidation leave the confidence level? A burst on one domain, then the level on it and on
the next domain, with a constant and a linearly decaying learning rate over the consolidation.

    python -m experiments.secl_consolidation_level --output-dir outputs/secl_consolidation_level

On SmolLM2's four-domain stream the consolidation schedule (docs/secl_results.md, seventh session) ended the
summarization-LM burst with the confidence far above its own targets (mean 0.77 on the burst against c* 0.44) and
carried it into MMLU STEM. This study isolates that step with answers and teacher fixed (adapter scope
"confidence": they do not depend on the adapter): ``--n`` questions of ``--burst-domain`` and of ``--carry-domain``
are scored once with the identity adapter (``secl_learnability.score_items``, saved item by item and resumed);
then, for each learning-rate schedule of the consolidation (``SECLConfig.consolidation_lr_scheduler``) and each
``--seeds`` seed (the consolidation's order), from the identity adapter: the burst as the stream runs it (one
update step per question, in order, on ĉ = c + α_step·clip(c* − c, −δ, δ) read just before the step, the question
then kept in the replay buffer: ``SECLBurstMixin.secl_update``), then ``SECLBurstMixin.secl_consolidation``
(``consolidation_epochs`` over the buffer). After the burst and after the consolidation every question of both
domains is read with the adapter: mean confidence against the accuracy and the mean c*, AUROC, Brier (with the
constant-accuracy Brier of the domain beside it). The schedule is the seventh session's (``SCHEDULE``).

Writes ``results.jsonl`` (one line per schedule, seed and point) and ``report.md``; a restart skips what is done.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import torch

from experiments.secl_learnability import MODEL_ALIASES, probe_layers, read_confidences, read_results, replay_items
from experiments.secl_learnability import score_items

# the consolidation schedule the seventh session ran as the default (docs/secl_results.md); the learning-rate
# schedule of its consolidation is what this study varies
SCHEDULE = dict(restate="option_text", tau_n=0.05, replay_size=50, replay_batch_size=0, consolidation_epochs=3,
                consolidation_batch_size=1)
LR_SCHEDULERS = ("constant", "linear")


def level_row(secl, sets: dict) -> dict:
    """Per domain: mean confidence, accuracy, mean c*, AUROC and Brier of the current adapter's reads."""
    from hf_calibration.metrics import confidence_auroc

    out = {}
    for name, (items, y) in sets.items():
        c = read_confidences(secl, items)
        out[name] = {"mean_confidence": float(c.mean()), "accuracy": float(y.mean()),
                     "mean_c_star": float(np.mean([i.c_star for i in items])),
                     "auroc": confidence_auroc(y, c),  # NaN on one class
                     "brier": float(np.mean((c - y) ** 2)), "brier_constant": float(y.mean() * (1 - y.mean()))}
    return out


def run_burst(secl, burst: list, seed: int, sets: dict) -> list[dict]:
    """The burst then the consolidation from the identity adapter; the level rows after each."""
    from hf_calibration.secl.replay import ReplayBuffer, directional_target, item_confidence

    cfg = secl.secl_config
    secl.reset_calibration()
    buffer = ReplayBuffer(cfg.replay_size, cfg.replay_batch_size, seed=seed)
    for item in burst:
        with torch.no_grad():
            c = float(item_confidence(secl, item)[0][0])
        current = dataclasses.replace(item, target=directional_target(c, item.c_star, alpha_step=cfg.alpha_step,
                                                                      delta=cfg.delta))
        secl.secl_update(current, buffer)
    rows = [{"point": "after the burst", **level_row(secl, sets)}]
    start = time.perf_counter()
    record = {"consolidation": secl.secl_consolidation(buffer, burst=seed)}
    rows.append({"point": "after the consolidation", **level_row(secl, sets), **record,
                 "consolidation_seconds": time.perf_counter() - start})
    return rows


def spread(results: list[dict]) -> dict:
    """Per learning-rate schedule, over the seeds, after the consolidation: mean and sd (ddof 1) of the burst's mean
    confidence minus its mean c*, of the carried domain's mean confidence, and of each domain's Brier minus its
    constant-accuracy Brier."""
    out = {}
    for scheduler in LR_SCHEDULERS:
        done = [r for r in results if r["lr_scheduler"] == scheduler and r["point"] == "after the consolidation"]
        if not done:
            continue
        values = {"burst level − mean c*": [r["burst"]["mean_confidence"] - r["burst"]["mean_c_star"] for r in done],
                  "carry mean conf": [r["carry"]["mean_confidence"] for r in done],
                  "burst Brier − const.": [r["burst"]["brier"] - r["burst"]["brier_constant"] for r in done],
                  "carry Brier − const.": [r["carry"]["brier"] - r["carry"]["brier_constant"] for r in done]}
        out[scheduler] = {"seeds": len(done), "stats": {
            k: (float(np.mean(v)), float(np.std(v, ddof=1)) if len(v) > 1 else float("nan")) for k, v in values.items()}}
    return out


def format_report(results: list[dict], meta: dict) -> str:
    table = []
    for name, v in spread(results).items():
        if not table:
            table = ["## Over the seeds, after the consolidation", "",
                     "| lr schedule | seeds | " + " | ".join(f"{k} (mean ± sd)" for k in v["stats"]) + " |",
                     "|---|---|" + "---|" * len(v["stats"])]
        table.append(f"| {name} | {v['seeds']} | " + " | ".join(f"{m:+.3f} ± {sd:.3f}" for m, sd in v["stats"].values())
                     + " |")
    if table:
        table += ["", "## Every run", ""]
    lines = [f"# Where the consolidation leaves the level: {meta['model']}, burst on {meta['burst_domain']}, "
             f"carried into {meta['carry_domain']}", "",
             f"{meta['n']} questions each; schedule {SCHEDULE}; mean confidence vs accuracy and mean c*; Brier "
             "beside the constant-accuracy Brier of the domain.", "", *table,
             "| lr schedule | seed | point | burst: mean conf | acc | mean c* | AUROC | Brier | const. Brier | "
             "carry: mean conf | acc | AUROC | Brier | const. Brier |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        b, c = r["burst"], r["carry"]
        lines.append(f"| {r['lr_scheduler']} | {r['seed']} | {r['point']} | {b['mean_confidence']:.3f} | "
                     f"{b['accuracy']:.3f} | {b['mean_c_star']:.3f} | {b['auroc']:.3f} | {b['brier']:.4f} | "
                     f"{b['brier_constant']:.4f} | {c['mean_confidence']:.3f} | {c['accuracy']:.3f} | {c['auroc']:.3f} | "
                     f"{c['brier']:.4f} | {c['brier_constant']:.4f} |")
    return "\n".join(lines) + "\n"


def parse_args(argv=None):
    from hf_calibration.cli import script_parser

    ap = script_parser("python -m experiments.secl_consolidation_level", __doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help="an alias (smollm2, qwen), a Hub id or a local folder")
    ap.add_argument("--burst-domain", default="halueval_summarization_lm", help="the burst's MCQA domain")
    ap.add_argument("--carry-domain", default="mmlu:stem", help="the domain read with the adapter the burst leaves")
    ap.add_argument("--n", type=int, default=50, help="questions of each domain (the burst takes all of its own)")
    add_run_arguments(ap, seeds=[0, 1])
    args = ap.parse_args(argv)
    if args.n < 2:
        ap.error(f"--n: must be at least 2, got {args.n}")
    check_seeds(ap, args)
    return args


def add_run_arguments(ap, *, seeds: list[int]) -> None:
    """--seeds (the consolidations' orders), --stream-seed, --threads and --output-dir, as the consolidation studies
    take them."""
    ap.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=seeds,
                    help="consolidation seeds (the order of its minibatches)")
    ap.add_argument("--stream-seed", type=int, default=1, help="which questions (build_stream's seed)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--output-dir", type=Path, required=True)


def check_seeds(ap, args) -> None:
    if not args.seeds or min(args.seeds) < 0:
        ap.error(f"--seeds: must be non-negative integers, got {args.seeds}")


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    path = args.output_dir / "results.jsonl"
    meta = {"model": args.model, "burst_domain": args.burst_domain, "carry_domain": args.carry_domain, "n": args.n}
    done = {(r["lr_scheduler"], r["seed"]) for r in read_results(path) if r["point"] == "after the consolidation"}
    todo = [(s, seed) for s in LR_SCHEDULERS for seed in args.seeds if (s, seed) not in done]
    if todo:  # else nothing to run (no model loaded): the report only
        run_all(args, todo, path, meta)
    results = read_results(path)
    (args.output_dir / "report.md").write_text(format_report(results, meta), encoding="utf-8")
    return results


def run_all(args, todo: list, path: Path, meta: dict) -> None:
    """Score both domains (resumed), the identity row once, then each (schedule, seed) of ``todo``, its rows
    appended to ``path`` and the report rewritten after each."""
    from hf_calibration.modeling import load_model
    from hf_calibration.modeling.streams import build_stream
    from hf_calibration.secl.config import SECLConfig
    from hf_calibration.secl.mixin import apply_secl

    torch.set_num_threads(args.threads)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    model, tokenizer = load_model(MODEL_ALIASES.get(args.model, args.model))
    base = SECLConfig(**{**SCHEDULE, "replay_size": args.n})
    torch.manual_seed(0)
    secl = apply_secl(model, tokenizer, base)
    layers = probe_layers(model.config.num_hidden_layers)
    sets = {}
    for name, domain in (("burst", args.burst_domain), ("carry", args.carry_domain)):
        items = build_stream(tokenizer, domain, limit_per_domain=args.n, seed=args.stream_seed, balance_gold=True)
        (args.output_dir / name).mkdir(exist_ok=True)
        rows = score_items(secl, items, args.output_dir / name / "items.jsonl", max_new_tokens=8, layers=layers)
        sets[name] = (replay_items(secl, items, rows, list(range(len(rows))), target="teacher", contexts={},
                                   tau_n=base.tau_n), np.array([r["correct"] for r in rows], dtype=int))
    if not read_results(path):
        with path.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"lr_scheduler": "none", "seed": -1, "point": "identity", **level_row(secl, sets)}) + "\n")
    for scheduler, seed in todo:
        secl.set_secl_config(dataclasses.replace(base, consolidation_lr_scheduler=scheduler))
        rows = run_burst(secl, sets["burst"][0], seed, sets)
        with path.open("a", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps({"lr_scheduler": scheduler, "seed": seed, **row}) + "\n")
        (args.output_dir / "report.md").write_text(format_report(read_results(path), meta), encoding="utf-8")

if __name__ == "__main__":
    main()
