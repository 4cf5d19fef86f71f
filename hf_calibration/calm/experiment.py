"""CALM with LoRA compared with the paper's baselines and ablations on the same splits (SPEC §1, §5).

Train on one domain (``--train-domain``: an MMLU group such as ``mmlu:stem``, or ``halueval_qa_lm``,
``halueval_qa``, ``gpqa``): S_T for training, S_V (labels unused) for the entropy, a labelled
validation split (post-hoc TS fitting, the constant-accuracy reference), an in-domain test split;
out of domain: ``--ood-domains`` (default for an MMLU group: the other MMLU categories, GPQA-Diamond
and HaluEval QA; for a HaluEval or GPQA domain: MMLU STEM and full HaluEval QA). ``--balance-gold``
balances the gold position across letters in every set (GPQA and HaluEval are balanced anyway; MMLU
keeps its original order without it, as in docs/calm_results.md). Every method starts from the same base model and sees the same
data in the same order.

Two phases, so a long run can be resumed: ``train`` writes ``<output>/scores/<method>.npz`` (option
log-scores per split) and skips methods already scored; ``report`` builds the table (``report.md``,
``report.json``, reliability diagrams ``reliability_<split>.png``) from them.

    python -m hf_calibration.calm.experiment --output-dir runs/calm_mmlu --n-train 320 --max-steps 40
    hf-calibration experiment calm          # Qwen2.5-Coder-0.5B on length-matched HaluEval (README "Results")
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

METHODS = ("uncalibrated", "ts", "sft", "label_smoothing", "cft", "bome", "iterate", "regularization", "scalar")
MMLU_OOD = "mmlu:humanities,mmlu:social_sciences,mmlu:other,gpqa,halueval_qa"
OTHER_OOD = "mmlu:stem,halueval_qa"


def _load_domain(spec: str, *, limit=None, seed=0, balance_gold=False):
    """``mmlu:<categories or subjects, '+'-joined>`` or a ``load_mcqa`` name."""
    from hf_calibration.data import load_mcqa

    name, _, subjects = spec.partition(":")
    return load_mcqa(name, subjects=subjects.replace("+", ",") or None, limit=limit, seed=seed,
                     balance_gold=balance_gold)


def split_key(spec: str) -> str:
    """A domain spec as a file/array key: "mmlu:stem" → "mmlu_stem"."""
    return spec.replace(":", "_").replace("+", "_")


def _ood_specs(args) -> list[str]:
    text = args.ood_domains or (MMLU_OOD if args.train_domain.startswith("mmlu") else OTHER_OOD)
    return [d.strip() for d in text.split(",") if d.strip()]


def ood_sets(args) -> list[str]:
    """The OOD split names (array keys) of ``args``: "mmlu:stem" → "mmlu_stem"."""
    return [split_key(spec) for spec in _ood_specs(args)]


def build_splits(args):
    """S_T, S_V, validation, ID test (disjoint, from ``--train-domain``) and the OOD sets; with
    ``--balance-gold`` each split is balanced on its own (a balanced whole splits into letter-skewed parts:
    the gold letter's share would differ between the training and the test data)."""
    from hf_calibration.data import balance_gold

    domain = _load_domain(args.train_domain, seed=args.seed).shuffle(seed=args.seed)
    sizes = [args.n_train, args.n_calibration, args.n_validation, args.n_test]
    if sum(sizes) > len(domain):
        raise ValueError(f"--n-train/--n-calibration/--n-validation/--n-test: {sizes} sum to more than the "
                         f"{len(domain)} questions of --train-domain {args.train_domain!r}")
    bounds = np.cumsum([0] + sizes)
    names = ("train", "calibration", "validation", "id_test")
    splits = {n: domain.select(range(bounds[i], bounds[i + 1])) for i, n in enumerate(names)}
    if args.balance_gold:
        splits = {n: balance_gold(split, seed=args.seed) for n, split in splits.items()}
    for spec in _ood_specs(args):
        splits[split_key(spec)] = _load_domain(spec, limit=args.n_ood, seed=args.seed, balance_gold=args.balance_gold)
    return splits


def score_all(model, tokenizer, splits, batch_size, ood):
    from hf_calibration.modeling import score_mcqa

    out = {}
    for name in ("validation", "id_test", *ood):
        s = score_mcqa(model, tokenizer, splits[name], batch_size=batch_size, progress=False)
        out[f"{name}_logits"] = s.option_logits
        out[f"{name}_labels"] = s.labels
    return out


def train_method(method, splits, args, tokenizer):
    from peft import LoraConfig

    from hf_calibration.calm import CALMConfig, CALMTrainer, mcqa_to_prompt_completion
    from hf_calibration.modeling import load_model, resolve_device

    model, _ = load_model(args.model)
    calm_method = "sft" if method == "label_smoothing" else method
    num_options = len(splits["train"][0]["choices"])  # the entropy and L_tr read these letters only (K = 2 for HaluEval)
    config = CALMConfig(
        output_dir=str(Path(args.output_dir) / "runs" / method), method=calm_method, max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size, learning_rate=args.learning_rate,
        alpha_learning_rate=args.alpha_learning_rate, inner_steps=args.inner_steps, num_options=num_options,
        inner_learning_rate=args.inner_learning_rate, label_smoothing_factor=0.1 if method == "label_smoothing" else 0.0,
        lr_scheduler_type="constant", warmup_steps=0, bf16=False, activation_checkpointing=False, save_strategy="no",
        report_to="none", logging_steps=10, seed=args.seed, use_cpu=resolve_device(args.device) == "cpu", max_length=None,
        disable_tqdm=True, dataset_num_proc=None,
    )
    train = mcqa_to_prompt_completion(splits["train"], tokenizer)
    calibration = mcqa_to_prompt_completion(splits["calibration"], tokenizer).remove_columns("completion")
    peft = LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r, lora_dropout=0.0,
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM")
    trainer = CALMTrainer(model, args=config, train_dataset=train, calibration_dataset=calibration,
                          processing_class=tokenizer, peft_config=peft)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    trainer.model.eval()
    logs = [e for e in trainer.state.log_history if "lower_loss" in e]
    return trainer.model, {"num_options": num_options, "train_seconds": seconds, "seconds_per_step": seconds / args.max_steps, "log": logs,
                           "mean_temperature": float(trainer.model.logit_adjustment.temperature.detach().mean())}


def run_train(args, splits=None):
    """Train and score every method of ``args.methods`` not scored yet; ``splits`` as from ``build_splits``."""
    from hf_calibration.modeling import load_model

    out = Path(args.output_dir)
    (out / "scores").mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    splits = build_splits(args) if splits is None else splits
    sizes = {k: len(v) for k, v in splits.items()}
    print("sizes:", sizes, flush=True)
    (out / "run.json").write_text(json.dumps({"args": vars(args), "sizes": sizes}, indent=2) + "\n")
    ood = ood_sets(args)
    base = tokenizer = None  # loaded at the first method that needs work: a report-only rerun loads no model
    for method in args.methods:
        path = out / "scores" / f"{method}.npz"
        if path.exists():  # checked per method, so two processes can share the list of methods
            print(f"{method}: already scored", flush=True)
            continue
        if method == "ts":  # fitted in `report` on the uncalibrated scores; nothing to train or score
            continue
        if tokenizer is None:
            base, tokenizer = load_model(args.model, device=args.device)
        start = time.perf_counter()  # the model load is not part of a method's wall time
        if method == "uncalibrated":
            scores, info = score_all(base, tokenizer, splits, args.eval_batch_size, ood), {}
        else:
            model, info = train_method(method, splits, args, tokenizer)
            scores = score_all(model, tokenizer, splits, args.eval_batch_size, ood)
        info["wall_seconds"] = time.perf_counter() - start
        np.savez(path, **scores)
        (out / "scores" / f"{method}.json").write_text(json.dumps(info, indent=2, default=float) + "\n")
        print(f"{method}: {info['wall_seconds']:.0f} s"
              + (f" ({info['seconds_per_step']:.2f} s/step)" if "seconds_per_step" in info else ""), flush=True)
    print(f"total {time.perf_counter() - t0:.0f} s", flush=True)


def _probs(logits):
    z = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(z)
    return p / p.sum(axis=1, keepdims=True)


def method_probabilities(out: Path, splits) -> tuple[dict, dict]:
    """Option probabilities per method and split from ``scores/*.npz`` (TS fitted once on validation), and labels."""
    from hf_calibration.posthoc import TemperatureScaler

    probs, labels = {}, {}
    for method in METHODS:
        path = out / "scores" / f"{'uncalibrated' if method == 'ts' else method}.npz"
        if not path.exists():
            continue
        data = np.load(path)
        transform = lambda z: z  # noqa: E731
        if method == "ts":
            transform = TemperatureScaler().fit(data["validation_logits"], data["validation_labels"]).transform
        probs[method] = {}
        for name in splits:
            logits = transform(np.where(np.isfinite(data[f"{name}_logits"]), data[f"{name}_logits"], -1e9))
            probs[method][name] = _probs(np.asarray(logits))
            labels[name] = data[f"{name}_labels"]
    return probs, labels


def run_report(args):
    from hf_calibration.reports import format_table, mcqa_report, references

    out = Path(args.output_dir)
    ood = ood_sets(args)
    kw = dict(n_resamples=args.n_resamples, seed=args.seed)
    probs, labels = method_probabilities(out, ("validation", "id_test", *ood))
    table = {m: {name: mcqa_report(labels[name], p, **kw) for name, p in per_split.items()}
             for m, per_split in probs.items()}
    results = {"tables": table, "references": {}}
    lines = []
    for name in ("id_test", *ood):
        signals = {m: table[m][name] for m in table}
        if "uncalibrated" in probs:
            k = probs["uncalibrated"][name].shape[1]
            correct = probs["uncalibrated"][name].argmax(1) == labels[name]
            val_acc = table["uncalibrated"]["validation"]["accuracy"]["value"]
            refs = references(correct, k, accuracy=val_acc, **kw)
            results["references"][name] = refs
            signals.update({f"ref: const = val acc ({val_acc:.3f})": refs["constant_accuracy"], "ref: const = 1/K": refs["constant_1/K"]})
        n = next(iter(table.values()))[name]["n"]  # calibration_report's "n" is a plain int
        lines += [f"### {name} (n={n})", "", "```",
                  format_table(signals), "```", ""]
    ood_mean = {}
    for m in table:
        ood_mean[m] = {key: float(np.mean([table[m][s][key]["value"] for s in ood]))
                       for key in ("accuracy", "conf_ece", "cw_ece", "smece", "brier", "auroc")}
    results["ood_mean"] = ood_mean
    lines += [f"### OOD mean (unweighted over the {len(ood)} OOD sets; point estimates)", "", "```",
              "method           acc    conf-ECE  cw-ECE  smECE  Brier  AUROC"]
    for m, v in ood_mean.items():
        lines.append(f"{m:<16} {v['accuracy']:.3f}  {v['conf_ece']:.3f}     {v['cw_ece']:.3f}   {v['smece']:.3f}  "
                     f"{v['brier']:.3f}  {v['auroc']:.3f}")
    lines += ["```", ""]
    timing = {}
    for m in table:
        info_path = out / "scores" / f"{'uncalibrated' if m == 'ts' else m}.json"
        if info_path.exists():
            timing[m] = json.loads(info_path.read_text())
    results["timing"] = {m: {k: v for k, v in t.items() if k != "log"} for m, t in timing.items()}
    lines += ["### wall time", "", "```"] + [
        f"{m:<16} total {t['wall_seconds']:.0f} s" + (f", {t['seconds_per_step']:.2f} s/step, mean τ {t['mean_temperature']:.3f}"
                                                      if "seconds_per_step" in t else "")
        for m, t in timing.items()] + ["```", ""]
    sizes = json.loads((out / "run.json").read_text())["sizes"] if (out / "run.json").exists() else {}
    lines.insert(0, f"{args.model}, trained on {args.train_domain}, seed {args.seed}; sizes {sizes}; "
                    f"{args.max_steps} steps of {args.batch_size}; 95% bootstrap intervals ({args.n_resamples} resamples)\n")
    text = "\n".join(lines)
    items = []
    for name in ("validation", "id_test", *ood):
        if name != "validation":
            _plot_split(out / f"reliability_{name}.png", {m: probs[m][name] for m in probs}, labels[name], name)
        for i, label in enumerate(labels[name]):
            items.append({"split": name, "index": i, "answer": int(label),
                          **{f"{m}_prediction": int(probs[m][name][i].argmax()) for m in probs},
                          **{f"{m}_confidence": float(probs[m][name][i].max()) for m in probs}})
    with open(out / "items.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in items)
    (out / "report.md").write_text(text)
    (out / "report.json").write_text(json.dumps(results, indent=2, default=float) + "\n")
    print(text)


def _plot_split(path: Path, probs: dict, labels, name: str) -> None:
    """Reliability diagrams (top-label confidence) of every method on one split, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hf_calibration.plotting import plot_reliability_diagram

    fig, axes = plt.subplots(1, len(probs), figsize=(3.6 * len(probs), 3.8), squeeze=False)
    for ax, (method, p) in zip(axes[0], probs.items()):
        plot_reliability_diagram((p.argmax(1) == labels).astype(int), p.max(1), n_bins=10, ax=ax, title=method)
    fig.suptitle(f"{name}: top-label reliability per method")
    fig.tight_layout()
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # a ValueError: the callers print one line and exit 2 (no usage dump)
        raise ValueError(message)


def build_parser() -> argparse.ArgumentParser:
    from hf_calibration._cli_args import add_device_argument, non_negative_int, positive

    p = _Parser(prog="python -m hf_calibration.calm.experiment", description=__doc__.splitlines()[0],
                allow_abbrev=False)  # --n-tr must be an error, not --n-train
    p.add_argument("phase", choices=["train", "report", "all"], nargs="?", default="all")
    p.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    p.add_argument("--train-domain", default="mmlu:stem",
                   help="mmlu:<categories or subjects, '+'-joined>, halueval_qa_lm, halueval_qa or gpqa")
    p.add_argument("--ood-domains", default=None,
                   help=f"comma-separated OOD sets (default: {MMLU_OOD} for an MMLU domain, else {OTHER_OOD})")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    for option, default in (("--n-train", 320), ("--n-calibration", 320), ("--n-validation", 150), ("--n-test", 150),
                            ("--n-ood", 120), ("--max-steps", 40), ("--batch-size", 8), ("--eval-batch-size", 16),
                            ("--lora-r", 8), ("--n-resamples", 1000)):
        p.add_argument(option, type=positive(int, option), default=default, help=f"default {default}")
    for option, default in (("--learning-rate", 5e-4), ("--alpha-learning-rate", 2e-2),
                            ("--inner-learning-rate", 1e-2)):
        p.add_argument(option, type=positive(float, option), default=default, help=f"default {default}")
    p.add_argument("--inner-steps", type=non_negative_int("--inner-steps"), default=1, help="T (default 1)")
    add_device_argument(p)  # scoring; training goes where the Trainer puts it (CPU when --device resolves to cpu)
    p.add_argument("--balance-gold", action="store_true", help="every option letter gold equally often in each set")
    p.add_argument("--seed", type=non_negative_int("--seed"), default=0)
    p.add_argument("--output-dir", required=True)
    return p


def check_args(argv=None):
    """``(args, splits)``: the command line parsed and every input checked before any model is resolved; ValueError
    for bad options, output folders, domains or sizes (``splits`` is None for the report phase)."""
    from hf_calibration._cli_args import output_dir

    args = build_parser().parse_args(argv)
    for folder in (args.output_dir, Path(args.output_dir) / "scores", Path(args.output_dir) / "runs"):
        output_dir(str(folder))  # a file in the way is found now, not when the first method's scores are saved
    return args, (build_splits(args) if args.phase in ("train", "all") else None)


def run(args, splits) -> int:
    """Train (``resolve_model_path`` first) and/or report, as ``check_args`` returned them."""
    from hf_calibration.modeling import resolve_model_path

    if args.phase in ("train", "all"):
        resolve_model_path(args.model)
        run_train(args, splits)
    if args.phase in ("report", "all"):
        run_report(args)
    return 0


def main(argv=None) -> int:
    return run(*check_args(argv))


def cli_main(argv=None) -> int:
    """``main`` for a command line: bad input prints one line and returns 2."""
    import sys

    try:
        return main(argv)
    except (ValueError, OSError) as err:
        print(f"calm experiment: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    import sys

    sys.exit(cli_main())
