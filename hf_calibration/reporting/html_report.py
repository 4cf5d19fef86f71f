"""One self-contained HTML page from result folders: tables with intervals and reliability diagrams side by side.

Any folder our jobs write works (evaluate, diagnose, secl, calm, experiments): the page reads every
``*.json`` in it (recursively, at most ``max_files``) and renders each metric table it finds — a mapping of
row names (signals, methods, references) to mappings of metric names to entries ``{"value", "low",
"high"}`` or numbers — as an HTML table, one column per row (so two folders fit side by side at 1,300 px) whose
cells read "value" over "[low, high]", with the constant references (rows named ``constant…``/``ref…``) marked;
and embeds every PNG (the reliability diagrams) as base64.
Folders are shown side by side, so methods and domains can be compared on one screen. No network, no
script, no external stylesheet: the file opens anywhere.

With ``ece`` (``{"n_bins", "binning", "norm"}``, ``expected_calibration_error``'s options) the per-answer files are
re-scored too: every ``*.jsonl`` whose records all carry a boolean ``correct`` (evaluate's and lm-eval import's
``predictions.jsonl``, diagnose's ``signals.jsonl``, a SECL stream's ``records.jsonl``) gets a table with one
row per confidence field it holds (``confidence`` or a signal of ``SIGNAL_NAMES``; a field ``<signal>_correct``,
as a SECL pass writes, is that row's correctness) and the constant-accuracy reference, every metric of
``calibration_report`` under those options with 95 % bootstrap intervals.
"""

from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path

__all__ = ["GENERATOR", "find_metric_tables", "non_numeric_cells", "render_report", "rescored_table"]

# in every page's head: `hf-calibration report` replaces an existing --output file only when it carries this
GENERATOR = '<meta name="generator" content="hf-calibration report">'

_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5rem;color:#222}
h1{font-size:1.4rem} h2{font-size:1.15rem;margin-top:0} h3{font-size:.9rem;margin:1rem 0 .3rem;overflow-wrap:anywhere}
.folders{display:grid;grid-template-columns:repeat(auto-fit,minmax(min(100%,34rem),1fr));gap:1.2rem}
.folder{border:1px solid #ccc;border-radius:6px;padding:.8rem;min-width:0}
.scroll{overflow-x:auto}
table{border-collapse:collapse;font-size:.78rem;margin-bottom:.8rem}
th,td{border:1px solid #ddd;padding:.15rem .35rem;text-align:right;white-space:nowrap}
th{white-space:normal;overflow-wrap:anywhere;max-width:9rem}
th:first-child,td:first-child{text-align:left}
td .ci{display:block;font-size:.68rem;color:#666}
.reference{background:#f3f3f3;color:#555;font-style:italic}
img{max-width:100%;border:1px solid #eee;margin:.3rem 0}
.run{font-size:.8rem;color:#555;white-space:pre-wrap;overflow-wrap:anywhere}
.invalid{color:#b00;font-weight:bold}
"""


def _is_entry(value) -> bool:
    return (isinstance(value, dict) and "value" in value) or (isinstance(value, (int, float))
                                                            and not isinstance(value, bool))


def _is_table(node) -> bool:
    """A mapping of rows → mappings whose values are mostly metric entries."""
    if not isinstance(node, dict) or not node or not all(isinstance(v, dict) for v in node.values()):
        return False
    return all(v and sum(_is_entry(x) for x in v.values()) >= max(1, len(v) // 2) for v in node.values())


def find_metric_tables(data, path: str = "") -> list[tuple[str, dict]]:
    """(where, table) for every metric table in a parsed JSON document, depth first."""
    if _is_table(data):
        return [(path or "metrics", data)]
    found = []
    if isinstance(data, dict):
        for key, value in data.items():
            found += find_metric_tables(value, f"{path}.{key}" if path else str(key))
    return found


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _not_a_number(entry):
    """The first value of a metric entry (``value``, ``low``, ``high``, or the entry itself) that is neither a
    number nor null (a hand-edited metrics.json: "0.12x", true, a list), else None. Null and NaN are an undefined
    metric (e.g. AUROC on one class), shown as "—"."""
    parts = [entry.get(k) for k in ("value", "low", "high")] if isinstance(entry, dict) else [entry]
    return next((v for v in parts if v is not None and not _is_number(v)), None)


def non_numeric_cells(data) -> list[str]:
    """"<table> · <row> · <metric> = <value>" for every metric-table cell of a parsed JSON document that holds
    something other than a number or null (``_not_a_number``): what the page flags as "not a number" instead of
    showing it as an undefined "—". A plain string counts where another row of the table has that metric as a
    number (rows may hold text fields of their own)."""
    found = []
    for where, table in find_metric_tables(data):
        metrics = {k for row in table.values() for k, v in row.items() if _is_entry(v)}
        for name, row in table.items():
            for metric, entry in row.items():
                if (metric in metrics or isinstance(entry, dict)) and _not_a_number(entry) is not None:
                    found.append(f"{where} · {name} · {metric} = {_not_a_number(entry)!r}")
    return found


def _cell(entry) -> str:
    bad = _not_a_number(entry)
    if bad is not None:
        return f'<span class="invalid">not a number: {html.escape(repr(bad)[:40])}</span>'
    if isinstance(entry, dict):
        value, low, high = entry.get("value"), entry.get("low"), entry.get("high")
    else:
        value, low, high = entry, None, None
    if not _is_number(value) or not math.isfinite(value):
        return "—"
    if isinstance(low, (int, float)) and isinstance(high, (int, float)):  # the interval on a line of its own
        return f'{value:.3f}<span class="ci">[{low:.3f}, {high:.3f}]</span>'

    return str(value) if isinstance(value, int) or float(value).is_integer() and abs(value) >= 2 else f"{value:.3f}"


def _is_reference(row: str) -> bool:
    return row.lower().startswith(("constant", "ref", "const_"))


def _table_html(where: str, table: dict) -> str:
    """One metric table: a column per row of ``table`` (model, signals, the references in grey) and a row per
    metric, so that two folders' tables fit side by side; each cell "value" over "[low, high]"."""
    metrics = list(dict.fromkeys(k for row in table.values() for k, v in row.items() if _is_entry(v)))
    names = list(table)

    def ref(name):
        return ' class="reference"' if _is_reference(name) else ""

    head = "".join(f"<th{ref(n)}>{html.escape(n)}</th>" for n in names)
    body = "".join(f"<tr><td>{html.escape(m)}</td>"
                   + "".join(f"<td{ref(n)}>{_cell(table[n].get(m))}</td>" for n in names) + "</tr>"
                   for m in metrics)
    return (f"<h3>{html.escape(where)}</h3><div class=\"scroll\"><table><thead><tr><th>metric</th>{head}</tr>"
            f"</thead><tbody>{body}</tbody></table></div>")


def rescored_table(path, ece: dict, *, n_resamples: int = 1000, seed: int = 0) -> dict:
    """The re-scored table of one per-answer file (module docstring): ``{row: calibration_report}``, empty when the
    file is not one (unreadable, not JSON lines, a record without a boolean ``correct``, no confidence field);
    ParameterError naming ``inputs`` for a per-answer file with a line that does not parse (``_jsonl_records``)."""
    import numpy as np

    from hf_calibration.metrics import calibration_report
    from hf_calibration.reporting.reports import references
    from hf_calibration.modeling.signals import SIGNAL_NAMES

    records = _jsonl_records(path)
    if not records or not all(isinstance(r, dict) and isinstance(r.get("correct"), bool) for r in records):
        return {}

    def is_confidence(value):
        return isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value <= 1.0

    table = {}
    for name in ("confidence", *SIGNAL_NAMES):
        if not all(is_confidence(r.get(name)) for r in records):
            continue
        correct_key = f"{name}_correct" if all(isinstance(r.get(f"{name}_correct"), bool) for r in records) else "correct"
        y = np.array([r[correct_key] for r in records], dtype=int)
        conf = np.array([r[name] for r in records], dtype=np.float64)
        table[SIGNAL_NAMES.get(name, name)] = calibration_report(y, conf, **ece, n_resamples=n_resamples, seed=seed)
    if table:
        y = np.array([r["correct"] for r in records], dtype=int)
        table["constant_accuracy"] = references(y, 2, **ece, n_resamples=n_resamples, seed=seed)["constant_accuracy"]
    return table


def _jsonl_records(path) -> list:
    """The records of a JSON-lines file ([] for one that is not text or not JSON lines at all). A file whose
    readable records are per-answer records (a boolean ``correct``) but with a line that does not parse — truncated
    or hand-edited — is a ParameterError naming ``inputs``, the file and the line: re-scored without it, the table
    would leave out answers and say nothing."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    records, bad = [], None
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            bad = bad or (lineno, err.msg)
    if bad is None:
        return records
    if records and all(isinstance(r, dict) and isinstance(r.get("correct"), bool) for r in records):
        from hf_calibration.errors import ParameterError

        raise ParameterError("inputs", str(path), f"{str(path)!r} line {bad[0]} is not JSON ({bad[1]}; truncated or "
                             f"edited?), so its re-scored table would leave out answers; fix or remove the line")
    return []


def _folder_html(folder: Path, max_files: int, ece: dict | None = None, n_resamples: int = 1000) -> str:
    parts = [f"<section class=\"folder\"><h2>{html.escape(folder.name or str(folder))}</h2>"]
    files = sorted(folder.rglob("*.json"))[:max_files]
    n_tables = 0
    for path in files:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue
        run = data.get("run") if isinstance(data, dict) else None
        tables = find_metric_tables(data)
        if not tables:
            continue
        rel = path.relative_to(folder)
        if isinstance(run, dict):
            summary = ", ".join(f"{k}={v}" for k, v in run.items() if isinstance(v, (str, int, float)))
            parts.append(f"<p class=\"run\">{html.escape(str(rel))}: {html.escape(summary)}</p>")
        for where, table in tables:
            parts.append(_table_html(f"{rel} · {where}", table))
            n_tables += 1
    if ece is not None:
        for path in sorted(folder.rglob("*.jsonl"))[:max_files]:
            table = rescored_table(path, ece, n_resamples=n_resamples)
            if table:
                parts.append(_table_html(f"{path.relative_to(folder)} · re-scored: conf-ECE with {ece['n_bins']} "
                                         f"{ece['binning']} bins, {ece['norm']}", table))
                n_tables += 1
    for png in sorted(folder.rglob("*.png"))[:max_files]:
        data = base64.b64encode(png.read_bytes()).decode("ascii")
        alt = html.escape(str(png.relative_to(folder)))
        parts.append(f"<h3>{alt}</h3><img alt=\"{alt}\" src=\"data:image/png;base64,{data}\">")
    if n_tables == 0:
        parts.append("<p>No metric tables found in this folder.</p>")
    parts.append("</section>")
    return "".join(parts)


def render_report(folders, *, title: str = "hf-calibration report", max_files: int = 200, ece: dict | None = None,
                  n_resamples: int = 1000) -> str:
    """The HTML page (a string) for result ``folders`` (paths), one column each; with ``ece`` the per-answer files
    re-scored under those ECE options (module docstring), ``n_resamples`` bootstrap resamples each.

    Raises FileNotFoundError naming a folder that does not exist, ValueError when ``folders`` is empty.
    """
    folders = [Path(f) for f in folders]
    if not folders:
        raise ValueError("folders: need at least one result folder, got none")
    for f in folders:
        if not f.is_dir():
            raise FileNotFoundError(f"folders: {str(f)!r} is not a folder")
    note = ("Cells: value over its [95 % bootstrap interval]. Grey italic columns are the constant references "
            "(confidence = accuracy, 1/K): an ECE that does not beat them, or comes with AUROC ≈ 0.5, is a "
            "shift of level, not information.")
    body = "".join(_folder_html(f, max_files, ece, n_resamples) for f in folders)
    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">{GENERATOR}"
            f"<title>{html.escape(title)}</title>"
            f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1><p>{note}</p>"
            f"<div class=\"folders\">{body}</div></body></html>\n")
