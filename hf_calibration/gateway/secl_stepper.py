"""SECL live per stream in the gateway: a ``StreamStepper`` over ``secl.service.SECLService`` (docs/gateway.md,
"Streams"; docs/serving.md, "SECL beside the server").

The gateway's worker thread calls ``step(state, record)`` with each answered request of a stream (its prompt ids
and options ride in the record: ``needs_prompt``); the step is ``SECLService.step`` on that stream: the entropy gate,
a burst when it fires (P(True) of the options, the LoRA update in the local trainer copy of the model) and, when
the adapter changed, a new version saved, loaded into the upstream (vLLM's runtime LoRA loading) and named by the
stream from then on. The service keeps its own per-stream state (``<state_dir>/<stream>/stream.json`` and the
version folders) and resumes it; the gateway's ``state.json`` keeps this stepper's summary: the served adapter
name, its version, bursts and questions. A request of the stream asking for the ``secl`` signal reads the
verbalized confidence through the stream's served adapter (the base model before the first version).
"""

from __future__ import annotations

from hf_calibration.errors import ParameterError


def _counters(stream) -> dict:
    counters = stream.counters
    return dict(counters() if callable(counters) else counters)


class SECLStepper:
    """``StreamStepper`` of SECL: ``service`` is a ``SECLService`` (its backend on the gateway's upstream, its
    trainer a ``SECLModel`` of the same model). ``burst_at_start``: open a burst at each new stream's first
    question (the entropy gate cannot fire during its warm-up)."""

    name = "secl"
    needs_prompt = True

    def __init__(self, service, *, burst_at_start: bool = False):
        self.service, self.burst_at_start = service, burst_at_start

    def initial_state(self, key: str) -> dict:
        return {"served_name": None, "version": 0, "bursts": 0, "questions": 0}

    def step(self, state: dict, record: dict) -> tuple[dict, dict]:
        key, prompt = record.get("stream"), record.get("prompt_ids")
        if not key or not prompt:
            raise ParameterError("record", sorted(record), "a SECL step needs the record's stream and prompt_ids")
        fresh = key not in self.service.streams
        stream = self.service.open_stream(key)
        if fresh and self.burst_at_start and stream.version == 0 and not _counters(stream).get("questions"):
            self.service.start_burst(key)
        options = record.get("options")
        mc = record.get("multiple_choice")
        self.service.step(key, prompt, choices=options if mc else None,
                          distractors=None if mc or not options else [o for o in options if o != record.get("answer")])
        counters = _counters(stream)
        new = {"served_name": stream.served_name, "version": int(stream.version),
               "bursts": int(counters.get("bursts", 0)), "questions": int(counters.get("questions", 0))}
        events = {"adapter_version": new["version"]}
        if new["bursts"] > state.get("bursts", 0):
            events["burst"] = True
        return new, events

    def reload_adapter(self, served_name: str) -> bool:
        """Have the upstream load again the stream adapter served as ``served_name`` (it answered that it does not
        serve it: restarted under the running gateway); ``SECLService.reload_adapter``."""
        return self.service.reload_adapter(served_name)

    def close(self) -> None:
        self.service.close()
