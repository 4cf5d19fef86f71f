"""Served SECL measured beside the in-process run (issue 51 item 4; the rule: docs/secl_results.md, section "Served
SECL measured against the in-process run").

    OMP_NUM_THREADS=1 python -m experiments.secl_served --output-dir outputs/secl_served/smollm2_seed0 --seed 0
    python -m experiments.secl_served --output-dir outputs/secl_served/smollm2_seed0 --seed 0 \\
        --analyse outputs/secl_decisive/smollm2_seed0/records.jsonl

1. **The served stream**: ``hf-calibration secl-serve``'s job (``jobs.secl_service.run_secl_service``) on the
   decisive comparison's stream (the same questions as the in-process stream job: ``--balance-gold``, the same seed,
   ``served_stream``), one stream over the whole of it, ``SECLConfig()`` (the product defaults: scope "confidence",
   no forced burst; the served gate reads vLLM's top-``top_logprobs`` entropy bound), against a real vLLM server
   started here on 127.0.0.1 (``modeling.backends.launch.local_vllm_server``) unless ``--base-url`` names one. The
   job keeps every finished question in its state folder and resumes.
2. **The student's read after the stream**: every question read once more through the adapter the stream ended with
   (``SECLService.step(update=False)`` on a copy of the state, so the stream's own state is not touched), one JSON
   line per question in ``final.jsonl`` (resumes).
3. ``--analyse RECORDS`` (the in-process stream job's ``records.jsonl``, same model, stream and seed): per domain
   the served and in-process rows on the same questions (matched by domain and position; the answers compared),
   AUROC, ECE (10 equal-width bins), Brier − the domain constant's Brier with 95 % bootstrap intervals, passes per
   question, and the paired within-domain difference served − in-process of the returned confidence
   (``metrics.paired.paired_strata_difference``); ``report.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np

from experiments.common import by_domain_position, read_jsonl

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

STREAM = "halueval_qa_lm,halueval_dialogue_lm,halueval_summarization_lm,mmlu:stem"
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
STREAM_NAME = "default"  # run_secl_service's one stream over the whole question stream


def _config(args):
    from hf_calibration.jobs.secl_service import SECLServiceConfig

    return SECLServiceConfig(output_dir=str(Path(args.output_dir) / "service"), base_url=args.base_url or
                             "http://127.0.0.1:1/v1", served_model=args.model, model=args.model, stream=args.stream,
                             limit_per_domain=args.per_domain, balance_gold=True, seed=args.seed,
                             max_new_tokens=args.max_new_tokens)


def serve_and_read(args, base_url: str) -> None:
    """Steps 1 and 2 against the server at ``base_url``."""
    import torch

    from hf_calibration import modeling
    from hf_calibration.jobs.secl_service import run_secl_service, served_stream
    from hf_calibration.modeling.backends import open_server_backend
    from hf_calibration.secl import SECLConfig, apply_secl
    from hf_calibration.secl.service import SECLService

    torch.set_num_threads(args.threads)
    args.base_url = base_url
    config = _config(args)
    result = run_secl_service(config, SECLConfig())
    print(result.table, flush=True)
    if result.run["stopped"]:
        raise SystemExit(f"the served stream stopped: {result.run['stopped']} (run again to resume)")
    out = Path(args.output_dir)
    final = out / "final.jsonl"
    done = {r["index"] for r in read_jsonl(final)}
    tokenizer, backend = open_server_backend(args.model, base_url, args.model)
    (out / "run.json").write_text(json.dumps({"server_context": backend.max_context, "model": args.model,
                                              "stream": args.stream, "seed": args.seed}))
    model, _ = modeling.load_model(args.model, device="cpu")
    trainer = apply_secl(model, tokenizer, SECLConfig())
    items = served_stream(config, trainer, tokenizer, backend.max_context)
    if len(done) < len(items):
        scratch = out / "final_state"
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.copytree(out / "service", scratch)
        service = SECLService(backend, trainer, scratch, max_new_tokens=args.max_new_tokens)
        with final.open("a", encoding="utf-8") as f:
            for i, item in enumerate(items):
                if i in done:
                    continue
                start = time.perf_counter()
                rec = service.step(STREAM_NAME, item.prompt_ids, choices=item.choices, update=False)
                f.write(json.dumps({"index": i, "final": rec.confidence, "adapter": rec.adapter,
                                    "answer_ids": rec.answer_ids, "forward_passes": rec.forward_passes,
                                    "seconds": time.perf_counter() - start}) + "\n")
                f.flush()
                if i % 50 == 0:
                    print(f"final read {i + 1}/{len(items)}", flush=True)
    backend.close()


# ---------------------------------------------------------------------------------------------------- analysis
def served_rows(args) -> list[dict]:
    """One dict per question of the served stream, in stream order: domain, answer (decoded), correct, the returned
    confidence, whether an update step trained on it, its passes, the final adapter's read, the gate's values."""
    from hf_calibration.jobs.secl_service import served_stream
    from hf_calibration.modeling import load_model
    from hf_calibration.modeling.streams import judge
    from hf_calibration.secl import SECLConfig, apply_secl

    out = Path(args.output_dir)
    state = json.loads((out / "service" / STREAM_NAME / "stream.json").read_text())
    records = state["records"]
    final = {r["index"]: r for r in read_jsonl(out / "final.jsonl")}
    model, tokenizer = load_model(args.model, device="cpu")
    trainer = apply_secl(model, tokenizer, SECLConfig())
    server_context = json.loads((out / "run.json").read_text()).get("server_context")
    items = served_stream(_config(args), trainer, tokenizer, server_context)
    rows = []
    for i, (item, rec) in enumerate(zip(items, records)):
        text = tokenizer.decode(rec["answer_ids"], skip_special_tokens=True)
        _, correct = judge(item, text)
        fin = final.get(i)
        rows.append({"domain": item.domain, "answer": text, "correct": bool(correct), "confidence": rec["confidence"],
                     "updated": bool(rec["updated"]), "in_burst": bool(rec["in_burst"]), "alarm": bool(rec["alarm"]),
                     "passes": rec["forward_passes"], "final": None if fin is None else fin["final"],
                     "final_passes": None if fin is None else fin["forward_passes"],
                     "entropy": rec["entropy"], "entropy_gap": rec.get("entropy_gap")})
    return rows


def _report(y, c, n_resamples: int, seed: int) -> dict:
    from hf_calibration.metrics import calibration_report

    acc = float(np.mean(y))
    rep = calibration_report(y, np.clip(c, 0, 1), n_bins=10, n_resamples=n_resamples, seed=seed)
    return {"n": int(len(y)), "accuracy": acc, "auroc": rep["auroc"], "ece": rep["conf_ece"],
            "brier_minus_constant": rep["brier"]["value"] - acc * (1 - acc)}


def analyse(args) -> dict:
    """The comparison of step 3 (module docstring) on what the output folder and ``args.analyse`` hold."""
    return compare(served_rows(args), read_jsonl(Path(args.analyse)), n_resamples=args.n_resamples, seed=args.seed)


def compare(served: list[dict], records: list[dict], *, n_resamples: int, seed: int) -> dict:
    """Served rows (``served_rows``) against the in-process stream job's records, matched by domain and position
    within it → the report of step 3: per domain each row's n, accuracy, AUROC, ECE, Brier − constant and passes,
    the gate's counts, and the paired within-domain AUROC and Brier differences (n-weighted): served − in-process of
    the returned confidence on the questions answered alike (``differences['auroc'|'brier']``), of the student's
    final read on the questions held out in both runs and answered alike (``differences['student_held_out']``), and
    the served student held out − P(True)Norm used directly on the same questions
    (``differences['served_student_held_out_minus_a']``). SystemExit naming ``--analyse`` when a served question has
    no record."""
    from hf_calibration.metrics.paired import paired_strata_difference

    by_pos = by_domain_position(records)
    pairs = [(s, by_pos.get(key)) for key, s in by_domain_position(served).items()]
    missing = sum(r is None for _, r in pairs)
    if missing:
        raise SystemExit(f"--analyse: {missing} served questions have no in-process record at the same position")
    same_answer = np.array([s["answer"].strip() == r["answer"].strip() for s, r in pairs])
    rep = {"n": len(pairs), "same_answer": int(same_answer.sum()), "domains": {}, "gate": {}, "differences": {}}
    strata, held_strata, held_vs_a = [], [], []
    for d in dict.fromkeys(s["domain"] for s, _ in pairs):
        dom = [(s, r) for s, r in pairs if s["domain"] == d]
        ys = np.array([int(s["correct"]) for s, _ in dom])
        yl = np.array([int(r["correct"]) for _, r in dom])
        row = {"served_returned": _report(ys, np.array([s["confidence"] for s, _ in dom]), n_resamples,
                                          seed),
               "in_process_returned": _report(yl, np.array([r["secl"] for _, r in dom]), n_resamples, seed),
               "norm_p_true": _report(yl, np.array([r["norm_p_true"] for _, r in dom]), n_resamples, seed)}
        held_s = [(s, r) for s, r in dom if not s["updated"] and s["final"] is not None]
        if held_s:
            row["served_student_held_out"] = _report(np.array([int(s["correct"]) for s, _ in held_s]),
                                                     np.array([s["final"] for s, _ in held_s]), n_resamples,
                                                     seed)
        held_l = [(s, r) for s, r in dom if not r.get("updated")]
        row["in_process_student_held_out"] = _report(np.array([int(r["correct"]) for _, r in held_l]),
                                                     np.array([r["secl_final"] for _, r in held_l]),
                                                     n_resamples, seed)
        row["passes"] = {"served_returned": float(np.mean([s["passes"] for s, _ in dom])),
                         "in_process_returned": float(np.mean([r["passes"]["secl"] for _, r in dom])),
                         "norm_p_true": float(np.mean([r["passes"]["norm_p_true"] for _, r in dom])),
                         "in_process_student_held_out": float(np.mean([r["passes"]["verbalized"] for _, r in held_l]))}
        if held_s:
            row["passes"]["served_student_held_out"] = float(np.mean([s["final_passes"] for s, _ in held_s]))
        rep["domains"][d] = row
        rep["gate"][d] = {"served_alarms": int(sum(s["alarm"] for s, _ in dom)),
                          "served_burst_questions": int(sum(s["in_burst"] for s, _ in dom)),
                          "served_updates": int(sum(s["updated"] for s, _ in dom)),
                          "in_process_alarms": int(sum(bool(r.get("alarm")) for _, r in dom)),
                          "in_process_burst_questions": int(sum(bool(r.get("burst")) for _, r in dom)),
                          "mean_entropy_gap": float(np.mean([s["entropy_gap"] or 0.0 for s, _ in dom]))}
        same = np.array([s["answer"].strip() == r["answer"].strip() for s, r in dom])
        if same.any():  # the paired difference on the questions both answered alike (the same label)
            y = yl[same]
            strata.append(((y, np.clip(np.array([s["confidence"] for s, _ in dom])[same], 0, 1)),
                           (y, np.clip(np.array([r["secl"] for _, r in dom])[same], 0, 1))))
        both = [(s, r) for s, r in held_s if not r.get("updated")
                and s["answer"].strip() == r["answer"].strip()]
        if both:  # the student held out in both runs, on the same answers
            y = np.array([int(r["correct"]) for _, r in both])
            held_strata.append(((y, np.clip([s["final"] for s, _ in both], 0, 1)),
                                (y, np.clip([r["secl_final"] for _, r in both], 0, 1))))
        if held_s:  # the served student held out against (a), P(True)Norm used directly, on the same questions
            y = np.array([int(s["correct"]) for s, _ in held_s])
            held_vs_a.append(((y, np.clip([s["final"] for s, _ in held_s], 0, 1)),
                              (np.array([int(r["correct"]) for _, r in held_s]),
                               np.clip([r["norm_p_true"] for _, r in held_s], 0, 1))))
    for name, groups in (("returned", strata), ("student_held_out", held_strata),
                         ("served_student_held_out_minus_a", held_vs_a)):
        for metric in ("auroc", "brier"):
            if not groups:
                continue
            diff = paired_strata_difference(groups, metric=metric, weights="size", n_resamples=n_resamples,
                                            seed=seed)
            cell = {k: diff[k] for k in ("value", "low", "high")}
            if name == "returned":
                rep["differences"][metric] = cell
            else:
                rep["differences"].setdefault(name, {})[metric] = cell
    return rep


def _cell(m) -> str:
    return f"{m['value']:.3f} [{m['low']:.3f}, {m['high']:.3f}]"


def format_report(rep: dict) -> str:
    lines = [f"{rep['n']} questions; the same answer served and in process on {rep['same_answer']}.", "",
             "| domain | row | n | acc | AUROC | ECE | Brier − constant | passes/q |", "|---|---|---|---|---|---|---|---|"]
    for d, row in rep["domains"].items():
        for name, r in row.items():
            if name == "passes":
                continue
            passes = row["passes"].get(name)
            lines.append(f"| {d} | {name} | {r['n']} | {r['accuracy']:.3f} | {_cell(r['auroc'])} | {_cell(r['ece'])} "
                         f"| {r['brier_minus_constant']:+.3f} | {'' if passes is None else f'{passes:.2f}'} |")
    lines += ["", "| domain | served alarms | served burst q | served updates | in-process alarms | in-process burst q "
                  "| mean top-k entropy gap (nats) |", "|---|---|---|---|---|---|---|"]
    for d, g in rep["gate"].items():
        lines.append(f"| {d} | {g['served_alarms']} | {g['served_burst_questions']} | {g['served_updates']} | "
                     f"{g['in_process_alarms']} | {g['in_process_burst_questions']} | {g['mean_entropy_gap']:.3f} |")
    lines += ["", "Served − in-process, returned confidence, within domains (same answers only): AUROC "
              f"{_cell(rep['differences']['auroc'])}, Brier {_cell(rep['differences']['brier'])}."]
    for name, what in (("student_held_out", "Served − in-process, the student held out in both (same answers only)"),
                       ("served_student_held_out_minus_a", "Served student held out − (a) P(True)Norm used directly")):
        if name in rep["differences"]:
            d = rep["differences"][name]
            lines.append(f"{what}, within domains: AUROC {_cell(d['auroc'])}, Brier {_cell(d['brier'])}.")
    return "\n".join(lines) + "\n"


def main(argv=None):
    from hf_calibration.cli import script_parser

    p = script_parser("python -m experiments.secl_served", __doc__.splitlines()[0])
    p.add_argument("--output-dir", default="outputs/secl_served/smollm2_seed0")
    p.add_argument("--model", default=MODEL)
    p.add_argument("--stream", default=STREAM)
    p.add_argument("--per-domain", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=8, help="the stream job's answer length")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the local trainer")
    p.add_argument("--base-url", default=None, help="a running vLLM server (…/v1); default: start one here")
    p.add_argument("--max-model-len", type=int, default=4096, help="the started server's context (tokens)")
    p.add_argument("--analyse", default=None, metavar="RECORDS",
                   help="the in-process stream job's records.jsonl: only the analysis, on what is saved")
    p.add_argument("--n-resamples", type=int, default=1000)
    args = p.parse_args(argv)
    out = Path(args.output_dir)
    if args.analyse is not None:
        if not Path(args.analyse).is_file():
            p.error(f"--analyse: no file {args.analyse}")
        rep = analyse(args)
        (out / "report.json").write_text(json.dumps(rep, indent=1, default=float))
        text = format_report(rep)
        (out / "report.md").write_text(text)
        print(text)
        return rep
    out.mkdir(parents=True, exist_ok=True)
    if args.base_url is not None:
        serve_and_read(args, args.base_url)
        return None
    from hf_calibration.modeling import resolve_model_path
    from hf_calibration.modeling.backends.launch import local_vllm_server

    venv = Path(os.path.abspath(os.environ.get("HF_CALIBRATION_VLLM_VENV") or ".venv-vllm"))  # the server runs elsewhere
    with local_vllm_server(venv / "bin" / "python", resolve_model_path(args.model), args.model,
                           log=(out / "vllm.log").resolve(), max_model_len=args.max_model_len, lora_rank=8,
                           timeout_s=600) as url:
        serve_and_read(args, url)
    return None


if __name__ == "__main__":
    main()
