"""``hf-calibration experiment NAME``: the project's headline tables, one command each (SPEC §5).

Each experiment runs its sub-runs (one per model × dataset, or one stream, or one training method)
into ``results/NAME/<sub-run>/`` with per-item JSONL, a metrics JSON and reliability-diagram PNGs,
then writes ``results/NAME/metrics.json`` and ``results/NAME/table.md`` and prints the table. A
sub-run whose metrics file already exists is read back, not recomputed, so an interrupted experiment
resumes where it stopped (``--overwrite`` recomputes). Every table carries the constant-accuracy
reference and AUROC next to ECE, with 95 % bootstrap intervals; sizes, seeds and wall times are
printed with it.

- ``diagnose``: the generation–discrimination gap (verbalized confidence vs P(True)/P(True)Norm) of
  SmolLM2-135M-Instruct and Qwen2.5-Coder-0.5B-Instruct on MMLU (gold position balanced), HaluEval QA
  (full and length-matched) and GSM8K (open-ended).
- ``secl``: a Qwen stream over length-matched HaluEval, GSM8K and an MMLU group through SECL, with the
  label-free baselines and supervised Platt/TS (``hf-calibration secl``).
- ``calm``: Qwen + LoRA trained on one domain, tested in and out of domain, CALM against SFT, TS and
  the other baselines (``hf_calibration.calm.experiment``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from hf_calibration._cli_args import add_device_argument, check_domains, non_negative_int, output_dir, positive

MODEL_ALIASES = {
    "smollm2": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "qwen": "Qwen/Qwen2.5-Coder-0.5B-Instruct",
}
DIAGNOSE_DATASETS = ("mmlu", "halueval_qa", "halueval_qa_lm", "gsm8k")

# The sizes of the recorded runs (README "Results"); each experiment finishes in about an hour on 2 CPU cores.
DEFAULTS = {
    "diagnose": {"models": "smollm2,qwen", "datasets": ",".join(DIAGNOSE_DATASETS), "limit": 100, "limit_open": 40},
    "secl": {"models": "qwen", "datasets": "halueval_qa_lm,gsm8k,mmlu:stem", "limit": 40},
    "calm": {"models": "qwen", "datasets": "halueval_qa_lm", "limit": None},
}


def _alias(model: str) -> str:
    for alias, name in MODEL_ALIASES.items():
        if model == name:
            return alias
    return Path(model.rstrip("/")).name.replace("/", "_") or "model"


def _models(text: str) -> list[str]:  # text is non-empty: run_experiment rejects an empty --models
    return [MODEL_ALIASES.get(m.strip(), m.strip()) for m in text.split(",") if m.strip()]


def add_experiment_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``experiment NAME``."""
    p = subparsers.add_parser(
        "experiment",
        help="reproduce a headline table (diagnose, secl, calm) into results/NAME/",
        description=__doc__.split("\n\n")[1],
    )
    p.add_argument("name", choices=sorted(DEFAULTS), help="which table")
    p.add_argument("--output-dir", default=None, help="folder for the results (default results/NAME)")
    p.add_argument("--models", default=None,
                   help="comma-separated model ids or aliases (smollm2, qwen); default per experiment: "
                        + "; ".join(f"{k}: {v['models']}" for k, v in DEFAULTS.items()))
    p.add_argument("--datasets", default=None,
                   help="comma-separated datasets (diagnose), stream domains (secl) or the training domain "
                        "(calm); default per experiment: "
                        + "; ".join(f"{k}: {v['datasets']}" for k, v in DEFAULTS.items()))
    p.add_argument("--limit", type=positive(int, "--limit"), default=None,
                   help="questions per dataset or stream domain (diagnose: 100, secl: 40)")
    p.add_argument("--limit-open", type=positive(int, "--limit-open"), default=None,
                   help="diagnose only: GSM8K problems (default 40; each costs a generation, a beam search for the "
                        "alternatives and their P(True) reads, several times an MCQA question)")
    p.add_argument("--seed", type=non_negative_int("--seed"), default=0, help="sampling and bootstrap seed (default 0)")
    p.add_argument("--batch-size", type=positive(int, "--batch-size"), default=8, help="prompts per forward pass")
    add_device_argument(p)
    p.add_argument("--n-resamples", type=positive(int, "--n-resamples"), default=1000,
                   help="bootstrap resamples for the 95%% intervals (default 1000)")
    p.add_argument("--overwrite", action="store_true", help="recompute sub-runs that already have results")
    p.add_argument("--calm-args", default="",
                   help="calm only: extra options for hf_calibration.calm.experiment, e.g. \"--n-train 64 --max-steps 16\"")
    p.set_defaults(func=run_experiment)
    return p


def run_experiment(args) -> int:
    defaults = DEFAULTS[args.name]
    for option in ("output_dir", "models", "datasets"):  # given but empty: an error, not the default
        value = getattr(args, option)
        if value is not None and not value.replace(",", "").strip():
            raise ValueError(f"--{option.replace('_', '-')}: must not be empty, got {value!r}")
    if args.calm_args and args.name != "calm":
        raise ValueError(f"--calm-args: only the calm experiment takes it, got --calm-args {args.calm_args!r} "
                         f"for {args.name}")
    out = output_dir(args.output_dir or str(Path("results") / args.name))
    models = _models(args.models or defaults["models"])
    datasets = [d.strip() for d in (args.datasets or defaults["datasets"]).split(",") if d.strip()]
    limit = args.limit or defaults["limit"]
    if args.name == "diagnose":
        if args.limit_open is not None and "gsm8k" not in datasets:
            raise ValueError(f"--limit-open: sizes GSM8K, which --datasets {','.join(datasets)} leaves out; got "
                             f"--limit-open {args.limit_open}")
        limits = {d: (args.limit_open or defaults["limit_open"]) if d == "gsm8k" else limit for d in datasets}
        return _diagnose(out, models, datasets, limits, args)
    if args.limit_open is not None:
        raise ValueError(f"--limit-open: only diagnose has an open-ended dataset size, got --limit-open {args.limit_open}")
    if args.name == "secl":
        return _secl(out, models, ",".join(datasets), limit, args)
    from hf_calibration.calm import experiment as calm
    from hf_calibration.data import MCQA_DATASETS
    from hf_calibration.modeling import resolve_model_path

    if len(datasets) != 1:
        raise ValueError(f"--datasets: calm trains on one domain, got {len(datasets)}: {datasets}")
    check_domains(datasets[0], "--datasets", sorted(MCQA_DATASETS))  # named here, not as a --calm-args error
    if len(models) != 1:
        raise ValueError(f"--models: calm trains one model, got {len(models)}: {models}")
    import shlex

    if args.limit is not None:
        raise ValueError(f"--limit: calm takes its split sizes from --calm-args (e.g. \"--n-ood 40\"), got --limit {args.limit}")
    try:
        extra = shlex.split(args.calm_args)
    except ValueError as err:  # e.g. an unbalanced quote
        raise ValueError(f"--calm-args: {err}, got {args.calm_args!r}") from None
    argv = ["all", "--model", models[0], "--train-domain", datasets[0], "--output-dir", str(out), "--balance-gold",
            "--seed", str(args.seed), "--n-resamples", str(args.n_resamples), "--device", args.device,
            *CALM_SIZES.split(),
            *extra]
    try:
        calm_args, splits = calm.check_args(argv)
    except ValueError as err:
        raise ValueError(f"--calm-args: {err}") from None
    resolve_model_path(models[0])  # here, so its errors name --models (main), not --calm-args
    code = calm.run(calm_args, splits)
    if code == 0:  # the same names as the other experiments
        (out / "metrics.json").write_text((out / "report.json").read_text())
        (out / "table.md").write_text((out / "report.md").read_text())
    return code


# The recorded Qwen run: sized so nine methods fit in about an hour on one idle CPU core (measured:
# ≈ 2 s per scored question, ≈ 20 s per SFT step, the bilevel methods up to 2.5× that): seven trainings of
# 8 steps (one pass over S_T), eight scorings of the validation, test and OOD sets. Too small for the
# intervals to separate methods.
CALM_SIZES = ("--n-train 32 --n-calibration 32 --n-validation 20 --n-test 30 --n-ood 20 --max-steps 8 "
              "--batch-size 4 --eval-batch-size 8 --learning-rate 1e-3 --alpha-learning-rate 5e-2")


# --------------------------------------------------------------------------------------------- diagnose


def _check_folders(folders) -> None:
    """Every sub-run folder must be creatable (no file in the way) before the first model loads, not when its
    results are written at the end of a run; the error names --output-dir, whose value each folder starts with."""
    for folder in folders:
        output_dir(str(folder))


def _check_datasets(datasets):
    for d in datasets:
        if d not in DIAGNOSE_DATASETS + ("gpqa",):
            raise ValueError(f"--datasets: unknown dataset {d!r} for diagnose; choose from "
                             f"{', '.join(DIAGNOSE_DATASETS + ('gpqa',))}")


def length_only_accuracy(dataset) -> float:
    """Accuracy of "pick the shortest option" (characters) on an MCQA dataset: the HaluEval length control."""
    picks = [int(np.argmin([len(c) for c in row["choices"]])) for row in dataset]
    return float(np.mean([p == row["answer"] for p, row in zip(picks, dataset)]))


def _diagnose_mcqa(model_name, model, tokenizer, name, dest, limit, args) -> dict:
    from hf_calibration.data import load_mcqa
    from hf_calibration.secl.cli import write_diagnosis
    from hf_calibration.secl.diagnose import diagnose

    dataset = load_mcqa(name, limit=limit, seed=args.seed, balance_gold=True)
    start = time.perf_counter()
    result, signals = diagnose(model, tokenizer, dataset, batch_size=args.batch_size,
                               n_resamples=args.n_resamples, seed=args.seed)
    run = {"model": model_name, "dataset": name, "subjects": None, "n": len(dataset), "seed": args.seed,
           "balance_gold": True, "prompt_format": signals.prompt_format, "tau_n": signals.tau_n,
           "wall_seconds": round(time.perf_counter() - start, 1), "length_only_accuracy": length_only_accuracy(dataset)}
    write_diagnosis(dest, dataset, result, signals, run)
    return {"run": run, **result}


def _diagnose_open(model_name, model, tokenizer, name, dest, limit, args) -> dict:
    """GSM8K: the baseline pass of the SECL stream (greedy answer, verbalized, P(True), P(True)Norm over beams)."""
    from hf_calibration.reports import AtomicOutputDir, write_json, write_jsonl
    from hf_calibration.secl.config import SECLConfig
    from hf_calibration.secl.diagnose import generation_discrimination_gap
    from hf_calibration.secl.mixin import SECLGenerationMixin, apply_secl
    from hf_calibration.secl.stream import BASELINE_ROWS, build_stream, run_stream, summarize_stream

    if not isinstance(model, SECLGenerationMixin):
        apply_secl(model, tokenizer, SECLConfig())
    items = build_stream(tokenizer, name, limit_per_domain=limit, seed=args.seed)
    start = time.perf_counter()
    records = run_stream(model, items, baseline_only=True)
    wall = time.perf_counter() - start
    rows = tuple(r for r in BASELINE_ROWS if r not in ("platt", "temperature"))
    summary = summarize_stream(records, n_resamples=args.n_resamples, seed=args.seed, signals=rows)[name]
    y = np.array([r["correct"] for r in records])
    result = {
        "signals": summary["signals"], "references": summary["references"],
        "gap": generation_discrimination_gap(y, [r["verbalized"] for r in records], [r["norm_p_true"] for r in records],
                                             n_resamples=args.n_resamples, seed=args.seed),
    }
    run = {"model": model_name, "dataset": name, "n": len(items), "seed": args.seed,
           "prompt_format": model.secl_prompt_format, "wall_seconds": round(wall, 1)}
    with AtomicOutputDir(dest) as tmp:
        write_jsonl(tmp / "records.jsonl", records)
        write_json(tmp / "diagnosis.json", {"run": run, **result})
        _plot_signals(tmp / "reliability_diagrams.png", y, {s: [r[s] for r in records] for s in rows},
                      f"{_alias(model_name)} · {name} (n={len(items)})")
    return {"run": run, **result}


def _titles() -> dict:
    """Display names of every signal: the diagnose table's and the stream's (one home each)."""
    from hf_calibration.secl.diagnose import SIGNAL_NAMES as DIAGNOSE_NAMES
    from hf_calibration.secl.stream import SIGNAL_NAMES as STREAM_NAMES

    return {**DIAGNOSE_NAMES, **STREAM_NAMES}


def _plot_signals(path: Path, correct, signals: dict, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hf_calibration.plotting import plot_reliability_diagram

    titles = _titles()
    fig, axes = plt.subplots(1, len(signals), figsize=(4.0 * len(signals), 4.0), squeeze=False)
    for ax, (name, conf) in zip(axes[0], signals.items()):
        plot_reliability_diagram(np.asarray(correct, dtype=int), np.asarray(conf, dtype=float), n_bins=15, ax=ax,
                                 title=titles.get(name, name))
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def _signed(d) -> str:
    if d.get("value") is None or not np.isfinite(d["value"]):
        return "—"
    if d.get("low") is None:
        return f"{d['value']:+.3f}"
    return f"{d['value']:+.3f} [{d['low']:+.3f},{d['high']:+.3f}]"


def diagnose_table(results: dict) -> str:
    """Markdown: one row per model × dataset × signal (acc, conf, ECE, Brier, AUROC), references, gaps."""
    from hf_calibration.reports import _fmt, format_table
    from hf_calibration.secl.stream import STREAM_COLUMNS

    titles = _titles()
    blocks = []
    summary = ["| model | dataset | n | acc | length-only acc | ECE verbalized | ECE P(True)Norm | AUROC verbalized "
               "| AUROC P(True) | AUROC P(True)Norm | ΔAUROC (Norm − verb.) | verdict |", "|" + "---|" * 12]
    for alias, per_dataset in results.items():
        for name, res in per_dataset.items():
            run = res["run"]
            rows = {titles.get(k, k): v for k, v in res["signals"].items()}
            rows.update({f"ref: {k}": v for k, v in res["references"].items()})
            length = run.get("length_only_accuracy")
            head = (f"**{alias} · {name}** (n={run['n']}, seed {run['seed']}, {run['wall_seconds']:.0f} s"
                    + (f"; pick-the-shorter-answer accuracy {length:.3f}" if length is not None else "") + ")")
            gap = dict(res["gap"])
            acc = res["signals"]["verbalized"]["accuracy"]["value"]
            if acc in (0.0, 1.0):  # one class: no ranking to measure, so no verdict
                gap["verdict"] = f"undefined (accuracy {acc:.0f}: AUROC needs right and wrong answers)"
            blocks.append(head + "\n\n" + format_table(rows, columns=STREAM_COLUMNS, markdown=True)
                          + f"\n\nΔAUROC {_signed(gap['delta_auroc'])}, ΔECE {_signed(gap['delta_ece'])} → "
                          f"**{gap['verdict']}**")
            s = res["signals"]
            summary.append(
                f"| {alias} | {name} | {run['n']} | {_fmt(s['verbalized']['accuracy'])} | "
                + ("—" if length is None else f"{length:.3f}")
                + f" | {_fmt(s['verbalized']['conf_ece'])} | {_fmt(s['norm_p_true']['conf_ece'])} | "
                f"{_fmt(s['verbalized']['auroc'])} | {_fmt(s['p_true']['auroc'])} | {_fmt(s['norm_p_true']['auroc'])} | "
                f"{_signed(gap['delta_auroc'])} | {gap['verdict']} |")
    return "\n".join(summary) + "\n\n" + "\n\n".join(blocks)


def _diagnose(out: Path, models, datasets, limits: dict, args) -> int:
    from hf_calibration.modeling import load_model, resolve_model_path

    _check_datasets(datasets)
    _check_folders(out / _alias(m) / d for m in models for d in datasets)
    for m in models:
        resolve_model_path(m)
    results: dict = {}
    start = time.perf_counter()
    for model_name in models:
        alias = _alias(model_name)
        results[alias] = {}
        model = tokenizer = None
        for name in sorted(datasets, key=lambda d: d == "gsm8k"):  # MCQA before SECL's adapters are added
            dest = out / alias / name
            if (dest / "diagnosis.json").exists() and not args.overwrite:
                results[alias][name] = json.loads((dest / "diagnosis.json").read_text())
                print(f"{alias} · {name}: read {dest / 'diagnosis.json'}", flush=True)
                continue
            if model is None:
                model, tokenizer = load_model(model_name, device=args.device)
            run = _diagnose_open if name == "gsm8k" else _diagnose_mcqa
            results[alias][name] = run(model_name, model, tokenizer, name, dest, limits[name], args)
            print(f"{alias} · {name}: {results[alias][name]['run']['wall_seconds']:.0f} s → {dest}", flush=True)
        del model
    return _finish(out, "diagnose", results, diagnose_table(results), models, datasets, limits, args, start)


def _finish(out: Path, name, results, table, models, datasets, limit, args, start) -> int:
    from hf_calibration.reports import write_json

    sub_runs = [r["run"] for per in results.values() for r in (per.values() if name == "diagnose" else [per])]
    run = {"experiment": name, "models": models, "datasets": datasets, "limit": limit, "seed": args.seed,
           "n_resamples": args.n_resamples, "wall_seconds_this_invocation": round(time.perf_counter() - start, 1),
           "wall_seconds_sub_runs": round(sum(r.get("wall_seconds", 0.0) for r in sub_runs), 1),
           "command": "hf-calibration " + " ".join(sys.argv[1:]) if sys.argv else None}
    write_json(out / "metrics.json", {"run": run, "results": results})
    header = (f"experiment {name}: models {', '.join(_alias(m) for m in models)}; datasets {', '.join(datasets)}; "
              f"questions per dataset {limit}; seed {args.seed}; 95% bootstrap intervals ({args.n_resamples} resamples); "
              f"sub-runs {run['wall_seconds_sub_runs']:.0f} s of compute as recorded when they ran, "
              f"this invocation {run['wall_seconds_this_invocation']:.0f} s")
    (out / "table.md").write_text(header + "\n\n" + table + "\n")
    print(header)
    print(table)
    print(f"wrote {out / 'metrics.json'}, {out / 'table.md'}")
    return 0


# ------------------------------------------------------------------------------------------------ secl


SECL_SIGNALS = ("verbalized", "p_true", "norm_p_true", "dinco", "secl", "platt", "temperature")


def secl_table(results: dict) -> str:
    """Markdown: per model and stream domain, one row per signal with the SECL shares and costs."""
    from hf_calibration.reports import format_table
    from hf_calibration.secl.stream import STREAM_COLUMNS

    titles = _titles()
    blocks = []
    for alias, res in results.items():
        run = res["run"]
        counters = run.get("counters", {})
        blocks.append(f"**{alias}**: stream {run['stream']}, {run['limit_per_domain']}/domain, seed {run['seed']}, "
                      f"burst at start {run['burst_at_start']}, {run['wall_seconds']:.0f} s (both passes); "
                      f"counters {json.dumps(counters)}")
        for domain, s in res["summary"].items():
            rows = {titles[k]: v for k, v in s["signals"].items()}
            rows.update({f"ref: {k}": v for k, v in s["references"].items()})
            verb, secl = s["signals"]["verbalized"]["conf_ece"]["value"], s["signals"]["secl"]["conf_ece"]["value"]
            cut = f"{(verb - secl) / verb:+.0%}" if verb > 0 else "—"
            blocks.append(
                f"[{domain}] n={s['n']}: trained on {s['share_trained']:.0%} of the questions (in burst "
                f"{s['share_in_burst']:.0%}, bin-gate skips {s['skipped_by_bin_gate']}, alarms {s['alarms']}); "
                f"SECL ECE cut vs verbalized {cut}; accuracy change {s['accuracy_change_secl']:+.3f}\n\n"
                + format_table(rows, columns=STREAM_COLUMNS, markdown=True))
    return "\n\n".join(blocks)


def _secl(out: Path, models, stream: str, limit, args) -> int:
    from hf_calibration.cli import main as cli_main
    from hf_calibration.modeling import resolve_model_path
    from hf_calibration.secl.cli import check_stream

    check_stream(stream, limit, stream_option="--datasets", limit_option="--limit")
    _check_folders(out / _alias(m) for m in models)
    for m in models:
        resolve_model_path(m)  # its errors name --models (main); the secl subcommand's would name --model
    results = {}
    start = time.perf_counter()
    for model_name in models:
        alias = _alias(model_name)
        dest = out / alias
        if not (dest / "metrics.json").exists() or args.overwrite:
            code = cli_main(["secl", "--model", model_name, "--stream", stream, "--limit-per-domain", str(limit),
                             "--balance-gold", "--burst-at-start", "--seed", str(args.seed),
                             "--batch-size", str(args.batch_size), "--n-resamples", str(args.n_resamples),
                             "--device", args.device, "--output-dir", str(dest)])
            if code:
                return code
        results[alias] = json.loads((dest / "metrics.json").read_text())
        records = [json.loads(line) for line in (dest / "records.jsonl").read_text().splitlines()]
        for domain in dict.fromkeys(r["domain"] for r in records):
            sub = [r for r in records if r["domain"] == domain]
            png = dest / f"reliability_{domain.replace(':', '_').replace('+', '_')}.png"
            if not png.exists() or args.overwrite:
                signals = {k: [r[k] for r in sub] for k in ("verbalized", "p_true", "norm_p_true", "dinco")}
                signals["secl"] = [r["secl"] for r in sub]
                _plot_signals(png, [r["correct"] for r in sub], signals, f"{alias} · {domain} (n={len(sub)})")
    datasets = [d for d in stream.split(",")]
    return _finish(out, "secl", results, secl_table(results), models, datasets, limit, args, start)
