"""Reliability diagrams (Guo et al. 2017, Fig. 1) with matplotlib.

Figures are built with :class:`matplotlib.figure.Figure` directly, not through ``pyplot``: no GUI
backend is touched and no global figure state is kept, so this works headless (Agg) and in threads.
``fig.savefig(...)`` renders with Agg.
"""

from __future__ import annotations

import numpy as np

from hf_calibration.metrics import expected_calibration_error, reliability_diagram

STYLES = ("bars", "points")


def plot_reliability_diagram(
    y_true,
    y_prob,
    *,
    n_bins: int = 15,
    binning: str = "uniform",
    ax=None,
    title: str | None = None,
    style: str = "bars",
):
    """Reliability diagram of the top-label confidence, with the confidence histogram underneath.

    Upper panel: accuracy per bin against confidence, with the diagonal of perfect calibration;
    ``style="bars"`` draws accuracy bars over the bin width and the gap to each bin's mean confidence
    in red, ``style="points"`` draws (mean confidence, accuracy) points joined by a line, with the gap
    as a vertical red segment. Lower panel: the share of predictions per bin. The title ends with the
    ECE of the same bins.

    Parameters
    ----------
    y_true, y_prob
        As :func:`hf_calibration.metrics.expected_calibration_error`.
    n_bins : int, default 15
    binning : {"uniform", "quantile"}, default "uniform"
    ax : matplotlib Axes, optional
        Axes for the diagram; the histogram is appended below it (``make_axes_locatable``). By default
        a new 5 x 5.5 inch figure with both panels is created.
    title : str, optional
        Prefix of the title; " — ECE = 0.123 (15 bins)" is appended ("(15 quantile bins)" for equal mass).
    style : {"bars", "points"}, default "bars"

    Returns
    -------
    matplotlib.figure.Figure
        The figure holding the diagram (``ax.figure`` when ``ax`` is given).

    Raises
    ------
    ValueError, TypeError
        As :func:`hf_calibration.metrics.expected_calibration_error`; unknown ``style``.

    Examples
    --------
    >>> fig = plot_reliability_diagram([1, 0, 1, 1], [0.9, 0.8, 0.3, 1.0], n_bins=5, title="demo")
    >>> fig.axes[0].get_title()
    'demo — ECE = 0.350 (5 bins)'
    """
    from matplotlib.figure import Figure

    if style not in STYLES:
        raise ValueError(f"style must be one of {', '.join(map(repr, STYLES))}, got {style!r}")
    table = reliability_diagram(y_true, y_prob, n_bins=n_bins, binning=binning)
    ece = expected_calibration_error(y_true, y_prob, n_bins=n_bins, binning=binning)

    if ax is None:
        fig = Figure(figsize=(5, 5.5), layout="constrained")
        ax, hist_ax = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    else:
        from mpl_toolkits.axes_grid1 import make_axes_locatable

        fig = ax.figure
        hist_ax = make_axes_locatable(ax).append_axes("bottom", size="30%", pad=0.15, sharex=ax)

    edges = table.bin_edges
    left, width = edges[:-1], np.diff(edges)
    centers = left + width / 2
    filled = table.counts > 0
    acc, conf = table.accuracy, table.mean_confidence

    ax.plot([0, 1], [0, 1], linestyle="--", color="0.5", linewidth=1, label="perfect calibration")
    if style == "bars":
        ax.bar(left[filled], acc[filled], width=width[filled], align="edge", color="C0", edgecolor="white",
               label="accuracy")
        gap_bottom = np.minimum(acc, conf)[filled]
        ax.bar(centers[filled], np.abs(acc - conf)[filled], bottom=gap_bottom, width=width[filled] * 0.5,
               color="C3", alpha=0.5, label="gap to mean confidence")
    else:
        ax.plot(conf[filled], acc[filled], marker="o", color="C0", label="accuracy")
        ax.vlines(conf[filled], np.minimum(acc, conf)[filled], np.maximum(acc, conf)[filled], color="C3",
                  alpha=0.7, label="gap to mean confidence")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy")
    ax.tick_params(labelbottom=False)
    ax.legend(loc="upper left", fontsize="small")
    suffix = f"ECE = {ece:.3f} ({n_bins}{' quantile' if binning == 'quantile' else ''} bins)"
    ax.set_title(f"{title} — {suffix}" if title else suffix)

    share = table.counts / table.counts.sum()
    hist_ax.bar(left, share, width=width, align="edge", color="0.4", edgecolor="white")
    hist_ax.set_xlim(0, 1)
    hist_ax.set_xlabel("confidence")
    hist_ax.set_ylabel("share")
    return fig


def plot_reliability_diagrams(panels: dict, *, n_bins: int = 15, binning: str = "uniform", title: str | None = None,
                              panel_size: tuple[float, float] = (4.0, 4.0)):
    """Reliability diagrams side by side, one per entry of ``panels`` (``{panel title: (y_true, y_prob)}``,
    each pair as :func:`plot_reliability_diagram` takes it) → :class:`matplotlib.figure.Figure`.

    ``n_bins`` and ``binning`` are each panel's (:func:`plot_reliability_diagram`); ``panel_size`` is (width,
    height) in inches per panel; ``title`` goes above the row.

    Examples
    --------
    >>> fig = plot_reliability_diagrams({"a": ([1, 0], [0.9, 0.2]), "b": ([1, 1], [0.6, 0.7])}, n_bins=5)
    >>> [ax.get_title() for ax in fig.axes if ax.get_title()]
    ['a — ECE = 0.150 (5 bins)', 'b — ECE = 0.350 (5 bins)']
    """
    from matplotlib.figure import Figure

    fig = Figure(figsize=(panel_size[0] * len(panels), panel_size[1]))
    for ax, (name, (y_true, y_prob)) in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels.items()):
        plot_reliability_diagram(y_true, y_prob, n_bins=n_bins, binning=binning, ax=ax, title=name)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
