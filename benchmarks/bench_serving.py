"""In-process transformers against a vLLM server: the same MMLU questions scored both ways (option-letter
probabilities, as ``hf-calibration evaluate`` reads them), the server at 1, 8 and 32 requests in flight.

    .venv/bin/python benchmarks/bench_serving.py --n 64              # starts vLLM from .venv-vllm on 127.0.0.1
    .venv/bin/python benchmarks/bench_serving.py --base-url http://127.0.0.1:8000/v1   # a server already running

Prints questions per second, the ratio to in-process, and whether the answers agree (same predictions, largest
probability difference). One warm-up pass each; the best of ``--repeats`` timed passes is reported.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def _best(fn, repeats):
    fn()  # warm-up: the server's first requests and torch's first batches pay one-off costs
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return min(times), out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=64, help="MMLU questions (stratified, seed 0)")
    parser.add_argument("--in-flight", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--batch-size", type=int, default=8, help="in-process prompts per forward pass")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--base-url", help="a running server (else one is started from --vllm-venv)")
    parser.add_argument("--served-model", default=MODEL)
    parser.add_argument("--vllm-venv", default=str(Path(__file__).resolve().parents[1] / ".venv-vllm"))
    args = parser.parse_args(argv)

    from hf_calibration.data import load_mcqa
    from hf_calibration.modeling import load_model, resolve_model_path, score_mcqa
    from hf_calibration.modeling.backends import OpenAICompatibleBackend, TransformersBackend
    from hf_calibration.modeling.backends.launch import local_vllm_server

    rows = list(load_mcqa("mmlu", limit=args.n, seed=0))
    model, tok = load_model(MODEL)
    local = TransformersBackend(model, batch_size=args.batch_size, pad_id=tok.pad_token_id)
    t_local, ref = _best(lambda: score_mcqa(local, tok, rows, progress=False), args.repeats)
    mean_len = np.mean([len(tok.encode(p, add_special_tokens=False)) for p in ref.prompts])
    local_name = f"transformers, batch {args.batch_size}"
    import os

    import torch

    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    lines = [f"{len(rows)} MMLU questions, SmolLM2-135M-Instruct float32, prompts {mean_len:.0f} tokens on average; "
             f"{os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}, load average {load}",
             f"{'backend':<28} {'q/s':>8} {'x in-process':>13} {'same answers':>13} {'max |Δp|':>10}",
             f"{local_name:<28} {len(rows) / t_local:8.2f} {1.0:13.2f} {'—':>13} {'—':>10}"]
    tmp = tempfile.TemporaryDirectory()
    server = (nullcontext(args.base_url) if args.base_url else
              local_vllm_server(Path(args.vllm_venv) / "bin" / "python", resolve_model_path(MODEL), args.served_model,
                                log=Path(tmp.name) / "server.log", max_model_len=2048, lora_rank=None))
    start = time.perf_counter()
    with server as url:
        lines.insert(1, f"server: {url} (up in {time.perf_counter() - start:.0f} s)")
        for k in args.in_flight:
            backend = OpenAICompatibleBackend(url, args.served_model, tok, max_in_flight=k)
            t, got = _best(lambda: score_mcqa(backend, tok, rows, progress=False), args.repeats)
            backend.close()
            same = int((got.prediction == ref.prediction).sum())
            lines.append(f"{'vLLM, ' + str(k) + ' in flight':<28} {len(rows) / t:8.2f} {t_local / t:13.2f} "
                         f"{f'{same}/{len(rows)}':>13} {np.abs(got.probs - ref.probs).max():10.1e}")
    print("\n".join(lines))
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
