"""The stream's evaluation passes (``evaluation.stream``) resume from a resume point and a per-question callback alone
(``start`` / ``on_record``), with no checkpoint file: a pass stopped after k questions and resumed from what its
callback was given there gives the records of a pass that never stopped.

Exact equality: without a replay buffer the resumed SECL pass runs the same kernels on the same shapes and values as
the unstopped one, from an exact copy of its state (adapter weights, AdamW's moments, gate, open burst, counters),
in one process (tests/conftest.py's tolerance policy).
"""

import copy

import pytest
import torch

from hf_calibration.evaluation.stream import SECLResume, baseline_pass, final_adapter_pass, secl_pass

# a burst over the first four questions: a pass resumed at question 2 must get back the open burst, the adapter and
# AdamW's state of the two updates before it
SECL_OPTIONS = {"burst_size": 4, "bin_gate_width": 0, "learning_rate": 0.1}
RESUME_AT = 2


@pytest.fixture(scope="module")
def stream(tiny_model_dir):
    from hf_calibration.modeling import load_model
    from hf_calibration.modeling.streams import build_stream
    from hf_calibration.secl import SECLConfig, apply_secl

    model, tokenizer = load_model(str(tiny_model_dir))
    torch.manual_seed(0)
    model = apply_secl(model, tokenizer, SECLConfig(**SECL_OPTIONS))
    items = build_stream(tokenizer, "mmlu:stem,halueval_qa_lm", limit_per_domain=3, seed=0)
    return model, items


@pytest.fixture(scope="module")
def whole(stream):
    """An unstopped run of the three passes, with what each callback was given and the SECL state after each
    question (``secl_snapshot``, deep-copied: AdamW's state tensors change in place on the next step)."""
    model, items = stream
    seen = {"baseline": [], "secl": [], "snapshots": [], "final": []}
    records = baseline_pass(model, items, progress=False,  # a record is copied: the SECL pass adds to it later
                            on_record=lambda i, r: seen["baseline"].append((i, copy.deepcopy(r))))
    baseline = copy.deepcopy(records)

    def keep(i, done):
        seen["secl"].append((i, copy.deepcopy(done)))
        seen["snapshots"].append(copy.deepcopy(model.secl_snapshot()))

    counters = secl_pass(model, items, records, burst_at_start=True, progress=False, on_record=keep)
    final_adapter_pass(model, items, records, progress=False, on_record=lambda i, c: seen["final"].append((i, c)))
    return {"records": records, "baseline": baseline, "counters": counters, "seen": seen,
            "adapter": {k: v.clone() for k, v in model.secl_adapter_state().items()}}


def _without_seconds(records) -> str:
    """The records without their timings, as text: equal text is equal values, NaN (an unparsed read) included."""
    return repr([{k: v for k, v in r.items() if "seconds" not in k} for r in records])


def test_the_callbacks_get_every_question_once_in_order(stream, whole):
    n = len(stream[1])
    seen = whole["seen"]
    assert [i for i, _ in seen["baseline"]] == [i for i, _ in seen["secl"]] == [i for i, _ in seen["final"]] == \
        list(range(n))
    assert [r for _, r in seen["baseline"]] == whole["baseline"]
    assert [c for _, c in seen["final"]] == [r["secl_final"] for r in whole["records"]]
    assert sum(done["fields"]["updated"] for _, done in seen["secl"][:4]) >= 2  # the burst trained the adapter


def test_a_resumed_baseline_pass_equals_an_unstopped_one(stream, whole):
    model, items = stream
    calls = []
    records = baseline_pass(model, items, progress=False, start=whole["baseline"][:RESUME_AT],
                            on_record=lambda i, r: calls.append(i))
    assert calls == list(range(RESUME_AT, len(items)))  # the started ones are not run again
    assert _without_seconds(records) == _without_seconds(whole["baseline"])
    with pytest.raises(ValueError, match="^start: covers 7 items, more than the 6"):
        baseline_pass(model, items, progress=False, start=whole["baseline"] + whole["baseline"][:1])


def test_a_resumed_secl_pass_equals_an_unstopped_one(stream, whole):
    """Resumed mid-burst from what ``on_record`` was given at question RESUME_AT - 1 (its ``done`` so far and the
    model's snapshot there): the same records, counters and final adapter; the final-adapter reads resumed from
    their first reads give the same reads."""
    model, items = stream
    seen = whole["seen"]
    start = SECLResume(done=[done for _, done in seen["secl"][:RESUME_AT]], snapshot=seen["snapshots"][RESUME_AT - 1])
    records, calls = copy.deepcopy(whole["baseline"]), []
    counters = secl_pass(model, items, records, burst_at_start=True, progress=False, start=start,
                         on_record=lambda i, done: calls.append(i))
    assert calls == list(range(RESUME_AT, len(items)))
    assert counters == whole["counters"]
    adapter = model.secl_adapter_state()
    assert all(torch.equal(adapter[k], whole["adapter"][k]) for k in whole["adapter"])
    reads = [c for _, c in seen["final"]]
    final_adapter_pass(model, items, records, progress=False, start=reads[:RESUME_AT],
                       on_record=lambda i, c: calls.append(i))
    assert calls[-(len(items) - RESUME_AT):] == list(range(RESUME_AT, len(items)))
    assert _without_seconds(records) == _without_seconds(whole["records"])


def test_a_secl_pass_resumed_from_another_questions_state_differs(stream, whole):
    """The resume point's snapshot is what the resumed questions are computed from (so the test above can fail): the
    same ``done`` with the state of one question earlier gives other records."""
    model, items = stream
    seen = whole["seen"]
    start = SECLResume(done=[done for _, done in seen["secl"][:RESUME_AT]], snapshot=seen["snapshots"][RESUME_AT - 2])
    records = copy.deepcopy(whole["baseline"])
    secl_pass(model, items, records, burst_at_start=True, progress=False, start=start)
    assert [r["secl"] for r in records[RESUME_AT:]] != [r["secl"] for r in whole["records"][RESUME_AT:]]
