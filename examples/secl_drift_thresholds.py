"""Page-Hinkley settings of SECL's entropy gate from real entropy streams (issue 16, item 3).

    .venv/bin/python examples/secl_drift_thresholds.py --output-dir outputs/secl_drift      # SmolLM2, 600/domain

1. **Entropies.** For each domain of the stream (default: length-matched HaluEval QA → dialogue →
   summarization, then MMLU STEM) ``--per-domain`` questions are drawn (``modeling.streams.build_stream``, seed
   ``--seed``, gold letters balanced), answered greedily with the model as it is (adapter off: what the default
   ``adapter_scope="confidence"`` gate sees), and each answer's gate input is computed as ``SECLGenerationMixin``
   computes it: the mean over the answer's tokens of the next-token entropy (nats). Batched with left padding
   (``--batch-size``). Saved to ``entropies.json`` and read back on a rerun.
2. **Development half → settings.** The first half of each domain's questions is the development split. Every
   setting of the grid (``EntropyShiftDetector``'s threshold λ, δ and EMA rate; warm-up and minimum instances as
   configured) is run (a) on each domain alone (``--stationary`` questions, default 300, or the half if shorter):
   alarms there are false alarms; (b) on the stream of ``--stream-per-domain`` questions per domain in order:
   an alarm within ``--window`` questions after a boundary detects it. Chosen: the settings with no false alarm
   on any domain, then the most boundaries detected, then the smallest mean delay, then the largest λ.
3. **Test half.** The chosen settings and the current ``SECLConfig`` defaults are run on the second half the
   same way; false alarms, delays and misses are reported per domain and boundary.

Writes ``entropies.json``, ``thresholds.json`` (every setting's development counts, the choice and both
test-half reports) and ``thresholds.md`` into ``--output-dir``. The detector is exactly the one SECL runs
(``secl.drift.EntropyShiftDetector``); under the "confidence" scope the gate's input does not depend on the
adapter, so replaying the entropies offline gives the alarms the stream would raise.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

DEFAULT_STREAM = "halueval_qa_lm,halueval_dialogue_lm,halueval_summarization_lm,mmlu:stem"
GRID = {"threshold": [5.0, 8.0, 10.0, 15.0, 20.0, 30.0, 50.0], "delta": [0.1, 0.25, 0.5, 1.0],
        "ema_rate": [0.01, 0.02, 0.05]}


def answer_entropies(model, tokenizer, items, *, batch_size: int, max_new_tokens: int, progress: bool = True):
    """Mean next-token entropy (nats) of each item's greedy answer, as SECL's gate computes it."""
    import torch
    from tqdm.auto import tqdm

    from hf_calibration.secl.mixin import SECLGenerationMixin

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    stop = {t for t in (tokenizer.eos_token_id, pad, model.generation_config.eos_token_id) if isinstance(t, int)}
    if isinstance(model.generation_config.eos_token_id, list):
        stop.update(model.generation_config.eos_token_id)
    out = []
    for start in tqdm(range(0, len(items), batch_size), desc="entropies", disable=not progress):
        batch = items[start:start + batch_size]
        width = max(len(it.prompt_ids) for it in batch)
        ids = torch.tensor([[pad] * (width - len(it.prompt_ids)) + it.prompt_ids for it in batch])
        mask = torch.tensor([[0] * (width - len(it.prompt_ids)) + [1] * len(it.prompt_ids) for it in batch])
        with torch.no_grad():
            gen = model.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                                 return_dict_in_generate=True, output_scores=True, pad_token_id=pad)
        steps = SECLGenerationMixin.secl_step_entropies(gen.scores)  # (steps, batch)
        for i, answer in enumerate(gen.sequences[:, width:].tolist()):
            length = next((j for j, t in enumerate(answer) if t in stop), len(answer))
            out.append(float(steps[: max(length, 1), i].mean()))
    return out


def alarms(entropies, setting: dict, *, warmup: int, min_instances: int) -> list[int]:
    """Indices of the questions at which ``EntropyShiftDetector(**setting)`` raises an alarm."""
    from hf_calibration.secl.drift import EntropyShiftDetector

    detector = EntropyShiftDetector(ema_rate=setting["ema_rate"], delta=setting["delta"],
                                    threshold=setting["threshold"], min_instances=min_instances, warmup=warmup)
    return [t for t, h in enumerate(entropies) if detector.update(h)]


def score(split: dict, domains: list, setting: dict, *, stationary: int, stream_per_domain: int, window: int,
          warmup: int, min_instances: int) -> dict:
    """False alarms per domain alone, and per boundary of the concatenated stream the delay (None: missed)."""
    false = {d: len(alarms(split[d][:stationary], setting, warmup=warmup, min_instances=min_instances))
             for d in domains}
    stream = [h for d in domains for h in split[d][:stream_per_domain]]
    hits = alarms(stream, setting, warmup=warmup, min_instances=min_instances)
    boundaries = {}
    for k in range(1, len(domains)):
        b = k * stream_per_domain
        first = next((t for t in hits if b <= t < b + window), None)
        boundaries[f"{domains[k - 1]} → {domains[k]}"] = None if first is None else first - b
    in_domain = [t for t in hits if not any(k * stream_per_domain <= t < k * stream_per_domain + window
                                            for k in range(1, len(domains)))]
    return {"false_alarms_alone": false, "delays": boundaries, "stream_alarms": hits,
            "stream_alarms_outside_windows": len(in_domain),
            "detected": sum(v is not None for v in boundaries.values()),
            "mean_delay": (sum(v for v in boundaries.values() if v is not None)
                           / max(1, sum(v is not None for v in boundaries.values())))}


def main(argv=None):
    from hf_calibration.cli import script_parser

    p = script_parser("python examples/secl_drift_thresholds.py", __doc__.splitlines()[0])
    p.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    p.add_argument("--stream", default=DEFAULT_STREAM)
    p.add_argument("--per-domain", type=int, default=600, help="questions per domain (half development, half test)")
    p.add_argument("--per-domain-of", nargs="*", default=[], metavar="DOMAIN=N",
                   help="another size for some domains (long prompts), e.g. halueval_summarization_lm=400")
    p.add_argument("--stationary", type=int, default=300, help="questions of one domain with no shift")
    p.add_argument("--stream-per-domain", type=int, default=150, help="questions per domain in the shifting stream")
    p.add_argument("--window", type=int, default=30, help="an alarm this soon after a boundary detects it")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=8, help="the stream job's answer length")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-dir", default="outputs/secl_drift")
    args = p.parse_args(argv)

    from hf_calibration import modeling
    from hf_calibration.secl.config import SECLConfig
    from hf_calibration.modeling.streams import build_stream, parse_stream

    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    cache = out / "entropies.json"
    labels = [n if s is None else f"{n}:{s.replace(',', '+')}" for n, s in parse_stream(args.stream)]
    data = json.loads(cache.read_text()) if cache.exists() else {}
    if data.get("model") != args.model or data.get("seed") != args.seed:
        data = {"model": args.model, "seed": args.seed, "max_new_tokens": args.max_new_tokens, "entropies": {},
                "seconds": {}}
    sizes_of = {d: args.per_domain for d in labels}
    for spec in args.per_domain_of:
        name, _, n = spec.partition("=")
        if name not in sizes_of or not n.isdigit() or int(n) < 2:
            p.error(f"--per-domain-of: {spec!r} is not DOMAIN=N with DOMAIN one of {labels} and N ≥ 2")
        sizes_of[name] = int(n)
    asked = data.setdefault("asked", {})  # a domain smaller than asked (length-matched QA: 332) is complete too
    missing = [d for d in labels
               if len(data["entropies"].get(d, [])) < sizes_of[d] and asked.get(d, 0) < sizes_of[d]]
    if missing:
        model, tokenizer = modeling.load_model(args.model, device="cpu")
        for domain in missing:
            start = time.perf_counter()
            items = build_stream(tokenizer, domain, limit_per_domain=sizes_of[domain], seed=args.seed,
                                 balance_gold=True)
            data["entropies"][domain] = answer_entropies(model, tokenizer, items, batch_size=args.batch_size,
                                                         max_new_tokens=args.max_new_tokens)
            data["seconds"][domain] = round(time.perf_counter() - start, 1)
            asked[domain] = sizes_of[domain]
            cache.write_text(json.dumps(data))
            print(f"{domain}: {len(items)} entropies in {data['seconds'][domain]:.0f} s", flush=True)

    halves = {}
    for name, part in (("development", 0), ("test", 1)):
        halves[name] = {}
        for d in labels:
            h = data["entropies"][d][:sizes_of[d]]
            half = len(h) // 2
            halves[name][d] = h[:half] if part == 0 else h[half:]
    shortest = min(len(v) for v in halves["development"].values())
    sizes = dict(stationary=args.stationary, stream_per_domain=min(args.stream_per_domain, shortest),
                 window=args.window)
    defaults = SECLConfig()
    fixed = dict(warmup=defaults.warmup, min_instances=defaults.ph_min_instances)
    rows = []
    for threshold, delta, ema in itertools.product(GRID["threshold"], GRID["delta"], GRID["ema_rate"]):
        setting = {"threshold": threshold, "delta": delta, "ema_rate": ema}
        rows.append({"setting": setting, **score(halves["development"], labels, setting, **sizes, **fixed)})
    clean = [r for r in rows if sum(r["false_alarms_alone"].values()) == 0]
    pool = clean or rows
    best = min(pool, key=lambda r: (sum(r["false_alarms_alone"].values()), -r["detected"], r["mean_delay"],
                                    -r["setting"]["threshold"]))
    current = {"threshold": defaults.ph_threshold, "delta": defaults.ph_delta, "ema_rate": defaults.ema_rate}
    report = {
        "model": args.model, "stream": labels, "per_domain": sizes_of, "seed": args.seed, "sizes": sizes, "fixed": fixed, "grid": GRID,
        "entropy_seconds": data["seconds"],
        "entropy_mean_sd": {d: [float(sum(h) / len(h)), float((sum((x - sum(h) / len(h)) ** 2 for x in h)
                                                                / (len(h) - 1)) ** 0.5)]
                            for d, h in data["entropies"].items() if d in labels},
        "development": rows, "chosen": best["setting"], "no_false_alarm_settings": len(clean),
        "test": {"chosen": score(halves["test"], labels, best["setting"], **sizes, **fixed),
                 "current_defaults": score(halves["test"], labels, current, **sizes, **fixed)},
        "current_defaults": current,
    }
    (out / "thresholds.json").write_text(json.dumps(report, indent=1))
    lines = [f"# Page-Hinkley settings from real entropy streams ({args.model.split('/')[-1]})", "",
             f"Stream {' → '.join(labels)}; {args.per_domain} questions per domain (seed {args.seed}), half "
             f"development, half test ({', '.join(f'{d}: {n}' for d, n in sizes_of.items() if n != args.per_domain) or 'all domains'}"
             f" as given); a domain alone: up to {sizes['stationary']} questions (its half); the shifting stream: "
             f"{sizes['stream_per_domain']} per domain; detection window {args.window}; warm-up {fixed['warmup']}, "
             f"minimum instances {fixed['min_instances']}.", "",
             "| domain | entropy mean | sd |", "|---|---|---|"]
    for d, (m, s) in report["entropy_mean_sd"].items():
        lines.append(f"| {d} | {m:.3f} | {s:.3f} |")
    lines += ["", f"Development: {len(clean)} of {len(rows)} settings raise no false alarm on any domain alone. "
              f"Chosen: λ = {best['setting']['threshold']:g}, δ = {best['setting']['delta']:g}, EMA rate "
              f"{best['setting']['ema_rate']:g} (boundaries detected {best['detected']} of {len(labels) - 1}, mean "
              f"delay {best['mean_delay']:.1f}).", "",
              "| test half | setting | false alarms, each domain alone | delays at the boundaries (— missed) | "
              "stream alarms outside the windows |", "|---|---|---|---|---|"]
    for name, setting in (("chosen", best["setting"]), ("current_defaults", current)):
        r = report["test"][name]
        lines.append(f"| {name} | λ={setting['threshold']:g}, δ={setting['delta']:g}, EMA {setting['ema_rate']:g} | "
                     + ", ".join(f"{d}: {n}" for d, n in r["false_alarms_alone"].items()) + " | "
                     + ", ".join(f"{b}: {'—' if v is None else v}" for b, v in r["delays"].items())
                     + f" | {r['stream_alarms_outside_windows']} |")
    (out / "thresholds.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
