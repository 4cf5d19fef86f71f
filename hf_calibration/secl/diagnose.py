"""Does SECL have something to distil? The generation–discrimination gap of a model (docs/methods.md, 'SECL: generation–discrimination gap').

SECL moves the verbalized confidence toward P(True)Norm. That can only help when P(True)Norm is the
better signal: lower ECE *and* better ranking of correct above wrong answers (AUROC). When P(True)Norm
only has the better level (lower ECE, AUROC no better), SECL can at most shift the level — which a
constant confidence equal to the accuracy also does (docs/methods.md, 'AUROC and AURC') — and the verdict says so.
"""

from __future__ import annotations

import numpy as np

from hf_calibration.errors import ParameterError
from hf_calibration.secl.confidence import DEFAULT_TAU_N, SIGNAL_NAMES, SIGNALS, MCQASignals, mcqa_signals

VERDICTS = ("helps", "ranking only", "level only", "does not help", "undecided")


def _entry(result) -> dict:
    """A ``BootstrapResult`` as a table entry; an interval no resample defined (NaN) is None."""
    value, low, high = (float(x) for x in result)
    if np.isnan(low) or np.isnan(high):
        low = high = None
    return {"value": value, "low": low, "high": high}


def _verdict(d_auroc: dict, d_ece: dict, confidence_level: float) -> tuple[str, bool | None, str]:
    """(verdict, secl_expected_to_help, explanation) from the two differences' intervals (the rule of
    ``generation_discrimination_gap``)."""
    ece_gap = d_ece["high"] is not None and d_ece["high"] < 0
    auroc_gap = d_auroc["low"] is not None and d_auroc["low"] > 0
    pct = f"{confidence_level:.0%}"
    ci = f"{pct} interval"
    if ece_gap and auroc_gap:
        verdict, helps = "helps", True
        explanation = (
            f"P(True)Norm is better calibrated (ECE {d_ece['value']:+.3f}) and ranks correct answers higher "
            f"(AUROC {d_auroc['value']:+.3f}) than the verbalized confidence, both beyond the {ci}s: "
            "SECL has a signal to distil and is expected to help."
        )
    elif auroc_gap:
        verdict, helps = "ranking only", None
        explanation = (
            f"P(True)Norm ranks correct answers higher (AUROC {d_auroc['value']:+.3f}, {ci} above 0) but its ECE "
            f"difference ({d_ece['value']:+.3f}) is not established ({ci} includes 0 or lies above it): SECL has a "
            "ranking to transfer; whether it lowers ECE is undecided at this sample size."
        )
    elif ece_gap:
        verdict, helps = "level only", False
        explanation = (
            f"P(True)Norm has the lower ECE ({d_ece['value']:+.3f}) but does not rank correct answers better "
            f"(AUROC {d_auroc['value']:+.3f}, {ci} includes 0): SECL could only shift the confidence "
            "level, which a constant equal to the accuracy also does; it is not expected to help."
        )
    else:
        verdict, helps = "does not help", False
        explanation = (
            f"P(True)Norm is neither better calibrated (ECE {d_ece['value']:+.3f}) nor better at ranking "
            f"(AUROC {d_auroc['value']:+.3f}) than the verbalized confidence beyond the {ci}s: there is no "
            "generation–discrimination gap, so SECL cannot help."
        )
    return verdict, helps, explanation


def generation_discrimination_gap(
    correct,
    verbalized,
    norm_p_true,
    *,
    n_bins: int = 15,
    binning: str = "uniform",
    norm: str = "l1",
    n_resamples: int = 1000,
    confidence_level: float = 0.95,
    seed: int = 0,
) -> dict:
    """The gap SECL distils, with paired bootstrap intervals, and the verdict in plain words.

    Parameters
    ----------
    correct : (n,) bool or {0, 1}; verbalized, norm_p_true : (n,) confidences in [0, 1] of the same
        answers. n_bins, binning, norm : the ECE of ``delta_ece`` (``expected_calibration_error``'s options;
        default 15 equal-width bins, l1). n_resamples : bootstrap resamples (the same resampled indices for both signals, so
        the differences are paired; ``metrics.bootstrap`` / ``metrics.paired_bootstrap``, BCa intervals).
        confidence_level : in (0, 1). seed : of the resamples.

    Returns
    -------
    dict with ``delta_auroc`` = AUROC(P(True)Norm) − AUROC(verbalized) and ``delta_ece`` =
    ECE(P(True)Norm) − ECE(verbalized) (under ``n_bins``/``binning``/``norm``), each {"value", "low", "high"};
    ``auroc_norm_p_true`` and ``auroc_verbalized`` likewise; ``verdict`` ∈ ``VERDICTS``;
    ``secl_expected_to_help`` (True, False, or None when undecided) and ``explanation`` (plain words).

    Rule: "helps" (True) when the ECE difference's interval lies below 0 and the AUROC difference's
    interval lies above 0; "ranking only" (None) when only the AUROC interval lies above 0 (SECL has a
    ranking to transfer, but a lower ECE is not established at this n); "level only" (False) when only
    the ECE interval lies below 0 (SECL could lower ECE only by shifting the level, which the
    constant-accuracy reference also does); otherwise "does not help" (False). "undecided" (None) when every
    answer is right or every one wrong: the differences are then undefined, not a verdict.
    """
    from hf_calibration.metrics import bootstrap, confidence_auroc, expected_calibration_error, paired_bootstrap

    y = np.asarray(correct).astype(int)
    v = np.asarray(verbalized, dtype=np.float64)
    p = np.asarray(norm_p_true, dtype=np.float64)
    if not (y.shape == v.shape == p.shape and y.ndim == 1):
        raise ParameterError("correct", correct, f"correct, verbalized, norm_p_true need equal 1-D shapes, got "
                             f"{y.shape}, {v.shape}, {p.shape}", related=("verbalized", "norm_p_true"))
    ece = dict(n_bins=n_bins, binning=binning, norm=norm)
    # one resampling for all four: the same seed draws the same item indices, so the differences are paired
    options = dict(n_resamples=n_resamples, confidence_level=confidence_level, seed=seed)
    auroc_p = _entry(bootstrap(confidence_auroc, y, p, **options))
    auroc_v = _entry(bootstrap(confidence_auroc, y, v, **options))
    d_auroc = _entry(paired_bootstrap(confidence_auroc, y, p, y, v, **options))
    d_ece = _entry(paired_bootstrap(expected_calibration_error, y, p, y, v, metric_kwargs=ece, **options))
    if y.min() == y.max():  # AUROC and the differences are undefined: no verdict to give
        verdict, helps = "undecided", None
        explanation = (
            f"every one of the {len(y)} answers is {'right' if y[0] else 'wrong'}, so AUROC and the ECE "
            "difference are undefined (they compare right with wrong answers): no verdict; score more or "
            "other questions."
        )
    else:
        verdict, helps, explanation = _verdict(d_auroc, d_ece, confidence_level)
    return {
        "delta_auroc": d_auroc, "delta_ece": d_ece, "auroc_norm_p_true": auroc_p, "auroc_verbalized": auroc_v,
        "verdict": verdict, "secl_expected_to_help": helps, "explanation": explanation,
        **ece, "n_resamples": int(n_resamples), "confidence_level": float(confidence_level), "seed": int(seed),
    }


def summarize(signals: MCQASignals, *, n_bins: int = 15, binning: str = "uniform", norm: str = "l1",
              n_resamples: int = 1000, seed: int = 0) -> dict:
    """diagnosis.json content (less the run description) from computed signals.

    ``signals``: per signal the calibration report (value with 95 % bootstrap interval per metric)
    plus ``confidence_sd``, ``mass_mean`` (probability of the tokens read), ``forward_passes`` and
    ``seconds`` per question; ``references``: constant accuracy (measured on the same questions) and
    1/K; ``position_bias`` per gold letter; ``gap``: ``generation_discrimination_gap``. ``n_bins``, ``binning``,
    ``norm``: the binned metrics' options (``calibration_report``) in every report and in the gap's ΔECE.
    """
    from hf_calibration.metrics import calibration_report
    from hf_calibration.reporting.reports import position_bias, references

    y = signals.correct.astype(int)
    k = signals.option_probs.shape[1]
    ece = dict(n_bins=n_bins, binning=binning, norm=norm)
    table = {}
    for name in SIGNALS:
        conf = signals.confidence[name]
        report = calibration_report(y, conf, **ece, n_resamples=n_resamples, seed=seed)
        report.update(
            confidence_sd=float(np.std(conf)),
            mass_mean=float(np.nanmean(signals.mass[name])),
            forward_passes=float(signals.forward_passes[name]),
            seconds=float(signals.seconds[name]),
        )
        table[name] = report
    greedy = signals.verbalized_greedy
    return {
        "signals": table,
        "references": references(signals.correct, k, **ece, n_resamples=n_resamples, seed=seed),
        "position_bias": position_bias(signals.labels, signals.prediction, k),
        "verbalized_greedy": {
            "share_numeric": float(np.mean(np.isfinite(greedy))),
            "mean": float(np.nanmean(greedy)) if np.isfinite(greedy).any() else None,
        },
        "tau_n": signals.tau_n,
        "prompt_format": signals.prompt_format,
        "gap": generation_discrimination_gap(
            signals.correct, signals.confidence["verbalized"], signals.confidence["norm_p_true"], **ece,
            n_resamples=n_resamples, seed=seed,
        ),
    }


def diagnose(
    backend,
    tokenizer,
    dataset,
    *,
    tau_n: float = DEFAULT_TAU_N,
    prompt_format: str = "auto",
    batch_size: int | None = None,
    n_bins: int = 15,
    binning: str = "uniform",
    norm: str = "l1",
    n_resamples: int = 1000,
    seed: int = 0,
    progress: bool = True,
    checkpoint=None,
) -> tuple[dict, MCQASignals]:
    """Compute the confidence signals on MCQA ``dataset`` through ``backend`` (a ``ScoringBackend``, or a bare model
    with ``batch_size``: ``confidence.mcqa_signals``, which takes ``checkpoint`` too) and summarise them
    (``summarize``, which takes the ECE options ``n_bins``, ``binning``, ``norm``)."""
    signals = mcqa_signals(backend, tokenizer, dataset, tau_n=tau_n, prompt_format=prompt_format,
                           batch_size=batch_size, progress=progress, checkpoint=checkpoint)
    return summarize(signals, n_bins=n_bins, binning=binning, norm=norm, n_resamples=n_resamples, seed=seed), signals


DIAGNOSIS_COLUMNS = (
    ("accuracy", "acc"),
    ("mean_confidence", "conf"),
    ("confidence_sd", "sd"),
    ("conf_ece", "ECE"),
    ("brier", "Brier"),
    ("auroc", "AUROC"),
    ("mass_mean", "mass"),
    ("forward_passes", "passes/q"),
    ("seconds", "s/q"),
)


def format_diagnosis(result: dict, title: str = "") -> str:
    """The printed table: one row per signal and reference, then the position bias (multiple choice only)
    and the verdict."""
    from hf_calibration.reporting.reports import format_table

    rows = {SIGNAL_NAMES[k]: v for k, v in result["signals"].items()}
    rows.update({f"ref: {k}": v for k, v in result["references"].items()})
    lines = [title] if title else []
    lines.append(format_table(rows, columns=DIAGNOSIS_COLUMNS))
    if "position_bias" in result:
        bias = "  ".join(
            f"{letter}: gold {b['gold_share']:.2f} acc "
            + ("—" if b["accuracy_when_gold"] is None else f"{b['accuracy_when_gold']:.2f}")
            + f" pred {b['prediction_share']:.2f}"
            for letter, b in result["position_bias"].items()
        )
        lines.append(f"position bias (per gold letter): {bias}")
    gap = result["gap"]

    def ci(d):
        if d["value"] is None or not np.isfinite(d["value"]):
            return "undefined"
        return f"{d['value']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]" if d["low"] is not None else f"{d['value']:+.3f}"

    lines.append(f"gap P(True)Norm − verbalized: ΔAUROC {ci(gap['delta_auroc'])}, ΔECE {ci(gap['delta_ece'])}")
    lines.append(f"verdict: {gap['verdict']} — {gap['explanation']}")
    return "\n".join(lines)


def plot_diagnosis(signals: MCQASignals, *, title: str | None = None, n_bins: int = 15, binning: str = "uniform"):
    """Reliability diagrams of option probability, P(True), P(True)Norm and verbalized, side by side."""
    from hf_calibration.reporting.plotting import plot_reliability_diagrams

    y = signals.correct.astype(int)
    names = ("option_probability", "p_true", "norm_p_true", "verbalized")
    return plot_reliability_diagrams({SIGNAL_NAMES[n]: (y, signals.confidence[n]) for n in names}, n_bins=n_bins,
                                     binning=binning, title=title, panel_size=(4.2, 4.2))
