"""Page-Hinkley's detection of domain shifts on a real stream, for the gate's entropy and three other reads
(issue 51 item 3; the rule: docs/secl_results.md, section "Page-Hinkley's detection on the real stream, four
signals").

    OMP_NUM_THREADS=1 nice -n 10 python -m experiments.secl_drift_signals --output-dir outputs/secl_drift_signals
    python -m experiments.secl_drift_signals --output-dir outputs/secl_drift_signals --analyse-only

1. **Reads**, once per question, with the model as it is (identity adapter: what the default scope's gate sees):
   ``evaluation.stream.baseline_pass`` on each question of the stream (``modeling.streams.build_stream`` with the stream
   job's context fitting, gold letters balanced) gives ``entropy`` (the gate's input), ``verbalized``, ``p_true``,
   ``norm_p_true``; the option letters' next-token probabilities are read through a ``TransformersBackend``
   (``option_prob``: the largest, the option-probability read); with ``--baseline-from RECORDS`` the baseline
   pass's reads are taken from a SECL stream job's ``records.jsonl`` on the same stream and seed and only the
   option letters are read (one pass per question). Questions are read round-robin over the domains
   (the i-th of each domain, then the (i+1)-th), so a run that stops leaves equal prefixes of every domain; each
   finished question is one line of ``reads.jsonl`` and a rerun continues with the questions not in it.
2. **Sweep** (offline, seconds): ``secl.drift.EntropyShiftDetector`` over the grid on each signal, the setting
   chosen on the development half (the first half of each domain's questions), reported on the test half and the
   whole stream, with Poisson intervals on the false alarms and a bootstrap over streams (``report.json``,
   ``report.md``).
"""

from __future__ import annotations

import itertools
import json
import os
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

STREAM = "halueval_qa_lm,halueval_dialogue_lm,halueval_summarization_lm,mmlu:stem"
SIGNALS = ("entropy", "verbalized", "p_true", "norm_p_true", "option_prob")
GRID = {"threshold": [5.0, 8.0, 10.0, 15.0, 20.0, 30.0, 50.0], "delta": [0.1, 0.25, 0.5, 1.0],
        "ema_rate": [0.01, 0.02, 0.05]}
KEEP = ("domain", "n_options", "answer", "parsed", "correct", "verbalized", "verbalized_greedy", "entropy", "p_true",
        "norm_p_true", "p_true_options", "n_distractors", "passes", "baseline_seconds")


# ---------------------------------------------------------------------------------------------------- reads
def round_robin(domains: list, sizes: dict) -> list[tuple[str, int]]:
    """(domain, index within the domain) in the order the reads are made: the i-th of every domain, then i+1."""
    return [(d, i) for i in range(max(sizes.values())) for d in domains if i < sizes[d]]


def read_saved(path: Path) -> dict:
    """{(domain, index): record} of the lines of ``reads.jsonl``; a cut last line (a run killed mid-write) is
    dropped."""
    out = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                continue
            out[(r["domain"], r["index"])] = r
    return out


def make_reads(args) -> None:
    import torch

    from hf_calibration import modeling
    from hf_calibration.jobs.secl_stream import stream_context
    from hf_calibration.modeling.backends.base import TransformersBackend
    from hf_calibration.modeling.streams import build_stream
    from hf_calibration.secl import SECLConfig, apply_secl
    from hf_calibration.evaluation.stream import baseline_pass

    torch.set_num_threads(args.threads)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "reads.jsonl"
    saved = read_saved(path)
    model, tokenizer = modeling.load_model(args.model, device="cpu")
    backend = TransformersBackend(model, batch_size=1, pad_id=tokenizer.pad_token_id or 0)
    secl = apply_secl(model, tokenizer, SECLConfig())
    items = build_stream(tokenizer, args.stream, limit_per_domain=args.per_domain, seed=args.seed, balance_gold=True,
                         prompt_format=secl.secl_config.prompt_format,
                         **stream_context(secl, tokenizer, secl.secl_config, max_new_tokens=args.max_new_tokens,
                                          on_overflow="truncate"))
    by_domain: dict = {}
    for item in items:
        by_domain.setdefault(item.domain, []).append(item)
    order = round_robin(list(by_domain), {d: len(v) for d, v in by_domain.items()})
    todo = [(d, i) for d, i in order if (d, i) not in saved]
    print(f"{len(saved)} questions read before, {len(todo)} to read", flush=True)
    given = baseline_records(Path(args.baseline_from)) if args.baseline_from else None
    with path.open("a", encoding="utf-8") as f:
        for n, (domain, i) in enumerate(todo):
            item = by_domain[domain][i]
            start = time.perf_counter()
            if given is None:
                rec = baseline_pass(secl, [item], max_new_tokens=args.max_new_tokens, progress=False)[0]
            elif (domain, i) in given:
                rec = given[(domain, i)]
            else:
                raise SystemExit(f"--baseline-from: {args.baseline_from} has no question {i} of {domain}")
            probs = option_probs(backend, tokenizer, item)
            line = {"domain": domain, "index": i, **{k: rec.get(k) for k in KEEP},
                    "option_probs": probs.tolist(), "option_prob": float(probs.max()),
                    "option_correct": bool(int(np.argmax(probs)) == item.gold), "gold": item.gold,
                    "seconds": time.perf_counter() - start}
            f.write(json.dumps(line) + "\n")
            f.flush()
            if n % 20 == 0:
                print(f"{len(saved) + n + 1}/{len(order)} {domain} #{i}: {line['seconds']:.1f} s", flush=True)


def option_probs(backend, tokenizer, item) -> np.ndarray:
    """(n_options,) the option letters' next-token probabilities after ``item.prompt_ids``, renormalised over the
    options (a letter's token variants summed); one forward pass."""
    from hf_calibration.modeling.prompts import option_token_ids

    letters = option_token_ids(tokenizer, item.n_options)
    flat = [t for v in letters for t in v]
    lp = backend.next_token_logprobs([item.prompt_ids], flat).logprobs[0]
    opt, col = [], 0
    for v in letters:
        opt.append(float(np.logaddexp.reduce(lp[col:col + len(v)])))
        col += len(v)
    probs = np.exp(np.array(opt) - max(opt))
    return probs / probs.sum()


def baseline_records(path: Path) -> dict:
    """{(domain, position within the domain): record} of a SECL stream job's ``records.jsonl`` (stream order): its
    baseline pass's reads, so ``--baseline-from`` adds only the option read (one pass per question) instead of
    running the baseline pass again."""
    from experiments.common import by_domain_position, read_jsonl

    return by_domain_position(read_jsonl(path))


# ---------------------------------------------------------------------------------------------------- sweep
def alarms(values, setting: dict, *, warmup: int = 10, min_instances: int = 10) -> list[int]:
    """Indices at which ``EntropyShiftDetector(**setting)`` fed ``values`` in order raises an alarm."""
    from hf_calibration.secl.drift import EntropyShiftDetector

    det = EntropyShiftDetector(ema_rate=setting["ema_rate"], delta=setting["delta"], threshold=setting["threshold"],
                               min_instances=min_instances, warmup=warmup)
    return [t for t, x in enumerate(values) if det.update(float(x))]


def score_stream(parts: list, setting: dict, *, window: int) -> dict:
    """``parts``: each domain's values in stream order. Per boundary the delay of the first alarm within ``window``
    questions of it (None: missed); false alarms: every other alarm; in-domain questions: those outside the
    windows."""
    values = np.concatenate(parts)
    hits = alarms(values, setting)
    bounds = [int(b) for b in np.cumsum([len(p) for p in parts])[:-1]]
    delays = [next((t - b for t in hits if b <= t < b + window), None) for b in bounds]
    inside = [any(b <= t < b + window for b in bounds) for t in hits]
    ends = bounds[1:] + [len(values)]
    n_in = len(values) - sum(min(window, e - b) for b, e in zip(bounds, ends))  # windows end at the next boundary
    return {"delays": delays, "detected": sum(d is not None for d in delays), "false_alarms": len(hits) - sum(inside),
            "in_domain": int(n_in), "alarms": hits}


def garwood(count: int, exposure: float, per: float = 1000.0) -> list[float]:
    """Exact Poisson 95 % interval of a rate (count / exposure · per)."""
    from scipy.stats import chi2

    low = 0.0 if count == 0 else chi2.ppf(0.025, 2 * count) / 2
    high = chi2.ppf(0.975, 2 * count + 2) / 2
    return [float(low / exposure * per), float(high / exposure * per)]


def bootstrap(parts: list, setting: dict, *, window: int, n: int, seed: int) -> dict:
    """Replicate streams (each domain resampled with replacement to its size, shuffled; order of domains kept)."""
    rng = np.random.default_rng(seed)
    det = np.zeros((n, len(parts) - 1), dtype=bool)
    at_least_2, fa, delays = [], [], []
    for r in range(n):
        s = score_stream([rng.choice(p, size=len(p), replace=True) for p in parts], setting, window=window)
        det[r] = [d is not None for d in s["delays"]]
        at_least_2.append(s["detected"] >= 2)
        fa.append(1000.0 * s["false_alarms"] / s["in_domain"])
        delays += [d for d in s["delays"] if d is not None]
    return {"detect_share": det.mean(0).tolist(), "share_2_of_3": float(np.mean(at_least_2)),
            "median_delay": float(np.median(delays)) if delays else None,
            "fa_per_1000": [float(np.mean(fa)), float(np.percentile(fa, 2.5)), float(np.percentile(fa, 97.5))]}


def choose(rows: list) -> dict:
    """The rule's choice: detecting ≥ 2 of 3, fewest false alarms, smallest mean delay, largest λ; else most
    detected with fewest false alarms."""
    def mean_delay(r):
        d = [x for x in r["delays"] if x is not None]
        return sum(d) / len(d) if d else 1e9

    pool = [r for r in rows if r["detected"] >= 2]
    if pool:
        return min(pool, key=lambda r: (r["false_alarms"], mean_delay(r), -r["setting"]["threshold"]))
    return min(rows, key=lambda r: (-r["detected"], r["false_alarms"], mean_delay(r), -r["setting"]["threshold"]))


def summarise(parts: list, setting: dict, *, window: int, n_boot: int, seed: int) -> dict:
    s = score_stream(parts, setting, window=window)
    s.pop("alarms")
    if s["in_domain"] < 1:
        raise ValueError(f"no in-domain question outside the {window}-question windows: too few questions per domain")
    s["fa_per_1000"] = 1000.0 * s["false_alarms"] / s["in_domain"]
    s["fa_interval"] = garwood(s["false_alarms"], s["in_domain"])
    s["bootstrap"] = bootstrap(parts, setting, window=window, n=n_boot, seed=seed)
    s["meets"] = bool(s["detected"] >= 2 and s["bootstrap"]["share_2_of_3"] >= 0.5 and s["fa_per_1000"] < 1)
    return s


def analyse(args) -> dict:
    from hf_calibration.secl.config import SECLConfig

    out = Path(args.output_dir)
    saved = read_saved(out / "reads.jsonl")
    domains = list(dict.fromkeys(d for d, _ in sorted(saved, key=lambda k: (k[1], 0))))
    domains = [d for d in args.stream_labels if d in domains]
    counts = {d: 0 for d in domains}
    for d in domains:  # the prefix of consecutive indices read in each domain
        while (d, counts[d]) in saved:
            counts[d] += 1
    n = min(counts.values())
    half = n // 2
    defaults = SECLConfig()
    current = {"threshold": defaults.ph_threshold, "delta": defaults.ph_delta, "ema_rate": defaults.ema_rate}
    report = {"stream": domains, "per_domain": n, "half": half, "window": args.window, "grid": GRID,
              "current_defaults": current, "signals": {}, "domain_mean_sd": {}}
    for sig in SIGNALS:
        vals = {d: np.array([saved[(d, i)][sig] for i in range(n)], dtype=float) for d in domains}
        report["domain_mean_sd"][sig] = {d: [float(v.mean()), float(v.std(ddof=1))] for d, v in vals.items()}
        dev = [vals[d][:half] for d in domains]
        test = [vals[d][half:] for d in domains]
        full = [vals[d] for d in domains]
        rows = []
        for th, de, ema in itertools.product(GRID["threshold"], GRID["delta"], GRID["ema_rate"]):
            setting = {"threshold": th, "delta": de, "ema_rate": ema}
            r = score_stream(dev, setting, window=args.window)
            r.pop("alarms")
            rows.append({"setting": setting, **r})
        best = choose(rows)
        report["signals"][sig] = {
            "development": rows, "chosen": best["setting"], "chosen_development": best,
            "development_2_of_3": sum(r["detected"] >= 2 for r in rows),
            **{f"{part}_{name}": summarise(p, setting, window=args.window, n_boot=args.n_boot, seed=args.seed)
               for part, p in (("test", test), ("full", full))
               for name, setting in (("chosen", best["setting"]), ("defaults", current))}}
    (out / "report.json").write_text(json.dumps(report, indent=1))
    (out / "report.md").write_text(format_report(report))
    print(format_report(report))
    return report


def _delays(ds) -> str:
    return ", ".join("—" if d is None else str(d) for d in ds)


def format_report(rep: dict) -> str:
    lines = [f"Stream {' → '.join(rep['stream'])}: {rep['per_domain']} per domain (development / test halves "
             f"{rep['half']} / {rep['per_domain'] - rep['half']}); window {rep['window']}.", "",
             "| signal | " + " | ".join(rep["stream"]) + " |", "|---" * (len(rep["stream"]) + 1) + "|"]
    for sig, per in rep["domain_mean_sd"].items():
        lines.append(f"| {sig} | " + " | ".join(f"{m:.3f} ± {s:.3f}" for m, s in per.values()) + " |")
    lines += ["", "| signal | setting (λ, δ, EMA) | part | delays (— missed) | false alarms / in-domain | per 1,000 "
              "[Poisson 95 %] | bootstrap: share detecting each boundary | ≥ 2 of 3 | median delay | per 1,000 "
              "[2.5, 97.5 %] | meets |", "|---" * 11 + "|"]
    for sig, r in rep["signals"].items():
        for key in ("test_chosen", "full_chosen", "test_defaults", "full_defaults"):
            part, name = key.split("_")
            st = r["chosen"] if name == "chosen" else rep["current_defaults"]
            s, b = r[key], r[key]["bootstrap"]
            lines.append(
                f"| {sig} | {name}: {st['threshold']:g}, {st['delta']:g}, {st['ema_rate']:g} | {part} | "
                f"{_delays(s['delays'])} | {s['false_alarms']} / {s['in_domain']} | {s['fa_per_1000']:.1f} "
                f"[{s['fa_interval'][0]:.1f}, {s['fa_interval'][1]:.1f}] | "
                + ", ".join(f"{x:.2f}" for x in b["detect_share"])
                + f" | {b['share_2_of_3']:.2f} | {b['median_delay'] if b['median_delay'] is not None else '—'} | "
                f"{b['fa_per_1000'][0]:.1f} [{b['fa_per_1000'][1]:.1f}, {b['fa_per_1000'][2]:.1f}] | "
                f"{'yes' if s['meets'] else 'no'} |")
    lines += ["", "Development: settings detecting ≥ 2 of 3 boundaries: "
              + ", ".join(f"{sig} {r['development_2_of_3']} of {len(r['development'])}"
                          for sig, r in rep["signals"].items()) + "."]
    return "\n".join(lines) + "\n"


def main(argv=None):
    from hf_calibration.cli import script_parser
    from hf_calibration.modeling.streams import parse_stream

    p = script_parser("python -m experiments.secl_drift_signals", __doc__.splitlines()[0])
    p.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    p.add_argument("--stream", default=STREAM)
    p.add_argument("--per-domain", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=8, help="the stream job's answer length")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--window", type=int, default=25, help="an alarm this soon after a boundary detects it")
    p.add_argument("--n-boot", type=int, default=1000, help="bootstrap replicate streams")
    p.add_argument("--output-dir", default="outputs/secl_drift_signals")
    p.add_argument("--analyse-only", action="store_true", help="only the sweep, on the reads saved so far")
    p.add_argument("--baseline-from", default=None, metavar="RECORDS",
                   help="a SECL stream job's records.jsonl on the same stream and seed: take its baseline reads and "
                        "read only the option letters (default: run the baseline pass here)")
    args = p.parse_args(argv)
    if args.baseline_from is not None and not Path(args.baseline_from).is_file():
        p.error(f"--baseline-from: no file {args.baseline_from}")
    args.stream_labels = [n if s is None else f"{n}:{s.replace(',', '+')}" for n, s in parse_stream(args.stream)]
    if not args.analyse_only:
        make_reads(args)
    return analyse(args)


if __name__ == "__main__":
    main()
