"""Post-hoc calibrators fitted in one domain, evaluated in-domain and out-of-domain (issue 4, SPEC §5).

SmolLM2-135M-Instruct (packaged, offline) scores MMLU STEM, humanities and GPQA-Diamond questions once.
Every calibrator is fitted on half of the STEM questions (the labelled validation split) and evaluated
on the other STEM half (in-domain), humanities and GPQA (out-of-domain). Each table carries the SPEC §5
references: a constant confidence equal to the validation accuracy, and 1/K.

    python examples/posthoc_domain_shift.py --stem 400 --humanities 200 --output-dir results/posthoc
"""

import time
from pathlib import Path

import numpy as np

from hf_calibration.reporting import reports
from hf_calibration.data import load_mcqa
from hf_calibration.modeling import load_model, score_mcqa
from hf_calibration.runtime.outputs import AtomicOutputDir
from hf_calibration.posthoc import CALIBRATORS


def _subset(scores, idx):
    from dataclasses import replace

    return replace(
        scores, option_logits=scores.option_logits[idx], probs=scores.probs[idx], option_mass=scores.option_mass[idx],
        prediction=scores.prediction[idx], confidence=scores.confidence[idx], labels=scores.labels[idx],
        correct=scores.correct[idx], prompts=[scores.prompts[i] for i in idx],
    )


def main(argv=None):
    from hf_calibration.cli import script_parser

    p = script_parser("python examples/posthoc_domain_shift.py", __doc__.splitlines()[0])
    p.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    p.add_argument("--stem", type=int, default=400, help="STEM questions (half fit, half in-domain test)")
    p.add_argument("--humanities", type=int, default=200)
    p.add_argument("--gpqa", type=int, default=198)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--n-resamples", type=int, default=1000)
    p.add_argument("--output-dir", default="results/posthoc")
    args = p.parse_args(argv)

    start = time.perf_counter()
    model, tokenizer = load_model(args.model)
    sets = {
        "stem": load_mcqa("mmlu", subjects="stem", limit=args.stem, seed=args.seed),
        "humanities": load_mcqa("mmlu", subjects="humanities", limit=args.humanities, seed=args.seed),
        "gpqa": load_mcqa("gpqa", limit=args.gpqa, seed=args.seed),
    }
    scored = {name: score_mcqa(model, tokenizer, ds, batch_size=args.batch_size) for name, ds in sets.items()}
    perm = np.random.default_rng(args.seed).permutation(len(sets["stem"]))
    half = len(perm) // 2
    fit = _subset(scored["stem"], np.sort(perm[:half]))
    evals = {"stem (ID)": _subset(scored["stem"], np.sort(perm[half:])),
             "humanities (OOD)": scored["humanities"], "gpqa (OOD)": scored["gpqa"]}

    calibrators = {}
    for method, cls in CALIBRATORS.items():
        c = cls()
        if c.input_kind == "logits":
            c.fit(fit.option_logits, fit.labels)
        else:
            c.fit(fit.confidence, fit.correct.astype(int))
        calibrators[method] = c

    kw = dict(n_resamples=args.n_resamples, seed=args.seed)
    val_acc = float(fit.correct.mean())
    results, text = {}, []
    for name, s in evals.items():
        signals = {"uncalibrated": reports.mcqa_report(s.labels, s.probs, **kw)}
        for method, c in calibrators.items():
            signals[method] = reports.posthoc_report(c, s, **kw)
        signals.update(reports.references(s.correct, s.probs.shape[1], accuracy=val_acc, **kw))
        results[name] = signals
        text.append(f"### {name}: n={len(s.labels)}\n\n" + reports.format_table(signals, markdown=True))
    wall = time.perf_counter() - start
    header = (
        f"{args.model}, prompt={fit.prompt_format}, seed={args.seed}; fitted on {half} STEM questions "
        f"(validation accuracy {val_acc:.3f}, temperature τ={calibrators['temperature'].temperature_:.3f}); "
        f"wall time {wall:.0f} s; 95% bootstrap intervals ({args.n_resamples} resamples)"
    )
    out = Path(args.output_dir)
    with AtomicOutputDir(out) as tmp:
        reports.write_json(tmp / "metrics.json", {"run": vars(args) | {"wall_seconds": wall, "fit_n": half,
                                                  "validation_accuracy": val_acc}, "results": results})
        (tmp / "table.md").write_text(header + "\n\n" + "\n\n".join(text) + "\n", encoding="utf-8")
        for method, c in calibrators.items():
            c.save(tmp / f"{method}.json")
    print(header + "\n\n" + "\n\n".join(text))


if __name__ == "__main__":
    main()
