"""``hf-calibration evaluate`` in process, this checkout against an older commit, in one run: the whole command
(model load, scoring, metrics, files) timed as a user runs it, the two checkouts alternating so that load on the
machine hits both alike.

    .venv/bin/python benchmarks/bench_evaluate.py --old 3e32563 --limit 100          # SmolLM2, MMLU

``--old`` is checked out into a temporary git worktree (removed at the end); each run is a fresh process
(``python -m hf_calibration.cli evaluate``) with that checkout on PYTHONPATH, into a fresh output folder. Prints
each run's wall time and the scoring time ``metrics.json`` records, the medians, the ratio new / old (below 1:
this checkout is faster) and the load average before and after. ``--limit``, ``--batch-size``, ``--repeats``
(timed runs per checkout), ``--warmup`` (untimed runs per checkout first) and ``--model`` as their names say.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(tree: Path, out: Path, args) -> tuple[float, float]:
    """(wall seconds, scoring seconds recorded in metrics.json) of one evaluate in a fresh process."""
    env = dict(os.environ, PYTHONPATH=str(tree), HF_HUB_OFFLINE="1")
    cmd = [sys.executable, "-m", "hf_calibration.cli", "evaluate", "--output-dir", str(out), "--model", args.model,
           "--limit", str(args.limit), "--batch-size", str(args.batch_size), "--n-resamples", "100"]
    start = time.perf_counter()
    subprocess.run(cmd, env=env, cwd=tree, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - start
    return wall, float(json.loads((out / "metrics.json").read_text())["run"]["scoring_seconds"])


def scoring_ab(args) -> str:
    """The scoring step alone, old ``score_mcqa`` (its module read from ``--old`` with ``git show``) against this
    checkout's, in this process on the same loaded model, alternating ``--repeats`` times: under a busy machine the
    steadier comparison. Returns the printed lines."""
    import importlib.util

    from hf_calibration.data import load_mcqa
    from hf_calibration.modeling import load_model, score_mcqa

    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{args.old}:hf_calibration/modeling/scoring.py"],
                            check=True, capture_output=True, text=True).stdout
    spec = importlib.util.spec_from_loader("old_scoring", loader=None)
    old = sys.modules["old_scoring"] = importlib.util.module_from_spec(spec)
    exec(compile(source, "old_scoring.py", "exec"), old.__dict__)
    rows = list(load_mcqa("mmlu", limit=args.limit, seed=0))
    model, tok = load_model(args.model)
    fns = {"old": lambda: old.score_mcqa(model, tok, rows, batch_size=args.batch_size, progress=False),
           "new": lambda: score_mcqa(model, tok, rows, batch_size=args.batch_size, progress=False)}
    times = {"old": [], "new": []}
    for name, fn in fns.items():
        fn()  # warm-up
    for _ in range(args.repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            got = fn()
            times[name].append(time.perf_counter() - start)
            times.setdefault(f"{name}_probs", got.probs)
    diff = float(abs(times["old_probs"] - times["new_probs"]).max())
    med = {n: statistics.median(times[n]) for n in ("old", "new")}
    return (f"score_mcqa alone, {len(rows)} questions, one process, alternating: old {' '.join(f'{t:.2f}' for t in times['old'])} s, "
            f"new {' '.join(f'{t:.2f}' for t in times['new'])} s; median ratio new / old {med['new'] / med['old']:.3f}; "
            f"max |Δp| {diff:.1e}; load average {', '.join(f'{x:.1f}' for x in os.getloadavg())}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", required=True, help="the commit to compare with (any git revision)")
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs per checkout first (0: none)")
    parser.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    parser.add_argument("--scoring-only", action="store_true", help="only the in-process scoring A/B (scoring_ab)")
    args = parser.parse_args(argv)
    if args.scoring_only:
        print(scoring_ab(args))
        return 0

    tmp = Path(tempfile.mkdtemp(prefix="bench-evaluate-"))
    old_tree = tmp / "old"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old_tree), args.old], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    load_before = os.getloadavg()
    times = {"old": [], "new": []}
    try:
        trees = {"old": old_tree, "new": ROOT}
        for w in range(args.warmup):  # the OS file cache, torch's first import
            for name, tree in trees.items():
                _run(tree, tmp / f"warm-{name}-{w}", args)
        for r in range(args.repeats):
            for name, tree in trees.items():
                times[name].append(_run(tree, tmp / f"{name}-{r}", args))
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old_tree)], check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    load_after = os.getloadavg()
    import torch

    print(f"hf-calibration evaluate, {args.model}, --limit {args.limit}, --batch-size {args.batch_size}, in process; "
          f"{os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}; load average before "
          f"{', '.join(f'{x:.1f}' for x in load_before)}, after {', '.join(f'{x:.1f}' for x in load_after)}")
    print(f"{'checkout':<10} {'wall s (each run)':<30} {'median':>8} {'scoring s (each)':<26} {'median':>8}")
    med = {}
    for name in ("old", "new"):
        walls, scoring = [t[0] for t in times[name]], [t[1] for t in times[name]]
        med[name] = (statistics.median(walls), statistics.median(scoring))
        label = args.old if name == "old" else "this"
        print(f"{label:<10} {' '.join(f'{w:.1f}' for w in walls):<30} {med[name][0]:8.1f} "
              f"{' '.join(f'{s:.2f}' for s in scoring):<26} {med[name][1]:8.2f}")
    print(f"ratio new / old: wall {med['new'][0] / med['old'][0]:.3f}, scoring {med['new'][1] / med['old'][1]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
