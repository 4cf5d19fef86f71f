"""``run_secl_stream`` with both adapter scopes (issue 16 item 1): the default pass keeps the base model's answers,
the comparison pass ("all", the paper's variant) is reported beside it, each with its own counters."""

import json

import numpy as np
import pytest

from hf_calibration.jobs import SECLStreamConfig, run_secl_stream
from hf_calibration.secl import SECLConfig


def test_run_secl_stream_compares_the_adapter_scopes(tiny_model_dir, tmp_path):
    config = SECLStreamConfig(model=str(tiny_model_dir), stream="mmlu:stem,gsm8k", limit_per_domain=2,
                              burst_at_start=True, compare_adapter_scopes=True, n_resamples=20,
                              output_dir=str(tmp_path / "s"))
    result = run_secl_stream(config, SECLConfig(burst_size=4, bin_gate_width=0, learning_rate=0.1), progress=False)
    run, records, summary = result.run, result.records, result.metrics["summary"]
    assert run["adapter_scope"] == run["config"]["adapter_scope"] == "confidence"
    assert run["compared"]["adapter_scope"] == "all" and run["compared"]["key"] == "secl_all"
    # each pass counts its own 4 questions, all in the burst opened at the start
    for counters in (result.counters, run["compared"]["counters"]):
        assert counters["questions"] == counters["burst_questions"] == 4
    assert result.counters == run["counters"]
    for r in records:
        assert 0 <= r["secl"] <= 1 and 0 <= r["secl_all"] <= 1
        assert r["burst"] and r["secl_all_burst"] and r["passes"]["secl"] >= 1 and r["passes"]["secl_all"] >= 1
        # the default scope answers as the base model did in the baseline pass, update or not
        assert r["secl_answer"] == r["answer"] and r["secl_correct"] == r["correct"]
        # P(True) of the answer and its distractors are kept: P(True)Norm is their softmax at τ_n (hand form)
        options = np.array(r["p_true_options"])
        assert len(options) == 1 + r["n_distractors"] and options[0] == r["p_true"]
        weights = np.exp(options / SECLConfig().tau_n)
        assert r["norm_p_true"] == pytest.approx(weights[0] / weights.sum(), abs=1e-9)
    overall = summary["overall"]
    assert {"secl", "secl_all"} <= set(overall["signals"]) and overall["accuracy_change_secl"] == 0.0
    assert overall["secl_all"]["share_in_burst"] == overall["share_in_burst"] == 1.0
    assert "SECL (scope all)" in result.table and "adapter scope confidence" in result.table
    # the saved adapter is the configured scope's, and says so
    saved = json.loads((result.paths["secl_adapter"] / "secl_config.json").read_text())
    assert saved["adapter_scope"] == "confidence"
    on_disk = [json.loads(line) for line in result.paths["records.jsonl"].read_text().splitlines()]
    assert on_disk[0]["secl_all_answer"] == records[0]["secl_all_answer"]


def test_run_secl_stream_records_the_scope(tiny_model_dir, tmp_path):
    config = SECLStreamConfig(model=str(tiny_model_dir), stream="gsm8k", limit_per_domain=2, n_resamples=20,
                              output_dir=str(tmp_path / "s"))
    result = run_secl_stream(config, SECLConfig(adapter_scope="all"), progress=False)
    assert result.run["adapter_scope"] == "all" and result.run["compared"] is None
    assert "secl_all" not in result.records[0] and "secl" in result.metrics["summary"]["overall"]["signals"]
    assert "adapter scope all" in result.table


def test_parallel_passes_give_the_sequential_records(tiny_model_dir, tmp_path):
    """--workers 3: the baseline pass here, each SECL pass in its own spawned process with the parent's identity
    adapter; the same records (every field, floats to float32 rounding), counters and saved adapter as one process
    running the passes in turn."""
    import math

    from safetensors.torch import load_file

    secl = SECLConfig(burst_size=3, bin_gate_width=0, learning_rate=0.1)
    runs = {}
    for workers in (1, 3):
        config = SECLStreamConfig(model=str(tiny_model_dir), stream="mmlu:stem,halueval_qa_lm", limit_per_domain=2,
                                  burst_at_start=True, compare_adapter_scopes=True, n_resamples=20, workers=workers,
                                  output_dir=str(tmp_path / f"w{workers}"))
        runs[workers] = run_secl_stream(config, secl, progress=False)
    one, three = runs[1], runs[3]
    assert three.run["workers"] == 3 and one.counters == three.counters
    assert one.run["compared"]["counters"] == three.run["compared"]["counters"]
    assert any(r["updated"] for r in one.records) and any(r["secl_all_updated"] for r in one.records)
    for a, b in zip(one.records, three.records):
        assert list(a) == list(b) and a["passes"] == b["passes"]
        for key, value in a.items():
            if "seconds" in key or key == "passes":
                continue
            if isinstance(value, float):
                assert math.isclose(value, b[key], rel_tol=1e-5, abs_tol=1e-6) or math.isnan(value) == math.isnan(
                    b[key]) == True, key  # noqa: E712  (no greedy digit on the tiny model: NaN in both)
            else:
                assert value == b[key], key
    weights = [load_file(r.paths["secl_adapter"] / "adapter_model.safetensors") for r in (one, three)]
    assert weights[0].keys() == weights[1].keys()
    assert all(float((weights[0][k] - weights[1][k]).abs().max()) < 1e-5 for k in weights[0])
    assert any(float(weights[0][k].abs().max()) > 0 for k in weights[0] if "lora_B" in k)  # it did train
    # the gate, the open burst and the counters the configured scope's pass left, saved beside the adapter
    states = [json.loads((r.paths["secl_adapter"] / "secl_state.json").read_text()) for r in (one, three)]
    assert states[0]["counters"] == states[1]["counters"] == one.counters
    assert states[0]["burst_left"] == states[1]["burst_left"]
    # the gate's running entropy statistics: float32 rounding (the processes may run other thread counts)
    gates = [{**st["gate"], **st["gate"].pop("ph", {})} for st in states]
    assert gates[0].keys() == gates[1].keys()
    for key, value in gates[0].items():
        assert value == gates[1][key] if not isinstance(value, float) else value == pytest.approx(
            gates[1][key], rel=1e-5, abs=1e-6), key


def test_workers_beyond_the_passes_is_an_error():
    from hf_calibration.errors import ParameterError

    with pytest.raises(ParameterError, match="workers: must be at most 2, the stream's passes"):
        SECLStreamConfig(model="m", stream="gsm8k", output_dir="o", workers=3)
