"""SECL speed: `generate` with the mixin outside bursts vs plain `generate`, and the cost of a burst.

    python benchmarks/bench_secl.py --model HuggingFaceTB/SmolLM2-135M-Instruct --n 20 --max-new-tokens 8 32 64
    python benchmarks/bench_secl.py --n 20 --max-new-tokens 8 32 64 128 --full-length --no-burst

Same prompts (MMLU, chat format), greedy, batch 1 (set OMP_NUM_THREADS yourself), once per
``--max-new-tokens`` value. For each prompt three calls follow each other on the same model, so a
changing machine load affects all three alike:
- plain: the model class's own ``generate`` (with the LoRA adapter on, as the burst questions so far left
  it; SECL's own answers run with it off under the default ``adapter_scope="confidence"``),
- SECL outside bursts: the mixin's ``generate`` (gate updated; the Page-Hinkley threshold is set out of
  reach so no alarm turns later prompts into burst questions),
- SECL inside a burst: ``start_burst()`` then the mixin's ``generate`` (a burst of one question, so the
  next "outside" call is outside again; MCQA distractors = the other options, shown with their text). The adapter
  accumulates over the burst questions, as in one burst of ``--n`` questions, and is reset to the
  identity before each length; plain and outside-burst calls always run the same weights.
Prints seconds per question, the ratios to plain, forward passes per question, the mean answer
length (generation stops at the end-of-turn token, so it is often shorter than ``--max-new-tokens``)
and the load average sampled after every prompt. ``--full-length`` suppresses the end-of-turn token
until ``--max-new-tokens`` (``min_new_tokens``), so every answer has exactly that length (as a worked
solution would); ``--no-burst`` skips the burst calls.

Target (issue 6): outside bursts at most 1.10× plain. The extra work outside bursts is one forward
pass over the follow-up turn that asks for the confidence (~45 tokens plus the restated answer), run
on ``generate``'s own key/value cache; its cost is roughly fixed per question, so the ratio falls as
answers get longer.
"""

import argparse
import os
import time

import torch

from hf_calibration.modeling import load_model
from hf_calibration.secl import SECLConfig, SECLGenerationMixin, apply_secl
from hf_calibration.modeling.streams import build_stream

TARGET = 1.10


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def answer_length(sequence, n_prompt, stop) -> int:
    answer = sequence[n_prompt:].tolist()
    return next((j for j, t in enumerate(answer) if t in stop), len(answer))


def measure(model, items, max_new_tokens, pad_id, *, full_length=False, burst=True):
    """Seconds, passes and answer lengths per mode for one answer length (module docstring)."""
    plain_generate = super(SECLGenerationMixin, model).generate  # the model class's own generate
    kw = dict(max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad_id)
    if full_length:
        kw["min_new_tokens"] = max_new_tokens
    stop = model.secl_stop_ids(kw)
    model.reset_calibration()
    sums = dict(plain=0.0, quiet=0.0, burst=0.0, quiet_passes=0, burst_passes=0, tokens=0, updates=0)
    loads = []
    for item in items:
        ids = torch.tensor([item.prompt_ids])
        inputs = dict(input_ids=ids, attention_mask=torch.ones_like(ids))
        seconds, out = timed(lambda: plain_generate(**inputs, **kw))
        sums["plain"] += seconds
        sums["tokens"] += answer_length(out[0], ids.shape[1], stop)
        seconds, _ = timed(lambda: model.generate(**inputs, **kw))
        record = model.secl_records[0].to_dict()
        assert not record["in_burst"], "an alarm opened a burst during the outside-burst measurement"
        sums["quiet"] += seconds
        sums["quiet_passes"] += record["forward_passes"]
        if burst:
            model.start_burst()
            seconds, _ = timed(lambda: model.generate(**inputs, secl_choices=[item.choices], **kw))
            record = model.secl_records[0].to_dict()
            sums["burst"] += seconds
            sums["burst_passes"] += record["forward_passes"]
            sums["updates"] += record["updated"]
        loads.append(os.getloadavg()[0])
    n = len(items)
    return {k: v / n if k not in ("updates",) else v for k, v in sums.items()}, loads


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    parser.add_argument("--n", type=int, default=20, help="MMLU prompts (default 20)")
    parser.add_argument("--max-new-tokens", type=int, nargs="+", default=[8, 32, 64],
                        help="answer lengths to measure, each on the same prompts (default 8 32 64)")
    parser.add_argument("--full-length", action="store_true",
                        help="no end-of-turn before --max-new-tokens: every answer has exactly that many tokens")
    parser.add_argument("--no-burst", action="store_true", help="measure plain and outside-burst calls only")
    args = parser.parse_args()
    if args.n < 1 or min(args.max_new_tokens) < 1:
        parser.error("--n and --max-new-tokens must be positive")

    wall = time.perf_counter()
    model, tokenizer = load_model(args.model)
    items = build_stream(tokenizer, "mmlu", limit_per_domain=args.n)
    pad_id = tokenizer.pad_token_id
    # burst_size=1: start_burst() makes exactly the next question a burst question
    config = SECLConfig(burst_size=1, ph_threshold=1e12)
    model = apply_secl(model, tokenizer, config)
    defaults = SECLConfig().to_dict()
    print("SECLConfig defaults (those that act here): " + ", ".join(
        f"{k}={defaults[k]}" for k in ("adapter_scope", "bin_gate_width", "n_bins", "alpha_step", "delta", "tau_n",
                                       "num_distractors", "steps_per_update", "learning_rate", "lora_r"))
          + "; changed for the benchmark: burst_size=1, ph_threshold=1e12", flush=True)
    warm = torch.tensor([items[0].prompt_ids])
    model.generate(warm, attention_mask=torch.ones_like(warm), max_new_tokens=2, do_sample=False,
                   pad_token_id=pad_id, secl_update=False)  # warm-up of both paths

    rows, all_loads = [], []
    for max_new_tokens in args.max_new_tokens:
        r, loads = measure(model, items, max_new_tokens, pad_id, full_length=args.full_length, burst=not args.no_burst)
        all_loads += loads
        rows.append((max_new_tokens, r))
        burst = "" if args.no_burst else f"burst {r['burst']:.3f} ({r['burst'] / r['plain']:.2f}x), "
        print(f"max_new_tokens {max_new_tokens}: plain {r['plain']:.3f} s/q, outside {r['quiet']:.3f} "
              f"({r['quiet'] / r['plain']:.2f}x), {burst}answer {r['tokens']:.1f} tokens, "
              f"load {min(loads):.1f}-{max(loads):.1f}", flush=True)

    print(f"\n{args.model}: {len(items)} MMLU prompts (mean {sum(len(i.prompt_ids) for i in items) / len(items):.0f} "
          f"tokens), {'answers forced to full length' if args.full_length else 'answers end at end-of-turn'}, "
          f"batch 1, threads={torch.get_num_threads()}, wall {time.perf_counter() - wall:.0f} s, "
          f"1-min load average {min(all_loads):.1f}-{max(all_loads):.1f} (mean {sum(all_loads) / len(all_loads):.1f})\n")
    print("| max new tokens | answer tokens (mean) | plain s/q | outside bursts s/q | ratio | passes/q "
          "| inside a burst s/q | ratio | passes/q | updates | ≤ 1.10 outside |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for max_new_tokens, r in rows:
        ratio = r["quiet"] / r["plain"]
        burst = (f"{r['burst']:.3f} | {r['burst'] / r['plain']:.2f} | {r['burst_passes']:.1f} | {r['updates']}/{len(items)}"
                 if not args.no_burst else "— | — | — | —")
        print(f"| {max_new_tokens} | {r['tokens']:.1f} | {r['plain']:.3f} | {r['quiet']:.3f} | {ratio:.2f} | "
              f"{r['quiet_passes']:.1f} | {burst} | {'yes' if ratio <= TARGET else 'no'} |")


if __name__ == "__main__":
    main()
