"""``hf-calibration calm``: fine-tune with CALM on MCQA data; options parsed from ``CALMConfig`` (TRL style).

Register with ``add_calm_parser(subparsers)``; the parsed namespace's ``func`` runs the job and returns
an exit code. Bad values raise ValueError naming the option, before any model is loaded.
"""

from __future__ import annotations

import dataclasses
import time


def add_calm_parser(subparsers):
    """Add the ``calm`` subcommand: every ``CALMConfig`` field as ``--field`` / ``--field-name``, plus data/model options."""
    from transformers import HfArgumentParser

    from hf_calibration.calm.config import CALMConfig

    # allow_abbrev=False, as on the subparser (cli._Parser): --learning is an error, not --learning-rate
    config_parser = HfArgumentParser(CALMConfig, add_help=False, allow_abbrev=False)
    p = subparsers.add_parser(
        "calm", parents=[config_parser], conflict_handler="resolve",
        help="fine-tune a causal LM with CALM (bilevel calibration) on MCQA data",
        description="Train LoRA (or full) weights and a logit adjustment with CALMTrainer on MMLU-style MCQA; "
        "S_T and S_V come from --train-subjects / --calibration-subjects, the labelled eval split from "
        "--eval-subjects. Writes the adapter, logit_adjustment.safetensors and a model card to --output-dir.",
    )
    p.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct",
                   help="Hub id or local folder (offline: the packaged SmolLM2 / Qwen2.5-Coder copies)")
    p.add_argument("--train-dataset", default="mmlu", help="mcqa dataset for S_T, S_V and eval: mmlu, gpqa, halueval_qa")
    p.add_argument("--train-subjects", default="stem", help="MMLU subjects/categories of S_T (comma-separated)")
    p.add_argument("--calibration-subjects", default=None,
                   help="MMLU subjects/categories of S_V (default: --train-subjects, disjoint questions)")
    p.add_argument("--eval-subjects", default=None,
                   help="MMLU subjects/categories of the labelled eval split (default: --train-subjects, disjoint)")
    p.add_argument("--n-train", type=int, default=320, help="questions in S_T (default 320)")
    p.add_argument("--n-calibration", type=int, default=320, help="questions in S_V (default 320)")
    p.add_argument("--n-eval", type=int, default=150, help="questions in the labelled eval split (0: none)")
    p.add_argument("--prompt-format", default="auto", choices=["auto", "chat", "plain"], help="MCQA prompt format")
    p.add_argument("--lora-r", type=int, default=8, help="LoRA rank on the attention projections (0: full fine-tuning)")
    p.set_defaults(func=run_calm)
    return p


def _split_config(args):
    from hf_calibration.calm.config import CALMConfig

    names = {f.name for f in dataclasses.fields(CALMConfig) if f.init}
    return CALMConfig(**{k: v for k, v in vars(args).items() if k in names})


def _datasets(args, tokenizer):
    from hf_calibration.calm.data import mcqa_to_prompt_completion
    from hf_calibration.data import load_mcqa

    subjects = {"train": args.train_subjects, "calibration": args.calibration_subjects or args.train_subjects,
                "eval": args.eval_subjects or args.train_subjects}
    sizes = {"train": args.n_train, "calibration": args.n_calibration, "eval": args.n_eval}
    pools, offsets, out = {}, {}, {}
    for split in ("train", "calibration", "eval"):
        if sizes[split] == 0:
            continue
        key = subjects[split]
        if key not in pools:  # one shuffled pool per subject set, cut into disjoint slices
            kw = {"subjects": key} if args.train_dataset == "mmlu" else {}
            pools[key] = load_mcqa(args.train_dataset, seed=args.seed, **kw).shuffle(seed=args.seed)
            offsets[key] = 0
        start, stop = offsets[key], offsets[key] + sizes[split]
        if stop > len(pools[key]):
            raise ValueError(f"--n-{split}: {sizes[split]} questions asked but only {len(pools[key]) - start} remain "
                             f"in {key!r} after the other splits")
        out[split] = mcqa_to_prompt_completion(pools[key].select(range(start, stop)), tokenizer,
                                               prompt_format=args.prompt_format)
        offsets[key] = stop
    return out


def run_calm(args) -> int:
    from peft import LoraConfig

    from hf_calibration._cli_args import output_dir

    from hf_calibration.calm.trainer import CALMTrainer
    from hf_calibration.data.loaders import resolve_subjects
    from hf_calibration.modeling import load_model, resolve_model_path

    for name in ("n_train", "n_calibration"):
        if getattr(args, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')}: must be a positive integer, got {getattr(args, name)!r}")
    if args.n_eval < 0:
        raise ValueError(f"--n-eval: must be ≥ 0, got {args.n_eval!r}")
    if args.lora_r < 0:
        raise ValueError(f"--lora-r: must be ≥ 0, got {args.lora_r!r}")
    if not args.output_dir:
        raise ValueError("--output-dir: required (the folder for the adapter, logit adjustment and model card)")
    output_dir(args.output_dir)
    from hf_calibration.data import MCQA_DATASETS

    if args.train_dataset not in MCQA_DATASETS:
        raise ValueError(f"--train-dataset: unknown dataset {args.train_dataset!r}; choose one of {sorted(MCQA_DATASETS)}")
    if args.train_dataset != "mmlu" and (args.calibration_subjects or args.eval_subjects
                                         or args.train_subjects not in (None, "stem")):
        raise ValueError(f"--train-subjects/--calibration-subjects/--eval-subjects: only --train-dataset mmlu has "
                         f"subjects, got --train-dataset {args.train_dataset!r}")
    if args.train_dataset == "mmlu":
        for opt in ("train_subjects", "calibration_subjects", "eval_subjects"):
            try:
                resolve_subjects(getattr(args, opt))
            except ValueError as err:
                raise ValueError(f"--{opt.replace('_', '-')}: {err}") from None
    config = _split_config(args)
    resolve_model_path(args.model)
    model, tokenizer = load_model(args.model)
    tokenizer.padding_side = "right"
    data = _datasets(args, tokenizer)
    peft = None
    if args.lora_r > 0:
        peft = LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r, lora_dropout=0.0, task_type="CAUSAL_LM",
                          target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    trainer = CALMTrainer(model, args=config, train_dataset=data["train"],
                          calibration_dataset=data["calibration"].remove_columns("completion"),
                          eval_dataset=data.get("eval"), processing_class=tokenizer, peft_config=peft)
    start = time.perf_counter()
    trainer.train()
    print(f"trained {trainer.state.global_step} steps in {time.perf_counter() - start:.0f} s")
    if "eval" in data:
        print({k: round(v, 4) for k, v in trainer.evaluate().items() if isinstance(v, float)})
    trainer.save_model(config.output_dir)
    print(f"wrote {config.output_dir}")
    return 0
