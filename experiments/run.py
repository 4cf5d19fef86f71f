"""``run_experiment``: the project's headline tables, one call each (``python -m experiments NAME``).

Each experiment runs its sub-runs (one per model × dataset, or one stream per model, or one training method)
into ``<output_dir>/<sub-run>/`` through the job functions (``run_diagnose``, ``run_secl_stream``, the calm
experiment's training and scoring), then writes ``<output_dir>/metrics.json`` and ``<output_dir>/table.md``.
A sub-run whose results already exist is read back, not recomputed, so an interrupted experiment resumes where
it stopped (``overwrite`` recomputes). Every table carries the constant-accuracy reference and AUROC next to
ECE, with 95 % bootstrap intervals; sizes, seeds and wall times come with it.

- ``diagnose``: the generation–discrimination gap (verbalized confidence vs P(True)/P(True)Norm) of
  SmolLM2-135M-Instruct and Qwen2.5-Coder-0.5B-Instruct on MMLU (gold position balanced), HaluEval QA
  (full and length-matched) and GSM8K (open-ended).
- ``secl``: a Qwen stream over length-matched HaluEval, GSM8K and an MMLU group through SECL, with the
  label-free baselines and supervised Platt/TS.
- ``calm``: Qwen + LoRA trained on one domain, tested in and out of domain, CALM against SFT, TS and the
  other baselines (``CALMExperimentConfig``).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from hf_calibration import modeling
from hf_calibration.data import MCQA_DATASETS, check_dataset_name, parse_domains
from hf_calibration.errors import ParameterError, renamed_parameters
from hf_calibration.jobs.common import (JobResult, batch_size_field, check_choice, check_device, check_int,
                                        check_non_empty, check_output_dir, device_field, n_resamples_field,
                                        progress_line, seed_field)
from hf_calibration.jobs.diagnose import DATASETS as DIAGNOSE_DATASETS
from hf_calibration.jobs.diagnose import DiagnoseConfig, run_diagnose
from hf_calibration.jobs.secl_stream import SECLStreamConfig, check_stream, run_secl_stream
from hf_calibration.reporting.reports import format_cell, format_table, write_json
from hf_calibration.secl.config import SECLConfig
from hf_calibration.modeling.signals import SIGNAL_NAMES
from hf_calibration.evaluation.stream import STREAM_COLUMNS, WITHIN_DOMAIN, pass_keys, signal_rows, summarize_stream

from experiments.calm import run_calm_experiment
from experiments.calm_config import CALMExperimentConfig
from experiments.calm_seeds import run_calm_seeds
from experiments.common import MAX_SEED, format_claim_check
from experiments.secl_claims import secl_claim_check

EXPERIMENTS = ("diagnose", "secl", "calm")
MODEL_ALIASES = {
    "smollm2": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "qwen": "Qwen/Qwen2.5-Coder-0.5B-Instruct",
}
# The sizes of the recorded runs (README "Results"); each experiment finishes in about an hour on 2 CPU cores.
DEFAULTS = {
    "diagnose": {"models": "smollm2,qwen", "datasets": "mmlu,halueval_qa,halueval_qa_lm,gsm8k", "limit": 100,
                 "limit_open": 40},
    "secl": {"models": "qwen", "datasets": "halueval_qa_lm,gsm8k,mmlu:stem", "limit": 40},
    "calm": {"models": "qwen", "datasets": "halueval_qa_lm", "limit": None},
}


def _per_experiment(key: str) -> str:
    return "; ".join(f"{name}: {d[key]}" for name, d in DEFAULTS.items())


@dataclass(kw_only=True)
class ExperimentConfig:
    """Options of ``run_experiment`` / ``python -m experiments NAME`` (the calm experiment's own are
    ``CALMExperimentConfig``). Checked at construction, every check that needs no file or model: ParameterError
    (a ValueError) naming the field and the value."""

    name: str = field(metadata={"help": "Which table.", "choices": list(EXPERIMENTS)})
    output_dir: str | None = field(default=None, metadata={"help": "Folder for the results (default results/NAME)."})
    models: str | None = field(default=None, metadata={
        "help": "Comma-separated model ids or aliases (smollm2, qwen); default per experiment: "
                + _per_experiment("models") + "."})
    datasets: str | None = field(default=None, metadata={
        "help": "Comma-separated datasets (diagnose), stream domains (secl) or the training domain (calm); default "
                "per experiment: " + _per_experiment("datasets") + "."})
    limit: int | None = field(default=None, metadata={
        "help": "Questions per dataset or stream domain (diagnose: 100, secl: 40; calm takes its split sizes)."})
    limit_open: int | None = field(default=None, metadata={
        "help": "Diagnose only: GSM8K problems (default 40; each costs a generation, a beam search for the "
                "alternatives and their P(True) reads, several times an MCQA question)."})
    workers: int | None = field(default=None, metadata={
        "help": "secl only: processes for the stream's three passes (baseline, SECL, SECL with the other adapter "
                "scope), 1 to 3 (default 1; SECLStreamConfig.workers)."})
    seed: int = seed_field()
    batch_size: int = batch_size_field()
    device: str = device_field()
    n_resamples: int = n_resamples_field()
    overwrite: bool = field(default=False, metadata={"help": "Recompute sub-runs that already have results."})

    def __post_init__(self):
        check_choice(self.name, "name", EXPERIMENTS)
        for name in ("output_dir", "models", "datasets"):  # given but empty: an error, not the default
            check_non_empty(getattr(self, name), name)
        for name in ("limit", "limit_open"):
            if getattr(self, name) is not None:
                check_int(getattr(self, name), name)
        check_int(self.seed, "seed", minimum=0)
        if self.seed > MAX_SEED:
            raise ParameterError("seed", self.seed, f"must be at most 2**32 - 1 (numpy's seed range), got {self.seed}")
        check_int(self.batch_size, "batch_size")
        check_int(self.n_resamples, "n_resamples")
        self.device = check_device(self.device)
        datasets, models = self.dataset_names(), self.model_names()
        if self.workers is not None:
            check_int(self.workers, "workers")
            if self.name != "secl" or self.workers > 3:
                raise ParameterError("workers", self.workers, f"only secl runs passes in parallel, 1 to 3 of them; got "
                                     f"{{workers}} {self.workers} for {self.name}")
        if self.name != "diagnose" and self.limit_open is not None:
            raise ParameterError("limit_open", self.limit_open, f"only diagnose has an open-ended dataset size, got "
                                 f"{{limit_open}} {self.limit_open}")
        if self.name == "diagnose":
            with renamed_parameters(name="datasets"):
                for d in datasets:
                    check_dataset_name(d, DIAGNOSE_DATASETS)
            if self.limit_open is not None and "gsm8k" not in datasets:
                raise ParameterError("limit_open", self.limit_open, f"sizes GSM8K, which {{datasets}} "
                                     f"{','.join(datasets)} leaves out; got {{limit_open}} {self.limit_open}",
                                     related=("datasets",))
        elif self.name == "secl":
            with renamed_parameters(stream="datasets", limit_per_domain="limit"):
                check_stream(",".join(datasets), self.limits()[datasets[0]])
        else:
            if len(datasets) != 1:
                raise ParameterError("datasets", self.datasets, f"calm trains on one domain, got {len(datasets)}: "
                                     f"{datasets}")
            with renamed_parameters(domains="datasets"):
                parse_domains(datasets[0], tuple(MCQA_DATASETS))
            if len(models) != 1:
                raise ParameterError("models", self.models, f"calm trains one model, got {len(models)}: {models}")
            if self.limit is not None:
                raise ParameterError("limit", self.limit, f"calm takes its split sizes from {{n_train}} … {{n_ood}}, "
                                     f"got {{limit}} {self.limit}", related=("n_train", "n_ood"))

    def model_names(self) -> list[str]:
        """The models (aliases resolved), the experiment's default when ``models`` is None."""
        text = self.models or DEFAULTS[self.name]["models"]
        return [MODEL_ALIASES.get(m.strip(), m.strip()) for m in text.split(",") if m.strip()]

    def dataset_names(self) -> list[str]:
        """The datasets or domains, the experiment's default when ``datasets`` is None."""
        return [d.strip() for d in (self.datasets or DEFAULTS[self.name]["datasets"]).split(",") if d.strip()]

    def limits(self) -> dict:
        """Questions per dataset: ``limit`` (or the default), ``limit_open`` for gsm8k in diagnose."""
        limit = self.limit or DEFAULTS[self.name]["limit"]
        open_limit = (self.limit_open or DEFAULTS["diagnose"]["limit_open"]) if self.name == "diagnose" else limit
        return {d: open_limit if d == "gsm8k" else limit for d in self.dataset_names()}


@dataclass(kw_only=True)
class ExperimentResult(JobResult):
    """``JobResult``: ``metrics`` holds ``results`` (per model, per dataset or stream domain: the sub-run's run and
    numbers; calm: the report's ``tables``, ``references``, ``ood_mean`` and ``timing``); ``paths`` the top-level
    files and every sub-run folder."""


def model_alias(model: str) -> str:
    """The short name of a model in tables and sub-run folders: its alias, else its last path component."""
    for alias, name in MODEL_ALIASES.items():
        if model == name:
            return alias
    return Path(model.rstrip("/")).name.replace("/", "_") or "model"


# --------------------------------------------------------------------------------------------- tables


def _signed(d) -> str:
    if d.get("value") is None or not np.isfinite(d["value"]):
        return "—"
    if d.get("low") is None:
        return f"{d['value']:+.3f}"
    return f"{d['value']:+.3f} [{d['low']:+.3f},{d['high']:+.3f}]"


def _signal_rows(res: dict) -> dict:
    rows = {SIGNAL_NAMES.get(k, k): v for k, v in res["signals"].items()}
    rows.update({f"ref: {k}": v for k, v in res["references"].items()})
    return rows


def diagnose_table(results: dict) -> str:
    """Markdown: one row per model × dataset × signal (acc, conf, ECE, Brier, AUROC), references, gaps."""
    blocks = []
    summary = ["| model | dataset | n | acc | length-only acc | ECE verbalized | ECE P(True)Norm | AUROC verbalized "
               "| AUROC P(True) | AUROC P(True)Norm | ΔAUROC (Norm − verb.) | verdict |", "|" + "---|" * 12]
    for alias, per_dataset in results.items():
        for name, res in per_dataset.items():
            run = res["run"]
            length = run.get("length_only_accuracy")
            head = (f"**{alias} · {name}** (n={run['n']}, seed {run['seed']}, {run['wall_seconds']:.0f} s"
                    + (f"; pick-the-shorter-answer accuracy {length:.3f}" if length is not None else "") + ")")
            gap = dict(res["gap"])
            acc = res["signals"]["verbalized"]["accuracy"]["value"]
            if acc in (0.0, 1.0):  # one class: no ranking to measure, so no verdict
                gap["verdict"] = f"undefined (accuracy {acc:.0f}: AUROC needs right and wrong answers)"
            blocks.append(head + "\n\n" + format_table(_signal_rows(res), columns=STREAM_COLUMNS, markdown=True)
                          + f"\n\nΔAUROC {_signed(gap['delta_auroc'])}, ΔECE {_signed(gap['delta_ece'])} → "
                          f"**{gap['verdict']}**")
            s = res["signals"]
            summary.append(
                f"| {alias} | {name} | {run['n']} | {format_cell(s['verbalized']['accuracy'])} | "
                + ("—" if length is None else f"{length:.3f}")
                + f" | {format_cell(s['verbalized']['conf_ece'])} | {format_cell(s['norm_p_true']['conf_ece'])} | "
                f"{format_cell(s['verbalized']['auroc'])} | {format_cell(s['p_true']['auroc'])} | "
                f"{format_cell(s['norm_p_true']['auroc'])} | {_signed(gap['delta_auroc'])} | {gap['verdict']} |")
    return "\n".join(summary) + "\n\n" + "\n\n".join(blocks)


def secl_table(results: dict) -> str:
    """Markdown: per model and stream domain, one row per signal with the SECL shares and costs."""
    blocks = []
    for alias, res in results.items():
        run = res["run"]
        blocks.append(f"**{alias}**: stream {run['stream']}, {run['limit_per_domain']}/domain, seed {run['seed']}, "
                      f"burst at start {run['burst_at_start']}, {run['wall_seconds']:.0f} s (both passes); "
                      f"counters {json.dumps(run.get('counters', {}))}")
        for domain, s in res["summary"].items():
            verb, secl = s["signals"]["verbalized"]["conf_ece"]["value"], s["signals"]["secl"]["conf_ece"]["value"]
            cut = f"{(verb - secl) / verb:+.0%}" if verb > 0 else "—"
            blocks.append(
                f"[{domain}] n={s['n']}: trained on {s['share_trained']:.0%} of the questions (in burst "
                f"{s['share_in_burst']:.0%}, bin-gate skips {s['skipped_by_bin_gate']}, alarms {s['alarms']}); "
                f"SECL ECE cut vs verbalized {cut}; accuracy change {s['accuracy_change_secl']:+.3f}\n\n"
                + format_table(_signal_rows(s), columns=STREAM_COLUMNS, markdown=True))
            for key in pass_keys(s["signals"]):
                paired = (s if key == "secl" else s[key])["paired"]
                blocks.append(f"{SIGNAL_NAMES[key]} − verbalized, paired bootstrap: ΔECE {_signed(paired['delta_ece'])}, "
                              f"ΔAUROC {_signed(paired['delta_auroc'])}, ΔBrier {_signed(paired['delta_brier'])}; "
                              f"Brier − constant-accuracy Brier {_signed(paired['delta_brier_vs_constant'])}"
                              + (f"; within domains (mean over domains): ΔECE "
                                 f"{_signed(paired[WITHIN_DOMAIN['ece']])}, ΔAUROC "
                                 f"{_signed(paired[WITHIN_DOMAIN['auroc']])}, Brier − each domain's constant-accuracy "
                                 f"Brier {_signed(paired[WITHIN_DOMAIN['brier_vs_constant']])}"
                                 if set(WITHIN_DOMAIN.values()) <= set(paired) else "") + ". "
                              f"Claim check ({SIGNAL_NAMES[key]}, {domain}):\n\n"
                              + format_claim_check(secl_claim_check(s, key)))
    return "\n\n".join(blocks)


# ------------------------------------------------------------------------------------------ sub-runs


_INTERVAL_KEYS = ("value", "low", "high", "baseline")


def _nan_intervals(obj):
    """``obj`` with the NaN that ``write_json`` wrote as null put back in every interval ({value, low, high, …}:
    a metric undefined on one class), so that a table read back is built as the one computed."""
    if isinstance(obj, dict):
        interval = "value" in obj and "low" in obj
        return {k: (float("nan") if interval and k in _INTERVAL_KEYS and v is None else _nan_intervals(v))
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [_nan_intervals(v) for v in obj]
    return obj


def _read_back(path: Path, what: str, progress: bool) -> dict:
    """The results of a finished sub-run (resume)."""
    progress_line(f"{what}: read {path}", progress)
    return _nan_intervals(json.loads(path.read_text()))


def _resolve_models(models) -> None:
    with renamed_parameters(model="models"):
        for m in models:
            modeling.resolve_model_path(m)


def _diagnose(out: Path, config: ExperimentConfig, progress: bool) -> tuple[dict, dict]:
    models, datasets, limits = config.model_names(), config.dataset_names(), config.limits()
    folders = {(m, d): out / model_alias(m) / d for m in models for d in datasets}
    for folder in folders.values():  # a file in the way is found before the first model loads
        check_output_dir(folder)
    _resolve_models(models)
    results: dict = {}
    for model_name in models:
        alias = model_alias(model_name)
        results[alias] = {}
        model = tokenizer = None
        for name in sorted(datasets, key=lambda d: d == "gsm8k"):  # MCQA before SECL's adapters are added
            dest = folders[model_name, name]
            if (dest / "diagnosis.json").exists() and not config.overwrite:
                results[alias][name] = _read_back(dest / "diagnosis.json", f"{alias} · {name}", progress)
                continue
            if model is None:
                model, tokenizer = modeling.load_model(model_name, device=config.device)
            job = DiagnoseConfig(output_dir=str(dest), model=model_name, dataset=name, limit=limits[name],
                                 seed=config.seed, batch_size=config.batch_size, device=config.device,
                                 n_resamples=config.n_resamples, balance_gold=name != "gsm8k")
            res = run_diagnose(job, model=model, tokenizer=tokenizer, progress=progress)
            results[alias][name] = {"run": res.run, **res.metrics}
            progress_line(f"{alias} · {name}: {res.run['wall_seconds']:.0f} s → {dest}", progress)
        del model
    return {"results": results}, {f"{model_alias(m)}/{d}": f for (m, d), f in folders.items()}


def _check_read_back_secl(stored: dict, secl: SECLConfig, dest: Path) -> None:
    """A sub-run read back must have run with the SECL options asked for: ParameterError naming the first that
    differs (options the sub-run did not record, older than them, are not compared)."""
    wanted = json.loads(json.dumps(asdict(secl)))
    for key, value in wanted.items():
        if key in stored and stored[key] != value:
            raise ParameterError(key, getattr(secl, key), f"the sub-run in {dest} ran with {{{key}}} "
                                 f"{stored[key]!r}, got {{{key}}} {value!r}: give --overwrite to run it again with "
                                 f"these options, or another --output-dir")


def _secl(out: Path, config: ExperimentConfig, progress: bool, secl: SECLConfig) -> tuple[dict, dict]:
    models = config.model_names()
    folders = {m: out / model_alias(m) for m in models}
    for folder in folders.values():
        check_output_dir(folder)
    _resolve_models(models)
    results = {}
    for model_name, dest in folders.items():
        alias = model_alias(model_name)
        if (dest / "metrics.json").exists() and not config.overwrite:
            results[alias] = _read_back(dest / "metrics.json", alias, progress)
            _check_read_back_secl(results[alias]["run"].get("config", {}), secl, dest)
            summary = results[alias]["summary"]
            if (any("paired" not in s for s in summary.values())
                    or (len(summary) > 2 and not set(WITHIN_DOMAIN.values()) <= set(summary["overall"]["paired"]))):
                # written before the paired intervals (or the within-domain differences of a stream of
                # several domains) existed: summarised again from its records
                records = [json.loads(line) for line in (dest / "records.jsonl").read_text().splitlines()]
                compared = results[alias]["run"].get("compared")
                keys = ("secl",) if not compared else ("secl", compared["key"])
                results[alias]["summary"] = summarize_stream(records, n_resamples=config.n_resamples,
                                                             seed=config.seed, signals=signal_rows(keys))
            continue
        job = SECLStreamConfig(output_dir=str(dest), model=model_name, stream=",".join(config.dataset_names()),
                               limit_per_domain=config.limits()[config.dataset_names()[0]], balance_gold=True,
                               burst_at_start=True, compare_adapter_scopes=True, workers=config.workers or 1,
                               seed=config.seed, device=config.device,
                               n_resamples=config.n_resamples)
        with renamed_parameters(stream="datasets", limit_per_domain="limit", model="models"):
            res = run_secl_stream(job, secl, progress=progress)
        results[alias] = {"run": res.run, **res.metrics}
    return {"results": results}, {model_alias(m): f for m, f in folders.items()}


# -------------------------------------------------------------------------------------------------- run


def run_experiment(config: ExperimentConfig, calm: CALMExperimentConfig | None = None, *,
                   secl: SECLConfig | None = None, progress: bool = True) -> ExperimentResult:
    """Run the experiment ``config.name`` into ``output_dir`` (default ``results/NAME``) and write its
    ``metrics.json`` (``{"run": run, **metrics}``) and ``table.md``.

    calm : the calm experiment's own options (default ``CALMExperimentConfig()``); only for ``name="calm"``.
    secl : SECL's options for the secl experiment's streams (default ``SECLConfig()``); only for ``name="secl"``.

    Every input is checked before the first model loads (sub-run folders, model paths, domains, sizes);
    ParameterError naming the field of ``config``, ``calm`` or ``secl``. Sub-runs with results are read back
    unless ``overwrite`` (a secl sub-run only when it ran with the same SECL options, else ParameterError naming
    the first that differs). ``progress``: a line per sub-run on stdout, and the progress bars.
    """
    if calm is not None and config.name != "calm":
        raise ParameterError("calm", calm, f"only the calm experiment takes its options, got name={config.name!r}")
    if secl is not None and config.name != "secl":
        raise ParameterError("secl", secl, f"only the secl experiment takes SECL's options, got name={config.name!r}")
    out = check_output_dir(config.output_dir or str(Path("results") / config.name))
    start = time.perf_counter()
    if config.name == "diagnose":
        metrics, folders = _diagnose(out, config, progress)
        table = diagnose_table(metrics["results"])
        sub_seconds = sum(r["run"]["wall_seconds"] for per in metrics["results"].values() for r in per.values())
        sizes = config.limits()
    elif config.name == "secl":
        metrics, folders = _secl(out, config, progress, SECLConfig() if secl is None else secl)
        table = secl_table(metrics["results"])
        sub_seconds = sum(r["run"]["wall_seconds"] for r in metrics["results"].values())
        sizes = config.limits()[config.dataset_names()[0]]
    else:
        calm = CALMExperimentConfig() if calm is None else calm
        common = dict(model_name=config.model_names()[0], train_domain=config.dataset_names()[0],
                      device=config.device, batch_size=config.batch_size, n_resamples=config.n_resamples,
                      overwrite=config.overwrite, progress=progress)
        if calm.seeds is not None and config.seed != 0:
            raise ParameterError("seed", config.seed, f"give either {{seed}} or the calm option {{seeds}} "
                                 f"({calm.seeds!r}), got {{seed}} {config.seed}", related=("seeds",))
        with renamed_parameters(model="models"):
            if calm.seeds is None:
                metrics, table, calm_run = run_calm_experiment(out, calm, seed=config.seed, **common)
                folders = ({} if calm.open_ended == "only" else {"scores": out / "scores", "runs": out / "runs"})
                if calm.open_ended != "off":
                    folders["open_ended"] = out / "open_ended"
                timings = [metrics.get("timing", {})]
            else:
                metrics, table, calm_run = run_calm_seeds(out, calm, **common)
                folders = {f"seed_{s}": out / f"seed_{s}" for s in calm.seed_list()}
                timings = [r.get("timing", {}) for r in metrics.get("per_seed", {}).values()]
                timings += [(r.get("open_ended") or {}).get("info", {}) for r in metrics.get("per_seed", {}).values()]
        timings.append((metrics.get("open_ended") or {}).get("info", {}))
        sub_seconds = sum(t.get("wall_seconds", 0.0) for timing in timings for t in timing.values())
        sizes = calm_run["sizes"]
    seeds = ",".join(map(str, calm.seed_list())) if calm is not None and calm.seeds is not None else config.seed
    run = {"experiment": config.name, "models": config.model_names(), "datasets": config.dataset_names(),
           "limit": sizes, "seed": seeds, "n_resamples": config.n_resamples,
           "wall_seconds_this_invocation": round(time.perf_counter() - start, 1),
           "wall_seconds_sub_runs": round(sub_seconds, 1), "config": asdict(config),
           **({"calm": asdict(calm)} if calm is not None else {})}
    if not table:  # the calm experiment's train phase: scores only, no table yet
        return ExperimentResult(metrics=metrics, run=run, paths=folders, output_dir=out)
    datasets = (calm.open_domains.split(",") if calm is not None and calm.open_ended == "only"
                else config.dataset_names())
    header = (f"experiment {config.name}: models {', '.join(model_alias(m) for m in config.model_names())}; "
              f"datasets {', '.join(datasets)}; questions per dataset {sizes}; seed {seeds}; "
              f"95% bootstrap intervals ({config.n_resamples} resamples); sub-runs {run['wall_seconds_sub_runs']:.0f} s "
              f"of compute as recorded when they ran, this invocation {run['wall_seconds_this_invocation']:.0f} s")
    write_json(out / "metrics.json", {"run": run, **metrics})
    (out / "table.md").write_text(header + "\n\n" + table + "\n")
    paths = {"metrics.json": out / "metrics.json", "table.md": out / "table.md", **folders}
    return ExperimentResult(metrics=metrics, run=run, paths=paths, output_dir=out, table=header + "\n" + table)
