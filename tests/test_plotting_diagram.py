"""The reliability diagram shows where the data is: counts per bin, a 95 % Wilson interval per bin, sparse bins
hatched and faded, the smoothed smECE curve on request, and titles in any script without a glyph warning."""

import io
import warnings

import numpy as np
import pytest

from hf_calibration.reporting.plotting import (SPARSE_BIN, plot_reliability_diagram, smooth_reliability_curve,
                                     wilson_interval)


def test_wilson_interval_matches_published_values():
    """Wilson (1927) 95 % intervals as tabulated by Newcombe (Stat. Med. 1998, Table I): 0/10 → [0, 0.2775],
    10/10 → [0.7225, 1], 3/3 → [0.4385, 1]; and 0/0 → NaN."""
    low, high = wilson_interval([0, 10, 3, 0], [10, 10, 3, 0])
    np.testing.assert_allclose(low[:3], [0.0, 0.7225, 0.4385], atol=5e-5)
    np.testing.assert_allclose(high[:3], [0.2775, 1.0, 1.0], atol=5e-5)
    assert np.isnan(low[3]) and np.isnan(high[3])


def _demo():
    """Most questions at confidence ~0.5, three right ones at 0.2-0.27 (the make-demo case of a tall sparse bar)."""
    rng = np.random.default_rng(0)
    conf = np.r_[rng.uniform(0.4, 0.6, 200), [0.21, 0.23, 0.25]]
    correct = np.r_[(rng.uniform(size=200) < conf[:200]).astype(int), [1, 1, 1]]
    return correct, conf


def test_sparse_bins_are_hatched_and_counted():
    correct, conf = _demo()
    fig = plot_reliability_diagram(correct, conf, n_bins=15)
    ax, hist_ax = fig.axes[:2]
    bars = [p for p in ax.patches if p.get_width() > 0.05]  # the accuracy bars (the gap bars are half as wide)
    tall = next(p for p in bars if p.get_x() < 0.25 < p.get_x() + p.get_width())
    assert tall.get_hatch() == "//" and tall.get_alpha() < 0.5  # three questions: hatched and faded
    dense = max(bars, key=lambda p: p.get_alpha())
    assert dense.get_hatch() is None and dense.get_alpha() == pytest.approx(1.0)
    labels = sorted(int(t.get_text()) for t in hist_ax.texts)
    counts = np.histogram(conf, bins=np.linspace(0, 1, 16))[0]
    assert labels == sorted(c for c in counts if c > 0) and min(labels) < SPARSE_BIN
    # one error bar per filled bin, from the Wilson interval of that bin (3 of 3 right → [0.4385, 1])
    lines = [c for c in ax.collections if hasattr(c, "get_segments") and len(c.get_segments()) == len(labels)]
    ys = sorted(tuple(np.round(seg[:, 1], 4)) for seg in lines[0].get_segments())
    assert (0.4385, 1.0) in ys


def test_smooth_curve_is_drawn_where_the_data_is():
    correct, conf = _demo()
    t, curve = smooth_reliability_curve(correct, conf)
    assert np.isnan(curve[t > 0.8]).all() and np.isfinite(curve[(t > 0.45) & (t < 0.55)]).all()
    inside = (t > 0.45) & (t < 0.55)
    assert np.all(np.abs(curve[inside] - 0.5) < 0.15)  # calibrated by construction around 0.5
    fig = plot_reliability_diagram(correct, conf, smooth=True)
    assert any(line.get_label().startswith("smoothed") for line in fig.axes[0].lines)


def test_title_in_another_script_draws_without_a_glyph_warning(tmp_path):
    correct, conf = _demo()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib's "Glyph 25454 missing from font(s)" would fail here
        plot_reliability_diagram(correct, conf, title="数据 quiz").savefig(tmp_path / "d.png")


def test_bins_all_right_or_all_wrong_draw():
    """The Wilson bound of 0/n or n/n equals the accuracy up to rounding (-1e-17): still a valid error bar."""
    conf = np.r_[np.full(7, 0.31), np.full(5, 0.71), np.full(3, 0.93)]
    correct = np.r_[np.zeros(7, int), np.ones(5, int), np.ones(3, int)]
    plot_reliability_diagram(correct, conf, n_bins=10).savefig(io.BytesIO())


# ---------------------------------------------------------------------------------------- issue 52, item 7


def _one_question_bin():
    """199 questions at confidence 0.3-0.6 and one, right, at 0.12: its bin is drawn to accuracy 1.0."""
    rng = np.random.default_rng(0)
    conf = rng.uniform(0.3, 0.6, size=199)
    correct = (rng.uniform(size=199) < conf - 0.1).astype(int)
    return np.r_[correct, 1], np.r_[conf, 0.12]


def _boxes_overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_a_one_question_bin_is_not_the_most_eye_catching_bar():
    correct, conf = _one_question_bin()
    fig = plot_reliability_diagram(correct, conf, n_bins=15)
    ax = fig.axes[0]
    counts = np.histogram(conf, bins=np.linspace(0, 1, 16))[0]
    bars = [p for p in ax.patches if p.get_width() > 0.05]  # accuracy bars (the gap bars are half as wide)

    def count(p):
        return counts[int(round(p.get_x() * 15))]

    def ink(p):  # what draws the eye: the bar's area times its opacity
        return p.get_height() * p.get_width() * p.get_alpha()

    single = next(p for p in bars if count(p) == 1)
    assert single.get_height() == pytest.approx(1.0)  # drawn to 1.0 ...
    assert ink(single) < min(ink(p) for p in bars if count(p) >= SPARSE_BIN)  # ... yet the faintest in ink
    # its interval (Wilson 1/1: [0.2065, 1]) drawn light, the dense ones dark
    (segments,) = [c for c in ax.collections if hasattr(c, "get_segments") and len(c.get_segments()) == 6]
    shade = {tuple(np.round(seg[:, 1], 4)): colour[0] for seg, colour in zip(segments.get_segments(),
                                                                         segments.get_colors())}
    assert shade[(0.2065, 1.0)] > 0.7 and max(v for k, v in shade.items() if k != (0.2065, 1.0)) < 0.3


def test_the_legend_covers_no_bin():
    from matplotlib.figure import Figure

    correct, conf = _one_question_bin()
    fig = plot_reliability_diagram(correct, conf)
    fig.canvas.draw()
    (legend,) = fig.legends
    assert fig.axes[0].get_legend() is None
    assert not any(_boxes_overlap(legend.get_window_extent(), a.get_window_extent()) for a in fig.axes)
    own = Figure(figsize=(8, 5))
    ax = own.subplots()
    plot_reliability_diagram(correct, conf, ax=ax)
    own.canvas.draw()
    assert ax.get_legend().get_window_extent().x0 >= ax.get_window_extent().x1  # right of the diagram


def test_the_secl_panels_share_one_legend_outside_every_panel():
    from hf_calibration.reporting.plotting import plot_reliability_diagrams

    correct, conf = _one_question_bin()
    fig = plot_reliability_diagrams({"stem": (correct, conf), "humanities": (correct[::-1], conf),
                                     "overall": (correct, conf)}, title="SECL")
    fig.canvas.draw()
    (legend,) = fig.legends
    assert all(a.get_legend() is None for a in fig.axes) and len(fig.axes) == 6
    assert not any(_boxes_overlap(legend.get_window_extent(), a.get_window_extent()) for a in fig.axes)
    labels = [t.get_text() for t in legend.get_texts()]
    assert len(labels) == len(set(labels)) and "95 % interval (Wilson)" in labels


def test_posthoc_draws_both_curves_and_both_eces():
    from hf_calibration.metrics import expected_calibration_error

    correct, conf = _one_question_bin()
    calibrated = np.where(conf < 0.45, 0.25, 0.4)  # two levels: bins [0.2, 0.267) and [0.4, 0.467)
    fig = plot_reliability_diagram(correct, conf, title="m", calibrated=(correct, calibrated),
                                   calibrated_label="after histogram")
    ax = fig.axes[0]
    before = expected_calibration_error(correct, conf)
    after = expected_calibration_error(correct, calibrated)
    assert ax.get_title() == f"m — ECE = {before:.3f} → {after:.3f} after histogram (15 bins)"
    (curve,) = [line for line in ax.lines if line.get_label() == "after histogram"]
    low = conf < 0.45  # by hand: each level's accuracy at its confidence
    np.testing.assert_allclose(curve.get_xdata(), [0.25, 0.4])
    np.testing.assert_allclose(curve.get_ydata(), [correct[low].mean(), correct[~low].mean()])
    assert any(line.get_label() == "perfect calibration" for line in ax.lines)  # and the uncalibrated bars stay
    assert len([p for p in ax.patches if p.get_width() > 0.05]) == 6
