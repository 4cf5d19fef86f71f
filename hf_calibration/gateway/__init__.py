"""The calibration gateway: an OpenAI-compatible HTTP server in front of a model server (vLLM) that adds a
calibrated confidence to every answer (docs/gateway.md; ``hf-calibration serve``).

- ``create_app(GatewayConfig)``: the ASGI app (FastAPI);
- ``GatewayConfig``: its options;
- ``learn_then_test``: the abstention threshold with a risk guarantee (``gateway.abstain``);
- ``StreamStore`` / ``StreamStepper``: per-stream state, records and the background step (``gateway.streams``).
"""

_LAZY = {
    "create_app": "hf_calibration.gateway.app",
    "GatewayConfig": "hf_calibration.gateway.config",
    "learn_then_test": "hf_calibration.gateway.abstain",
    "StreamStore": "hf_calibration.gateway.streams",
    "StreamStepper": "hf_calibration.gateway.streams",
}


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = globals()[name] = getattr(importlib.import_module(_LAZY[name]), name)
    return value


__all__ = sorted(_LAZY)
