"""The golden SECL run (issue 48, item 6): a fixed stream through SmolLM2 with SECL, in process, whose records a
refactor of SECL must reproduce. ``python -m tests.secl.golden`` writes the fixture ``golden_inprocess.json``
(run it only when SECL's behaviour is meant to change, and say why in the commit).

The stream: the packaged MMLU's STEM then humanities questions, 6 each (``build_stream``, seed 0), a burst opened
at the first question and lasting 8 questions (the entropy gate cannot fire during its warm-up), bin-gate width
0 and a learning rate that moves the confidence visibly, the burst's questions replayed (replay_size) and
consolidated when the burst ends, so the update, replay and consolidation paths all run. Then every question is
read once more, without update, with the adapter the stream ended with.
"""

from __future__ import annotations

import json
from pathlib import Path

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
STREAM = "mmlu:stem,mmlu:humanities"
PER_DOMAIN = 6
MAX_NEW = 4
SETTINGS = dict(burst_size=8, bin_gate_width=0, learning_rate=1e-2, replay_size=50, replay_batch_size=2,
                consolidation_epochs=1, consolidation_batch_size=4)
FIXTURE = Path(__file__).with_name("golden_inprocess.json")
# the record fields compared exactly (answers, gate and burst decisions, pseudo-label decisions) and within the
# derived tolerance (float reads: test_golden.py)
EXACT = ("answer_ids", "alarm", "in_burst", "skipped_by_bin_gate", "updated", "n_distractors", "forward_passes")
FLOATS = ("confidence", "verbalized", "p_true", "norm_p_true", "target", "confidence_after", "entropy")


def _record(r) -> dict:
    r = r.to_dict() if hasattr(r, "to_dict") else dict(r)
    return {k: r[k] for k in EXACT[1:] + FLOATS}


def run_golden() -> dict:
    """The golden run's records: {"stream": [one per question], "final": [confidence per question], "counters"}."""
    import torch

    from hf_calibration.modeling import load_model
    from hf_calibration.modeling.streams import build_stream
    from hf_calibration.secl import SECLConfig, apply_secl

    model, tokenizer = load_model(MODEL)  # its own copy: apply_secl changes the model in place
    torch.manual_seed(0)  # LoRA A
    secl = apply_secl(model, tokenizer, SECLConfig(**SETTINGS))
    items = build_stream(tokenizer, STREAM, limit_per_domain=PER_DOMAIN, seed=0)
    stop = secl.secl_stop_ids()

    def run(item, update):
        ids = torch.tensor([item.prompt_ids])
        out = secl.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW, do_sample=False,
                            return_dict_in_generate=True, secl_choices=[item.choices], secl_update=update,
                            pad_token_id=tokenizer.pad_token_id)
        answer = out.sequences[0, len(item.prompt_ids):].tolist()
        answer = answer[: next((j for j, t in enumerate(answer) if t in stop), len(answer))]
        rec = _record(secl.secl_records[0])
        assert abs(float(out.confidences[0]) - rec["confidence"]) < 1e-6
        return {"domain": item.domain, "answer_ids": answer, **rec}

    secl.start_burst()
    stream = [run(item, True) for item in items]
    final = [run(item, False)["confidence"] for item in items]
    return {"stream": stream, "final": final, "counters": dict(secl.secl_counters)}


if __name__ == "__main__":
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    FIXTURE.write_text(json.dumps(run_golden(), indent=1) + "\n", encoding="utf-8")
