"""The ``features`` the ``evaluate`` modules in ``metrics/<name>/`` declare (one definition for all seven).

``datasets`` is imported inside the function, so ``hf_calibration.metrics`` itself stays numpy-only.
"""

from hf_calibration.errors import ParameterError, renamed_parameters

#: The library's argument names, as the modules call them (``evaluate``'s names).
MODULE_NAMES = {"y_prob": "predictions", "y_true": "references"}


def calibration_features(forms=("confidence", "probabilities")):
    """``datasets.Features`` for the input forms of a calibration metric.

    "confidence": ``predictions`` float64 of shape (n,) with 0/1 ``references``;
    "probabilities": ``predictions`` of shape (n, K) with integer labels in [0, K).
    Returns one Features for one form, else the list ``evaluate.MetricInfo(features=...)`` accepts.
    """
    import datasets

    values = {
        "confidence": datasets.Value("float64"),
        "probabilities": datasets.Sequence(datasets.Value("float64")),
    }
    unknown = [f for f in forms if f not in values]
    if unknown or not forms:
        raise ParameterError("forms", forms, f"must be a non-empty subset of {sorted(values)}, got {forms!r}")
    features = [datasets.Features({"predictions": values[f], "references": datasets.Value("int64")}) for f in forms]
    return features[0] if len(features) == 1 else features


def module_inputs(predictions, references):
    """``(y_true, y_prob)`` numpy arrays of what an evaluate module's ``_compute`` received, checked first.

    predictions : n confidences, or n rows of K probabilities (every row the same K); references : n labels.
    Raises ParameterError naming ``predictions`` or ``references`` for no input, rows of different lengths (e.g.
    ``add_batch`` calls with another option count) or n that differ; numpy's own messages ("inhomogeneous
    shape", an IndexError) never reach the user.
    """
    import numpy as np

    predictions, references = list(predictions), list(references)
    if not predictions:
        raise ParameterError("predictions", predictions, "empty; pass at least one prediction (add_batch or "
                             "compute(predictions=…))")
    if len(references) != len(predictions):
        raise ParameterError("references", len(references), f"{len(references)} labels for {len(predictions)} "
                             "{predictions}", related=("predictions",))
    def width(p):
        return len(p) if isinstance(p, (list, tuple, np.ndarray)) else None

    first = next((i for i, p in enumerate(predictions) if width(p) != width(predictions[0])), None)
    if first is not None:
        shown = [("a number" if width(p) is None else f"{width(p)} options") for p in (predictions[0], predictions[first])]
        raise ParameterError("predictions", predictions[first], f"rows of different lengths (row 0: {shown[0]}, row "
                             f"{first}: {shown[1]}); one option count per call, also across add_batch calls")
    return np.asarray(references), np.asarray(predictions, dtype=np.float64)


class CheckedInputs:
    """Mixin before ``evaluate.Metric`` in the modules' classes: ``compute`` or ``add_batch`` given an empty
    ``predictions`` raises a ParameterError naming it (evaluate itself would fail with an IndexError while
    inferring the features); ``_compute`` then checks the rest with ``module_inputs``, and the library's errors
    and warnings about ``y_prob`` / ``y_true`` name ``predictions`` / ``references`` (``MODULE_NAMES``)."""

    def compute(self, *, predictions=None, references=None, **kwargs):
        """The metric of the predictions given here or added by ``add_batch`` (evaluate.Metric.compute)."""
        _not_empty(predictions)
        _integer_labels(references)
        with renamed_parameters(**MODULE_NAMES):
            return super().compute(predictions=predictions, references=references, **kwargs)

    def add_batch(self, *, predictions=None, references=None, **kwargs):
        """Add a batch of predictions and references (evaluate.Metric.add_batch)."""
        _not_empty(predictions)
        _integer_labels(references)
        return super().add_batch(predictions=predictions, references=references, **kwargs)


def _not_empty(predictions) -> None:
    if predictions is not None and len(predictions) == 0:
        raise ParameterError("predictions", predictions, "empty; pass at least one prediction")


def _integer_labels(references) -> None:
    """ParameterError naming ``references`` for a label that is not an integer, before evaluate's int64 feature
    would cast it (0.5 → 0): the library functions refuse it too (``check_labels``)."""
    for i, label in enumerate(references if references is not None else ()):
        integral = isinstance(label, (int, bool)) or (hasattr(label, "is_integer") and label.is_integer())
        if not integral and not (hasattr(label, "dtype") and label.dtype.kind in "biu"):
            raise ParameterError("references", label, f"must hold integer labels (0/1 correctness, or class "
                                 f"indices for probability vectors), got {label!r} at index {i}")
