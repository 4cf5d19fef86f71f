"""``run_secl_service``: a multi-domain question stream through SECL beside an OpenAI-compatible server (vLLM),
the adapter trained locally and hot-swapped into the server (``hf-calibration secl-serve``; ``secl.service``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from hf_calibration.errors import ParameterError
from hf_calibration.jobs.common import (OVERFLOW_POLICIES, JobResult, balance_gold_field, check_choice, check_device,
                                        check_int, check_output_dir, check_path, device_field, model_field,
                                        on_overflow_field, output_dir_field, seed_field, served_model_field)
from hf_calibration.reporting.reports import write_json
from hf_calibration.secl.config import SECLConfig
from hf_calibration.secl.service import SWAP_MODES


@dataclass(kw_only=True)
class SECLServiceConfig:
    """Options of ``run_secl_service`` / ``hf-calibration secl-serve`` besides SECL's own (``SECLConfig``). Checked at
    construction: ParameterError (a ValueError) naming the field and the value."""

    output_dir: str = output_dir_field(
        "The service's state folder: each stream's adapter versions and stream.json (created; a run on a folder with "
        "state resumes every stream where it stopped).")
    base_url: str = field(metadata={
        "help": "URL of the vLLM (OpenAI-compatible) server, e.g. http://127.0.0.1:8000/v1, started with "
                "--enable-lora --max-lora-rank R and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True (docs/serving.md)."})
    served_model: str | None = served_model_field()
    model: str = model_field()
    stream: str = field(default="mmlu:stem,mmlu:humanities", metadata={
        "help": "Comma-separated MCQA domains in stream order (as `secl --stream`; a served burst reads P(True) of "
                "the options; another domain is refused before any model loads)."})
    limit_per_domain: int = field(default=20, metadata={"help": "Questions per domain."})
    stream_per_domain: bool = field(default=False, metadata={
        "help": "One SECL stream (its own adapter, gate and records) per domain, questions interleaved round-robin; "
                "default: one stream named 'default' over the whole stream in order."})
    max_new_tokens: int = field(default=8, metadata={"help": "Answer length (8: a letter)."})
    balance_gold: bool = balance_gold_field()
    on_overflow: str = on_overflow_field()
    burst_at_start: bool = field(default=False, metadata={
        "help": "Open a burst at the first question of each stream (the entropy gate cannot fire during its warm-up)."})
    swap: str = field(default="update", metadata={
        "help": "When the trained adapter replaces the served one: after every accepted 'update', or at the end of "
                "each 'burst' with updates.", "choices": list(SWAP_MODES)})
    seed: int = seed_field()
    device: str = device_field()

    def __post_init__(self):
        from hf_calibration.data import MCQA_DATASETS
        from hf_calibration.modeling.backends import check_backend_options
        from hf_calibration.modeling.streams import parse_stream

        check_path(self.output_dir, "output_dir")
        check_backend_options("openai", self.base_url, self.served_model)
        open_ended = [name for name, _ in parse_stream(self.stream) if name not in MCQA_DATASETS]
        if open_ended:  # refused here, before any server is asked or model loaded
            raise ParameterError("stream", self.stream, f"the served SECL stream takes MCQA domains only, got "
                                 f"{open_ended[0]!r} (a burst reads P(True) of the options; open-ended alternatives "
                                 f"need a beam search); MCQA domains: {', '.join(MCQA_DATASETS)}")
        for name in ("limit_per_domain", "max_new_tokens"):
            check_int(getattr(self, name), name)
        check_choice(self.swap, "swap", SWAP_MODES)
        check_choice(self.on_overflow, "on_overflow", OVERFLOW_POLICIES)
        if not isinstance(self.balance_gold, bool):
            raise ParameterError("balance_gold", self.balance_gold, f"must be true or false, got {self.balance_gold!r}")
        check_int(self.seed, "seed", minimum=0)
        self.device = check_device(self.device)


@dataclass(kw_only=True)
class SECLServiceResult(JobResult):
    """``JobResult`` plus each stream's ``records`` (the whole stream's, resumed ones included) and ``counters``."""

    records: dict
    counters: dict


def _plan(config: SECLServiceConfig, items) -> list[tuple[str, object]]:
    """(stream name, item) in the order the service answers them."""
    if not config.stream_per_domain:
        return [("default", item) for item in items]
    by_domain: dict[str, list] = {}
    for item in items:
        by_domain.setdefault(item.domain.replace(":", "-").replace("+", "_"), []).append(item)
    queues = list(by_domain.items())
    out, i = [], 0
    while any(q for _, q in queues):
        name, queue = queues[i % len(queues)]
        if queue:
            out.append((name, queue.pop(0)))
        i += 1
    return out


def served_stream(config: SECLServiceConfig, trainer, tokenizer, server_context: int | None) -> list:
    """The stream's questions (``modeling.streams.build_stream`` items) as the in-process stream job builds them
    (``jobs.secl_stream.stream_context``: the same questions, gold letters, ids and cuts), fitted to the smaller of
    the model's context and the server's (``server_context`` tokens; None: the model's). The stream's domains are
    MCQA (``SECLServiceConfig`` refuses others at construction). ParameterError naming ``on_overflow`` under "error"
    for a question that does not fit."""
    from hf_calibration.jobs.secl_stream import stream_context
    from hf_calibration.modeling.streams import build_stream

    context = stream_context(trainer, tokenizer, trainer.secl_config, max_new_tokens=config.max_new_tokens,
                             on_overflow=config.on_overflow)
    if server_context is not None:
        context["context"] = min(c for c in (context["context"], server_context) if c is not None)
    return build_stream(tokenizer, config.stream, limit_per_domain=config.limit_per_domain, seed=config.seed,
                        balance_gold=config.balance_gold, prompt_format=trainer.secl_config.prompt_format, **context)


def run_secl_service(config: SECLServiceConfig, secl_config: SECLConfig | None = None, *,
                     progress: bool = True) -> SECLServiceResult:
    """SECL over ``config.stream`` beside the server at ``config.base_url`` (``secl.service.SECLService``).

    A stream whose state is in ``output_dir`` resumes after its last saved question. Writes ``output_dir``/
    ``<stream>/v<N>`` (adapter versions), ``<stream>/stream.json`` and ``service.json`` (run, counters).
    Raises ParameterError naming the option (server checks, LoRA refusals, non-MCQA domains) before any
    question where it can; a server that stops answering mid-run ends the run with every finished question saved.
    """
    from tqdm.auto import tqdm

    from hf_calibration import modeling
    from hf_calibration.modeling.backends import ServerError, open_server_backend
    from hf_calibration.secl.mixin import apply_secl
    from hf_calibration.secl.service import SECLService

    secl_config = secl_config or SECLConfig()
    out = check_output_dir(config.output_dir)
    start = time.perf_counter()
    tokenizer, backend = open_server_backend(config.model, config.base_url, config.served_model)
    backend.require_runtime_lora("secl-serve (SECL hot-swaps each stream's adapter)")
    model, _ = modeling.load_model(config.model, device=config.device)
    trainer = apply_secl(model, tokenizer, secl_config)
    items = served_stream(config, trainer, tokenizer, backend.max_context)
    service = SECLService(backend, trainer, out, swap=config.swap, max_new_tokens=config.max_new_tokens)
    plan = _plan(config, items)
    done = {name: len(service.open_stream(name).records) for name in dict(plan)}
    seen: dict[str, int] = {}
    stopped = None
    try:
        for name, item in tqdm(plan, desc="SECL service", disable=not progress, unit="q"):
            seen[name] = seen.get(name, 0) + 1
            if seen[name] <= done[name]:
                continue  # answered before a restart
            if seen[name] == 1 and config.burst_at_start:
                service.start_burst(name)
            service.step(name, item.prompt_ids, choices=item.choices)
        service.close()
    except ServerError as err:
        stopped = str(err)  # the saved state is the last finished question's: a rerun resumes there
    finally:
        backend.close()
    counters = {name: dict(s.counters) for name, s in service.streams.items()}
    run = {"model": config.model, "base_url": config.base_url, "served_model": config.served_model or config.model,
           "stream": config.stream, "limit_per_domain": config.limit_per_domain, "balance_gold": config.balance_gold,
           "on_overflow": config.on_overflow, "seed": config.seed, "swap": config.swap,
           "adapter_scope": secl_config.adapter_scope, "resumed": done, "stopped": stopped,
           "seconds": round(time.perf_counter() - start, 1)}
    out.mkdir(parents=True, exist_ok=True)
    versions = {name: s.served_name for name, s in service.streams.items()}
    write_json(out / "service.json", {"run": run, "counters": counters, "served_adapters": versions})
    table = "\n".join(f"{name}: {c['questions']} questions, {c['bursts']} bursts, {c['updates']} updates, "
                      f"served as {versions[name] or 'the base model'}" for name, c in counters.items())
    if stopped:
        table += f"\nstopped: {stopped} (rerun the same command to resume)"
    records = {name: [r.to_dict() for r in s.records] for name, s in service.streams.items()}
    return SECLServiceResult(metrics={"counters": counters}, run=run, paths={"service": out / "service.json"},
                             output_dir=out, table=table, records=records, counters=counters)
