"""The check of the SECL paper's claims (Hedna et al. 2026) on a stream's summary (``evaluation.stream.summarize_stream``),
with the paper's thresholds: ECE at least 56 % below the verbalized confidence, 6–26 % of the questions trained,
at most 4.6 forward passes per question."""

from __future__ import annotations

import numpy as np

from hf_calibration.metrics import interval_verdict
from hf_calibration.evaluation.stream import WITHIN_DOMAIN

from experiments.common import format_interval

# The paper's claims where the generation–discrimination gap exists, and its forward-pass budget.
ECE_CUT = 0.56
TRAINED_SHARE = (0.06, 0.26)
PASS_BUDGET = 4.6


def secl_claim_check(domain: dict, key: str = "secl") -> list[tuple[str, bool | None, str]]:
    """The paper's claims on one domain's summary (``evaluation.stream.summarize_stream``) for the SECL pass ``key``: a list of
    (claim, held, evidence). held is True/False, or None when the interval does not decide. Rules: ECE at least
    56 % below verbalized (point estimate, and the paired ΔECE interval below 0); within-domain AUROC not below
    verbalized (held unless the paired ΔAUROC interval lies below 0); Brier below the constant-accuracy Brier
    (paired interval below 0: held; above 0: not; else undecided) — for the overall summary of several domains
    all three read ``within_domain_difference`` (the ECE cut is then −ΔECE over the verbalized ECE, both
    n-weighted means over the domains), not the pooled ECE and AUROC and the one pooled constant; accuracy unchanged
    (the pass's answers against the baseline's); 6–26 % of the questions trained; at most 4.6 forward passes per
    question."""
    s = domain["signals"]
    shares = domain if key == "secl" else domain[key]
    p = shares["paired"]
    # over a stream of several domains: the within-domain differences (within_domain_difference); a summary
    # written before the ECE one existed keeps the pooled ECE
    within = WITHIN_DOMAIN["auroc"] in p
    within_ece = WITHIN_DOMAIN["ece"] in p
    if within_ece:
        d_ece = p[WITHIN_DOMAIN["ece"]]
        verb = d_ece["baseline"]
        cut = -d_ece["value"] / verb if verb > 0 else float("nan")
    else:
        verb, ece = s["verbalized"]["conf_ece"]["value"], s[key]["conf_ece"]["value"]
        cut = (verb - ece) / verb if verb > 0 else float("nan")
        d_ece = p["delta_ece"]
    d_auc = p[WITHIN_DOMAIN["auroc"]] if within else p["delta_auroc"]
    d_brier = p[WITHIN_DOMAIN["brier_vs_constant"]] if within else p["delta_brier_vs_constant"]

    interval = format_interval
    ece_held = bool(cut >= ECE_CUT and d_ece["high"] < 0) if np.isfinite(cut) else None
    if ece_held is False and d_ece["low"] <= 0 <= d_ece["high"] and cut >= ECE_CUT:
        ece_held = None
    auc_held = None if not np.isfinite(d_auc["value"]) else d_auc["high"] >= 0
    passes = s[key]["forward_passes"]
    trained = shares["share_trained"]
    change = shares["accuracy_change_secl"]
    return [
        ("ECE ≥ 56 % below verbalized", ece_held,
         f"cut {cut:+.0%}; " + ("within-domain ΔECE (mean over domains) " if within_ece else "paired ΔECE ")
         + interval(d_ece)),
        ("AUROC not below verbalized", auc_held,
         f"{'within-domain ΔAUROC (mean over domains)' if within else 'paired ΔAUROC'} {interval(d_auc)}"),
        ("Brier below the constant-accuracy Brier", interval_verdict(d_brier),
         f"{'within-domain ΔBrier vs each domain constant (mean over domains)' if within else 'paired ΔBrier'} "
         f"{interval(d_brier)}"),
        ("accuracy unchanged", change == 0.0, f"change {change:+.3f}"),
        ("6–26 % of the questions trained", TRAINED_SHARE[0] <= trained <= TRAINED_SHARE[1], f"{trained:.1%}"),
        ("≤ 4.6 forward passes per question", passes <= PASS_BUDGET, f"{passes:.2f}"),
    ]
