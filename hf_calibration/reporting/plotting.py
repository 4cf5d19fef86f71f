"""Reliability diagrams (Guo et al. 2017, Fig. 1) with matplotlib.

Figures are built with :class:`matplotlib.figure.Figure` directly, not through ``pyplot``: no GUI
backend is touched and no global figure state is kept, so this works headless (Agg) and in threads.
``fig.savefig(...)`` renders with Agg.
"""

from __future__ import annotations

import numpy as np

from hf_calibration.metrics import expected_calibration_error, reliability_diagram

STYLES = ("bars", "points")
SPARSE_BIN = 10  # a bin with fewer predictions is drawn hatched: its accuracy's 95 % interval spans ~0.4 or more
TITLE_WIDTH = 60  # a longer title puts the ECE on a line of its own, so the figure keeps its width
SPARSE_ALPHA = 0.12  # ... and nearly transparent, so a bar of one question drawn to 1.0 does not catch the eye first


def plot_reliability_diagram(
    y_true,
    y_prob,
    *,
    n_bins: int = 15,
    binning: str = "uniform",
    ax=None,
    title: str | None = None,
    style: str = "bars",
    smooth: bool = False,
    calibrated=None,
    calibrated_label: str = "calibrated",
):
    """Reliability diagram of the top-label confidence, with the confidence histogram underneath.

    Upper panel: accuracy per bin against confidence, with the diagonal of perfect calibration;
    ``style="bars"`` draws accuracy bars over the bin width and the gap to each bin's mean confidence
    in red, ``style="points"`` draws (mean confidence, accuracy) points joined by a line, with the gap
    as a vertical red segment. So that few-sample bins do not catch the eye first, each bin's bar is shaded by
    the questions it holds (its count against the mean count of the filled bins), and a bin of fewer than
    ``SPARSE_BIN`` questions is hatched and nearly transparent, its 95 % Wilson interval (``wilson_interval``)
    in light grey; ``smooth`` adds smECE's kernel-smoothed curve (``smooth_reliability_curve``). Lower panel:
    the share of predictions per bin, each bar labelled with its count. The legend lies outside the diagram
    (below the figure, or right of a given ``ax``), so it covers no bin. The title ends with the ECE of the same
    bins.

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
        Prefix of the title; " — ECE = 0.123 (15 bins)" is appended ("(15 quantile bins)" for equal mass;
        "ECE = 0.123 → 0.045 <calibrated_label>" with ``calibrated``), on a second line when both are longer than
        ``TITLE_WIDTH`` characters.
    style : {"bars", "points"}, default "bars"
    smooth : bool, default False
        Also draw the smoothed reliability curve of smECE (relplot's curve, without its bootstrap band).
    calibrated : (y_true, y_prob), optional
        The same questions after a post-hoc calibrator (forms as ``y_true, y_prob``): drawn as a second curve
        (points joined by a line; a sparse bin's point hollow, not joined) over the same bins, its share per bin
        as a step line in the histogram.
    calibrated_label : str, default "calibrated"
        Its name in the legend and the title, e.g. "after histogram".

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
    if style not in STYLES:
        raise ValueError(f"style must be one of {', '.join(map(repr, STYLES))}, got {style!r}")
    given = ax is not None
    fig, ax, hist_ax = _diagram_axes(ax)
    _draw_diagram(ax, hist_ax, y_true, y_prob, n_bins=n_bins, binning=binning, title=title, style=style,
                  smooth=smooth, calibrated=calibrated, calibrated_label=calibrated_label)
    handles, labels = _legend_entries([ax, hist_ax])
    if given:  # right of the diagram, outside it
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1), borderaxespad=0, fontsize="x-small")
    else:
        fig.legend(handles, labels, loc="outside lower center", ncols=2, fontsize="x-small", frameon=False)
    return fig


def _draw_diagram(ax, hist_ax, y_true, y_prob, *, n_bins, binning, title, style, smooth, calibrated,
                  calibrated_label) -> None:
    """``plot_reliability_diagram``'s two panels into ``ax`` and ``hist_ax``, without a legend."""
    table = reliability_diagram(y_true, y_prob, n_bins=n_bins, binning=binning)
    ece = expected_calibration_error(y_true, y_prob, n_bins=n_bins, binning=binning)
    ax.plot([0, 1], [0, 1], linestyle="--", color="0.5", linewidth=1, label="perfect calibration")
    _draw_bins(ax, table, style)
    if smooth:
        t, curve = smooth_reliability_curve(y_true, y_prob)
        ax.plot(t, curve, color="C2", linewidth=1.5, label="smoothed (smECE kernel)")
    ece_text = f"ECE = {ece:.3f}"
    after = None
    if calibrated is not None:
        after = reliability_diagram(*calibrated, n_bins=n_bins, binning=binning)
        _draw_calibrated(ax, after, calibrated_label)
        ece_text += f" → {expected_calibration_error(*calibrated, n_bins=n_bins, binning=binning):.3f} " \
                    f"{calibrated_label}"
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy")
    ax.tick_params(labelbottom=False)
    suffix = f"{ece_text} ({n_bins}{' quantile' if binning == 'quantile' else ''} bins)"
    one_line = title and len(title) + len(suffix) <= TITLE_WIDTH
    ax.set_title(_drawable((f"{title} — {suffix}" if one_line else f"{title}\n{suffix}") if title else suffix))
    _draw_histogram(hist_ax, table, after, calibrated_label)


def _legend_entries(axes) -> tuple[list, list]:
    """(handles, labels) of ``axes`` together, each label once."""
    entries = {}
    for a in axes:
        for handle, label in zip(*a.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    return list(entries.values()), list(entries)


def _diagram_axes(ax):
    """(figure, diagram axes, histogram axes): a new 5 x 5.5 inch figure with both panels when ``ax`` is None,
    else ``ax.figure`` with the histogram appended below ``ax``."""
    if ax is None:
        from matplotlib.figure import Figure

        fig = Figure(figsize=(5, 5.5), layout="constrained")
        ax, hist_ax = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    else:
        from mpl_toolkits.axes_grid1 import make_axes_locatable

        fig = ax.figure
        hist_ax = make_axes_locatable(ax).append_axes("bottom", size="30%", pad=0.15, sharex=ax)
    return fig, ax, hist_ax


def _bin_layout(table):
    """(left edges, widths, centres, filled, sparse) of the bins of a ``reliability_diagram`` table; sparse bins
    hold fewer than ``SPARSE_BIN`` predictions."""
    edges = table.bin_edges
    left, width = edges[:-1], np.diff(edges)
    filled = table.counts > 0
    return left, width, left + width / 2, filled, filled & (table.counts < SPARSE_BIN)


def _draw_bins(ax, table, style: str) -> None:
    """The accuracy of each filled bin in ``style``, its gap to the bin's mean confidence and its 95 % Wilson
    interval, shaded by the questions the bin holds; a sparse bin hatched, nearly transparent, its interval
    light grey (bars)."""
    left, width, centers, filled, sparse = _bin_layout(table)
    acc, conf = table.accuracy, table.mean_confidence
    # shade by how much data a bin holds (its count against the mean count of the filled bins)
    weight = np.clip(table.counts / max(table.counts[filled].mean(), 1), 0, 1) if filled.any() else table.counts
    alpha = np.where(sparse, SPARSE_ALPHA, 0.25 + 0.75 * weight)
    low, high = wilson_interval(np.nan_to_num(acc) * table.counts, table.counts)
    if style == "bars":
        for i, k in enumerate(np.flatnonzero(filled & ~sparse)):
            ax.bar(left[k], acc[k], width=width[k], align="edge", color="C0", alpha=alpha[k], edgecolor="white",
                   label=None if i else "accuracy (shade: questions in the bin)")
        for i, k in enumerate(np.flatnonzero(sparse)):
            ax.bar(left[k], acc[k], width=width[k], align="edge", color="C0", alpha=alpha[k], edgecolor="C0",
                   linewidth=0, hatch="//", label=None if i else f"accuracy of a bin with < {SPARSE_BIN} questions")
        for i, part in enumerate((filled & ~sparse, sparse)):  # the legend's swatch from a dense bin
            gap_color = [(0.84, 0.15, 0.16, 0.5 * a) for a in alpha[part]]  # C3, faded with the bin's shade
            ax.bar(centers[part], np.abs(acc - conf)[part], bottom=np.minimum(acc, conf)[part],
                   width=width[part] * 0.5, color=gap_color, label=None if i else "gap to mean confidence")
        x = centers
    else:
        ax.plot(conf[filled], acc[filled], marker="o", color="C0", label="accuracy")
        ax.vlines(conf[filled], np.minimum(acc, conf)[filled], np.maximum(acc, conf)[filled], color="C3",
                  alpha=0.7, label="gap to mean confidence")
        x = conf
    order = np.r_[np.flatnonzero(filled & ~sparse), np.flatnonzero(sparse)]  # dense first: the legend's swatch
    below, above = np.clip(acc - low, 0, None)[order], np.clip(high - acc, 0, None)[order]  # rounding: -1e-17
    bars = ax.errorbar(x[order], acc[order], yerr=[below, above], fmt="none", ecolor="0.2", elinewidth=0.8,
                       capsize=0, label="95 % interval (Wilson)")
    colors = ["0.75" if s else "0.2" for s in sparse[order]]  # a sparse bin's wide interval: light grey
    bars[2][0].set_color(colors)
    ends = np.r_[acc[order] - below, acc[order] + above]  # the caps, coloured as their interval
    ax.scatter(np.r_[x[order], x[order]], ends, marker="_", s=12, c=colors * 2, linewidths=0.8, zorder=3)


def _draw_calibrated(ax, table, label: str) -> None:
    """The reliability curve after a calibrator: (mean confidence, accuracy) per filled bin, joined where the bin
    holds ``SPARSE_BIN`` questions or more, hollow and apart where it is sparse."""
    _, _, _, filled, sparse = _bin_layout(table)
    conf, acc = table.mean_confidence, table.accuracy
    dense = filled & ~sparse
    ax.plot(conf[dense], acc[dense], color="C1", linewidth=1.5, marker="o", markersize=4, label=label)
    if sparse.any():  # not joined: a line to a bin of one question would draw the eye there
        ax.plot(conf[sparse], acc[sparse], linestyle="none", marker="o", markersize=4, color="C1", alpha=0.6,
                markerfacecolor="white", label=f"{label}, bin with < {SPARSE_BIN} questions")


def _draw_histogram(hist_ax, table, after=None, after_label: str = "") -> None:
    """The share of predictions per bin, each bar labelled with its count (red when sparse); with ``after`` (the
    table after a calibrator) its share as a step line."""
    left, width, centers, filled, sparse = _bin_layout(table)
    share = table.counts / table.counts.sum()
    hist_ax.bar(left, share, width=width, align="edge", color="0.4", edgecolor="white")
    for k in np.flatnonzero(filled):  # the count itself, so a tall bar of three questions reads as three
        hist_ax.text(centers[k], share[k], str(table.counts[k]), ha="center", va="bottom", fontsize=6,
                     color="C3" if sparse[k] else "0.2")
    top = share.max()
    if after is not None:
        share_after = after.counts / after.counts.sum()
        hist_ax.stairs(share_after, after.bin_edges, color="C1", linewidth=1.2, label=f"share {after_label}")
        top = max(top, share_after.max())
    hist_ax.set_ylim(0, max(top, 1e-9) * 1.3)
    hist_ax.set_xlim(0, 1)
    hist_ax.set_xlabel("confidence" + (f"   (hatched: < {SPARSE_BIN} questions)" if sparse.any() else ""))
    hist_ax.set_ylabel("share")


def wilson_interval(successes, n, z: float = 1.959963984540054):
    """Wilson score interval (Wilson, JASA 1927) of a proportion: ``(low, high)`` arrays for ``successes`` out of
    ``n`` trials (elementwise; NaN where ``n`` is 0), at 95 % for the default ``z`` (the normal 0.975 quantile).

    centre = (p + z²/2n) / (1 + z²/n), half-width = z / (1 + z²/n) · sqrt(p(1 - p)/n + z²/4n²), p = successes / n;
    unlike p ± z·sqrt(p(1 - p)/n) it stays inside [0, 1] and is not empty at p = 0 or 1.
    """
    successes, n = np.asarray(successes, dtype=float), np.asarray(n, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = successes / n
        denom = 1 + z * z / n
        centre = (p + z * z / (2 * n)) / denom
        half = z / denom * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


def smooth_reliability_curve(y_true, y_prob, *, grid: int = 201):
    """The kernel-smoothed reliability curve of smECE (Błasiok & Nakkiran, ICLR 2024): at each confidence t on a
    grid, the accuracy ``sum_i K(t, c_i) y_i / sum_i K(t, c_i)`` with the Gaussian kernel reflected at 0 and 1, at
    the bandwidth sigma* = smECE (the fixed point ``metrics.smooth_ece`` finds). Returns ``(t, accuracy)``,
    arrays of ``grid`` points (NaN where no prediction lies within about a bandwidth); top-label confidence for
    (n, K) probabilities."""
    from hf_calibration.metrics import smooth_ece
    from hf_calibration.metrics.binning import top_label

    conf, correct = top_label(y_true, y_prob)
    sigma = max(smooth_ece(y_true, y_prob), 1e-3)
    t = np.linspace(0.0, 1.0, grid)[:, None]
    kernel = sum(np.exp(-((t - c) ** 2) / (2 * sigma * sigma)) for c in (conf, -conf, 2 - conf))
    mass = kernel.sum(axis=1)
    curve = kernel @ np.asarray(correct, dtype=float) / np.maximum(mass, 1e-300)
    curve[mass < 0.5] = np.nan  # no data within about a bandwidth: not drawn rather than extrapolated
    return t[:, 0], curve


def _drawable(text: str) -> str:
    """``text`` with the characters the figure's font cannot draw replaced by "?" (a Chinese question in a title
    made matplotlib warn "Glyph … missing from font(s) DejaVu Sans" on every save)."""
    from matplotlib import font_manager

    font = font_manager.get_font(font_manager.findfont(font_manager.FontProperties()))
    charmap = font.get_charmap()
    return "".join(c if ord(c) in charmap or c in "\n\t" else "?" for c in text)


def plot_reliability_diagrams(panels: dict, *, n_bins: int = 15, binning: str = "uniform", title: str | None = None,
                              panel_size: tuple[float, float] = (4.0, 4.0)):
    """Reliability diagrams side by side, one per entry of ``panels`` (``{panel title: (y_true, y_prob)}``,
    each pair as :func:`plot_reliability_diagram` takes it) → :class:`matplotlib.figure.Figure`.

    ``n_bins`` and ``binning`` are each panel's (:func:`plot_reliability_diagram`); ``panel_size`` is (width,
    height) in inches per panel; ``title`` goes above the row, one legend for all panels below it (outside every
    panel, so it covers no bin).

    Examples
    --------
    >>> fig = plot_reliability_diagrams({"a": ([1, 0], [0.9, 0.2]), "b": ([1, 1], [0.6, 0.7])}, n_bins=5)
    >>> [ax.get_title() for ax in fig.axes if ax.get_title()]
    ['a — ECE = 0.150 (5 bins)', 'b — ECE = 0.350 (5 bins)']
    """
    from matplotlib.figure import Figure

    fig = Figure(figsize=(panel_size[0] * len(panels), panel_size[1] + 0.6), layout="constrained")
    grid = fig.add_gridspec(2, len(panels), height_ratios=[3, 1])
    axes = []
    for j, (name, (y_true, y_prob)) in enumerate(panels.items()):
        ax = fig.add_subplot(grid[0, j])
        hist_ax = fig.add_subplot(grid[1, j], sharex=ax)
        _draw_diagram(ax, hist_ax, y_true, y_prob, n_bins=n_bins, binning=binning, title=name, style="bars",
                      smooth=False, calibrated=None, calibrated_label="")
        axes += [ax, hist_ax]
    fig.legend(*_legend_entries(axes), loc="outside lower center", ncols=5, fontsize="x-small", frameon=False)
    if title:
        fig.suptitle(_drawable(title))
    return fig
