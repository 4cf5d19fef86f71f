"""Wall time per optimizer step and peak memory: CALM (T = 1, T = 3) against TRL ``SFTTrainer``.

Same model, batch, LoRA config and MMLU prompt/completion data for all three; each configuration runs
in its own subprocess so peak memory is not shared. Peak memory: ``torch.cuda.max_memory_allocated``
on GPU; on CPU the rise of peak RSS (``ru_maxrss``) during training over the RSS before training,
i.e. the training overhead beyond the loaded model. The first step is a warm-up and not timed.
Targets (issue 5): CALM T = 1 ≤ 2.5× SFT step time, peak memory ≤ 1.3× SFT's.

    python benchmarks/bench_calm.py --steps 4 --batch-size 4
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def worker(args) -> dict:
    import torch
    from transformers import TrainerCallback
    from trl import SFTConfig, SFTTrainer

    from hf_calibration.calm import CALMConfig, CALMTrainer, default_lora_config, mcqa_to_prompt_completion
    from hf_calibration.data import load_mcqa
    from hf_calibration.modeling import load_model

    model, tok = load_model(args.model)
    tok.padding_side = "right"
    n = args.batch_size * (args.steps + 1)
    data = mcqa_to_prompt_completion(load_mcqa("mmlu", subjects="stem", limit=2 * n, seed=0), tok)
    train, calibration = data.select(range(n)), data.select(range(n, 2 * n)).remove_columns("completion")
    common = dict(output_dir=os.path.join(args.output_dir, args.worker), max_steps=args.steps + 1,
                  per_device_train_batch_size=args.batch_size, bf16=args.bf16, activation_checkpointing=False,
                  report_to="none", save_strategy="no", logging_steps=1000, disable_tqdm=True, seed=0,
                  use_cpu=not torch.cuda.is_available(), learning_rate=1e-4, max_length=None)
    peft = default_lora_config(8)
    if args.worker == "sft":
        trainer = SFTTrainer(model, args=SFTConfig(**common), train_dataset=train, processing_class=tok,
                             peft_config=peft)
    else:
        config = CALMConfig(**common, method="bome", inner_steps=int(args.worker.split("T")[1]))
        trainer = CALMTrainer(model, args=config, train_dataset=train, calibration_dataset=calibration,
                              processing_class=tok, peft_config=peft)

    times = []

    class Timer(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            times.append(time.perf_counter() - self.t)

    trainer.add_callback(Timer())
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    rss_before = _rss_mb()
    trainer.train()
    if torch.cuda.is_available():
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - rss_before
    timed = times[1:]
    return {"step_s": sum(timed) / len(timed), "peak_mb": peak, "steps_timed": len(timed)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    p.add_argument("--steps", type=int, default=3, help="timed optimizer steps (after one warm-up step)")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--output-dir", default="/tmp/bench_calm")
    p.add_argument("--bf16", action="store_true", help="bf16 mixed precision (CUDA; TrainingArguments.bf16)")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print("RESULT " + json.dumps(worker(args)))
        return
    results = {}
    for name in ("sft", "calm_T1", "calm_T3"):
        cmd = [sys.executable, __file__, "--worker", name, "--model", args.model, "--steps", str(args.steps),
               "--batch-size", str(args.batch_size), "--output-dir", args.output_dir] + (["--bf16"] if args.bf16 else [])
        out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
        if out.returncode != 0 or not line:
            sys.exit(f"{name} failed:\n{out.stderr[-3000:]}")
        results[name] = json.loads(line[0][len("RESULT "):])
        print(f"{name:8s} {results[name]['step_s']:.2f} s/step, peak {results[name]['peak_mb']:.0f} MB", flush=True)
    sft = results["sft"]
    for name in ("calm_T1", "calm_T3"):
        r = results[name]
        print(f"{name} / sft: step time {r['step_s'] / sft['step_s']:.2f}x, peak memory "
              f"{r['peak_mb'] / sft['peak_mb']:.2f}x")
    print(f"model {args.model}, batch {args.batch_size}, bf16 {args.bf16}, LoRA r=8 on q/k/v/o, {args.steps} timed steps; "
          "targets: T=1 step ≤ 2.5x, memory ≤ 1.3x")


if __name__ == "__main__":
    main()
