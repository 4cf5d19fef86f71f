"""The `evaluate` modules in metrics/<name>/ load offline and agree with the library."""

from pathlib import Path

import pytest

from hf_calibration import metrics as lib
from hf_calibration.errors import ParameterError
from tests.metrics.data import make_binary, make_multiclass

evaluate = pytest.importorskip("evaluate")

METRICS_DIR = Path(__file__).resolve().parents[2] / "metrics"

# folder -> (library function, result key, accepts (n,) confidences)
MODULES = {
    "expected_calibration_error": (lib.expected_calibration_error, "expected_calibration_error", True),
    "classwise_ece": (lib.classwise_ece, "classwise_ece", False),
    "smooth_ece": (lib.smooth_ece, "smooth_ece", True),
    "calibration_brier_score": (lib.brier_score, "brier_score", True),
    "negative_log_likelihood": (lib.negative_log_likelihood, "negative_log_likelihood", True),
    "confidence_auroc": (lib.confidence_auroc, "confidence_auroc", True),
    "aurc": (lib.aurc, "aurc", True),
}


@pytest.fixture(scope="module")
def loaded():
    return {name: evaluate.load(str(METRICS_DIR / name), keep_in_memory=True) for name in MODULES}


def _forms(accepts_conf):
    labels, probs = make_multiclass(300, 4, seed=11)
    forms = [(labels, probs)]
    if accepts_conf:
        forms.append(make_binary(300, seed=12))
    return forms


@pytest.mark.parametrize("name", MODULES)
def test_batches_equal_one_shot_equal_library(loaded, name):
    func, key, accepts_conf = MODULES[name]
    module = loaded[name]
    for references, predictions in _forms(accepts_conf):
        expected = func(references, predictions)
        one_shot = module.compute(predictions=predictions, references=references)[key]
        for start in range(0, len(references), 110):
            module.add_batch(predictions=predictions[start : start + 110], references=references[start : start + 110])
        batched = module.compute()[key]
        assert one_shot == pytest.approx(expected, abs=1e-12)
        assert batched == pytest.approx(expected, abs=1e-12)


def test_options_are_passed_through(loaded):
    labels, probs = make_multiclass(300, 4, seed=13)
    module = loaded["expected_calibration_error"]
    for options in ({"n_bins": 10, "binning": "quantile"}, {"norm": "l2", "debiased": True}, {"norm": "max"}):
        got = module.compute(predictions=probs, references=labels, **options)["expected_calibration_error"]
        assert got == pytest.approx(lib.expected_calibration_error(labels, probs, **options), abs=1e-12)
    module = loaded["classwise_ece"]
    assert module.compute(predictions=probs, references=labels, n_bins=5)["classwise_ece"] == pytest.approx(
        lib.classwise_ece(labels, probs, n_bins=5), abs=1e-12
    )
    module = loaded["smooth_ece"]
    assert module.compute(predictions=probs, references=labels, sigma=0.1)["smooth_ece"] == pytest.approx(
        lib.smooth_ece(labels, probs, sigma=0.1), abs=1e-12
    )


def test_validation_errors_reach_the_user(loaded):
    """The library's errors name the module's arguments: ``predictions`` (the functions' y_prob), ``references``."""
    with pytest.raises(ParameterError, match="^predictions: row 1 sums to 0.5") as err:
        loaded["expected_calibration_error"].compute(predictions=[[0.5, 0.5], [0.25, 0.25]], references=[0, 1])
    assert err.value.parameter == "predictions"
    with pytest.raises(ParameterError, match=r"^predictions: must hold probabilities in \[0, 1\], got 1.5 at "
                                             r"predictions\[1\]$") as err:
        loaded["confidence_auroc"].compute(predictions=[0.5, 1.5], references=[0, 1])
    assert err.value.parameter == "predictions"
    with pytest.raises(ParameterError, match=r"^references: must be 0 or 1 \(correctness\) when predictions holds") as err:
        loaded["calibration_brier_score"].compute(predictions=[0.5, 0.7], references=[0, 2])
    assert err.value.parameter == "references"


def test_every_folder_is_complete():
    for name in MODULES:
        folder = METRICS_DIR / name
        assert {f"{name}.py", "README.md", "requirements.txt", "app.py"} <= {p.name for p in folder.iterdir()}
        card = (folder / "README.md").read_text()
        header = card.split("---")[1]
        for field in ("title:", "sdk: gradio", "app_file: app.py", "- evaluate", "- metric", "description:"):
            assert field in header, (name, field)
        assert "hf-calibration" in (folder / "requirements.txt").read_text().split()
        source = (folder / f"{name}.py").read_text()
        assert "import datasets\nimport evaluate\n" in source
        assert "**kwargs" not in source


@pytest.mark.parametrize("name", MODULES)
def test_empty_ragged_and_mixed_batches_name_the_argument(loaded, name):
    """Before: IndexError (empty), numpy's "inhomogeneous shape" (ragged rows, or add_batch calls with another
    option count)."""
    module = loaded[name]
    with pytest.raises(ValueError, match="^predictions: empty"):
        module.compute(predictions=[], references=[])
    ragged = [[0.2, 0.8], [0.1, 0.2, 0.7]]
    with pytest.raises(ValueError, match=r"^predictions: rows of different lengths \(row 0: 2 options, row 1: 3"):
        module.compute(predictions=ragged, references=[1, 2])
    module.add_batch(predictions=[[0.2, 0.8], [0.6, 0.4]], references=[1, 0])
    module.add_batch(predictions=[[0.1, 0.2, 0.7]], references=[2])
    with pytest.raises(ValueError, match=r"row 0: 2 options, row 2: 3 options"):
        module.compute()
