"""``run_calm``: fine-tune a causal LM with CALM on MCQA data (``hf-calibration calm``; docs/methods.md, "CALM").

As a TRL script takes ``(ScriptArguments, SFTConfig)``, the job takes the data and model options
(``CALMJobConfig``) and the trainer's (``hf_calibration.calm.CALMConfig``, an ``SFTConfig``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from hf_calibration import modeling
from hf_calibration.calm import CALMConfig, CALMTrainer, mcqa_to_prompt_completion
from hf_calibration.data import MCQA_DATASETS, load_mcqa, resolve_subjects
from hf_calibration.errors import ParameterError, renamed_parameters
from hf_calibration.jobs.common import (JobResult, check_choice, check_int, check_output_dir, fit_mcqa_to_context,
                                        model_field, on_overflow_field, overwrite_field, prompt_format_field)
from hf_calibration.metrics.validation import check_n_bins
from hf_calibration.modeling.context import OVERFLOW_POLICIES
from hf_calibration.modeling.prompts import PROMPT_FORMATS
from hf_calibration.runtime.outputs import check_result_folder, mark_written, snapshot

SPLITS = ("train", "calibration", "eval")
# what CALMTrainer.save_model writes (adapter or full model, α, tokenizer, card): another job's, or the same names
# saved without this package's marker (a CALMTrainer run in Python), are refused unless --overwrite
CALM_FILES = ("adapter_model.safetensors", "adapter_config.json", "model.safetensors", "config.json",
              "logit_adjustment.safetensors", "logit_adjustment_config.json", "README.md", "training_args.bin",
              "tokenizer.json", "tokenizer_config.json")


@dataclass(kw_only=True)
class CALMJobConfig:
    """Data and model options of ``run_calm`` / ``hf-calibration calm`` (the trainer's are ``CALMConfig``).
    Checked at construction: ParameterError (a ValueError) naming the field and the value."""

    model: str = model_field()
    train_dataset: str = field(default="mmlu", metadata={
        "help": "MCQA dataset for S_T, S_V and eval: mmlu, gpqa, halueval_qa, halueval_dialogue, "
                "halueval_summarization (each HaluEval set also _lm: length-matched)."})
    train_subjects: str = field(default="stem", metadata={
        "help": "MMLU subjects/categories of S_T (comma-separated)."})
    calibration_subjects: str | None = field(default=None, metadata={
        "help": "MMLU subjects/categories of S_V (default: train_subjects, disjoint questions)."})
    eval_subjects: str | None = field(default=None, metadata={
        "help": "MMLU subjects/categories of the labelled eval split (default: train_subjects, disjoint)."})
    n_train: int = field(default=320, metadata={"help": "Questions in S_T."})
    n_calibration: int = field(default=320, metadata={"help": "Questions in S_V."})
    n_eval: int = field(default=150, metadata={"help": "Questions in the labelled eval split (0: none)."})
    prompt_format: str = prompt_format_field()
    on_overflow: str = on_overflow_field()
    lora_r: int = field(default=8, metadata={
        "help": "LoRA rank on the attention projections (0: full fine-tuning)."})
    overwrite: bool = overwrite_field()

    def __post_init__(self):
        check_int(self.n_train, "n_train")
        check_int(self.n_calibration, "n_calibration")
        check_int(self.n_eval, "n_eval", minimum=0)
        check_int(self.lora_r, "lora_r", minimum=0)
        check_choice(self.prompt_format, "prompt_format", PROMPT_FORMATS)
        check_choice(self.on_overflow, "on_overflow", OVERFLOW_POLICIES)
        check_choice(self.train_dataset, "train_dataset", sorted(MCQA_DATASETS))
        names = ("train_subjects", "calibration_subjects", "eval_subjects")
        if self.train_dataset != "mmlu":
            for name in names:
                if getattr(self, name) not in (None, "stem" if name == "train_subjects" else None):
                    raise ParameterError(name, getattr(self, name), f"only {{train_dataset}} mmlu has subjects, got "
                                         f"{{train_dataset}} {self.train_dataset!r}", related=("train_dataset",))
            return
        for name in names:
            with renamed_parameters(subjects=name):
                resolve_subjects(getattr(self, name))

    def subjects(self, split: str) -> str:
        """The subjects of ``split`` ("train", "calibration" or "eval")."""
        return getattr(self, f"{split}_subjects") or self.train_subjects


@dataclass(kw_only=True)
class CALMJobResult(JobResult):
    """``JobResult`` (``metrics``: the eval split's metrics, empty without one; ``paths["model"]``: the saved
    adapter, logit adjustment and model card) plus the trainer."""

    trainer: object


def _datasets(config: CALMJobConfig, seed: int, tokenizer, model=None, max_length: int | None = None) -> dict:
    """S_T, S_V and the eval split as prompt/completion rows: one shuffled pool per subject set, cut into
    disjoint slices; each prompt and its completion (a letter and the end of turn: 2 tokens) fitted to the model's
    context and ``max_length`` (``config.on_overflow``; TRL would cut the end, the completion with it)."""
    pools, offsets, out = {}, {}, {}
    for split in SPLITS:
        size = getattr(config, f"n_{split}")
        if size == 0:
            continue
        key = config.subjects(split)
        if key not in pools:
            kw = {"subjects": key} if config.train_dataset == "mmlu" else {}
            pools[key] = load_mcqa(config.train_dataset, seed=seed, **kw).shuffle(seed=seed)
            offsets[key] = 0
        start, stop = offsets[key], offsets[key] + size
        if stop > len(pools[key]):
            raise ParameterError(f"n_{split}", size, f"{size} questions asked but only {len(pools[key]) - start} "
                                 f"remain in {key!r} after the other splits")
        rows = fit_mcqa_to_context(pools[key].select(range(start, stop)), model, tokenizer, reserve=2,
                                   prompt_format=config.prompt_format, on_overflow=config.on_overflow,
                                   limit=max_length)
        out[split] = mcqa_to_prompt_completion(rows, tokenizer, prompt_format=config.prompt_format)
        offsets[key] = stop
    return out


def run_calm(config: CALMJobConfig, training: CALMConfig) -> CALMJobResult:
    """Train LoRA (or full) weights and a logit adjustment with ``CALMTrainer`` on MCQA data: S_T and S_V from
    ``train_subjects`` / ``calibration_subjects``, the labelled eval split from ``eval_subjects``; save the adapter,
    ``logit_adjustment.safetensors`` and a model card to ``training.output_dir``.

    The output folder and the model path are checked before the model loads; ParameterError naming the field
    (``output_dir`` is ``CALMConfig``'s): a folder holding another job's results, or files ``CALM_FILES`` names that
    no run of this package wrote (e.g. a ``CALMTrainer.save_model`` in Python), is refused unless ``overwrite``
    (``outputs``). The folder is marked as calm's once the model is saved.
    """
    from hf_calibration.calm.lora import default_lora_config

    if not training.output_dir:
        raise ParameterError("output_dir", training.output_dir,
                             "required (the folder for the adapter, logit adjustment and model card)")
    out = check_output_dir(training.output_dir)
    check_result_folder(out, "calm", CALM_FILES, overwrite=config.overwrite)
    modeling.resolve_model_path(config.model)
    model, tokenizer = modeling.load_model(config.model)
    tokenizer.padding_side = "right"
    data = _datasets(config, training.seed, tokenizer, model, training.max_length)
    if "eval" in data:  # the eval ECEs' bins against the eval questions: refused now, not after training
        with renamed_parameters(n_bins="eval_num_bins"):
            check_n_bins(training.eval_num_bins, len(data["eval"]), of="eval questions")
    peft = None
    if config.lora_r > 0:
        peft = default_lora_config(config.lora_r)
    trainer = CALMTrainer(model, args=training, train_dataset=data["train"],
                          calibration_dataset=data["calibration"].remove_columns("completion"),
                          eval_dataset=data.get("eval"), processing_class=tokenizer, peft_config=peft)
    before, start = snapshot(out), time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    metrics = {k: v for k, v in trainer.evaluate().items() if isinstance(v, float)} if "eval" in data else {}
    trainer.save_model(training.output_dir)
    if trainer.args.should_save:  # the marker: this folder is calm's (checkpoints of this run included)
        mark_written(out, "calm", before)
    lines = [f"trained {trainer.state.global_step} steps in {seconds:.0f} s"]
    if metrics:
        lines.append(str({k: round(v, 4) for k, v in metrics.items()}))
    run = {"model": config.model, "train_dataset": config.train_dataset, "sizes": {k: len(v) for k, v in data.items()},
           "steps": trainer.state.global_step, "train_seconds": round(seconds, 1), "method": training.method}
    return CALMJobResult(metrics=metrics, run=run, paths={"model": out}, output_dir=out, table="\n".join(lines),
                         trainer=trainer)
