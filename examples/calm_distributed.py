"""CALM (BOME) with LoRA on MMLU under ``accelerate launch``: DDP or DeepSpeed ZeRO-2/3 (docs/distributed.md).

Every ``CALMConfig`` / ``SFTConfig`` field is a command-line flag (``--max_steps``, ``--learning_rate``,
``--alpha_learning_rate``, ``--inner_steps``, …), as with TRL's scripts. On a machine without GPUs
``hf_calibration.runtime.distributed.cpu_training_kwargs()`` supplies the CPU plumbing (gloo), so the same script
runs with the ``*_cpu.yaml`` configs. Examples (8 GPUs, then 2 CPU processes):

    accelerate launch --config_file examples/accelerate_configs/deepspeed_zero2.yaml examples/calm_distributed.py \\
        --output_dir runs/calm_zero2 --max_steps 200 --per_device_train_batch_size 4
    accelerate launch --config_file examples/accelerate_configs/multi_gpu_cpu.yaml examples/calm_distributed.py \\
        --output_dir runs/calm_ddp_cpu --max_steps 2 --per_device_train_batch_size 2 --n_train 16 --n_calibration 16
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hf_calibration.runtime.distributed import cpu_training_kwargs


@dataclass
class ScriptArguments:
    model_name_or_path: str = field(default="HuggingFaceTB/SmolLM2-135M-Instruct",
                                    metadata={"help": "Base model (Hub id, folder, or a packaged offline model)."})
    train_subjects: str = field(default="stem", metadata={"help": "MMLU category or subject of S_T and S_V."})
    n_train: int = field(default=256, metadata={"help": "Questions in S_T (labelled)."})
    n_calibration: int = field(default=256, metadata={"help": "Questions in S_V (labels unused)."})
    lora_r: int = field(default=8, metadata={"help": "LoRA rank (q, k, v, o projections; lora_alpha = 2r)."})


def main():
    from transformers import HfArgumentParser

    from hf_calibration.calm import CALMConfig, CALMTrainer, default_lora_config, mcqa_to_prompt_completion
    from hf_calibration.data import load_mcqa
    from hf_calibration.modeling import load_model

    parser = HfArgumentParser((ScriptArguments, CALMConfig))
    parser.set_defaults(bf16=False, activation_checkpointing=False, report_to="none", logging_steps=1, max_length=None,
                        **cpu_training_kwargs())  # before the config exists: it may create the gloo process group
    script, config = parser.parse_args_into_dataclasses()
    model, tokenizer = load_model(script.model_name_or_path)
    data = load_mcqa("mmlu", subjects=script.train_subjects, seed=config.seed).shuffle(seed=config.seed)
    data = mcqa_to_prompt_completion(data.select(range(script.n_train + script.n_calibration)), tokenizer)
    train = data.select(range(script.n_train))
    calibration = data.select(range(script.n_train, len(data))).remove_columns("completion")
    peft = default_lora_config(script.lora_r)
    trainer = CALMTrainer(model, args=config, train_dataset=train, calibration_dataset=calibration,
                          processing_class=tokenizer, peft_config=peft)
    trainer.train()
    trainer.save_model(config.output_dir)  # collective under ZeRO-3 (gathers the adapter and α); written by rank 0


if __name__ == "__main__":
    main()
