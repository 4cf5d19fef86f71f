"""Pieces every experiment shares: the in-domain splits, the seed range, method names as the tables show them,
the seeds-table cell, the resume check of a run folder, and the claim-check table."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from hf_calibration.errors import ParameterError

# The in-domain splits of the CALM experiments (multiple-choice and open-ended): S_T, S_V (labels unused), the
# labelled validation split (checkpoint selection, post-hoc fitting), the in-domain test split.
IN_DOMAIN_SPLITS = ("train", "calibration", "validation", "id_test")
MAX_SEED = 2**32 - 1  # numpy's and the Trainer's seed range
# How a method id reads in a table: the trainer's id "bome" names the solver; the method is CALM.
METHOD_LABELS = {"bome": "CALM"}
CLAIM_WORDS = {True: "held", False: "not held", None: "undecided", "not run": "not run"}


def method_label(method: str) -> str:
    """The name of a method id in a table: "bome" → "CALM", the others as they are."""
    return METHOD_LABELS.get(method, method)


def pair_label(a: str, b: str) -> str:
    """"CALM − ts": the table label of the difference of methods a and b."""
    return f"{method_label(a)} − {method_label(b)}"


def format_interval(d: dict) -> str:
    """``+0.012 [-0.030, +0.051]`` of a ``{"value", "low", "high"}`` difference."""
    return f"{d['value']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"


def format_claim_check(checks) -> str:
    """Markdown table of (claim, held, evidence) rows; held is True ("held"), False ("not held"), None
    ("undecided": the interval includes the threshold) or the string "not run"."""
    return "\n".join(["| claim | result | evidence |", "|---|---|---|"]
                     + [f"| {claim} | {CLAIM_WORDS[held]} | {evidence} |" for claim, held, evidence in checks])


def mean_range(values) -> str:
    """``mean (min–max)`` of one value per seed for the seeds tables; an undefined value (None or NaN, e.g. AUROC
    on a split where a seed got every answer wrong) is left out and the cell says over how many seeds it is, "—"
    when none is defined."""
    values = np.asarray([np.nan if v is None else v for v in values], dtype=float)
    defined = values[~np.isnan(values)]
    if len(defined) == 0:
        return "—"
    cell = (f"{defined.mean():.3f} ({defined.min():.3f}–{defined.max():.3f})" if len(defined) > 1
            else f"{defined[0]:.3f}")
    return cell if len(defined) == len(values) else f"{cell} ({len(defined)} of {len(values)} seeds)"


# The settings of a CALM run that its scores depend on: a folder is resumed or reported only with the same ones.
RUN_FIELDS = ("n_train", "n_calibration", "n_validation", "n_test", "n_ood", "max_steps", "train_batch_size", "lora_r",
              "learning_rate", "alpha_learning_rate", "inner_learning_rate", "inner_steps", "eta", "bome_optimizer",
              "entropy_domain", "balance_gold", "select_by", "select_every", "upper_gradient", "extra_train")


def check_same_run(out: Path, current: dict, *, names: dict | None = None) -> None:
    """A folder holding an earlier run (``out/run.json``) is resumed or reported only with the settings it was run
    with: ParameterError naming the first field of ``current`` whose stored value differs (``names`` maps a
    run.json key to the option's field name). Fields the stored run does not record are not compared."""
    path = out / "run.json"
    if not path.is_file():
        return
    try:
        stored = json.loads(path.read_text())
    except ValueError:
        raise ParameterError("output_dir", str(out), f"{str(path)!r} is not valid JSON; remove it or use another "
                             f"{{output_dir}}") from None
    flat = {**stored.get("config", {}), **{k: v for k, v in stored.items() if k != "config"}}
    for key, value in current.items():
        if key in flat and flat[key] != value:
            name = (names or {}).get(key, key)
            raise ParameterError(name, value, f"{str(out)!r} holds a run with {key} {flat[key]!r}, not {value!r}; "
                                 f"give the same settings, or another {{output_dir}}", related=("output_dir",))


def read_jsonl(path: Path) -> list[dict]:
    """The JSON lines of ``path`` (none when it does not exist); a line cut by a run killed mid-write is dropped."""
    out = []
    if Path(path).is_file():
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def by_domain_position(records: list[dict]) -> dict:
    """{(domain, position within the domain): record} of records in stream order (a stream job's records.jsonl)."""
    out, seen = {}, {}
    for rec in records:
        k = seen[rec["domain"]] = seen.get(rec["domain"], -1) + 1
        out[(rec["domain"], k)] = rec
    return out
