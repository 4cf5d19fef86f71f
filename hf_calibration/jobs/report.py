"""``run_report``: one self-contained HTML page from result folders (``hf-calibration report DIR [DIR …]``)."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from hf_calibration.errors import MissingPathError, ParameterError, ParameterWarning
from hf_calibration.reporting.html_report import GENERATOR, non_numeric_cells, render_report
from hf_calibration.jobs.common import (ECE_DEFAULTS, JobResult, check_choice, check_int, check_output_file, check_path,
                                        n_resamples_field)
from hf_calibration.metrics.binning import BINNINGS
from hf_calibration.metrics.ece import NORMS


@dataclass(kw_only=True)
class ReportConfig:
    """Options of ``run_report`` / ``hf-calibration report``."""

    inputs: list[str] = field(default_factory=list, metadata={
        "help": "Result folders written by evaluate, diagnose, secl, calm or an experiment, shown side by side "
                "(on the command line: the positional DIR arguments).", "nargs": "+"})
    output: str | None = field(default=None, metadata={
        "help": "The HTML file to write (self-contained; when not given: report.html inside the first DIR). An "
                "existing file is replaced only when it is a report of this command, or with --overwrite."})
    title: str = field(default="hf-calibration report", metadata={"help": "The page's title."})
    n_bins: int | None = field(default=None, metadata={
        "help": "Re-score the per-answer files (predictions.jsonl, signals.jsonl, records.jsonl) with this many bins "
                "(default when --binning or --norm is given: 15); the stored tables keep the options they were "
                "computed with."})
    binning: str | None = field(default=None, metadata={
        "help": "Re-score with uniform (equal width) or quantile (equal mass) bins (default when --n-bins or --norm "
                "is given: uniform).", "choices": list(BINNINGS)})
    norm: str | None = field(default=None, metadata={
        "help": "Re-score with conf-ECE's norm l1, l2 or max (default when --n-bins or --binning is given: l1).",
        "choices": list(NORMS)})
    n_resamples: int = n_resamples_field()
    overwrite: bool = field(default=False, metadata={
        "help": "Replace an existing --output file that is not a report written by this command."})

    def __post_init__(self):
        if isinstance(self.inputs, (str, Path)):  # one folder given as a string, not a list of its characters
            self.inputs = [str(self.inputs)]
        if not self.inputs:
            raise ParameterError("inputs", self.inputs, "need at least one result folder, got none")
        for folder in self.inputs:
            check_path(folder, "inputs")
        if self.output is not None:
            check_path(self.output, "output", what="file")
        if self.n_bins is not None:
            check_int(self.n_bins, "n_bins")
        if self.binning is not None:
            check_choice(self.binning, "binning", BINNINGS)
        if self.norm is not None:
            check_choice(self.norm, "norm", NORMS)
        check_int(self.n_resamples, "n_resamples")

    def ece_options(self) -> dict | None:
        """The re-scoring options, None when none of n_bins, binning, norm is given."""
        given = {k: getattr(self, k) for k in ECE_DEFAULTS if getattr(self, k) is not None}
        return {**ECE_DEFAULTS, **given} if given else None


def run_report(config: ReportConfig) -> JobResult:
    """Write ``config.output`` (by default ``report.html`` inside the first input folder, never the current
    folder unasked): the metric tables (value [95 % interval], constant references marked) and the
    reliability diagrams of every folder in ``config.inputs``, one column per folder (``html_report``); with any of
    ``n_bins``, ``binning``, ``norm`` also the per-answer files re-scored under those ECE options.

    MissingPathError naming ``inputs`` for a folder that does not exist; ParameterError naming ``output`` for a
    place that cannot be written (both before anything is read or written), or naming ``inputs`` when the folders
    hold no result at all (nothing written).
    """
    folders = [Path(f) for f in config.inputs]
    for f in folders:
        if not f.is_dir():
            raise MissingPathError("inputs", str(f), f"{str(f)!r} is not a folder")
    out = check_output_file(folders[0] / "report.html" if config.output is None else config.output)
    _check_replaceable(out, config)
    page = render_report(folders, title=config.title, ece=config.ece_options(), n_resamples=config.n_resamples)
    n_tables, n_images = page.count("<table>"), page.count("<img ")
    unreadable, flagged = _check_json(folders)
    why = (f"not valid JSON: {', '.join(repr(str(p)) for p in unreadable[:3])}"
           + (f" and {len(unreadable) - 3} more" if len(unreadable) > 3 else "")) if unreadable else ""
    if n_tables == 0:  # diagrams alone are not a report: their numbers are what a reader compares
        raise ParameterError("inputs", [str(f) for f in folders], "found no result (a metrics.json, "
                             "report.json or per-answer file) in " + ", ".join(repr(str(f)) for f in folders)
                             + (f"; {why}" if why else "") + "; give folders written by evaluate, diagnose, secl, "
                             "calm or an experiment")
    if unreadable:
        warnings.warn(ParameterWarning("inputs", config.inputs, f"{{inputs}}: left out of the page, {why}"),
                      stacklevel=2)
    if flagged:  # a hand-edited value is not an undefined metric: flagged on the page and said here
        warnings.warn(ParameterWarning("inputs", config.inputs, f"{{inputs}}: {len(flagged)} metric value(s) are not "
                                       f"numbers, flagged 'not a number' on the page: {'; '.join(flagged[:3])}"
                                       + (" …" if len(flagged) > 3 else "")), stacklevel=2)
    staged = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staged.write_text(page, encoding="utf-8")
        os.replace(staged, out)
    finally:
        staged.unlink(missing_ok=True)
    run = {"inputs": [str(f) for f in folders], "title": config.title, "ece": config.ece_options(), "tables": n_tables,
           "images": n_images}
    return JobResult(metrics={}, run=run, paths={"report": out}, output_dir=out.parent,
                     table=f"{n_tables} tables and {run['images']} diagrams from {len(folders)} folder(s)")


__all__ = ["ReportConfig", "run_report"]


def _check_replaceable(out: Path, config: ReportConfig) -> None:
    """An existing ``output`` is replaced only when this command wrote it (its marker), or with ``overwrite``."""
    if config.overwrite or not out.exists():
        return
    try:
        ours = GENERATOR in out.read_text(encoding="utf-8", errors="replace")[:2000]
    except OSError:
        ours = False
    if not ours:
        raise ParameterError("output", str(out), f"{str(out)!r} exists and is not a report written by "
                             "hf-calibration report; choose another file, or pass {overwrite} to replace it",
                             related=("overwrite",))


def _check_json(folders) -> tuple[list[Path], list[str]]:
    """(the ``*.json`` files under ``folders`` that do not parse (a truncated or hand-edited metrics.json), which the
    page skips and the error names when nothing else was found; "<file>: <cell>" for each metric value that is not
    a number (``html_report.non_numeric_cells``), which the page flags)."""
    import json

    bad, flagged = [], []
    for folder in folders:
        for path in sorted(Path(folder).rglob("*.json")):
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, ValueError):
                bad.append(path)
                continue
            flagged += [f"{str(path)!r}: {cell}" for cell in non_numeric_cells(data)]
    return bad, flagged
