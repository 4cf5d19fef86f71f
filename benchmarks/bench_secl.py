"""SECL speed: `generate` with the mixin outside bursts vs plain `generate`, and the cost of a burst.

    python benchmarks/bench_secl.py --model HuggingFaceTB/SmolLM2-135M-Instruct --n 20

Same prompts (MMLU, chat format), greedy, ``--max-new-tokens`` tokens, batch 1 (set OMP_NUM_THREADS
yourself). Plain and SECL calls alternate prompt by prompt on the same model (plain = the model
class's own ``generate``, adapter at identity), so a changing machine load affects both alike.
Prints seconds per question and the ratios:
- outside bursts / plain generate (target: at most 1.10; the extra work is the verbalized-confidence
  read, which continues from generate's own key/value cache),
- inside a burst / plain generate, and forward passes per question in each mode.
"""

import argparse
import time

import torch

from hf_calibration.modeling import load_model
from hf_calibration.modeling.prompts import LETTERS
from hf_calibration.secl import SECLConfig, SECLGenerationMixin, apply_secl
from hf_calibration.secl.stream import build_stream


def timed(fn, items):
    start = time.perf_counter()
    for item in items:
        fn(item)
    return (time.perf_counter() - start) / len(items)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    args = parser.parse_args()

    model, tokenizer = load_model(args.model)
    items = build_stream(tokenizer, "mmlu", limit_per_domain=args.n)
    kw = dict(max_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id)

    def ids(item):
        t = torch.tensor([item.prompt_ids])
        return dict(input_ids=t, attention_mask=torch.ones_like(t))

    model = apply_secl(model, tokenizer, SECLConfig(burst_size=10 ** 6))
    plain_generate = super(SECLGenerationMixin, model).generate  # the model class's own generate
    plain_generate(**ids(items[0]), **kw)  # warm-up
    plain = quiet = 0.0
    for item in items:
        plain += timed(lambda it: plain_generate(**ids(it), **kw), [item]) / len(items)
        quiet += timed(lambda it: model.generate(**ids(it), **kw), [item]) / len(items)
    quiet_passes = model.secl_counters["forward_passes"] / model.secl_counters["questions"]
    model.reset_calibration()
    model.start_burst()
    before = dict(model.secl_counters)
    burst = timed(lambda it: model.generate(**ids(it), secl_distractors=[list(LETTERS[: it.n_options])], **kw), items)
    n = model.secl_counters["questions"] - before["questions"]
    burst_passes = (model.secl_counters["forward_passes"] - before["forward_passes"]) / n
    updates = model.secl_counters["updates"] - before["updates"]
    print(f"{args.model}: {len(items)} MMLU prompts, {args.max_new_tokens} new tokens, threads={torch.get_num_threads()}")
    print(f"plain generate            {plain:.3f} s/q")
    print(f"SECL outside bursts       {quiet:.3f} s/q  ratio {quiet / plain:.2f}  passes/q {quiet_passes:.1f}")
    print(f"SECL inside a burst       {burst:.3f} s/q  ratio {burst / plain:.2f}  passes/q {burst_passes:.1f} "
          f"(updates on {updates}/{n}; the rest skipped by the bin gate)")


if __name__ == "__main__":
    main()
