"""Issue 52 item 6: AUROC on one class says so, the evaluate modules refuse what the functions refuse."""

import math
import warnings
from pathlib import Path

import numpy as np
import pytest

from hf_calibration import metrics as lib
from hf_calibration.errors import ParameterError, ParameterWarning

METRICS_DIR = Path(__file__).resolve().parents[2] / "metrics"


@pytest.mark.parametrize("correct", [1, 0])
def test_confidence_auroc_on_one_class_warns_naming_y_true(correct):
    from sklearn.exceptions import UndefinedMetricWarning
    from sklearn.metrics import roc_auc_score

    conf = [0.9, 0.6, 0.7]
    with pytest.warns(UndefinedMetricWarning, match="Only one class"):  # the peer: undefined, said so, nan
        assert math.isnan(roc_auc_score([correct] * 3, conf))
    with pytest.warns(ParameterWarning) as caught:
        value = lib.confidence_auroc([correct] * 3, conf)
    assert math.isnan(value)
    (w,) = caught
    assert w.message.parameter == "y_true"
    assert f"all 3 predictions are {'correct' if correct else 'wrong'}" in str(w.message)


def test_confidence_auroc_on_two_classes_is_silent_and_matches_sklearn():
    from sklearn.metrics import roc_auc_score

    y, conf = [1, 0, 1, 0, 1], [0.9, 0.8, 0.7, 0.1, 0.8]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert lib.confidence_auroc(y, conf) == pytest.approx(roc_auc_score(y, conf), abs=1e-15)


@pytest.fixture(scope="module")
def modules():
    evaluate = pytest.importorskip("evaluate")
    return {name: evaluate.load(str(METRICS_DIR / name), keep_in_memory=True)
            for name in ("expected_calibration_error", "confidence_auroc")}


def test_ece_module_refuses_a_fractional_reference_as_the_function_does(modules):
    with pytest.raises(ParameterError, match="got 0.5 at index 0"):  # the function
        lib.expected_calibration_error([0.5, 1], [0.9, 0.8])
    module = modules["expected_calibration_error"]
    with pytest.raises(ParameterError) as err:
        module.compute(predictions=[0.9, 0.8], references=[0.5, 1])
    assert err.value.parameter == "references" and "0.5" in str(err.value) and "index 0" in str(err.value)
    with pytest.raises(ParameterError, match="references"):
        module.add_batch(predictions=[0.9, 0.8], references=[1, 0.25])
    # integral floats stay labels, as in the function
    got = module.compute(predictions=[0.9, 0.8, 0.3], references=[1.0, 0.0, 1.0])["expected_calibration_error"]
    assert got == pytest.approx(lib.expected_calibration_error([1, 0, 1], [0.9, 0.8, 0.3]), abs=1e-15)


def test_ece_module_refuses_a_billion_bins(modules):
    with pytest.raises(ParameterError) as err:
        modules["expected_calibration_error"].compute(predictions=[0.9, 0.8], references=[1, 0], n_bins=10**9)
    assert err.value.parameter == "n_bins" and "1000000000" in str(err.value)


def test_auroc_module_warns_on_one_class(modules):
    with pytest.warns(ParameterWarning, match="all 3 predictions are correct"):
        value = modules["confidence_auroc"].compute(predictions=[0.9, 0.6, 0.7], references=[1, 1, 1])
    assert math.isnan(value["confidence_auroc"])
