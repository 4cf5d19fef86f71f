"""``hf-calibration diagnose`` and ``hf-calibration secl`` subcommands.

``hf_calibration.cli`` registers them with ``add_diagnose_parser(subparsers)`` and
``add_secl_parser(subparsers)``; each sets ``func(args) -> int``. Bad values raise ValueError naming
the option (the main CLI prints one line and exits 2) before any output is written.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

from hf_calibration._cli_args import (add_device_argument, check_domains, load_mcqa_from_args, non_negative_int,
                                     output_dir, positive)


def _common(p, default_limit=None):
    p.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct",
                   help="Hub id or local folder (offline: the packaged SmolLM2 / Qwen2.5-Coder copies)")
    if default_limit is not None:
        p.add_argument("--limit", type=positive(int, "--limit"), default=default_limit,
                       help=f"number of questions (default {default_limit})")
    p.add_argument("--seed", type=non_negative_int("--seed"), default=0, help="sampling and bootstrap seed (default 0)")
    p.add_argument("--prompt-format", default="auto", choices=["auto", "chat", "plain"],
                   help="chat template or plain prompt (auto: chat when the tokenizer has a template)")
    p.add_argument("--batch-size", type=positive(int, "--batch-size"), default=8,
                   help="follow-up prompts per forward pass")
    add_device_argument(p)
    p.add_argument("--n-resamples", type=positive(int, "--n-resamples"), default=1000,
                   help="bootstrap resamples for the 95%% intervals")
    p.add_argument("--output-dir", required=True, help="folder for the outputs (created)")


# --------------------------------------------------------------------------- diagnose


def add_diagnose_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``diagnose``: the four confidence signals, their metrics and the SECL verdict."""
    p = subparsers.add_parser(
        "diagnose",
        help="measure the generation–discrimination gap: will SECL help this model?",
        description="For each MCQA question: option probability, P(True) of the predicted answer, P(True)Norm "
        "over the options, verbalized confidence and a DINCO-style score. Writes diagnosis.json, signals.jsonl "
        "and reliability_diagrams.png; prints the table and the verdict.",
    )
    p.add_argument("--dataset", default="mmlu", help="mmlu, gpqa, halueval_qa or halueval_qa_lm (length-matched HaluEval)")
    p.add_argument("--subjects", default=None,
                   help="MMLU subjects and/or categories, comma-separated (stem, humanities, social_sciences, other)")
    p.add_argument("--tau-n", type=positive(float, "--tau-n"), default=None,
                   help="temperature τ_n of P(True)Norm (default 0.2)")
    _common(p, default_limit=200)
    p.set_defaults(func=run_diagnose)
    return p


def write_diagnosis(out: Path, dataset, result: dict, signals, run: dict) -> None:
    """diagnosis.json, signals.jsonl (one record per question) and reliability_diagrams.png, atomically."""
    import matplotlib.pyplot as plt
    import numpy as np

    from hf_calibration.reports import AtomicOutputDir, write_json, write_jsonl
    from hf_calibration.secl.diagnose import plot_diagnosis

    records = []
    for i, row in enumerate(dataset):
        records.append({
            "index": i, "subject": row["subject"], "answer": int(signals.labels[i]),
            "prediction": int(signals.prediction[i]), "correct": bool(signals.correct[i]),
            **{name: float(c[i]) for name, c in signals.confidence.items()},
            "verbalized_greedy": None if np.isnan(signals.verbalized_greedy[i]) else float(signals.verbalized_greedy[i]),
            "option_probs": signals.option_probs[i].tolist(),
            "p_true_options": [None if np.isnan(v) else float(v) for v in signals.p_true_options[i]],
        })
    with AtomicOutputDir(out) as tmp:
        write_json(tmp / "diagnosis.json", {"run": run, **result})
        write_jsonl(tmp / "signals.jsonl", records)
        fig = plot_diagnosis(signals, title=f"{run['model'].split('/')[-1]} · {run['dataset']} (n={len(dataset)})")
        fig.savefig(tmp / "reliability_diagrams.png", dpi=110, bbox_inches="tight")
        plt.close(fig)


def run_diagnose(args) -> int:
    from hf_calibration.modeling import load_model, resolve_model_path
    from hf_calibration.secl.confidence import DEFAULT_TAU_N
    from hf_calibration.secl.diagnose import diagnose, format_diagnosis

    out = output_dir(args.output_dir)
    tau_n = DEFAULT_TAU_N if args.tau_n is None else args.tau_n
    dataset = load_mcqa_from_args(args)
    resolve_model_path(args.model)
    start = time.perf_counter()
    model, tokenizer = load_model(args.model, device=args.device)
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    result, signals = diagnose(model, tokenizer, dataset, tau_n=tau_n, prompt_format=args.prompt_format,
                               batch_size=args.batch_size, n_resamples=args.n_resamples, seed=args.seed)
    run = {
        "model": args.model, "dataset": args.dataset, "subjects": args.subjects, "n": len(dataset),
        "seed": args.seed, "prompt_format": signals.prompt_format, "tau_n": tau_n,
        "load_seconds": round(load_s, 1), "wall_seconds": round(time.perf_counter() - start, 1),
    }
    title = (f"{args.model} on {args.dataset}" + (f" ({args.subjects})" if args.subjects else "")
             + f": n={len(dataset)}, seed={args.seed}, prompt={signals.prompt_format}, τ_n={tau_n}, "
             f"{run['wall_seconds']:.0f} s; 95% bootstrap intervals")
    write_diagnosis(out, dataset, result, signals, run)
    print(format_diagnosis(result, title))
    print(f"wrote {out / 'diagnosis.json'}, {out / 'signals.jsonl'}, {out / 'reliability_diagrams.png'}")
    return 0


# --------------------------------------------------------------------------------------------------- secl

_CONFIG_OPTIONS = (  # (option, SECLConfig field, type)
    ("--burst-size", "burst_size", int), ("--num-distractors", "num_distractors", int), ("--tau-n", "tau_n", float),
    ("--alpha-step", "alpha_step", float), ("--delta", "delta", float), ("--bin-gate-width", "bin_gate_width", int),
    ("--learning-rate", "learning_rate", float), ("--steps-per-update", "steps_per_update", int),
    ("--lora-r", "lora_r", int), ("--ph-threshold", "ph_threshold", float), ("--ph-delta", "ph_delta", float),
    ("--ema-rate", "ema_rate", float),
)


def add_secl_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``secl``: a multi-domain stream through SECLGenerationMixin, with the baselines."""
    from dataclasses import fields

    from hf_calibration.secl.config import SECLConfig

    helps = {f.name: f.metadata.get("help", "") for f in fields(SECLConfig)}
    defaults = SECLConfig()
    p = subparsers.add_parser(
        "secl",
        help="run a question stream through SECL and compare it with the baselines",
        description="Two passes over the same stream: the baselines (verbalized, P(True), P(True)Norm, DINCO-style; "
        "Platt/TS with labels, 2-fold) and SECL online. Writes records.jsonl, metrics.json and the calibrated "
        "adapter (secl_adapter/); prints a table per domain and overall.",
    )
    p.add_argument("--stream", default="mmlu:stem,mmlu:humanities,halueval_qa",
                   help="comma-separated domains in stream order: mmlu:<category or subject, '+'-joined>, gpqa, "
                        "halueval_qa, halueval_qa_lm, gsm8k")
    p.add_argument("--limit-per-domain", type=positive(int, "--limit-per-domain"), default=50,
                   help="questions per domain (default 50)")
    p.add_argument("--max-new-tokens", type=positive(int, "--max-new-tokens"), default=8,
                   help="answer length (default 8: a letter or a number)")
    p.add_argument("--balance-gold", action="store_true",
                   help="move each MCQA question's correct option so every letter is gold equally often")
    p.add_argument("--burst-at-start", action="store_true",
                   help="open a burst at the first question (the entropy gate cannot fire during its warm-up)")
    for option, name, kind in _CONFIG_OPTIONS:
        p.add_argument(option, dest=name, type=kind, default=None,
                       help=f"{helps[name]} Default {getattr(defaults, name)}.".replace("%", "%%"))
    _common(p)
    p.set_defaults(func=run_secl)
    return p


# The labelled Platt/TS rows are 2-fold cross-fitted over the whole stream: each fold needs a question.
MIN_STREAM_QUESTIONS = 2


def check_stream(spec: str, limit_per_domain: int, *, stream_option: str = "--stream",
                 limit_option: str = "--limit-per-domain") -> None:
    """The stream's domains (``check_domains``) and its size, before any model loads; the errors name the options
    given (``experiment secl`` passes ``--datasets`` and ``--limit``)."""
    from hf_calibration.secl.stream import MCQA_DOMAINS, OPEN_DOMAINS

    check_domains(spec, stream_option, MCQA_DOMAINS + OPEN_DOMAINS)
    n_domains = len(spec.split(","))
    if limit_per_domain * n_domains < MIN_STREAM_QUESTIONS:
        raise ValueError(f"{limit_option}: the stream needs at least {MIN_STREAM_QUESTIONS} questions (the labelled "
                         f"Platt/TS baselines are 2-fold cross-fitted over it, one question per fold); got "
                         f"{limit_option} {limit_per_domain} for {n_domains} domain(s)")


def _warn_short_domains(items, limit: int) -> None:
    """One line on stderr per domain that has fewer questions than ``--limit-per-domain`` asked for."""
    import sys
    from collections import Counter

    for domain, n in Counter(item.domain for item in items).items():
        if n < limit:
            print(f"hf-calibration: warning: --limit-per-domain {limit} exceeds the {n} questions of {domain}; "
                  f"using all {n}", file=sys.stderr)


def run_secl(args) -> int:
    import json

    from hf_calibration.modeling import load_model, resolve_model_path
    from hf_calibration.reports import AtomicOutputDir, write_json, write_jsonl
    from hf_calibration.secl.config import SECLConfig
    from hf_calibration.secl.mixin import apply_secl
    from hf_calibration.secl.stream import build_stream, format_stream_summary, run_stream, summarize_stream

    out = output_dir(args.output_dir)
    check_stream(args.stream, args.limit_per_domain)
    overrides = {}
    for option, name, kind in _CONFIG_OPTIONS:
        value = getattr(args, name)
        if value is None:
            continue
        if kind is float and not math.isfinite(value):  # SECLConfig takes ph_threshold=inf; PageHinkley does not
            raise ValueError(f"{option}: must be a finite number, got {value!r}")
        SECLConfig.check_value(name, value, option)  # the error names the option, not the field
        overrides[name] = value
    config = SECLConfig(prompt_format=args.prompt_format, **overrides)
    resolve_model_path(args.model)
    start = time.perf_counter()
    model, tokenizer = load_model(args.model, device=args.device)
    load_s = time.perf_counter() - start
    model = apply_secl(model, tokenizer, config)
    items = build_stream(tokenizer, args.stream, limit_per_domain=args.limit_per_domain, seed=args.seed,
                         balance_gold=args.balance_gold,
                         prompt_format=args.prompt_format)
    _warn_short_domains(items, args.limit_per_domain)
    start = time.perf_counter()
    records = run_stream(model, items, max_new_tokens=args.max_new_tokens, burst_at_start=args.burst_at_start)
    wall = time.perf_counter() - start
    summary = summarize_stream(records, n_resamples=args.n_resamples, seed=args.seed)
    run = {"model": args.model, "stream": args.stream, "limit_per_domain": args.limit_per_domain, "n": len(items),
           "seed": args.seed, "prompt_format": model.secl_prompt_format, "max_new_tokens": args.max_new_tokens,
           "burst_at_start": args.burst_at_start, "balance_gold": args.balance_gold,
           "config": config.to_dict(), "counters": model.secl_counters, "load_seconds": round(load_s, 1),
           "wall_seconds": round(wall, 1),
           "seconds_per_question": {
               "baseline_pass": sum(r["baseline_seconds"] for r in records) / len(records),
               "secl_pass": sum(r["secl_seconds"] for r in records) / len(records)}}
    with AtomicOutputDir(out) as tmp:
        write_jsonl(tmp / "records.jsonl", records)
        write_json(tmp / "metrics.json", {"run": run, "summary": summary})
        model.save_pretrained(tmp / "secl_adapter")
    print(f"{args.model} · stream {args.stream} · {args.limit_per_domain}/domain · seed {args.seed} · "
          f"prompt {model.secl_prompt_format} · {wall:.0f} s · 95% bootstrap intervals")
    print(format_stream_summary(summary))
    print(f"counters: {json.dumps(model.secl_counters)}")
    print(f"wrote {out / 'records.jsonl'}, {out / 'metrics.json'}, {out / 'secl_adapter'}")
    return 0
