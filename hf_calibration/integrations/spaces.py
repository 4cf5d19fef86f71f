"""A Gradio page for an ``evaluate`` metric module: what each ``metrics/<name>/app.py`` launches as a Space.

evaluate's own ``launch_gradio_widget`` builds its page with ``gr.inputs.Dataframe``, an API gradio removed
in version 4, so a Space made with it no longer starts. This page is the same idea on current gradio
(tested with 6.31): a table with one column per input of the metric (``predictions``, ``references``);
each cell is a JSON value (``0.9``, ``[0.8, 0.2]``, ``1``, ``["Paris", "paris"]``), so every input form the
metric accepts can be typed; the result of ``module.compute`` is shown as JSON. Extra keyword options of the
metric (``n_bins``, …) go in a JSON object field. gradio is imported only when a page is built.
"""

from __future__ import annotations

import json

__all__ = ["compute_from_table", "launch_metric_space", "metric_space"]


def _cell(value, column: str, row: int):
    if isinstance(value, (int, float, list)):
        return value
    text = str(value).strip()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        if text and text[0] not in "[{\"0123456789-.":
            return text  # a bare string answer ("Paris") in a string column
        raise ValueError(f"{column}[{row}]: not a JSON value, got {text!r}") from None


def _input_names(module) -> list[str]:
    """The metric's input columns (the first feature set when it declares several input forms)."""
    features = getattr(module, "features", None)
    if isinstance(features, (list, tuple)):
        features = features[0] if features else None
    return list(features) if features else ["predictions", "references"]


def compute_from_table(module, rows, options: str | dict | None = None) -> dict:
    """``module.compute`` on a table of rows ``[[prediction, reference], …]`` (cells as JSON text or values).

    ``options``: a JSON object (or dict) of the metric's keyword options. Empty rows are skipped. Raises
    ValueError naming the column and row of a cell that is not JSON, or ``options`` when it is not an object.
    """
    if hasattr(rows, "values"):  # a pandas DataFrame, as gradio passes it
        rows = rows.values.tolist()
    names = _input_names(module)
    columns: dict[str, list] = {n: [] for n in names}
    for i, row in enumerate(rows):
        if all(str(c).strip() == "" for c in row):
            continue
        for name, cell in zip(names, row):
            columns[name].append(_cell(cell, name, i))
    if isinstance(options, str):
        options = json.loads(options) if options.strip() else {}
    if options is not None and not isinstance(options, dict):
        raise ValueError(f"options: expected a JSON object such as {{\"n_bins\": 10}}, got {options!r}")
    return module.compute(**columns, **(options or {}))


def metric_space(module, examples=None):
    """The Gradio ``Interface`` of ``module`` (an ``evaluate.EvaluationModule``): table in, JSON out; its API
    endpoint is ``/compute`` (``gradio_client.Client(url).predict(table, options, api_name="/compute")``).

    ``examples``: rows to show first (default: one row per input form is not known, so two empty rows).
    """
    import gradio as gr

    names = _input_names(module)
    value = examples or [["0.9", "1"], ["0.3", "0"]]
    def compute(table, options):
        return compute_from_table(module, table, options)

    return gr.Interface(
        fn=compute,
        api_name="compute",  # the endpoint a client calls: /compute
        inputs=[gr.Dataframe(value=value, headers=names, datatype=["str"] * len(names), label="inputs (JSON cells)"),
                gr.Textbox(value="{}", label="options (JSON object, e.g. {\"n_bins\": 10})")],
        outputs=gr.JSON(label=module.name),
        title=module.name.replace("_", " "),
        description=(module.description or "").strip(),
        article=(module.inputs_description or "").strip() and f"```\n{module.inputs_description.strip()}\n```",
        flagging_mode="never",
    )


def launch_metric_space(module, examples=None, **launch_kwargs):
    """Build :func:`metric_space` and ``launch`` it (a Space's ``app.py`` calls this). Blocks while serving."""
    return metric_space(module, examples).launch(**launch_kwargs)
