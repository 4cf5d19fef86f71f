"""Cost per question of the SECL stream's baseline pass, per domain: the P(True) reads with and without
``generate``'s prompt cache.

    OMP_NUM_THREADS=1 python benchmarks/bench_secl_stream.py --per-domain 4
    python benchmarks/bench_secl_stream.py --stream halueval_qa_lm,mmlu:stem --per-domain 10

For each question of the stream (``modeling.streams.build_stream``, gold letters balanced, seed 0): one ``generate``
with the SECL mixin and ``secl_update=False`` (the answer and its verbalized confidence, as the baseline pass
runs it), then the pseudo-label (P(True) of the answer and of each other option, P(True)Norm) twice, in
alternating order so a changing machine load affects both alike: continuing the returned prompt cache
(``secl_pseudo_label(prompt_cache=...)``, what ``stream.baseline_pass`` does) and running the prompt again (what
it did before). Prints, per domain, the mean prompt length, seconds per question of each part, the ratio of the
baseline pass's cost per question (generate + label) without the cache to that with it, and the largest
difference between the two P(True) values (they are the same computation).
"""

import argparse
import time
from collections import defaultdict

import numpy as np
import torch

from hf_calibration.modeling import load_model
from hf_calibration.secl import SECLConfig, apply_secl
from hf_calibration.modeling.streams import build_stream

DEFAULT_STREAM = "halueval_qa_lm,halueval_dialogue_lm,halueval_summarization_lm,mmlu:stem"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    parser.add_argument("--stream", default=DEFAULT_STREAM)
    parser.add_argument("--per-domain", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    args = parser.parse_args()

    wall = time.perf_counter()
    model, tokenizer = load_model(args.model)
    model = apply_secl(model, tokenizer, SECLConfig())
    items = build_stream(tokenizer, args.stream, limit_per_domain=args.per_domain, seed=0, balance_gold=True)
    rows = defaultdict(lambda: defaultdict(list))
    for n, item in enumerate(items):
        ids = torch.tensor([item.prompt_ids])
        start = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new_tokens,
                             do_sample=False, return_dict_in_generate=True, secl_update=False,
                             secl_choices=[item.choices], pad_token_id=tokenizer.pad_token_id)
        gen = time.perf_counter() - start
        answer = out.sequences[0, len(item.prompt_ids):].tolist()
        stop = model.secl_stop_ids()
        answer = answer[: next((j for j, t in enumerate(answer) if t in stop), len(answer))]
        labels = {}
        for mode in (("cached", "again") if n % 2 == 0 else ("again", "cached")):
            start = time.perf_counter()
            labels[mode] = model.secl_pseudo_label(item.prompt_ids, answer, choices=item.choices,
                                                   prompt_cache=out.cache if mode == "cached" else None)
            rows[item.domain][mode].append(time.perf_counter() - start)
        rows[item.domain]["generate"].append(gen)
        rows[item.domain]["tokens"].append(len(item.prompt_ids))
        rows[item.domain]["diff"].append(float(np.max(np.abs(labels["cached"]["p_true"] - labels["again"]["p_true"]))))

    print(f"\n{args.model}: {len(items)} questions, {args.per_domain} per domain, threads={torch.get_num_threads()}, "
          f"wall {time.perf_counter() - wall:.0f} s\n")
    print("| domain | prompt tokens | generate s/q | P(True) reads, cached s/q | P(True) reads, prompt again s/q "
          "| baseline pass s/q, cached | before | before / cached | max abs P(True) difference |")
    print("|---|---|---|---|---|---|---|---|---|")
    for domain, r in rows.items():
        gen, cached, again = (float(np.mean(r[k])) for k in ("generate", "cached", "again"))
        print(f"| {domain} | {np.mean(r['tokens']):.0f} | {gen:.3f} | {cached:.3f} | {again:.3f} | {gen + cached:.3f} "
              f"| {gen + again:.3f} | {(gen + again) / (gen + cached):.2f} | {max(r['diff']):.1e} |")


if __name__ == "__main__":
    main()
