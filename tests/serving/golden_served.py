"""The golden SECL run through the vLLM server (issue 48, item 6): ``tests/secl/golden.py``'s stream, settings and
seed, through ``SECLService`` (answers, gate entropy, verbalized and P(True) reads served; the update steps on the
local trainer; each new adapter version loaded into the server) in the default "confidence" scope, whose records a
refactor of SECL or of the served read path must reproduce. ``tests/serving/test_golden_served.py`` compares.

    python -m tests.serving.golden_served --url http://127.0.0.1:PORT/v1

writes the fixture ``golden_served.json`` from a server started as ``tests/conftest.py``'s ``vllm_server`` starts it
(run it only when SECL's served behaviour is meant to change, and say why in the commit). The fixture in the
repository was recorded on the commit before the one-read-path redesign (3e32563).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.secl.golden import EXACT, FLOATS, MAX_NEW, MODEL, PER_DOMAIN, SETTINGS, STREAM

FIXTURE = Path(__file__).with_name("golden_served.json")
SERVED = ("adapter",)  # the served adapter name each read was made with (None: the base model)


def _record(r) -> dict:
    r = r.to_dict() if hasattr(r, "to_dict") else dict(r)
    return {k: r.get(k) for k in EXACT + FLOATS + SERVED}


def adapter_version(name):
    """The served adapter's version ("<stream>-v3" → "v3"; None for the base model): the stream's name differs
    between runs on one server, whose adapter names must not clash."""
    return None if name is None else "v" + name.rsplit("-v", 1)[1]


def run_golden_served(backend, state_dir, name: str = "golden") -> dict:
    """The served golden run's records: {"stream": [...], "final": [confidence per question], "counters"}, the stream
    called ``name`` (its adapters are served as "<name>-v<k>")."""
    import torch

    from hf_calibration.modeling import load_model
    from hf_calibration.modeling.streams import build_stream
    from hf_calibration.secl import SECLConfig, apply_secl
    from hf_calibration.secl.service import SECLService

    model, tokenizer = load_model(MODEL)
    torch.manual_seed(0)  # LoRA A, as the in-process golden run
    trainer = apply_secl(model, tokenizer, SECLConfig(**SETTINGS))
    items = build_stream(tokenizer, STREAM, limit_per_domain=PER_DOMAIN, seed=0)
    service = SECLService(backend, trainer, state_dir, max_new_tokens=MAX_NEW)
    service.start_burst(name)
    stream = [{"domain": item.domain, **_record(service.step(name, item.prompt_ids, choices=item.choices))}
              for item in items]
    final = [_record(service.step(name, item.prompt_ids, choices=item.choices, update=False))["confidence"]
             for item in items]
    counters = dict(service.streams[name].counters)
    return {"stream": stream, "final": final, "counters": counters}


if __name__ == "__main__":
    import argparse
    import os
    import tempfile

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="…/v1 of a vLLM server serving the packaged SmolLM2")
    args = parser.parse_args()
    from hf_calibration.modeling import load_model
    from hf_calibration.modeling.backends import OpenAICompatibleBackend

    _, tok = load_model(MODEL)
    backend = OpenAICompatibleBackend(args.url, MODEL, tok, max_in_flight=4)
    with tempfile.TemporaryDirectory() as state:
        FIXTURE.write_text(json.dumps(run_golden_served(backend, state), indent=1) + "\n", encoding="utf-8")
