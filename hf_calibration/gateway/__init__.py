"""The calibration gateway: an OpenAI-compatible HTTP server in front of a model server (vLLM) that adds a
calibrated confidence to every answer (docs/gateway.md; ``hf-calibration serve``).

- ``create_app(GatewayConfig)``: the ASGI app (FastAPI);
- ``GatewayConfig``: its options;
- ``learn_then_test``: the abstention threshold with a risk guarantee (``gateway.abstain``);
- ``StreamStore`` / ``StreamStepper``: per-stream state, records and the background step (``gateway.streams``).
"""

from hf_calibration.runtime.lazy import lazy_exports

_LAZY = {
    "create_app": "hf_calibration.gateway.app",
    "GatewayConfig": "hf_calibration.gateway.config",
    "learn_then_test": "hf_calibration.gateway.abstain",
    "StreamStore": "hf_calibration.gateway.streams",
    "StreamStepper": "hf_calibration.gateway.streams",
}

__getattr__, __all__ = lazy_exports(__name__, _LAZY)
