"""``run_serve``: the calibration gateway on an address (``hf-calibration serve``; ``hf_calibration.gateway``)."""

from __future__ import annotations

import logging
import signal as signals
from dataclasses import dataclass, field

from hf_calibration.errors import ParameterError
from hf_calibration.gateway.config import GatewayConfig
from hf_calibration.jobs.common import JobResult, check_int


@dataclass(kw_only=True)
class ServeConfig(GatewayConfig):
    """Options of ``run_serve`` / ``hf-calibration serve``: the gateway's (``GatewayConfig``) and where it listens."""

    host: str = field(default="127.0.0.1", metadata={
        "help": "Address to listen on (0.0.0.0: every interface, behind your load balancer)."})
    port: int = field(default=8100, metadata={"help": "TCP port to listen on."})
    check_upstream: bool = field(default=True, metadata={
        "help": "At start-up, when the upstream answers: check that it serves --served-model (or --model) with the "
                "tokenizer of --model and returns log-probabilities (an unreachable upstream is only logged: the "
                "gateway answers 503 until it is back)."})

    def __post_init__(self):
        super().__post_init__()
        check_int(self.port, "port")
        if self.port > 65535:
            raise ParameterError("port", self.port, f"must be ≤ 65535, got {self.port}")


def _check_upstream(config: ServeConfig, tokenizer) -> None:
    """The backend's start-up checks against the upstream; ParameterError naming the option at fault, a warning
    when the upstream does not answer."""
    from hf_calibration.modeling.backends import OpenAICompatibleBackend, ServerError

    try:
        OpenAICompatibleBackend(config.upstream, config.served_model or config.model, tokenizer, retries=0,
                                timeout=30.0).close()
    except ServerError as err:
        if "cannot reach" not in str(err):
            raise ParameterError("upstream", config.upstream, err.reason) from None
        logging.getLogger("hf_calibration.gateway").warning("upstream not answering yet: %s", err.reason)
    except ParameterError as err:
        raise ParameterError("upstream" if err.parameter == "base_url" else err.parameter, err.value,
                             err.reason) from None


def run_serve(config: ServeConfig) -> JobResult:
    """Serve the gateway (``gateway.create_app``) with uvicorn on ``config.host:config.port`` until interrupted
    (SIGINT/SIGTERM); SIGHUP reloads ``--calibrator``. Every file and the upstream (when it answers) are checked
    before the port opens: ParameterError naming the option. Returns the streams served and the state folder."""
    import uvicorn

    from hf_calibration.gateway.app import create_app
    from hf_calibration.modeling.backends import load_tokenizer

    tokenizer = load_tokenizer(config.model)
    if config.check_upstream:
        _check_upstream(config, tokenizer)
    app = create_app(config, tokenizer=tokenizer)
    gw = app.state.gateway

    def reload(*_):
        try:
            cal = gw.reload_calibrator()
            logging.getLogger("hf_calibration.gateway").warning("calibrator reloaded: %s", cal.describe())
        except ParameterError as err:
            logging.getLogger("hf_calibration.gateway").error("calibrator not reloaded: %s", err)

    if hasattr(signals, "SIGHUP"):
        signals.signal(signals.SIGHUP, reload)
    uvicorn.run(app, host=config.host, port=config.port, log_level="warning", timeout_graceful_shutdown=30)
    streams = gw.streams.streams()
    paths = {"state_dir": config.state_dir} if config.state_dir else {}
    return JobResult(metrics={"streams": len(streams)}, run={"upstream": config.upstream, "model": config.model},
                     paths=paths, output_dir=config.state_dir,
                     table=f"gateway stopped; {len(streams)} stream(s): {', '.join(streams) or 'none'}")
