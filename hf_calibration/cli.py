"""``hf-calibration`` command line: one subcommand per job.

Bad input prints one line ``hf-calibration: error: …`` on stderr and exits with code 2, before any
output file is written.
"""

from __future__ import annotations

import argparse
import sys
import time

from hf_calibration import reports
from hf_calibration._cli_args import (add_device_argument, as_option, input_file, load_mcqa_from_args, non_negative_int,
                                     output_dir, output_file, positive)


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)  # a prefix such as --limit must not pass for --limit-per-domain
        super().__init__(*args, **kwargs)

    def error(self, message):  # one line, exit 2 (argparse's own usage dump is several lines)
        print(f"hf-calibration: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _add_evaluate(sub):
    p = sub.add_parser(
        "evaluate",
        help="score MCQA questions with a model and report calibration metrics",
        description="Score multiple-choice questions by option-letter probabilities; write predictions.jsonl, "
        "metrics.json and reliability_diagram.png; print a table.",
    )
    p.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct",
                   help="Hub id or local folder (offline: the packaged SmolLM2 / Qwen2.5-Coder copies)")
    p.add_argument("--dataset", default="mmlu", help="mmlu, gpqa, halueval_qa or halueval_qa_lm (length-matched HaluEval)")
    p.add_argument("--subjects", default=None,
                   help="MMLU subjects and/or categories, comma-separated (stem, humanities, social_sciences, other)")
    p.add_argument("--limit", type=positive(int, "--limit"), default=500,
                   help="number of questions, stratified by subject (default 500)")
    p.add_argument("--seed", type=non_negative_int("--seed"), default=0, help="sampling seed (default 0)")
    p.add_argument("--batch-size", type=positive(int, "--batch-size"), default=8, help="questions per forward pass")
    add_device_argument(p)
    p.add_argument("--prompt-format", default="auto", choices=["auto", "chat", "plain"],
                   help="chat template or plain prompt (auto: chat when the tokenizer has a template)")
    p.add_argument("--n-resamples", type=positive(int, "--n-resamples"), default=1000,
                   help="bootstrap resamples for the 95%% intervals")
    p.add_argument("--posthoc", default=None,
                   help="a calibrator saved by `fit-posthoc`; its metrics are reported next to the uncalibrated ones")
    p.add_argument("--output-dir", required=True, help="folder for the outputs (created)")
    p.set_defaults(func=_run_evaluate)


def _add_fit_posthoc(sub):
    from hf_calibration.posthoc import CALIBRATORS

    p = sub.add_parser(
        "fit-posthoc",
        help="fit a post-hoc calibrator on the predictions.jsonl written by `evaluate`",
        description="Fit temperature/vector scaling on the option logits, or Platt/isotonic/histogram binning on "
        "the top-label confidence, and save it as JSON for `evaluate --posthoc`.",
    )
    p.add_argument("--method", required=True, choices=sorted(CALIBRATORS), help="calibrator to fit")
    p.add_argument("--predictions", required=True, help="predictions.jsonl from `hf-calibration evaluate`")
    p.add_argument("--output", required=True, help="JSON file to write the fitted calibrator to")
    p.set_defaults(func=_run_fit_posthoc)


def _run_fit_posthoc(args) -> int:
    from hf_calibration.posthoc import CALIBRATORS

    out = output_file(args.output)
    records = reports.read_predictions(input_file(args.predictions, "--predictions"))
    calibrator = CALIBRATORS[args.method]()
    if calibrator.input_kind == "logits":
        calibrator.fit(reports.option_logits_of(records, "--predictions"), [r["answer"] for r in records])
    else:
        correct = [int(r["correct"]) for r in records]
        if len(set(correct)) < 2:  # checked here so the error names the file, not the calibrator's parameter
            raise ValueError(f"--predictions: all {len(correct)} predictions in {args.predictions!r} are "
                             f"{'right' if correct[0] else 'wrong'}; {args.method} needs right and wrong ones to fit")
        calibrator.fit([r["confidence"] for r in records], correct)
    out.parent.mkdir(parents=True, exist_ok=True)
    calibrator.save(out)
    fitted = {k: v for k, v in vars(calibrator).items() if k.endswith("_") and not k.startswith("_")}
    summary = ", ".join(f"{k}={v:.4g}" for k, v in fitted.items() if isinstance(v, float))
    print(f"fitted {args.method} on {len(records)} predictions{': ' + summary if summary else ''}; wrote {out}")
    return 0


def _run_evaluate(args) -> int:
    from hf_calibration.modeling import load_model, resolve_model_path, score_mcqa

    from hf_calibration.posthoc import VectorScaler, load_calibrator

    out = output_dir(args.output_dir)
    calibrator = None
    if args.posthoc is not None:
        path = input_file(args.posthoc, "--posthoc")
        try:
            calibrator = load_calibrator(path)
        except (ValueError, TypeError, KeyError, UnicodeDecodeError) as err:
            raise ValueError(f"--posthoc: {args.posthoc!r} is not a calibrator saved by fit-posthoc ({err})") from None
    dataset = load_mcqa_from_args(args)
    if isinstance(calibrator, VectorScaler):  # one weight per option: the option count must match
        k = max(len(c) for c in dataset["choices"])
        if len(calibrator.coef_) != k:
            raise ValueError(f"--posthoc: {args.posthoc!r} was fitted on {len(calibrator.coef_)} options, but "
                             f"--dataset {args.dataset} has {k}")
    resolve_model_path(args.model)  # fails fast on a bad path before the heavy load
    start = time.perf_counter()
    model, tokenizer = load_model(args.model, device=args.device)
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    scores = score_mcqa(model, tokenizer, dataset, batch_size=args.batch_size, prompt_format=args.prompt_format)
    score_s = time.perf_counter() - start
    run = {
        "model": args.model, "dataset": args.dataset, "subjects": args.subjects, "n": len(dataset),
        "seed": args.seed, "prompt_format": scores.prompt_format, "load_seconds": round(load_s, 2),
        "scoring_seconds": round(score_s, 2),
    }
    metrics = reports.mcqa_metrics(scores, n_resamples=args.n_resamples, seed=args.seed, calibrator=calibrator)
    if calibrator is not None:
        run["posthoc"] = str(args.posthoc)
    reports.write_evaluation(out, dataset, scores, metrics, run)
    print(reports.format_mcqa_table(metrics, run))
    print(f"wrote {out / 'predictions.jsonl'}, {out / 'metrics.json'}, {out / 'reliability_diagram.png'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="hf-calibration", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_evaluate(sub)
    _add_fit_posthoc(sub)
    from hf_calibration.calm.cli import add_calm_parser
    from hf_calibration.secl.cli import add_diagnose_parser, add_secl_parser

    add_calm_parser(sub)
    add_diagnose_parser(sub)
    add_secl_parser(sub)
    from hf_calibration.experiments import add_experiment_parser

    add_experiment_parser(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, OSError) as err:  # bad values, and files that cannot be read or written
        message = str(err)
        option = "--model" if hasattr(args, "model") else "--models" if hasattr(args, "models") else None
        if option and isinstance(err, (ValueError, FileNotFoundError)):
            message = as_option(message, {"model": option})  # resolve_model_path names its parameter
        print(f"hf-calibration: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
