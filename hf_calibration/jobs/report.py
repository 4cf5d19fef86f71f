"""``run_report``: one self-contained HTML page from result folders (``hf-calibration report DIR [DIR …]``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hf_calibration.errors import MissingPathError, ParameterError
from hf_calibration.html_report import render_report
from hf_calibration.jobs.common import JobResult, check_output_file


@dataclass(kw_only=True)
class ReportConfig:
    """Options of ``run_report`` / ``hf-calibration report``."""

    inputs: list[str] = field(default_factory=list, metadata={
        "help": "Result folders written by evaluate, diagnose, secl, calm or an experiment, shown side by side "
                "(on the command line: the positional DIR arguments).", "nargs": "+"})
    output: str = field(default="report.html", metadata={"help": "The HTML file to write (self-contained)."})
    title: str = field(default="hf-calibration report", metadata={"help": "The page's title."})

    def __post_init__(self):
        if not self.inputs:
            raise ParameterError("inputs", self.inputs, "need at least one result folder, got none")


def run_report(config: ReportConfig) -> JobResult:
    """Write ``config.output``: the metric tables (value [95 % interval], constant references marked) and the
    reliability diagrams of every folder in ``config.inputs``, one column per folder (``html_report``).

    MissingPathError naming ``inputs`` for a folder that does not exist; ParameterError naming ``output`` for a
    place that cannot be written; both before anything is read or written.
    """
    folders = [Path(f) for f in config.inputs]
    for f in folders:
        if not f.is_dir():
            raise MissingPathError("inputs", str(f), f"{str(f)!r} is not a folder")
    out = check_output_file(config.output)
    page = render_report(folders, title=config.title)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    n_tables = page.count("<table>")
    run = {"inputs": [str(f) for f in folders], "title": config.title, "tables": n_tables,
           "images": page.count("<img ")}
    return JobResult(metrics={}, run=run, paths={"report": out}, output_dir=out.parent,
                     table=f"{n_tables} tables and {run['images']} diagrams from {len(folders)} folder(s)")


__all__ = ["ReportConfig", "run_report"]
