"""``run_secl_stream`` with both adapter scopes (issue 16 item 1): the default pass keeps the base model's answers,
the comparison pass ("all", the paper's variant) is reported beside it, each with its own counters."""

import json

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
