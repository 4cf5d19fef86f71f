"""Does a second SECL burst, where the teacher ranks poorly, undo what the first taught, and does keeping the first
burst's questions in the replay buffer (rehearsal) stop it?

    python -m experiments.secl_burst_interference --output-dir outputs/secl_burst_interference

On SmolLM2's four-domain stream with the consolidation schedule and the decaying rate (docs/secl_results.md, ninth
session) the questions of HaluEval QA-LM after its burst were read at AUROC 0.624, but the adapter the stream ended
with ranked QA-LM at 0.525: the summarization-LM burst (teacher AUROC about 0.5 there) came between. This study
isolates the two bursts with answers and teacher fixed (adapter scope "confidence"): ``--burst`` questions of
``--first-domain`` (the first burst) and ``--held-out`` more of it (never trained on), ``--burst`` questions of
``--second-domain`` (the second burst), scored once with the identity adapter (``secl_learnability.score_items``,
saved item by item and resumed). For each ``--seeds`` seed (the consolidations' order), from the identity adapter:
the first burst as the stream runs it (one update step per question on ĉ = c + α_step·clip(c* − c, −δ, δ), then
``SECLBurstMixin.secl_consolidation``), read; then from that same state (adapter and AdamW restored) two arms of
the second burst:

- "cleared": the buffer emptied when the burst opens (``SECLConfig.replay_scope`` "burst", the default), the
  consolidation over the second burst only;
- "kept": the first burst's questions stay in the buffer (``replay_scope`` "stream", ``replay_size`` 2 ×
  ``--burst``), the consolidation over both bursts (twice its passes).

After each point the held-out questions of the first domain and both bursts' own are read: mean confidence against
accuracy and mean c*, AUROC, Brier beside the constant-accuracy Brier. The schedule is the ninth session's
(``SCHEDULE``).

Writes ``results.jsonl`` (one line per seed and point) and ``report.md``; a restart skips the seeds done.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import numpy as np
import torch

from experiments.secl_consolidation_level import add_run_arguments, check_seeds, level_row
from experiments.secl_learnability import MODEL_ALIASES, probe_layers, read_results, replay_items, score_items

# the four-domain stream's schedule with the decaying consolidation rate (docs/secl_results.md, ninth session)
SCHEDULE = dict(restate="option_text", tau_n=0.05, replay_batch_size=0, consolidation_epochs=3,
                consolidation_batch_size=1, consolidation_lr_scheduler="linear")
ARMS = ("cleared", "kept")


def burst_steps(secl, burst: list, buffer) -> int:
    """One update step per question in order, as the stream runs a burst (``SECLBurstMixin.secl_update``).
    Returns the forward passes."""
    import dataclasses

    from hf_calibration.secl.replay import directional_target, item_confidence

    cfg, passes = secl.secl_config, 0
    for item in burst:
        with torch.no_grad():
            c = float(item_confidence(secl, item)[0][0])
        current = dataclasses.replace(item, target=directional_target(c, item.c_star, alpha_step=cfg.alpha_step,
                                                                      delta=cfg.delta))
        passes += 1 + secl.secl_update(current, buffer)[0]
    return passes


def run_seed(secl, sets: dict, seed: int, burst_size: int) -> list[dict]:
    """The first burst, then each arm of the second from the state it leaves; a row after each point."""
    from hf_calibration.secl.replay import ReplayBuffer

    secl.reset_calibration()
    buffer = ReplayBuffer(2 * burst_size, 0, seed=seed)
    start = time.perf_counter()
    passes = burst_steps(secl, sets["first burst"][0], buffer)
    passes += secl.secl_consolidation(buffer, burst=seed)["forward_passes"]
    rows = [{"arm": "first burst only", "point": "after the first burst", "passes": passes,
             "seconds": time.perf_counter() - start, **level_row(secl, sets)}]
    adapter = {k: v.detach().clone() for k, v in secl.secl_adapter_state().items()}
    optimizer = copy.deepcopy(secl.secl_optimizer().state_dict())
    kept_items = list(buffer.items)
    for arm in ARMS:
        secl.secl_set_adapter(adapter)
        secl.secl_optimizer().load_state_dict(copy.deepcopy(optimizer))
        buffer = ReplayBuffer(2 * burst_size, 0, seed=seed)
        if arm == "kept":
            buffer.items = list(kept_items)
        start = time.perf_counter()
        passes = burst_steps(secl, sets["second burst"][0], buffer)
        record = {"consolidation": secl.secl_consolidation(buffer, burst=seed + 1)}
        passes += record["consolidation"]["forward_passes"]
        rows.append({"arm": arm, "point": "after the second burst", "passes": passes,
                     "seconds": time.perf_counter() - start, "consolidated": record["consolidation"]["questions"],
                     **level_row(secl, sets)})
    return rows


def format_report(results: list[dict], meta: dict) -> str:
    sets = ("held-out", "first burst", "second burst")
    lines = [f"# A second burst after the first: {meta['model']}, {meta['first_domain']} then {meta['second_domain']}",
             "", f"{meta['burst']} questions per burst, {meta['held_out']} held-out of the first domain; schedule "
             f"{SCHEDULE}; Brier beside the constant-accuracy Brier of each set.", "",
             "## Over the seeds (mean ± sd)", "",
             "| arm | seeds | held-out AUROC | held-out mean conf. | held-out Brier − const. | second burst AUROC | "
             "second burst Brier − const. | passes |", "|---|---|---|---|---|---|---|---|"]
    for arm in ("identity", "first burst only", *ARMS):
        done = [r for r in results if r["arm"] == arm]
        if not done:
            continue

        def stat(f):
            v = [f(r) for r in done]
            return f"{np.mean(v):+.3f} ± {np.std(v, ddof=1) if len(v) > 1 else float('nan'):.3f}"

        lines.append(f"| {arm} | {len(done)} | {stat(lambda r: r['held-out']['auroc'])} | "
                     f"{stat(lambda r: r['held-out']['mean_confidence'])} | "
                     f"{stat(lambda r: r['held-out']['brier'] - r['held-out']['brier_constant'])} | "
                     f"{stat(lambda r: r['second burst']['auroc'])} | "
                     f"{stat(lambda r: r['second burst']['brier'] - r['second burst']['brier_constant'])} | "
                     f"{np.mean([r.get('passes', 0) for r in done]):.0f} |")
    lines += _difference_lines(results, meta)
    lines += ["", "## Every row", "", "| arm | seed | " + " | ".join(
        f"{s}: mean conf | acc | mean c* | AUROC | Brier | const." for s in sets) + " |",
              "|---|---|" + "---|" * (6 * len(sets))]
    for r in results:
        cells = [f"{r[s]['mean_confidence']:.3f} | {r[s]['accuracy']:.3f} | {r[s]['mean_c_star']:.3f} | "
                 f"{r[s]['auroc']:.3f} | {r[s]['brier']:.4f} | {r[s]['brier_constant']:.4f}" for s in sets]
        lines.append(f"| {r['arm']} | {r['seed']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def auroc_se(auc: float, n_pos: int, n_neg: int) -> float:
    """The standard error of an AUROC from ``n_pos`` positives and ``n_neg`` negatives (Hanley & McNeil 1982,
    eq. 2): SE² = [A(1−A) + (n₊−1)(Q₁−A²) + (n₋−1)(Q₂−A²)] / (n₊n₋), Q₁ = A/(2−A), Q₂ = 2A²/(1+A); NaN
    with one class or a NaN AUROC."""
    if not n_pos or not n_neg or not np.isfinite(auc):
        return float("nan")
    q1, q2 = auc / (2 - auc), 2 * auc ** 2 / (1 + auc)
    return float(np.sqrt((auc * (1 - auc) + (n_pos - 1) * (q1 - auc ** 2) + (n_neg - 1) * (q2 - auc ** 2))
                         / (n_pos * n_neg)))


def _difference_lines(results: list[dict], meta: dict) -> list[str]:
    """Held-out AUROC, each arm against "cleared": the seeds' mean difference and a 95 % interval that adds each
    arm's Hanley–McNeil variance (the held-out questions, treated as independent samples: wider than a paired
    interval) to the seeds' variance of the difference over their number."""
    base = {r["seed"]: r["held-out"]["auroc"] for r in results if r["arm"] == "cleared"}
    n = meta["held_out"]
    lines = ["", "## Held-out AUROC against 'cleared' (95 % interval: Hanley–McNeil SE of each arm, unpaired, plus "
             "the seeds' variance of the difference)", "", "| arm | seeds | held-out AUROC − cleared | interval |",
             "|---|---|---|---|"]
    for arm in ("identity", "first burst only", "kept"):
        rows = [r for r in results if r["arm"] == arm]
        if arm == "identity":  # one row, compared with every seed's cleared arm
            auc = {s: rows[0]["held-out"]["auroc"] for s in base} if rows else {}
        else:
            auc = {r["seed"]: r["held-out"]["auroc"] for r in rows if r["seed"] in base}
        if not auc:
            continue
        seeds = list(auc)
        diffs = np.array([auc[s] - base[s] for s in seeds])
        pos = round(rows[0]["held-out"]["accuracy"] * n)
        var = np.mean([auroc_se(auc[s], pos, n - pos) ** 2 + auroc_se(base[s], pos, n - pos) ** 2 for s in seeds])
        if len(diffs) > 1:
            var += np.var(diffs, ddof=1) / len(diffs)
        half = 1.96 * np.sqrt(var)
        lines.append(f"| {arm} | {len(seeds)} | {diffs.mean():+.3f} | [{diffs.mean() - half:+.3f}, "
                     f"{diffs.mean() + half:+.3f}] |")
    return lines


def parse_args(argv=None):
    from hf_calibration.cli import script_parser

    ap = script_parser("python -m experiments.secl_burst_interference", __doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help="an alias (smollm2, qwen), a Hub id or a local folder")
    ap.add_argument("--first-domain", default="halueval_qa_lm", help="the first burst's MCQA domain (strong teacher)")
    ap.add_argument("--second-domain", default="halueval_summarization_lm",
                    help="the second burst's MCQA domain (weak teacher)")
    ap.add_argument("--burst", type=int, default=50, help="questions per burst (the stream's burst_size)")
    ap.add_argument("--held-out", type=int, default=150, help="questions of the first domain never trained on")
    add_run_arguments(ap, seeds=[0, 1, 2])
    args = ap.parse_args(argv)
    for name, value in (("--burst", args.burst), ("--held-out", args.held_out)):
        if value < 2:
            ap.error(f"{name}: must be at least 2, got {value}")
    check_seeds(ap, args)
    return args


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    path = args.output_dir / "results.jsonl"
    meta = {"model": args.model, "first_domain": args.first_domain, "second_domain": args.second_domain,
            "burst": args.burst, "held_out": args.held_out}
    done = {r["seed"] for r in read_results(path) if r["arm"] == ARMS[-1]}
    todo = [seed for seed in args.seeds if seed not in done]
    if todo:  # else nothing to run (no model loaded): the report only
        run_all(args, todo, path)
    results = read_results(path)
    (args.output_dir / "report.md").write_text(format_report(results, meta), encoding="utf-8")
    return results


def run_all(args, todo: list, path: Path) -> None:
    """Score the three sets (resumed), the identity row once, then each seed of ``todo``, its rows appended to
    ``path``."""
    from hf_calibration.modeling import load_model
    from hf_calibration.modeling.streams import build_stream
    from hf_calibration.secl.config import SECLConfig
    from hf_calibration.secl.mixin import apply_secl

    torch.set_num_threads(args.threads)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    model, tokenizer = load_model(MODEL_ALIASES.get(args.model, args.model))
    config = SECLConfig(**SCHEDULE, replay_size=2 * args.burst)
    torch.manual_seed(0)
    secl = apply_secl(model, tokenizer, config)
    layers = probe_layers(model.config.num_hidden_layers)
    sets = {}
    for name, domain, n in (("first", args.first_domain, args.burst + args.held_out),
                            ("second", args.second_domain, args.burst)):
        items = build_stream(tokenizer, domain, limit_per_domain=n, seed=args.stream_seed, balance_gold=True)
        (args.output_dir / name).mkdir(exist_ok=True)
        rows = score_items(secl, items, args.output_dir / name / "items.jsonl", max_new_tokens=8, layers=layers)
        scored = replay_items(secl, items, rows, list(range(len(rows))), target="teacher", contexts={},
                              tau_n=config.tau_n)
        y = np.array([r["correct"] for r in rows], dtype=int)
        if name == "first":
            sets["first burst"] = (scored[:args.burst], y[:args.burst])
            sets["held-out"] = (scored[args.burst:], y[args.burst:])
        else:
            sets["second burst"] = (scored, y)
    if not read_results(path):
        with path.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"arm": "identity", "seed": -1, "point": "identity", **level_row(secl, sets)}) + "\n")
    for seed in todo:
        rows = run_seed(secl, sets, seed, args.burst)
        with path.open("a", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps({"seed": seed, **row}) + "\n")


if __name__ == "__main__":
    main()
