"""The calm experiment over training seeds (``CALMExperimentConfig.seeds``): each seed's run into
``<output>/seed_<s>/``, then the summary over seeds (``seeds.md``, ``seeds.json``): mean and range per method, CALM −
TS and − SFT pooled over seeds, the claim check on the pooled intervals."""

from __future__ import annotations

from pathlib import Path

from hf_calibration.data import domain_key
from hf_calibration.errors import ParameterError
from hf_calibration.jobs.common import progress_line

from experiments.calm import method_probabilities, read_scored, run_calm_experiment
from experiments.calm_claims import PAIRS, calm_claim_check, pooled_difference
from experiments.calm_config import CALMExperimentConfig
from experiments.calm_open import check_open_answers, open_seeds_report
from experiments.common import format_claim_check, mean_range, method_label, pair_label


def seeds_report(out: Path, per_seed: dict, ood: list, *, header: str, n_resamples: int, seed: int,
                 open_row: tuple | None = None) -> tuple[dict, str]:
    """The summary over training seeds of ``per_seed`` (``{seed: report results}``, each seed's scores read back
    from ``out/seed_<s>/scores``): per split and method the mean and range over seeds of accuracy, conf-ECE, Brier
    and AUROC (and the constant-accuracy reference); CALM − TS and − SFT pooled over seeds (``pooled_difference``)
    with each seed's value; the claim check on the pooled intervals. Writes ``seeds.md`` and ``seeds.json``."""
    from hf_calibration.reporting.reports import write_json

    splits = ("id_test", *ood)
    runs = [method_probabilities(read_scored(out / f"seed_{s}")[0], ("validation", *splits)) for s in per_seed]
    kw = dict(n_resamples=n_resamples, seed=seed)
    tables = [r["tables"] for r in per_seed.values()]
    methods = [m for m in tables[0] if all(m in t for t in tables)]
    lines = [header, "", f"Mean (min–max) over the {len(per_seed)} seeds {', '.join(map(str, per_seed))}; each "
             f"seed's full table is seed_<s>/report.md.", ""]
    summary = {}
    for name in splits:
        lines += [f"### {name}", "", "| method | acc | conf-ECE | Brier | AUROC |", "|---|---|---|---|---|"]
        for m in methods:
            vals = {k: [t[m][name][k]["value"] for t in tables] for k in ("accuracy", "conf_ece", "brier", "auroc")}
            summary.setdefault(name, {})[m] = vals
            lines.append(f"| {method_label(m)} | " + " | ".join(mean_range(v) for v in vals.values()) + " |")
        refs = [r["references"][name]["constant_accuracy"]["conf_ece"]["value"] for r in per_seed.values()
                if name in r.get("references", {})]
        if refs:
            lines.append(f"| ref: const. = val. acc. | | {mean_range(refs)} | | |")
        lines.append("")
    pooled = {}
    lines += ["### paired differences pooled over seeds (stratified bootstrap, the same questions for both methods)",
              "", "| split | comparison | Δ conf-ECE [95 %] (per seed) | Δ accuracy [95 %] (per seed) |", "|---|---|---|---|"]
    for name in splits:
        for a, b in PAIRS:
            if a not in methods or b not in methods:
                continue
            d = {key: pooled_difference(runs, [name], a, b, key=key, **kw) for key in ("conf_ece", "accuracy")}
            pooled.setdefault(name, {})[f"{a} − {b}"] = d
            lines.append(f"| {name} | {pair_label(a, b)} | " + " | ".join(
                f"{v['value']:+.3f} [{v['low']:+.3f}, {v['high']:+.3f}] ("
                + ", ".join(f"{x:+.3f}" for x in v["per_stratum"]) + ")" for v in d.values()) + " |")
    checks, evidence = calm_claim_check(runs, list(ood), open_row=open_row, **kw)
    lines += ["", f"### claim check (pooled over {len(per_seed)} seeds)", "", format_claim_check(checks), ""]
    results = {"seeds": list(per_seed), "summary": summary, "pooled": pooled,
               "claims": [{"claim": c, "held": h, "evidence": e} for c, h, e in checks], "claim_evidence": evidence}
    text = "\n".join(lines)
    (out / "seeds.md").write_text(text)
    write_json(out / "seeds.json", results)
    return results, text


def run_calm_seeds(out: Path, config: CALMExperimentConfig, *, model_name: str, train_domain: str, device: str,
                   batch_size: int, n_resamples: int, overwrite: bool = False, progress: bool = True,
                   ) -> tuple[dict, str, dict]:
    """``run_calm_experiment`` once per seed of ``config.seed_list()`` into ``out/seed_<s>/`` (each resumable as
    one run), then ``seeds_report`` and, with the open-ended setting, ``calm_open.open_seeds_report`` → (results,
    Markdown text, run info); the train phase returns no table."""
    seeds = config.seed_list()
    mcq = config.open_ended != "only"
    if config.phase == "report":  # every seed's scores first: a missing seed must not leave the others rewritten
        for s in seeds:
            if mcq and not read_scored(out / f"seed_{s}")[0]:
                raise ParameterError("phase", config.phase, f"no method has been scored in "
                                     f"{str(out / f'seed_{s}' / 'scores')!r} yet; run the train phase first")
            if config.open_ended != "off":
                check_open_answers(out / f"seed_{s}" / "open_ended", config)
    per_seed, runs = {}, {}
    for s in seeds:
        progress_line(f"seed {s}", progress)
        per_seed[s], _, runs[s] = run_calm_experiment(out / f"seed_{s}", config, model_name=model_name,
                                                     train_domain=train_domain, seed=s, device=device,
                                                     batch_size=batch_size, n_resamples=n_resamples,
                                                     overwrite=overwrite, progress=progress)
    run = {**runs[seeds[0]], "seed": seeds, "sizes": {s: r["sizes"] for s, r in runs.items()}}
    if config.phase == "train":
        return {}, "", run
    open_row = open_results = None
    if config.open_ended != "off":  # the open-ended claim pooled over the seeds' answers
        open_results, open_text, open_row = open_seeds_report(out, config, seeds, model_name=model_name,
                                                              n_resamples=n_resamples, seed=seeds[0])
        if not mcq:
            return ({"open_ended_seeds": open_results, "per_seed": {s: {"open_ended": r.get("open_ended")}
                                                                    for s, r in per_seed.items()}},
                    open_text, run)
    ood = [domain_key(sp) for sp in config.ood_specs(train_domain)]
    header = (f"{model_name}, trained on {train_domain}, seeds {', '.join(map(str, seeds))}; sizes "
              f"{runs[seeds[0]]['sizes']} per seed; {config.max_steps} steps of {config.train_batch_size}; 95% "
              f"bootstrap intervals ({n_resamples} resamples)")
    results, text = seeds_report(out, per_seed, ood, header=header, n_resamples=n_resamples, seed=seeds[0],
                                 open_row=open_row)
    if open_results is not None:
        results["open_ended_seeds"] = open_results
        text += "\n\n" + open_text
    results["per_seed"] = {s: {k: v for k, v in r.items() if k in ("ood_mean", "timing", "claims", "open_ended")}
                           for s, r in per_seed.items()}
    return results, text, run
