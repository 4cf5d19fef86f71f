"""The CALM tables' paired comparisons and the check of the CALM paper's claims (Wang et al.): CALM − TS and
CALM − SFT on the same questions, pooled over seeds and OOD sets by a stratified paired bootstrap
(``metrics.paired_strata_difference``)."""

from __future__ import annotations

import numpy as np

from hf_calibration.metrics import interval_verdict, paired_strata_difference

from experiments.common import format_interval

PAIRS = (("bome", "ts"), ("bome", "sft"))


def top_label(probs: dict, labels: dict, method: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(correct, confidence) of a method's top-label answers on a split."""
    p = probs[method][split]
    return (p.argmax(1) == labels[split]).astype(int), p.max(1)


def paired_comparisons(probs: dict, labels: dict, splits, *, n_resamples: int, seed: int) -> dict:
    """``{split: {"bome − ts": {"conf_ece": …, "accuracy": …}, "bome − sft": …}}``: paired bootstrap (the same
    resampled questions for both methods) of the top-label conf-ECE (15 equal-width bins) and of the accuracy,
    method a − method b, each ``{"value", "low", "high"}`` (95 %); the pairs of ``PAIRS`` whose methods were both
    scored. ``metrics.paired_strata_difference`` with the split as its one stratum, so a single seed's interval
    here and the pooled one of ``pooled_difference`` over that split come from the same draws."""
    out = {}
    for name in splits:
        per_pair = {}
        for a, b in PAIRS:
            if a not in probs or b not in probs:
                continue
            stratum = [(top_label(probs, labels, a, name), top_label(probs, labels, b, name))]
            per_pair[f"{a} − {b}"] = {}
            for key in ("conf_ece", "accuracy"):
                d = paired_strata_difference(stratum, metric=key, n_resamples=n_resamples, seed=seed)
                per_pair[f"{a} − {b}"][key] = {k: d[k] for k in ("value", "low", "high")}
        if per_pair:
            out[name] = per_pair
    return out


ACCURACY_SHARE = 0.95  # the paper's claim: CALM keeps at least 95 % of SFT's in-domain accuracy


def pooled_difference(runs: list, splits, a: str, b: str, *, key: str = "conf_ece", share: float = 1.0,
                      n_resamples: int, seed: int) -> dict:
    """``paired_strata_difference`` of the top-label (correct, confidence) of methods a and b over the strata
    (seed, split) of ``runs`` (a list of (probs, labels), one per training seed) × ``splits``, seed-major."""
    strata = [(top_label(probs, labels, a, s), top_label(probs, labels, b, s)) for probs, labels in runs for s in splits]
    return paired_strata_difference(strata, metric=key, share=share, n_resamples=n_resamples, seed=seed)


def calm_claim_check(runs: list, ood: list, *, n_resamples: int, seed: int,
                     open_row: tuple | None = None) -> tuple[list, dict]:
    """The paper's claims (Wang et al., CALM) on ``runs`` (one (probs, labels) per training seed) → (rows for
    ``common.format_claim_check``, the differences behind them). Each multiple-choice claim is decided by a
    pooled paired interval (``pooled_difference``, over seeds and, out of domain, the OOD sets with equal weights):
    below 0 held, above 0 not held, else undecided; accuracy: CALM − 0.95 · SFT above 0 held, below 0 not held.
    The open-ended Semantic-ECE claim is ``open_row`` (``experiments.calm_open.open_claim``'s row) when the
    open-ended setting ran, else "not run"."""
    kw = dict(n_resamples=n_resamples, seed=seed)
    methods = set(runs[0][0])
    rows, evidence = [], {}
    interval = format_interval

    where = f"mean over {len(ood)} OOD set(s) × {len(runs)} seed(s)"
    for b, name in (("ts", "TS"), ("sft", "SFT")):
        claim = f"OOD conf-ECE of CALM below {name}"
        if not {"bome", b} <= methods or not ood:
            rows.append((claim, "not run", f"needs bome, {b} and an OOD set"))
            continue
        d = evidence[f"bome − {b} ood conf_ece"] = pooled_difference(runs, ood, "bome", b, **kw)
        rows.append((claim, interval_verdict(d), f"{where}: paired Δ {interval(d)}; per stratum "
                     + ", ".join(f"{v:+.3f}" for v in d["per_stratum"])))
    claim = f"in-domain accuracy of CALM ≥ {ACCURACY_SHARE:.0%} of SFT's"
    if {"bome", "sft"} <= methods:
        d = evidence["bome − 0.95·sft id accuracy"] = pooled_difference(runs, ["id_test"], "bome", "sft", key="accuracy",
                                                                       share=ACCURACY_SHARE, **kw)
        acc = {m: np.mean([np.mean(top_label(p, lab, m, "id_test")[0]) for p, lab in runs]) for m in ("bome", "sft")}
        rows.append((claim, interval_verdict(d, held_when="above"),
                     f"CALM {acc['bome']:.3f} / SFT {acc['sft']:.3f} = {acc['bome'] / acc['sft']:.0%} (mean over "
                     f"{len(runs)} seed(s)); CALM − {ACCURACY_SHARE}·SFT {interval(d)}"))
    else:
        rows.append((claim, "not run", "needs bome and sft"))
    rows.append(open_row or ("lowest mean Semantic-ECE, open-ended cross-domain", "not run",
                             "the open-ended setting did not run (--open-ended also)"))
    return rows, evidence
