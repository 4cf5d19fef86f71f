"""One equal-width bin rule everywhere (issue 14): metrics, streaming state, histogram binning, SECL gate.

The documented rule (module docstring of ``hf_calibration.metrics.binning``): bin k of B holds the
confidences c with e_k <= c < e_(k+1), where e_k is the float64 nearest to the fraction k/B; 0.0 is in
the first bin and 1.0 in the last. The expected bins below come from exact ``fractions.Fraction``
comparisons of that rule, not from the library.
"""

from fractions import Fraction

import numpy as np
import pytest

from hf_calibration.errors import ParameterError
from hf_calibration.metrics import BinnedCalibrationState, expected_calibration_error, reliability_diagram
from hf_calibration.metrics.binning import uniform_bin_index
from hf_calibration.posthoc import HistogramBinningCalibrator
from hf_calibration.secl.mixin import bin_gate_passes, confidence_bin


def _edge(k: int, n_bins: int) -> Fraction:
    """Exact value of e_k, the float64 nearest to k / n_bins (Fraction.__float__ rounds correctly)."""
    return Fraction(float(Fraction(k, n_bins)))


def _documented_bin(c, n_bins: int) -> int:
    exact = Fraction(float(c))  # float32 and float64 values are exact in a Fraction
    return max(k for k in range(n_bins) if exact >= _edge(k, n_bins))


def _nearest_float32(q: Fraction) -> np.float32:
    guess = np.float32(float(q))
    candidates = [np.nextafter(guess, np.float32(-1)), guess, np.nextafter(guess, np.float32(2))]
    return min(candidates, key=lambda x: abs(Fraction(float(x)) - q))


def _points(n_bins: int, dtype) -> np.ndarray:
    """Each edge k/B as the nearest ``dtype`` value, and its two neighbours, kept inside [0, 1]."""
    out = []
    for k in range(n_bins + 1):
        q = Fraction(k, n_bins)
        x = np.float64(float(q)) if dtype == np.float64 else _nearest_float32(q)
        out += [np.nextafter(x, dtype(-1)), x, np.nextafter(x, dtype(2))]
    out = np.array(out, dtype=dtype)
    return np.unique(out[(out >= 0) & (out <= 1)])


@pytest.mark.parametrize("n_bins", range(2, 51))
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_every_binning_puts_each_edge_where_the_exact_rule_does(n_bins, dtype):
    c = _points(n_bins, dtype)
    expected = np.array([_documented_bin(x, n_bins) for x in c])

    idx = uniform_bin_index(c, n_bins)
    assert idx.shape == c.shape
    np.testing.assert_array_equal(idx, expected)
    assert [int(uniform_bin_index(x, n_bins)) for x in c] == expected.tolist()  # numpy scalars
    assert [int(uniform_bin_index(float(x), n_bins)) for x in c] == expected.tolist()  # Python floats
    assert [confidence_bin(float(x), n_bins) for x in c] == expected.tolist()  # SECL bin gate

    counts = np.bincount(expected, minlength=n_bins)
    correct = np.arange(len(c)) % 2  # both classes, so the calibrator can be fitted
    np.testing.assert_array_equal(reliability_diagram(correct, c, n_bins=n_bins).counts, counts)
    np.testing.assert_array_equal(BinnedCalibrationState(n_bins).update(correct, c).sums[0], counts)
    np.testing.assert_array_equal(HistogramBinningCalibrator(n_bins=n_bins).fit(c, correct).bin_counts_, counts)


def test_uniform_bin_index_accepts_scalars_and_other_dtypes():
    assert uniform_bin_index(0.7, 10) == 7 and np.ndim(uniform_bin_index(0.7, 10)) == 0
    assert uniform_bin_index(1, 4) == 3 and uniform_bin_index(True, 4) == 3
    np.testing.assert_array_equal(uniform_bin_index(np.float16([0.0, 0.5, 1.0]), 4), [0, 2, 3])
    np.testing.assert_array_equal(uniform_bin_index([[0.0, 0.3], [0.65, 1.0]], 10), [[0, 3], [6, 9]])
    assert uniform_bin_index(np.empty(0), 10).shape == (0,)
    # long double: just below the float64 edge 0.7 stays in bin 6
    below = np.nextafter(np.longdouble(0.7), np.longdouble(0))
    if below != np.float64(below):  # only where long double is wider than float64
        assert uniform_bin_index(np.array([below]), 10).tolist() == [6]


@pytest.mark.parametrize(
    "conf, n_bins, exc, message",
    [
        ([0.2, 1.5], 10, ValueError, r"^conf: must hold confidences in \[0, 1\], got 1.5 at conf\[1\]$"),
        ([0.2, np.nan], 10, ValueError, r"^conf: must hold confidences in \[0, 1\], got nan at conf\[1\]$"),
        (-0.1, 10, ValueError, r"^conf: must hold confidences in \[0, 1\], got -0.1$"),
        ([0.5], 0, ValueError, "n_bins: must be a positive integer, got 0"),
        ([0.5], 2.0, TypeError, "n_bins: must be an int"),
        (["a"], 10, TypeError, "^conf: must hold real numbers"),
    ],
)
def test_uniform_bin_index_errors(conf, n_bins, exc, message):
    with pytest.raises(ParameterError, match=message) as err:
        uniform_bin_index(conf, n_bins)
    assert isinstance(err.value, exc) and err.value.parameter == ("n_bins" if "n_bins" in message else "conf")


# The replay of issue 14: histogram binning disagreed with the reliability diagram on the same data.
# three copies of eight predictions: every bin's accuracy and the ECE are those of the eight (each bin's counts
# triple), and n = 24 allows the 20 bins (at most max(n, 15) bins: docs/methods.md)
REPLAY_CONF = [0.25, 0.3, 0.3, 0.55, 0.6, 0.65, 0.7, 0.75] * 3
REPLAY_CORRECT = [0, 1, 1, 0, 1, 1, 0, 0] * 3
QUERIES = [0.3, 0.6, 0.7]
# By hand from bins [k/B, (k+1)/B):
#   B=5:  [.2,.4) {.25 x, .3 ok, .3 ok} acc 2/3;  [.4,.6) {.55 x} acc 0;
#         [.6,.8) {.6 ok, .65 ok, .7 x, .75 x} acc 1/2
#         ECE = (3·|2/3 − .85/3| + 1·|0 − .55| + 4·|1/2 − .675|) / 8 = (1.15 + .55 + .7) / 8 = 3/10
#   B=10: [.2,.3) {.25 x} 0; [.3,.4) {.3, .3 ok} 1; [.5,.6) {.55 x} 0; [.6,.7) {.6 ok, .65 ok} 1;
#         [.7,.8) {.7 x, .75 x} 0
#         ECE = (.25 + 2·.7 + .55 + 2·.375 + 2·.725) / 8 = 4.4 / 8 = 11/20
#   B=20: every value alone in its bin except the two .3 (both ok):
#         ECE = (.25 + 1.4 + .55 + .4 + .35 + .7 + .75) / 8 = 11/20
REPLAY = {
    5: dict(bins=[1, 3, 3], values=[Fraction(2, 3), Fraction(1, 2), Fraction(1, 2)], ece=Fraction(3, 10)),
    10: dict(bins=[3, 6, 7], values=[1, 1, 0], ece=Fraction(11, 20)),
    20: dict(bins=[6, 12, 14], values=[1, 1, 0], ece=Fraction(11, 20)),
}


@pytest.mark.parametrize("n_bins", sorted(REPLAY))
def test_replay_calibrator_diagram_ece_and_gate_agree(n_bins):
    want = REPLAY[n_bins]
    values = [float(v) for v in want["values"]]
    cal = HistogramBinningCalibrator(n_bins=n_bins).fit(REPLAY_CONF, REPLAY_CORRECT)
    np.testing.assert_allclose(cal.transform(QUERIES), values, rtol=0, atol=1e-15)
    table = reliability_diagram(REPLAY_CORRECT, REPLAY_CONF, n_bins=n_bins)
    np.testing.assert_allclose(table.accuracy[want["bins"]], values, rtol=0, atol=1e-15)
    state = BinnedCalibrationState(n_bins).update(REPLAY_CORRECT, REPLAY_CONF)
    np.testing.assert_allclose(state.reliability().accuracy[want["bins"]], values, rtol=0, atol=1e-15)
    assert expected_calibration_error(REPLAY_CORRECT, REPLAY_CONF, n_bins=n_bins) == pytest.approx(
        float(want["ece"]), abs=1e-12
    )
    assert [confidence_bin(q, n_bins) for q in QUERIES] == want["bins"]
    np.testing.assert_array_equal(uniform_bin_index(np.array(QUERIES), n_bins), want["bins"])


def test_secl_gate_uses_the_documented_edges():
    # 0.57 * 100 = 56.99999999999999 in float64, but 0.57 is the float64 nearest 57/100: bin 57.
    assert confidence_bin(0.57, 100) == 57
    assert bin_gate_passes(0.565, 0.57, n_bins=100, width=0)  # bins 56 and 57
    assert not bin_gate_passes(0.57, 0.575, n_bins=100, width=0)  # both in bin 57
