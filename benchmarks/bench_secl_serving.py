"""SECL beside a vLLM server against plain serving and against SECL in process: seconds per question outside and
inside bursts, the adapter swap's latency, forward passes per question; prints the ratios.

Start a server as docs/serving.md does (``--enable-lora --max-lora-rank 8``, ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``),
then::

    python benchmarks/bench_secl_serving.py --base-url http://127.0.0.1:8000/v1 --n 8

The same MMLU questions go through: plain serving (the answer only), the SECL service outside a burst (answer +
verbalized read), the SECL service inside a burst (every question: P(True) of the options, bin gate width 0, an
update and a swap per accepted question), and the same three in process (``SECLModel.generate`` with
``secl_update=False``, then outside and inside a burst).
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def _secl_model(config):
    from hf_calibration.modeling import load_model
    from hf_calibration.secl import apply_secl

    model, tokenizer = load_model(MODEL)
    torch.manual_seed(0)
    return apply_secl(model, tokenizer, config)


def _timed(fn, items):
    start = time.perf_counter()
    out = [fn(item) for item in items]
    return (time.perf_counter() - start) / len(items), out


def served(args, items, config):
    from hf_calibration.modeling.backends import open_server_backend
    from hf_calibration.secl.service import SECLService

    _, backend = open_server_backend(MODEL, args.base_url, args.served_model or MODEL, max_in_flight=8)
    plain, _ = _timed(lambda it: backend.generate([it.prompt_ids], max_new_tokens=args.max_new_tokens), items)
    swaps = []
    with tempfile.TemporaryDirectory() as state:
        service = SECLService(backend, _secl_model(config), state, max_new_tokens=args.max_new_tokens)
        swap = service._swap

        def timed_swap(stream):
            start = time.perf_counter()
            swap(stream)
            swaps.append(time.perf_counter() - start)

        service._swap = timed_swap
        outside, rec_out = _timed(lambda it: service.step("outside", it.prompt_ids, choices=it.choices), items)
        service.start_burst("inside")
        inside, rec_in = _timed(lambda it: service.step("inside", it.prompt_ids, choices=it.choices), items)
    backend.close()
    return {"plain": plain, "outside": outside, "inside": inside, "swap": sum(swaps) / max(len(swaps), 1),
            "n_swaps": len(swaps), "passes_outside": _mean_passes(rec_out), "passes_inside": _mean_passes(rec_in)}


def in_process(args, items, config):
    secl = _secl_model(config)

    def run(item, update):
        ids = torch.tensor([item.prompt_ids])
        secl.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new_tokens, do_sample=False,
                      secl_choices=[item.choices], secl_update=update, pad_token_id=secl.secl_tokenizer.pad_token_id)
        return secl.secl_records[0].to_dict()

    with secl.peft_model.disable_adapter():
        plain, _ = _timed(lambda it: secl.peft_model.generate(
            torch.tensor([it.prompt_ids]), max_new_tokens=args.max_new_tokens, do_sample=False,
            pad_token_id=secl.secl_tokenizer.pad_token_id), items)
    outside, rec_out = _timed(lambda it: run(it, True), items)
    secl.reset_calibration(counters=True)
    secl.start_burst()
    inside, rec_in = _timed(lambda it: run(it, True), items)
    return {"plain": plain, "outside": outside, "inside": inside, "passes_outside": _mean_passes(rec_out),
            "passes_inside": _mean_passes(rec_in)}


def _mean_passes(records):
    return sum(r.forward_passes for r in records) / len(records)


def main():
    from hf_calibration.modeling.backends import load_tokenizer
    from hf_calibration.secl import SECLConfig
    from hf_calibration.modeling.streams import build_stream

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--served-model", default=None)
    parser.add_argument("--n", type=int, default=8, help="questions per measurement")
    parser.add_argument("--max-new-tokens", type=int, default=4)
    parser.add_argument("--scope", default="all", choices=["all", "confidence"])
    args = parser.parse_args()
    config = SECLConfig(burst_size=args.n, bin_gate_width=0, adapter_scope=args.scope)
    items = build_stream(load_tokenizer(MODEL), "mmlu", limit_per_domain=args.n)
    s, p = served(args, items, config), in_process(args, items, config)
    print(f"{len(items)} MMLU questions, SmolLM2-135M, scope {args.scope}, seconds per question")
    print(f"{'':24}{'server':>10}{'in process':>12}{'server/in-proc':>16}")
    for key in ("plain", "outside", "inside"):
        print(f"{key:24}{s[key]:>10.3f}{p[key]:>12.3f}{s[key] / p[key]:>16.2f}")
    print(f"{'passes/q outside':24}{s['passes_outside']:>10.2f}{p['passes_outside']:>12.2f}")
    print(f"{'passes/q inside':24}{s['passes_inside']:>10.2f}{p['passes_inside']:>12.2f}")
    print(f"ratios to plain serving: outside a burst {s['outside'] / s['plain']:.2f}x, inside {s['inside'] / s['plain']:.2f}x"
          f" (in process: {p['outside'] / p['plain']:.2f}x, {p['inside'] / p['plain']:.2f}x)")
    print(f"swap (save_pretrained + rename + /v1/load_lora_adapter + unload): {s['swap']:.3f} s mean over "
          f"{s['n_swaps']} swaps")


if __name__ == "__main__":
    main()
