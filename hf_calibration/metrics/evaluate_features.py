"""The ``features`` the ``evaluate`` modules in ``metrics/<name>/`` declare (one definition for all seven).

``datasets`` is imported inside the function, so ``hf_calibration.metrics`` itself stays numpy-only.
"""


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
        raise ValueError(f"forms: must be a non-empty subset of {sorted(values)}, got {forms!r}")
    features = [datasets.Features({"predictions": values[f], "references": datasets.Value("int64")}) for f in forms]
    return features[0] if len(features) == 1 else features
