"""Speed against lm-evaluation-harness: our ``run_evaluate`` and lm-eval's HF backend on the same N MMLU questions.

    python benchmarks/bench_lm_eval.py            # N = 500
    python benchmarks/bench_lm_eval.py --n 40

Same model (the packaged SmolLM2-135M-Instruct by default, float32), same device, same batch size, the same
questions (``data.load_mcqa("mmlu", limit=N, seed)``, as ``run_evaluate`` loads them) and, with the default
``--prompt-format plain``, the same prompt text: the question, "A. …" option lines and the instruction
(``modeling.prompts.format_mcqa``) followed by "\\nAnswer:".
- ours: ``run_evaluate`` reads the next-token probabilities of the option letters ("A" and " A" summed) from one
  forward pass per question, then computes every metric with ``--n-resamples`` bootstrap resamples.
- lm-eval: a local ``multiple_choice`` task over the same rows (``lm_eval_tasks.write_mcqa_task``, choices
  "A"–"D" after the target delimiter " "), ``simple_evaluate`` with an ``HFLM`` built beforehand; it computes
  the log-likelihood of each continuation " A" … " D" (one-token continuations of one context share a forward
  pass through its logits cache) and acc with its standard error.
Each side loads its own model; "load" is that, "scoring" the rest (ours: ``run["scoring_seconds"]``; lm-eval:
``simple_evaluate``, which also builds the task). Ours runs first, then lm-eval, in one process. Prints both
times, the ratios lm-eval / ours, both accuracies and how often the two predictions agree (they need not: we
sum "A" and " A", lm-eval scores " A").
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=500, help="MMLU questions (stratified by subject)")
    p.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--device", default="cpu")
    p.add_argument("--prompt-format", default="plain", choices=["plain", "chat"],
                   help="ours; lm-eval always gets the plain text (chat would need its apply_chat_template)")
    p.add_argument("--n-resamples", type=int, default=1000, help="our bootstrap resamples (timed apart)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    import lm_eval
    import numpy as np
    import torch
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from hf_calibration.data import load_mcqa
    from hf_calibration.jobs import EvaluateConfig, run_evaluate
    from hf_calibration.integrations.lm_eval_tasks import write_mcqa_task
    from hf_calibration.modeling import resolve_model_path

    work = Path(tempfile.mkdtemp(prefix="bench_lm_eval-"))
    rows = load_mcqa("mmlu", limit=args.n, seed=args.seed)

    start = time.perf_counter()
    ours = run_evaluate(EvaluateConfig(model=args.model, dataset="mmlu", limit=args.n, seed=args.seed,
                                       batch_size=args.batch_size, device=args.device,
                                       prompt_format=args.prompt_format, n_resamples=args.n_resamples,
                                       output_dir=str(work / "ours")), progress=False)
    ours_total = time.perf_counter() - start
    ours_load, ours_scoring = ours.run["load_seconds"], ours.run["scoring_seconds"]

    write_mcqa_task(rows, work / "tasks", "bench_mmlu", choices="letters")
    start = time.perf_counter()
    lm = HFLM(pretrained=resolve_model_path(args.model), device=args.device, batch_size=args.batch_size,
              dtype="float32")
    theirs_load = time.perf_counter() - start
    start = time.perf_counter()
    results = simple_evaluate(model=lm, tasks=["bench_mmlu"], log_samples=True, verbosity="WARNING",
                              task_manager=TaskManager(include_path=str(work / "tasks")))
    theirs_scoring = time.perf_counter() - start
    theirs_total = theirs_load + theirs_scoring

    logged = sorted(results["samples"]["bench_mmlu"], key=lambda s: s["doc_id"])
    theirs_pred = np.array([int(np.argmax([ll for ll, _ in s["filtered_resps"]])) for s in logged])
    agreement = float(np.mean(theirs_pred == ours.scores.prediction))
    n = len(rows)
    print(f"N = {n} MMLU questions (seed {args.seed}), model {args.model} (float32), device {args.device}, "
          f"{torch.get_num_threads()} torch threads")
    print(f"ours   : run_evaluate, prompt {ours.scores.prompt_format} (format_mcqa + next-token letter probabilities), "
          f"batch {args.batch_size} questions/forward; load {ours_load:.1f} s, scoring {ours_scoring:.1f} s "
          f"({n / ours_scoring:.1f} q/s), total with {args.n_resamples}-resample metrics {ours_total:.1f} s; "
          f"accuracy {ours.metrics['signals']['option_probability']['accuracy']['value']:.3f}")
    print(f"lm-eval: {lm_eval.__version__} HF backend, prompt plain "
          f"(format_mcqa + \"\\nAnswer:\", continuations ' A'..' D'), batch {args.batch_size} requests/forward; "
          f"load {theirs_load:.1f} s, scoring {theirs_scoring:.1f} s ({n / theirs_scoring:.1f} q/s), "
          f"total {theirs_total:.1f} s; acc {results['results']['bench_mmlu']['acc,none']:.3f}")
    print(f"lm-eval / ours: scoring {theirs_scoring / ours_scoring:.2f}x, load + scoring "
          f"{theirs_total / (ours_load + ours_scoring):.2f}x; predictions agree on {agreement:.1%} of the questions")


if __name__ == "__main__":
    main()
