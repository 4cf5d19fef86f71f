"""The gateway's Prometheus metrics (prometheus-client), one ``CollectorRegistry`` per app so that two gateways in
one process (tests) keep their own counts. Names, labels and units are listed in docs/gateway.md."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# seconds; from a cached pass-through on loopback to a long generation with its confidence reads
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
CONFIDENCE_BUCKETS = tuple(i / 10 for i in range(1, 11))


class GatewayMetrics:
    """Counters, histograms and gauges of one gateway (docs/gateway.md, "Metrics")."""

    def __init__(self):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("gateway_requests", "Requests answered, by endpoint and HTTP status.",
                                ("endpoint", "status"), registry=r)
        self.latency = Histogram("gateway_request_seconds", "Wall time from request to the last byte sent, by "
                                 "endpoint (seconds).", ("endpoint",), buckets=LATENCY_BUCKETS, registry=r)
        self.confidence_seconds = Histogram("gateway_confidence_seconds", "Wall time of the confidence reads of "
                                            "one answer, by signal (seconds).", ("signal",),
                                            buckets=LATENCY_BUCKETS, registry=r)
        self.upstream_errors = Counter("gateway_upstream_errors", "Upstream failures: unreachable, broken, or an "
                                       "HTTP error status.", ("kind",), registry=r)
        self.confidence = Histogram("gateway_confidence", "Calibrated confidence of each answer, by stream and "
                                    "signal.", ("stream", "signal"), buckets=CONFIDENCE_BUCKETS, registry=r)
        self.answers = Counter("gateway_answers", "Answers given a confidence, by stream and whether the gateway "
                               "advised abstaining.", ("stream", "abstain"), registry=r)
        self.in_flight = Gauge("gateway_in_flight", "Requests being answered now.", registry=r)
        self.calibrator_version = Gauge("gateway_calibrator_info", "The calibrator in use (value 1).",
                                        ("kind", "version"), registry=r)
        self.stream_steps = Counter("gateway_stream_steps", "Records the per-stream worker has stepped, by stream.",
                                    ("stream",), registry=r)
        self.secl_bursts = Gauge("gateway_secl_bursts", "SECL bursts a stream has opened (when SECL runs).",
                                 ("stream",), registry=r)
        self.adapter_version = Gauge("gateway_adapter_version", "The LoRA adapter version a stream is served with "
                                     "(when SECL runs; 0: the base model).", ("stream",), registry=r)
