import numpy as np
import pytest
from matplotlib.figure import Figure

from hf_calibration.errors import ParameterError
from hf_calibration.metrics import expected_calibration_error
from hf_calibration.reporting.plotting import plot_reliability_diagram
from tests.metrics.data import make_multiclass


@pytest.mark.parametrize("style", ["bars", "points"])
def test_figure_with_histogram_and_ece_title(style, tmp_path):
    labels, probs = make_multiclass(400, 4, seed=0)
    fig = plot_reliability_diagram(labels, probs, n_bins=10, title="model", style=style)
    assert isinstance(fig, Figure)
    diagram, histogram = fig.axes
    ece = expected_calibration_error(labels, probs, n_bins=10)
    assert diagram.get_title() == f"model — ECE = {ece:.3f} (10 bins)"
    heights = [p.get_height() for p in histogram.patches]
    assert sum(heights) == pytest.approx(1.0)
    assert len(heights) == 10
    fig.savefig(tmp_path / "diagram.png")
    assert (tmp_path / "diagram.png").stat().st_size > 1000


def test_draws_into_given_axes():
    fig = Figure()
    ax = fig.subplots()
    out = plot_reliability_diagram([1, 0, 1], [0.9, 0.4, 0.6], ax=ax, binning="quantile", n_bins=3)
    assert out is fig and len(fig.axes) == 2
    assert ax.get_title().startswith("ECE = ")


def test_conf_view_and_errors():
    fig = plot_reliability_diagram(np.array([1, 0]), np.array([0.8, 0.3]))
    assert fig.axes[0].get_title() == "ECE = 0.250 (15 bins)"
    with pytest.raises(ValueError, match="style must be one of 'bars', 'points', got 'line'"):
        plot_reliability_diagram([1], [0.5], style="line")
    with pytest.raises(ParameterError, match=r"^y_prob: must hold probabilities in \[0, 1\], got 1.5 at y_prob\[0\]$"):
        plot_reliability_diagram([1], [1.5])
