"""``run_serve``: the calibration gateway on an address (``hf-calibration serve``; ``hf_calibration.gateway``)."""

from __future__ import annotations

import logging
import signal as signals
from dataclasses import dataclass, field

from hf_calibration.errors import ParameterError
from hf_calibration.gateway.config import GatewayConfig
from hf_calibration.jobs.common import JobResult, check_int, check_output_dir


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

    secl: bool = field(default=False, metadata={
        "help": "Run SECL live per stream (docs/gateway.md, 'Streams'): a local copy of --model trains each stream's "
                "LoRA adapter in bursts in the background, the upstream (vLLM started with --enable-lora and "
                "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True) serves its versions, and the secl signal reads through "
                "them. SECL's options are SECLConfig's defaults. Needs --state-dir."})
    secl_burst_at_start: bool = field(default=False, metadata={
        "help": "With --secl: open a burst at each new stream's first question (the entropy gate cannot fire "
                "during its warm-up)."})

    def __post_init__(self):
        super().__post_init__()
        if self.secl and self.state_dir is None:
            raise ParameterError("secl", self.secl, "needs {state_dir}: the streams' adapters are saved there",
                                 related=("state_dir",))
        if self.secl_burst_at_start and not self.secl:
            raise ParameterError("secl_burst_at_start", True, "applies with {secl} only", related=("secl",))
        if self.state_dir is not None:
            check_output_dir(self.state_dir, "state_dir")
        check_int(self.port, "port")
        if self.port > 65535:
            raise ParameterError("port", self.port, f"must be ≤ 65535, got {self.port}")


def _check_listen(host: str, port: int) -> None:
    """``host:port`` can be listened on (resolved and bound once, as uvicorn will): else ParameterError naming
    ``host`` or ``port``, in one line, before the tokenizer and the upstream checks."""
    import socket

    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError) as err:
        raise ParameterError("host", host, f"cannot be resolved, got {host!r} ({err})") from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as err:
            raise ParameterError("port", port, f"cannot listen on {host}:{port}: {err.strerror}") from None


def _check_upstream(config: ServeConfig, tokenizer) -> None:
    """The backend's start-up checks against the upstream; ParameterError naming the option at fault, a warning
    when the upstream does not answer."""
    from hf_calibration.modeling.backends import OpenAICompatibleBackend, ServerError, ServerUnreachable

    try:
        OpenAICompatibleBackend(config.upstream, config.served_model or config.model, tokenizer, retries=0,
                                timeout=30.0).close()
    except ServerUnreachable as err:
        logging.getLogger("hf_calibration.gateway").warning("upstream not answering yet: %s", err.reason)
    except ServerError as err:
        raise ParameterError("upstream", config.upstream, err.reason) from None
    except ParameterError as err:
        raise ParameterError("upstream" if err.parameter == "base_url" else err.parameter, err.value,
                             err.reason) from None


def _secl_stepper(config: ServeConfig, tokenizer):
    """The SECL stepper (``gateway.secl_stepper``): a ``SECLService`` on the upstream with a local trainer copy of
    the model, its state in ``<state_dir>/.secl`` (a name no stream key can take)."""
    from pathlib import Path

    from hf_calibration import modeling
    from hf_calibration.gateway.secl_stepper import SECLStepper
    from hf_calibration.modeling.backends import OpenAICompatibleBackend
    from hf_calibration.secl.config import SECLConfig
    from hf_calibration.secl.mixin import apply_secl
    from hf_calibration.secl.service import SECLService

    backend = OpenAICompatibleBackend(config.upstream, config.served_model or config.model, tokenizer)
    model, _ = modeling.load_model(config.model)
    service = SECLService(backend, apply_secl(model, tokenizer, SECLConfig()), Path(config.state_dir) / ".secl")
    return SECLStepper(service, burst_at_start=config.secl_burst_at_start)


def run_serve(config: ServeConfig) -> JobResult:
    """Serve the gateway (``gateway.create_app``) with uvicorn on ``config.host:config.port`` until interrupted
    (SIGINT/SIGTERM); SIGHUP reloads ``--calibrator``. Every file and the upstream (when it answers) are checked
    before the port opens: ParameterError naming the option. Returns the streams served and the state folder."""
    import uvicorn

    from hf_calibration.gateway.app import create_app
    from hf_calibration.modeling.backends import load_tokenizer

    _check_listen(config.host, config.port)
    tokenizer = load_tokenizer(config.model)
    if config.check_upstream:
        _check_upstream(config, tokenizer)
    app = create_app(config, tokenizer=tokenizer, stepper=_secl_stepper(config, tokenizer) if config.secl else None)
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
