"""One CALMTrainer run on the tiny random model, started by ``accelerate launch`` (or plain python) from the tests.

Every rank writes its trainable parameters (LoRA + α) to ``params_rank<r>.safetensors``; with ``--save`` the
run also calls ``save_model(<output-dir>/saved)`` and writes the in-memory model's logits on a fixed prompt
(``logits.safetensors``), which the test compares with the artifact reloaded by ``CALMModel.from_pretrained``.

With ``--same-step-cases`` it runs instead every case of tests/calm/same_step.py (all methods, both entropy
domains): the tiny model (all weights, no LoRA) takes the case's SGD steps on 4 examples with completions of 2,
12, 6 and 4 tokens; every rank writes ``<domain>-<case>-rank<r>.safetensors`` with the trainable parameters
before (``before.<name>``) and after (``after.<name>``), and the main process writes ``positions.json`` (token
positions of the data, for the tolerance).
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for tests.tiny

from hf_calibration.runtime.distributed import cpu_training_kwargs  # noqa: E402

PROMPT = "which option is correct ? A. B. C. D. Answer"
WORDS = "the a of and to in is was for on that with as by it at from this be are".split()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--max-steps", type=int, default=3)
    parser.add_argument("--per-device-batch-size", type=int, default=4)
    parser.add_argument("--save", action="store_true")
    parser.add_argument("--method", default="bome", help="CALMConfig.method")
    parser.add_argument("--cft-coefficient", type=float, default=None, help="CALMConfig.cft_coefficient")
    parser.add_argument("--zero3-persistence-threshold", type=int, default=None,
                        help="stage3_param_persistence_threshold: small, so the tiny base model is really sharded")
    parser.add_argument("--gradient-accumulation-steps", type=int, default=1)
    parser.add_argument("--same-step-cases", action="store_true")
    args = parser.parse_args()
    extra = cpu_training_kwargs()  # before anything creates an Accelerator
    if args.same_step_cases:
        return same_step_cases(args, extra)

    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from safetensors.torch import save_file

    from hf_calibration.calm import CALMConfig, CALMTrainer, mcqa_to_prompt_completion
    from tests.tiny import make_tiny_model, make_tiny_tokenizer

    tok = make_tiny_tokenizer()
    rows = [{"question": f"which option is correct ? {w}", "choices": ["the", "a", "of", "and"], "answer": i % 4,
             "subject": "x", "source": "tiny"} for i, w in enumerate(WORDS[:16])]
    train = mcqa_to_prompt_completion(Dataset.from_list(rows), tok)
    out = Path(args.output_dir)
    config = CALMConfig(
        output_dir=str(out / "run"), max_steps=args.max_steps, per_device_train_batch_size=args.per_device_batch_size,
        learning_rate=1e-2, alpha_learning_rate=5e-2, bf16=False, gradient_checkpointing=False, report_to="none",
        logging_steps=1, save_strategy="no", disable_tqdm=True, seed=0, method=args.method,
        **({} if args.cft_coefficient is None else {"cft_coefficient": args.cft_coefficient}), **extra,
    )
    trainer = CALMTrainer(make_tiny_model(tok), args=config, train_dataset=train,
                          calibration_dataset=train.remove_columns("completion"), processing_class=tok,
                          peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    if args.zero3_persistence_threshold is not None:
        ds = trainer.accelerator.state.deepspeed_plugin.deepspeed_config
        ds["zero_optimization"]["stage3_param_persistence_threshold"] = args.zero3_persistence_threshold
    trainer.train()
    acc = trainer.accelerator
    calm = trainer.calm_model
    params = {n: p.detach().cpu().clone().contiguous() for n, p in calm.named_parameters() if p.requires_grad}
    save_file(params, str(out / f"params_rank{acc.process_index}.safetensors"))
    sharded = sum(1 for p in calm.parameters() if getattr(p, "ds_numel", 0) and p.numel() == 0)
    if args.save:
        trainer.save_model(str(out / "saved"))
        calm.eval()
        with torch.no_grad():  # every rank: under ZeRO-3 the forward gathers the sharded weights collectively
            logits = calm(input_ids=torch.tensor([tok.encode(PROMPT)])).logits.float().contiguous()
        if acc.is_main_process:
            save_file({"logits": logits}, str(out / "logits.safetensors"))
    if acc.is_main_process:
        info = {"num_processes": acc.num_processes, "distributed_type": str(acc.distributed_type),
                "sharded_parameters": sharded, "prompt": PROMPT,
                "log_history": [e for e in trainer.state.log_history if "bome_lambda" in e]}
        (out / "result.json").write_text(json.dumps(info, indent=2))
    acc.wait_for_everyone()


def same_step_cases(args, extra):
    from safetensors.torch import save_file

    from hf_calibration.calm import CALMConfig, CALMTrainer
    from tests.calm.same_step import CASES, SGD, options_data, positions, vocab_data
    from tests.tiny import make_tiny_model, make_tiny_tokenizer

    tok = make_tiny_tokenizer()
    out = Path(args.output_dir)
    sizes = {}
    for domain in ("vocab", "options"):
        train, calibration = vocab_data(4) if domain == "vocab" else options_data(tok, 4)
        for case, method, overrides, steps in CASES:
            config = CALMConfig(
                output_dir=str(out / "run"), max_steps=steps, per_device_train_batch_size=args.per_device_batch_size,
                gradient_accumulation_steps=args.gradient_accumulation_steps, bf16=False, gradient_checkpointing=False,
                report_to="none", logging_steps=1, save_strategy="no", disable_tqdm=True, seed=0, method=method,
                entropy_domain=domain, **{**SGD, **overrides}, **extra,
            )
            trainer = CALMTrainer(make_tiny_model(tok), args=config, train_dataset=train,
                                  calibration_dataset=calibration, processing_class=tok)
            before = {f"before.{n}": p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
            trainer.train()
            after = {f"after.{n}": p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
            acc = trainer.accelerator
            save_file({**before, **after}, str(out / f"{domain}-{case}-rank{acc.process_index}.safetensors"))
            sizes[domain] = positions(trainer)
            acc.wait_for_everyone()
    if acc.is_main_process:
        (out / "positions.json").write_text(json.dumps({**sizes, "num_processes": acc.num_processes}))


if __name__ == "__main__":
    main()
