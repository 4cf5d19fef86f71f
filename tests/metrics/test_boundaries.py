"""Bad and boundary inputs: each kind from the issue, for every metric it concerns.

Every error must name the argument and the offending value.
"""

import numpy as np
import pytest
import torch
from netcal.metrics import ECE as NetcalECE
from sklearn.calibration import calibration_curve
from torchmetrics.functional.classification import binary_calibration_error

from hf_calibration.errors import ParameterError
from hf_calibration.metrics import (
    BinnedCalibrationState,
    adaptive_calibration_error,
    aurc,
    bootstrap,
    brier_score,
    calibration_report,
    classwise_ece,
    confidence_auprc,
    confidence_auroc,
    expected_calibration_error,
    negative_log_likelihood,
    reliability_diagram,
    smooth_ece,
)

ALL_METRICS = [
    expected_calibration_error,
    adaptive_calibration_error,
    smooth_ece,
    brier_score,
    negative_log_likelihood,
    confidence_auroc,
    confidence_auprc,
    aurc,
]
MULTICLASS_ONLY = [classwise_ece]
EVERY = ALL_METRICS + MULTICLASS_ONLY


def _ece_quantile(y, p):
    return expected_calibration_error(y, p, binning="quantile")


def _state(y, p):
    return BinnedCalibrationState().update(y, p).compute()


VALIDATING = EVERY + [_ece_quantile, _state, reliability_diagram]


# -- confidence exactly 0 and 1 ------------------------------------------------------------------


def test_confidence_zero_and_one_fall_in_first_and_last_bin():
    table = reliability_diagram([0, 1, 1], [0.0, 1.0, 0.5], n_bins=10)
    assert table.counts.tolist() == [1, 0, 0, 0, 0, 1, 0, 0, 0, 1]
    assert len(table.counts) == 10  # no phantom 11th bin
    # gaps |0 - 0|, |1 - 1|, |1 - .5| -> 1/6
    assert expected_calibration_error([0, 1, 1], [0.0, 1.0, 0.5], n_bins=10) == pytest.approx(1 / 6)
    state = BinnedCalibrationState(n_bins=10).update([0, 1, 1], [0.0, 1.0, 0.5])
    assert state.sums[0].tolist() == table.counts.tolist()


def test_confidence_one_shares_the_last_bin_unlike_torchmetrics():
    conf, outcome = [0.95, 1.0, 1.0], [1, 0, 1]
    # ours: one bin [0.9, 1] with acc 2/3 and conf 0.98333 -> 0.31667
    expected = abs(2 / 3 - (0.95 + 1.0 + 1.0) / 3)
    assert expected_calibration_error(outcome, conf, n_bins=10) == pytest.approx(expected, abs=1e-12)
    # torchmetrics 1.9 bucketizes with right=True, so 1.0 lands in an extra (n_bins + 1)-th bin:
    # {0.95}: gap .05 (w 1/3) and {1.0, 1.0}: gap .5 (w 2/3) -> 0.35. That is the known bug.
    peer = binary_calibration_error(torch.tensor(conf, dtype=torch.float64), torch.tensor(outcome), n_bins=10)
    assert float(peer) == pytest.approx(0.05 / 3 + 0.5 * 2 / 3, abs=1e-12)


def test_confidence_zero_and_one_for_probability_rows():
    probs = [[1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [1 / 3, 1 / 3, 1 / 3]]
    labels = [0, 1, 0]
    # conf 1, 1, 1/3; correct, wrong, correct (argmax of the tie is class 0)
    assert expected_calibration_error(labels, probs, n_bins=3) == pytest.approx((0 + 1 + 2 / 3) / 3, abs=1e-12)
    assert classwise_ece(labels, probs, n_bins=3) >= 0
    assert np.isfinite(negative_log_likelihood(labels, probs))


# -- bin edges at exact fractions -----------------------------------------------------------------


def test_verbalised_confidence_on_a_bin_edge():
    # 0.7 with 10 bins belongs to [0.7, 0.8). scikit-learn 1.9 bins are right-closed, (e_k, e_k+1],
    # so it puts 0.7 in (0.6, 0.7] together with 0.65.
    conf, outcome = [0.65, 0.7], [1, 0]
    assert expected_calibration_error(outcome, conf, n_bins=10) == pytest.approx((0.35 + 0.7) / 2, abs=1e-12)
    prob_true, prob_pred = calibration_curve(outcome, conf, n_bins=10)
    assert prob_true.tolist() == [0.5] and prob_pred == pytest.approx([0.675])
    # torch.linspace(0, 1, 11)[3] is 0.30000000000000004, so torchmetrics puts 0.3 in [0.2, 0.3):
    # one bin with acc 1/2 and conf .25 instead of two bins with gaps .8 and .3.
    conf, outcome = [0.2, 0.3], [1, 0]
    assert expected_calibration_error(outcome, conf, n_bins=10) == pytest.approx((0.8 + 0.3) / 2, abs=1e-12)
    peer = binary_calibration_error(torch.tensor(conf, dtype=torch.float64), torch.tensor(outcome), n_bins=10)
    assert float(peer) == pytest.approx(0.25, abs=1e-12)


@pytest.mark.parametrize("n_bins", [1, 2, 3, 7, 10, 15, 22, 49, 100])
def test_every_fraction_k_over_b_lands_in_bin_k(n_bins):
    k = np.arange(n_bins + 1)
    table = reliability_diagram(np.ones(n_bins + 1, int), k / n_bins, n_bins=n_bins)
    expected = np.bincount(np.minimum(k, n_bins - 1), minlength=n_bins)
    np.testing.assert_array_equal(table.counts, expected)


def test_values_one_ulp_around_an_edge():
    edge = 7 / 10
    below, above = np.nextafter(edge, 0), np.nextafter(edge, 1)
    table = reliability_diagram([1, 1, 1], [below, edge, above], n_bins=10)
    assert table.counts[6] == 1 and table.counts[7] == 2


# -- all confidences equal ---------------------------------------------------------------------------


def test_all_confidences_equal():
    conf, outcome = np.full(10, 0.7), np.array([1, 1, 1, 0, 0, 1, 1, 0, 1, 1])  # accuracy 0.7
    for binning in ("uniform", "quantile"):
        assert expected_calibration_error(outcome, conf, binning=binning) == pytest.approx(0.0, abs=1e-12)
    outcome2 = np.array([1, 0, 0, 0, 0, 0, 0, 0, 0, 0])  # accuracy 0.1
    for binning in ("uniform", "quantile"):
        assert expected_calibration_error(outcome2, conf, binning=binning) == pytest.approx(0.6, abs=1e-12)
        assert expected_calibration_error(outcome2, conf, binning=binning, norm="max") == pytest.approx(0.6)
    assert adaptive_calibration_error(outcome2, conf) == pytest.approx(0.6, abs=1e-12)
    assert confidence_auroc(outcome2, conf) == 0.5  # all tied
    assert aurc(outcome2, conf) == pytest.approx(0.9, abs=1e-12)  # risk = error rate at every coverage
    assert np.isfinite(smooth_ece(outcome2, conf))


# -- empty bins, n = 1, n_bins > n, ties at quantile edges -------------------------------------------------


def test_empty_bins_carry_no_weight():
    conf, outcome = [0.05, 0.95], [0, 1]
    assert expected_calibration_error(outcome, conf, n_bins=10) == pytest.approx(0.05, abs=1e-12)
    assert expected_calibration_error(outcome, conf, n_bins=10, norm="max") == pytest.approx(0.05, abs=1e-12)
    table = reliability_diagram(outcome, conf, n_bins=10)
    assert np.isnan(table.accuracy[1:9]).all() and table.counts[1:9].sum() == 0
    assert table.to_dict()["accuracy"][1] is None


def test_single_prediction():
    assert expected_calibration_error([1], [0.8]) == pytest.approx(0.2)
    assert expected_calibration_error([1], [0.8], binning="quantile") == pytest.approx(0.2)
    assert adaptive_calibration_error([0], [0.8]) == pytest.approx(0.8)
    assert classwise_ece([1], [[0.3, 0.7]]) == pytest.approx((0.3 + 0.3) / 2)
    assert brier_score([1], [0.8]) == pytest.approx(0.04)
    assert negative_log_likelihood([1], [0.8]) == pytest.approx(-np.log(0.8))
    with pytest.warns(UserWarning, match="all 1 predictions are correct"):  # one class only: undefined, said so
        assert np.isnan(confidence_auroc([1], [0.8]))
    assert confidence_auprc([1], [0.8]) == 1.0
    assert np.isnan(confidence_auprc([0], [0.8]))
    assert aurc([0], [0.8]) == 1.0
    assert 0 <= smooth_ece([1], [0.8]) <= 1
    est, low, high = bootstrap(expected_calibration_error, [1], [0.8], n_resamples=10)
    assert est == low == high == pytest.approx(0.2)
    report = calibration_report([1], [0.8], n_resamples=10)
    assert np.isnan(report["auroc"]["value"]) and np.isnan(report["auroc"]["low"])


def test_more_quantile_bins_than_predictions():
    conf, outcome = [0.2, 0.5, 0.9], [1, 0, 1]
    # each prediction alone in its bin -> mean |y - c|
    expected = (0.8 + 0.5 + 0.1) / 3
    assert expected_calibration_error(outcome, conf, n_bins=10, binning="quantile") == pytest.approx(expected)
    assert adaptive_calibration_error(outcome, conf, n_bins=10) == pytest.approx(expected)
    table = reliability_diagram(outcome, conf, n_bins=10, binning="quantile")
    assert table.counts.sum() == 3 and (table.counts > 0).sum() == 3


def test_ties_at_quantile_edges():
    conf, outcome = [0.2, 0.2, 0.2, 0.2, 0.8, 0.8], [1, 0, 0, 0, 1, 1]
    # edges at the linear quantiles: 1/3 -> 0.2, 2/3 -> 0.2 + (1/3)(0.6) = 0.4
    # bins [0, .2) empty; [.2, .4): four 0.2 (acc 1/4); [.4, 1]: two 0.8 (acc 1)
    assert expected_calibration_error(outcome, conf, n_bins=3, binning="quantile") == pytest.approx(
        4 / 6 * 0.05 + 2 / 6 * 0.2, abs=1e-12
    )
    assert adaptive_calibration_error(outcome, conf, n_bins=3) == pytest.approx((0.05 + 0.2) / 2, abs=1e-12)


def test_coincident_quantile_edges():
    conf, outcome = np.array([0.2] * 5 + [0.8]), np.array([1, 0, 0, 0, 0, 1])
    # edges 0.2 and 0.2 coincide: two empty bins and one with everything (acc 1/3, conf 0.3)
    assert expected_calibration_error(outcome, conf, n_bins=3, binning="quantile") == pytest.approx(1 / 30, abs=1e-12)
    assert adaptive_calibration_error(outcome, conf, n_bins=3) == pytest.approx(1 / 30, abs=1e-12)
    # netcal cannot bin this: scipy's binned_statistic_dd rejects coincident edges.
    with pytest.raises(ValueError, match="edge difference is numerically 0"):
        NetcalECE(bins=3, equal_intervals=False).measure(conf, outcome)


# -- probability rows not summing to 1 -------------------------------------------------------------------


@pytest.mark.parametrize("metric", [m for m in VALIDATING if m is not classwise_ece] + [classwise_ece])
def test_rows_not_summing_to_one(metric):
    probs = np.array([[0.5, 0.5], [0.2, 0.8], [0.6, 0.4], [0.4, 0.3]])
    with pytest.raises(ParameterError, match=r"^y_prob: row 3 sums to 0\.7, expected 1 within atol=0\.0001") as err:
        metric([0, 1, 0, 1], probs)
    assert err.value.parameter == "y_prob" and isinstance(err.value, ValueError)


def test_row_sum_tolerance():
    ok = np.array([[0.5, 0.5 + 5e-5], [0.3, 0.7]])
    assert expected_calibration_error([0, 1], ok) >= 0
    with pytest.raises(ValueError, match="row 0 sums to 1.0002"):
        expected_calibration_error([0, 1], np.array([[0.5, 0.5002], [0.3, 0.7]]))


def test_bad_row_in_a_later_chunk_is_named_by_its_global_index():
    probs = np.full((100_000, 4), 0.25)
    probs[70_001] = [0.25, 0.25, 0.25, 0.2]
    with pytest.raises(ParameterError, match="y_prob: row 70001 sums to 0.95"):
        expected_calibration_error(np.zeros(100_000, int), probs)
    probs[70_001] = [0.25, 0.25, np.nan, 0.25]
    with pytest.raises(ParameterError, match=r"got nan at y_prob\[70001, 2\]$"):
        expected_calibration_error(np.zeros(100_000, int), probs)


# -- NaN / inf / outside [0, 1] -----------------------------------------------------------------------------


@pytest.mark.parametrize("metric", VALIDATING)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_probabilities(metric, bad):
    probs = np.array([[0.5, 0.5], [0.2, 0.8], [0.5, 0.5]])
    probs[2, 1] = bad
    with pytest.raises(ParameterError, match=rf"^y_prob: must hold finite numbers in \[0, 1\], got {bad} at "
                                             rf"y_prob\[2, 1\]$") as err:
        metric([0, 1, 0], probs)
    assert err.value.parameter == "y_prob" and np.isnan(err.value.value) == np.isnan(bad)
    if metric not in MULTICLASS_ONLY:
        with pytest.raises(ParameterError, match=rf"^y_prob: must hold finite numbers in \[0, 1\], got {bad} at "
                                                 rf"y_prob\[1\]$") as err:
            metric([0, 1, 0], np.array([0.2, bad, 0.9]))
        assert err.value.parameter == "y_prob"


@pytest.mark.parametrize("metric", [m for m in VALIDATING if m not in MULTICLASS_ONLY])
@pytest.mark.parametrize("bad", [1.2, -0.1])
def test_confidence_outside_unit_interval(metric, bad):
    with pytest.raises(ParameterError, match=rf"^y_prob: must hold probabilities in \[0, 1\], got {bad} at "
                                             rf"y_prob\[2\]$") as err:
        metric([0, 1, 0], [0.2, 0.9, bad])
    assert err.value.parameter == "y_prob" and err.value.value == bad


@pytest.mark.parametrize("metric", VALIDATING)
def test_probability_outside_unit_interval(metric):
    with pytest.raises(ParameterError, match=r"^y_prob: must hold probabilities in \[0, 1\], got 1.2 at "
                                             r"y_prob\[1, 0\]$") as err:
        metric([0, 1], [[0.5, 0.5], [1.2, -0.2]])
    assert err.value.parameter == "y_prob" and err.value.value == 1.2


def _report(y, p):
    return calibration_report(y, p, n_resamples=20)


@pytest.mark.parametrize("metric", [_report, confidence_auroc, brier_score, expected_calibration_error])
@pytest.mark.parametrize("y_true, y_prob, parameter, value, fragment", [
    ([], [], "y_prob", None, "must hold at least one prediction, got shape (0,)"),
    ([1, 0, 1], [0.9, np.nan, 0.4], "y_prob", np.nan, "must hold finite numbers in [0, 1], got nan at y_prob[1]"),
    ([1, 0, 1], [0.9, 0.2, np.inf], "y_prob", np.inf, "must hold finite numbers in [0, 1], got inf at y_prob[2]"),
    ([1, 0, 1], [0.9, 1.5, 0.4], "y_prob", 1.5, "must hold probabilities in [0, 1], got 1.5 at y_prob[1]"),
    ([1, 0, 1], [-0.25, 0.5, 0.4], "y_prob", -0.25, "must hold probabilities in [0, 1], got -0.25 at y_prob[0]"),
    ([1, 0], [0.9, 0.2, 0.4], "y_true", [1, 0], "has 2 entries but y_prob has 3 rows"),
])
def test_new_user_bad_inputs_name_the_argument_and_the_value(metric, y_true, y_prob, parameter, value, fragment):
    """A new user's mistakes (no data, NaN/inf, a confidence outside [0, 1], lengths that differ) raise ParameterError
    (a ValueError) naming the argument, as every metric, the report and the CLI do; before: a plain ValueError."""
    with pytest.raises(ParameterError) as err:
        metric(y_true, y_prob)
    assert err.value.parameter == parameter and isinstance(err.value, ValueError)
    assert str(err.value) == f"{parameter}: {fragment}" and "\n" not in str(err.value)
    if value is not None:
        assert err.value.value == value or (np.isnan(value) and np.isnan(err.value.value))


def test_nan_in_labels():
    with pytest.raises(ValueError, match=r"y_true: must hold integer labels, got nan at index 1"):
        expected_calibration_error([1.0, np.nan], [0.2, 0.3])


# -- labels -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("metric", VALIDATING)
def test_negative_label(metric):
    with pytest.raises(ValueError, match=r"y_true: must lie in \[0, 1\] \(K=2 classes\), got -1 at index 1"):
        metric([0, -1], [[0.5, 0.5], [0.2, 0.8]])


@pytest.mark.parametrize("metric", VALIDATING)
def test_label_not_below_k(metric):
    message = r"y_true: must lie in \[0, 2\] \(K=3 classes\), got 3 at index 0"
    with pytest.raises(ValueError, match=message):
        metric([3, 0], [[0.5, 0.25, 0.25], [0.2, 0.7, 0.1]])


@pytest.mark.parametrize("metric", [m for m in VALIDATING if m not in MULTICLASS_ONLY])
def test_correctness_must_be_binary(metric):
    with pytest.raises(ValueError, match=r"y_true: must be 0 or 1 \(correctness\).*got 2 at index 2"):
        metric([0, 1, 2], [0.2, 0.3, 0.4])


def test_non_integer_label():
    with pytest.raises(ValueError, match=r"y_true: must hold integer labels, got 0.5 at index 0"):
        expected_calibration_error([0.5, 1.0], [0.2, 0.3])
    assert expected_calibration_error([0.0, 1.0], [0.2, 0.7]) == pytest.approx((0.2 + 0.3) / 2)


# -- lengths, shapes, types ------------------------------------------------------------------------------------


@pytest.mark.parametrize("metric", VALIDATING)
def test_length_mismatch(metric):
    with pytest.raises(ParameterError, match="^y_true: has 3 entries but y_prob has 2 rows$") as err:
        metric([0, 1, 1], [[0.5, 0.5], [0.2, 0.8]])
    assert err.value.parameter == "y_true"


@pytest.mark.parametrize("metric", [m for m in VALIDATING if m is not _state])
def test_empty_input(metric):
    # BinnedCalibrationState.update takes an empty batch as a no-op (a process with no data), so
    # there the error comes from compute(): tests/metrics/test_streaming.py
    with pytest.raises(ParameterError, match=r"^y_prob: must hold at least one prediction, got shape \(0, 3\)$") as err:
        metric([], np.empty((0, 3)))
    assert err.value.parameter == "y_prob"


@pytest.mark.parametrize(
    "probs, message",
    [
        (np.full((2, 2, 2), 0.5), r"^y_prob: must have shape \(n,\) or \(n, K\), got shape \(2, 2, 2\)$"),
        (np.full((2, 1), 1.0), r"^y_prob: must be confidences of shape \(n,\) or probabilities of shape \(n, K\) "
                               r"with K ≥ 2, got shape \(2, 1\)$"),
        (0.5, r"^y_prob: .*got shape \(\)$"),
    ],
)
def test_bad_prob_shapes(probs, message):
    with pytest.raises(ParameterError, match=message) as err:
        expected_calibration_error([0, 1], probs)
    assert err.value.parameter == "y_prob"


def test_two_dimensional_labels():
    with pytest.raises(ValueError, match=r"y_true: must have shape \(n,\), got shape \(2, 1\)"):
        expected_calibration_error([[0], [1]], [0.2, 0.3])


def test_classwise_needs_probability_rows():
    with pytest.raises(ParameterError, match=r"^y_prob: must be probabilities of shape \(n, K\)") as err:
        classwise_ece([0, 1], [0.2, 0.3])
    assert err.value.parameter == "y_prob"


def test_non_numeric_input():
    with pytest.raises(TypeError, match=r"y_prob: must hold numbers, got dtype <U3"):
        expected_calibration_error([0, 1], ["0.2", "0.3"])
    with pytest.raises(TypeError, match="y_true: must hold numbers"):
        expected_calibration_error(["a", "b"], [0.2, 0.3])


def test_ragged_rows():
    with pytest.raises(ValueError, match="y_prob: must be a rectangular array"):
        expected_calibration_error([0, 1], [[0.5, 0.5], [1.0]])


# -- (n, 2) arrays are two classes, not a positive-class column ---------------------------------------------


def test_two_column_arrays_are_multiclass():
    rng = np.random.default_rng(0)
    positive = rng.uniform(size=500)
    probs = np.c_[1 - positive, positive]
    labels = (rng.uniform(size=500) < positive).astype(int)
    conf, correct = probs.max(axis=1), (probs.argmax(axis=1) == labels).astype(int)
    # top-label view of K = 2
    top_label_ece = expected_calibration_error(correct, conf)
    assert expected_calibration_error(labels, probs) == pytest.approx(top_label_ece, abs=1e-12)
    # multiclass Brier of K = 2 is twice the binary Brier of the positive column
    assert brier_score(labels, probs) == pytest.approx(2 * brier_score(labels, positive), abs=1e-12)
    assert negative_log_likelihood(labels, probs) == pytest.approx(negative_log_likelihood(labels, positive), abs=1e-12)
    # netcal reads an (n, 2) array as binary and calibrates the positive-class column instead:
    netcal = NetcalECE(bins=15).measure(probs, labels)
    assert netcal == pytest.approx(expected_calibration_error(labels, positive), abs=1e-6)
    assert netcal != pytest.approx(expected_calibration_error(labels, probs), abs=1e-3)


# -- dtypes and containers ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_half_precision_tensors(dtype):
    gen = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(400, 5, generator=gen), dim=1).to(dtype)
    labels = torch.randint(0, 5, (400,), generator=gen)
    # Rows of a half-precision softmax sum to 1 only within ~K eps(dtype); they must be accepted, and
    # their values used exactly (every float16/bfloat16 value is a float64).
    exact, y = probs.double().numpy(), labels.numpy()
    conf, correct = exact.max(axis=1), (exact.argmax(axis=1) == y).astype(int)
    top_label_metrics = [m for m in ALL_METRICS if m not in (brier_score, negative_log_likelihood)]
    for metric in top_label_metrics:
        assert metric(labels, probs) == pytest.approx(metric(correct, conf), abs=1e-12), metric.__name__
    onehot = np.eye(5)[y]
    assert brier_score(labels, probs) == pytest.approx(np.mean(np.sum((exact - onehot) ** 2, axis=1)), abs=1e-12)
    nll = -np.mean(np.log(exact[np.arange(400), y]))
    assert negative_log_likelihood(labels, probs) == pytest.approx(nll, abs=1e-12)
    per_class = [expected_calibration_error(onehot[:, k].astype(int), exact[:, k]) for k in range(5)]
    assert classwise_ece(labels, probs) == pytest.approx(np.mean(per_class), abs=1e-12)


def test_half_precision_row_tolerance_scales_with_eps():
    rows = torch.tensor([[0.5, 0.5], [0.3, 0.7]], dtype=torch.bfloat16)
    rows[0, 1] = 0.5 + 2**-8  # off by 0.0039: within K * eps(bfloat16) = 2 * 2**-7
    assert expected_calibration_error(torch.tensor([0, 1]), rows) >= 0
    with pytest.raises(ValueError, match="expected 1 within atol=0.0001"):
        expected_calibration_error([0, 1], rows.double().numpy())


def test_half_precision_values_are_used_exactly():
    conf = torch.tensor([0.3, 0.7, 0.9], dtype=torch.bfloat16)
    outcome = torch.tensor([0, 1, 1])
    exact = conf.double().numpy()  # bfloat16 0.3 is 0.30078125
    assert expected_calibration_error(outcome, conf) == pytest.approx(np.mean(np.abs(exact - [0, 1, 1])), abs=1e-15)
    assert expected_calibration_error(outcome, np.float16([0.3, 0.7, 0.9])) == pytest.approx(
        np.mean(np.abs(np.float16([0.3, 0.7, 0.9]).astype(np.float64) - [0, 1, 1])), abs=1e-15
    )


@pytest.mark.parametrize("metric", EVERY)
def test_python_lists_equal_arrays(metric):
    labels = [0, 2, 1, 1, 0]
    probs = [[0.6, 0.3, 0.1], [0.2, 0.5, 0.3], [0.1, 0.7, 0.2], [0.5, 0.25, 0.25], [0.4, 0.4, 0.2]]
    expected = metric(np.array(labels), np.array(probs))
    assert metric(labels, probs) == expected or (np.isnan(expected) and np.isnan(metric(labels, probs)))


def test_bool_correctness_and_integer_confidences():
    assert expected_calibration_error([True, False], [1, 0]) == 0.0


# -- options -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n_bins", [0, -3])
@pytest.mark.parametrize(
    "metric",
    [
        expected_calibration_error,
        classwise_ece,
        adaptive_calibration_error,
        reliability_diagram,
        BinnedCalibrationState,
    ],
)
def test_n_bins_not_positive(metric, n_bins):
    with pytest.raises(ValueError, match=f"n_bins: must be a positive integer, got {n_bins}"):
        if metric is BinnedCalibrationState:
            metric(n_bins=n_bins)
        else:
            metric([0, 1], [[0.5, 0.5], [0.3, 0.7]], n_bins=n_bins)


@pytest.mark.parametrize("n_bins", [2.5, True, "15", None])
def test_n_bins_not_an_int(n_bins):
    with pytest.raises(TypeError, match=r"n_bins: must be an int, got"):
        expected_calibration_error([0, 1], [0.5, 0.5], n_bins=n_bins)


def test_unknown_options():
    with pytest.raises(ValueError, match=r"binning: must be one of 'uniform', 'quantile', got 'equal'"):
        expected_calibration_error([0, 1], [0.5, 0.5], binning="equal")
    with pytest.raises(ValueError, match=r"norm: must be one of 'l1', 'l2', 'max', got 'l3'"):
        expected_calibration_error([0, 1], [0.5, 0.5], norm="l3")
    with pytest.raises(ParameterError, match=r"^debiased: must be False with norm='max' .*norm='l1' and norm='l2'"):
        expected_calibration_error([0, 1], [0.5, 0.5], norm="max", debiased=True)
    with pytest.raises(ParameterError, match=r"^sigma: must be in \(0, 1\], got 0$"):
        smooth_ece([0, 1], [0.5, 0.5], sigma=0)
