"""Speed and memory of hf_calibration.metrics against torchmetrics, netcal and relplot.

Tasks, each on the same top-label problem (labels and float32 probabilities of shape (n, 4), softmax of
standard-normal logits; every implementation gets the (n, 4) array and computes the top label itself):

* ``ece``          binned ECE, 15 equal-width bins: torchmetrics ``multiclass_calibration_error``,
                   netcal ``ECE(bins=15)``, relplot ``binnedECE`` (after ``multiclass_logits_to_confidences``)
* ``ece_quantile`` equal-mass ECE, 15 bins: netcal ``ECE(bins=15, equal_intervals=False)``
* ``smece``        smooth ECE: relplot ``smECE``

Every (task, implementation, n) runs in a fresh subprocess that loads the data from .npy files, warms
up on 1,000 rows, then measures one call for memory (tracemalloc peak of numpy allocations, and the
growth of the process's peak RSS, which also sees torch's allocator) and ``--repeats`` calls for time
(best of). "x fastest peer" is time / time of the fastest peer on that task and n (< 1: faster).

Usage:  python benchmarks/bench_metrics.py [--sizes 1e5 1e6 1e7] [--repeats 3] [--tasks ece smece]
                                           [--max-n relplot/smece=1e6 ...]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc

import numpy as np

TASKS = {
    "ece": ["hf_calibration", "torchmetrics", "netcal", "relplot"],
    "ece_quantile": ["hf_calibration", "netcal"],
    "smece": ["hf_calibration", "relplot"],
}


def make_data(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 4, size=n)
    probs = np.empty((n, 4), np.float32)
    step = 1 << 20
    for s in range(0, n, step):
        logits = rng.standard_normal((min(step, n - s), 4)).astype(np.float32)
        e = np.exp(logits)
        probs[s : s + step] = e / e.sum(axis=1, keepdims=True)
    return labels, probs


def implementation(task: str, impl: str):
    """A function (labels, probs) -> float."""
    if impl == "hf_calibration":
        from hf_calibration.metrics import expected_calibration_error, smooth_ece

        if task == "ece":
            return lambda y, p: expected_calibration_error(y, p, n_bins=15)
        if task == "ece_quantile":
            return lambda y, p: expected_calibration_error(y, p, n_bins=15, binning="quantile")
        return smooth_ece
    if impl == "torchmetrics":
        import torch
        from torchmetrics.functional.classification import multiclass_calibration_error

        return lambda y, p: float(
            multiclass_calibration_error(torch.from_numpy(p), torch.from_numpy(y), num_classes=4, n_bins=15)
        )
    if impl == "netcal":
        from netcal.metrics import ECE

        metric = ECE(bins=15, equal_intervals=task == "ece")
        return lambda y, p: metric.measure(p, y)
    if impl == "relplot":
        import relplot
        from relplot.metrics import binnedECE

        if task == "ece":
            return lambda y, p: binnedECE(*relplot.multiclass_logits_to_confidences(p, y, probs=True), nbins=15)
        return lambda y, p: relplot.smECE(*relplot.multiclass_logits_to_confidences(p, y, probs=True))
    raise ValueError(f"unknown implementation {impl!r}")


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def worker(task: str, impl: str, data_dir: str, repeats: int) -> dict:
    labels = np.load(os.path.join(data_dir, "labels.npy"))
    probs = np.load(os.path.join(data_dir, "probs.npy"))
    fn = implementation(task, impl)
    fn(labels[:1000], probs[:1000])  # imports, lazy initialisation
    rss_before = _peak_rss_bytes()
    tracemalloc.start()
    start = time.perf_counter()
    value = float(fn(labels, probs))
    first = time.perf_counter() - start
    traced_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    rss_growth = _peak_rss_bytes() - rss_before
    times = []
    for _ in range(repeats if first < 20 else 1):
        start = time.perf_counter()
        fn(labels, probs)
        times.append(time.perf_counter() - start)
    return {
        "value": value,
        "seconds": min(times),
        "traced_peak": traced_peak if impl != "torchmetrics" else None,  # torch's allocator is not traced
        "rss_growth": max(rss_growth, 0),
        "input_bytes": probs.nbytes,
    }


def _mb(x):
    return "n/a" if x is None else f"{x / 2**20:.1f}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", type=float, default=[1e5, 1e6, 1e7])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tasks", nargs="+", choices=list(TASKS), default=list(TASKS))
    parser.add_argument(
        "--max-n", nargs="*", default=[], metavar="IMPL/TASK=N",
        help="skip an implementation above this n (e.g. netcal/ece_quantile=1e6) when it takes minutes",
    )
    parser.add_argument("--worker", nargs=4, metavar=("TASK", "IMPL", "DATA_DIR", "REPEATS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        task, impl, data_dir, repeats = args.worker
        print(json.dumps(worker(task, impl, data_dir, int(repeats))))
        return 0

    caps = {k: float(v) for k, v in (item.split("=") for item in args.max_n)}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(s) for s in args.sizes):
            labels, probs = make_data(n)
            np.save(os.path.join(tmp, "labels.npy"), labels)
            np.save(os.path.join(tmp, "probs.npy"), probs)
            del labels, probs
            for task in args.tasks:
                impls = TASKS[task]
                results = {}
                for impl in impls:
                    if n > caps.get(f"{impl}/{task}", float("inf")):
                        results[impl] = None
                        continue
                    cmd = [sys.executable, __file__, "--worker", task, impl, tmp, str(args.repeats)]
                    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                    results[impl] = json.loads(out.strip().splitlines()[-1])
                    print(f"# {task:12s} {impl:14s} n={n:.0e}: {results[impl]['seconds']:.3f} s", file=sys.stderr)
                peers = [r["seconds"] for i, r in results.items() if i != "hf_calibration" and r is not None]
                fastest = min(peers) if peers else float("nan")
                for impl, r in results.items():
                    rows.append((task, n, impl, r, fastest))

    columns = ["task", "n", "implementation", "time (s)", "x fastest peer", "tracemalloc peak (MiB)",
               "peak RSS growth (MiB)", "value"]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * 8)
    for task, n, impl, r, fastest in rows:
        if r is None:
            print(f"| {task} | {n:.0e} | {impl} | skipped (--max-n) | | | | |")
            continue
        print(
            f"| {task} | {n:.0e} | {impl} | {r['seconds']:.3f} | {r['seconds'] / fastest:.2f} | "
            f"{_mb(r['traced_peak'])} | {_mb(r['rss_growth'])} | {r['value']:.6f} |"
        )
    print()
    for task, n, impl, r, fastest in rows:
        if impl == "hf_calibration" and r is not None:
            extra = max(r["traced_peak"], r["rss_growth"]) / r["input_bytes"]
            print(
                f"{task} n={n:.0e}: hf_calibration {fastest / r['seconds']:.1f}x faster than the fastest peer; "
                f"peak extra memory {extra:.2f}x the (n, 4) float32 input ({r['input_bytes'] / 2**20:.0f} MiB)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
