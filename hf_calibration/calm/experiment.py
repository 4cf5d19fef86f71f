"""CALM on MMLU with LoRA, compared with the paper's baselines and ablations on the same splits (SPEC §5).

Train on one MMLU category (default STEM): S_T for training, S_V (labels unused) for the entropy,
a labelled validation split (post-hoc TS fitting, the constant-accuracy reference), an in-domain test
split; out-of-domain: the other MMLU categories, GPQA-Diamond and HaluEval QA (2 options; the right
answer is the shorter one in 98 % of items, SPEC §5). Every method starts from the same base model
and sees the same data in the same order.

Two phases, so a long run can be resumed: ``train`` writes ``<output>/scores/<method>.npz`` (option
log-scores per split) and skips methods already scored; ``report`` builds the table from them.

    python examples/calm_mcqa.py --output-dir runs/calm_mmlu --n-train 320 --max-steps 40
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

METHODS = ("uncalibrated", "ts", "sft", "label_smoothing", "cft", "bome", "iterate", "regularization", "scalar")
OOD_SETS = ("humanities", "social_sciences", "other", "gpqa", "halueval_qa")


def build_splits(args):
    from hf_calibration.data import load_mcqa

    stem = load_mcqa("mmlu", subjects=args.train_subjects, seed=args.seed).shuffle(seed=args.seed)
    sizes = [args.n_train, args.n_calibration, args.n_validation, args.n_test]
    if sum(sizes) > len(stem):
        raise ValueError(f"split sizes {sizes} exceed the {len(stem)} questions of {args.train_subjects!r}")
    bounds = np.cumsum([0] + sizes)
    names = ("train", "calibration", "validation", "id_test")
    splits = {n: stem.select(range(bounds[i], bounds[i + 1])) for i, n in enumerate(names)}
    for name in OOD_SETS:
        if name in ("gpqa", "halueval_qa"):
            splits[name] = load_mcqa(name, limit=args.n_ood, seed=args.seed)
        else:
            splits[name] = load_mcqa("mmlu", subjects=name, limit=args.n_ood, seed=args.seed)
    return splits


def score_all(model, tokenizer, splits, batch_size):
    from hf_calibration.modeling import score_mcqa

    out = {}
    for name in ("validation", "id_test", *OOD_SETS):
        s = score_mcqa(model, tokenizer, splits[name], batch_size=batch_size, progress=False)
        out[f"{name}_logits"] = s.option_logits
        out[f"{name}_labels"] = s.labels
    return out


def train_method(method, splits, args, tokenizer):
    from peft import LoraConfig

    from hf_calibration.calm import CALMConfig, CALMTrainer, mcqa_to_prompt_completion
    from hf_calibration.modeling import load_model

    model, _ = load_model(args.model)
    calm_method = "sft" if method == "label_smoothing" else method
    config = CALMConfig(
        output_dir=str(Path(args.output_dir) / "runs" / method), method=calm_method, max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size, learning_rate=args.learning_rate,
        alpha_learning_rate=args.alpha_learning_rate, inner_steps=args.inner_steps,
        inner_learning_rate=args.inner_learning_rate, label_smoothing_factor=0.1 if method == "label_smoothing" else 0.0,
        lr_scheduler_type="constant", warmup_steps=0, bf16=False, gradient_checkpointing=False, save_strategy="no",
        report_to="none", logging_steps=10, seed=args.seed, use_cpu=True, max_length=None,
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
    return trainer.model, {"train_seconds": seconds, "seconds_per_step": seconds / args.max_steps, "log": logs,
                           "mean_temperature": float(trainer.model.logit_adjustment.temperature.detach().mean())}


def run_train(args):
    from hf_calibration.modeling import load_model

    out = Path(args.output_dir)
    (out / "scores").mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    splits = build_splits(args)
    sizes = {k: len(v) for k, v in splits.items()}
    print("sizes:", sizes, flush=True)
    base, tokenizer = load_model(args.model)
    (out / "run.json").write_text(json.dumps({"args": vars(args), "sizes": sizes}, indent=2) + "\n")
    for method in args.methods:
        path = out / "scores" / f"{method}.npz"
        if path.exists():
            print(f"{method}: already scored", flush=True)
            continue
        start = time.perf_counter()
        if method == "ts":  # fitted in `report` on the uncalibrated scores; nothing to train or score
            continue
        if method == "uncalibrated":
            scores, info = score_all(base, tokenizer, splits, args.eval_batch_size), {}
        else:
            model, info = train_method(method, splits, args, tokenizer)
            scores = score_all(model, tokenizer, splits, args.eval_batch_size)
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


def run_report(args):
    from hf_calibration.posthoc import TemperatureScaler
    from hf_calibration.reports import format_table, mcqa_report, references

    out = Path(args.output_dir)
    kw = dict(n_resamples=args.n_resamples, seed=args.seed)
    table = {}
    for method in METHODS:
        path = out / "scores" / f"{'uncalibrated' if method == 'ts' else method}.npz"
        if not path.exists():
            continue
        data = np.load(path)
        transform = lambda z: z  # noqa: E731
        if method == "ts":
            scaler = TemperatureScaler().fit(data["validation_logits"], data["validation_labels"])
            transform = scaler.transform
        table[method] = {}
        for name in ("validation", "id_test", *OOD_SETS):
            logits = transform(np.where(np.isfinite(data[f"{name}_logits"]), data[f"{name}_logits"], -1e9))
            table[method][name] = mcqa_report(data[f"{name}_labels"], _probs(np.asarray(logits)), **kw)
    results = {"tables": table, "references": {}}
    lines = []
    base = np.load(out / "scores" / "uncalibrated.npz") if (out / "scores" / "uncalibrated.npz").exists() else None
    for name in ("id_test", *OOD_SETS):
        signals = {m: table[m][name] for m in table}
        if base is not None:
            labels = base[f"{name}_labels"]
            k = base[f"{name}_logits"].shape[1]
            correct = _probs(np.where(np.isfinite(base[f"{name}_logits"]), base[f"{name}_logits"], -1e9)).argmax(1) == labels
            val_acc = table["uncalibrated"]["validation"]["accuracy"]["value"]
            refs = references(correct, k, accuracy=val_acc, **kw)
            results["references"][name] = refs
            signals.update({f"ref: const = val acc ({val_acc:.3f})": refs["constant_accuracy"], "ref: const = 1/K": refs["constant_1/K"]})
        n = next(iter(table.values()))[name]["n"]  # calibration_report's "n" is a plain int
        lines += [f"### {name} (n={n})", "", "```",
                  format_table(signals), "```", ""]
    ood_mean = {}
    for m in table:
        ood_mean[m] = {key: float(np.mean([table[m][s][key]["value"] for s in OOD_SETS]))
                       for key in ("accuracy", "conf_ece", "cw_ece", "smece", "brier", "auroc")}
    results["ood_mean"] = ood_mean
    lines += ["### OOD mean (unweighted over the 5 OOD sets; point estimates)", "", "```",
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
    text = "\n".join(lines)
    (out / "report.md").write_text(text)
    (out / "report.json").write_text(json.dumps(results, indent=2, default=float) + "\n")
    print(text)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("phase", choices=["train", "report", "all"], nargs="?", default="all")
    p.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    p.add_argument("--train-subjects", default="stem")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--n-train", type=int, default=320)
    p.add_argument("--n-calibration", type=int, default=320)
    p.add_argument("--n-validation", type=int, default=150)
    p.add_argument("--n-test", type=int, default=150)
    p.add_argument("--n-ood", type=int, default=120)
    p.add_argument("--max-steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--eval-batch-size", type=int, default=16)
    p.add_argument("--learning-rate", type=float, default=5e-4)
    p.add_argument("--alpha-learning-rate", type=float, default=2e-2)
    p.add_argument("--inner-steps", type=int, default=1)
    p.add_argument("--inner-learning-rate", type=float, default=1e-2)
    p.add_argument("--lora-r", type=int, default=8)
    p.add_argument("--n-resamples", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-dir", required=True)
    args = p.parse_args(argv)
    if args.phase in ("train", "all"):
        run_train(args)
    if args.phase in ("report", "all"):
        run_report(args)


if __name__ == "__main__":
    main()
