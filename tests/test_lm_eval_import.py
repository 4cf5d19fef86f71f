"""Reading lm-eval per-sample logs (hand-written in lm-eval 0.4's format), the import job on them, and the ECE hook
for lm-eval task YAMLs. The real lm-eval run is tests/jobs/test_lm_eval_real.py."""

import json

import numpy as np
import pytest

from hf_calibration.errors import MissingPathError, ParameterError, ParameterWarning
from hf_calibration.integrations.lm_eval_import import find_samples, option_log_scores, read_samples, to_mcqa_scores

DATE = "2026-01-02T03-04-05.123456"


def record(doc_id, lls, choices, target, *, delimiter=" ", subject=None, **logged):
    """One line as lm-eval's EvaluationTracker writes it: floats and booleans as strings."""
    return {"doc_id": doc_id, "doc": {"question": f"q{doc_id}", **({"subject": subject} if subject else {})},
            "target": str(target),
            "arguments": {f"gen_args_{i}": {"arg_0": f"q{doc_id}\nAnswer:", "arg_1": delimiter + c}
                          for i, c in enumerate(choices)},
            "resps": [[[str(ll), "False"]] for ll in lls], "filtered_resps": [[str(ll), "False"] for ll in lls],
            "filter": "none", "metrics": sorted(logged), **logged}


def write(folder, task, records, *, date=DATE, results=None):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"samples_{task}_{date}.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    if results is not None:
        (folder / f"results_{date}.json").write_text(json.dumps(results), encoding="utf-8")
    return path


# "abcd": 4 characters, 4 bytes; "éé": 2 characters, 4 bytes
CHOICES = ["abcd", "éé"]


def test_log_likelihoods_targets_and_lengths(tmp_path):
    path = write(tmp_path, "my_task_v2", [
        record(0, [-2.0, -1.5], CHOICES, 0, acc=0.0, acc_norm=0.0),
        record(1, [-2.0, -3.0], CHOICES, "éé", acc=0.0, acc_norm=1.0),  # a choice text as the target
    ])
    samples = read_samples(path)
    assert samples.task == "my_task_v2" and samples.choices == [CHOICES, CHOICES]
    assert samples.labels.tolist() == [0, 1]
    np.testing.assert_array_equal(option_log_scores(samples, "acc"), [[-2.0, -1.5], [-2.0, -3.0]])
    np.testing.assert_array_equal(option_log_scores(samples, "acc_norm"), [[-0.5, -0.75], [-0.5, -1.5]])
    np.testing.assert_array_equal(option_log_scores(samples, "acc_bytes"), [[-0.5, -0.375], [-0.5, -0.75]])
    scores = to_mcqa_scores(samples, "acc_norm")
    assert scores.prediction.tolist() == [0, 0]
    assert scores.correct.tolist() == [True, False]
    np.testing.assert_allclose(scores.probs[0], [np.exp(-0.5), np.exp(-0.75)] / (np.exp(-0.5) + np.exp(-0.75)))
    np.testing.assert_allclose(scores.option_mass, [np.exp(-2.0) + np.exp(-1.5), np.exp(-2.0) + np.exp(-3.0)])
    assert samples.logged["acc_norm"].tolist() == [0.0, 1.0] and "acc_bytes" not in samples.logged


def test_delimiter_from_the_run_config_and_fewer_choices_padded(tmp_path):
    results = {"configs": {"t": {"target_delimiter": "::"}}, "model_name": "org/model"}
    path = write(tmp_path, "t", [record(0, [-1.0, -2.0, -3.0], ["x", "yy", "z"], 2, delimiter="::"),
                                 record(1, [-1.0, -2.0], ["x", "yy"], 1, delimiter="::")], results=results)
    samples = read_samples(path)
    assert samples.target_delimiter == "::" and samples.choices[0] == ["x", "yy", "z"]
    assert samples.model == "org/model"
    scores = option_log_scores(samples, "acc_norm")
    np.testing.assert_array_equal(scores, [[-1.0, -1.0, -3.0], [-1.0, -1.0, -np.inf]])
    assert to_mcqa_scores(samples).probs[1, 2] == 0.0


def test_a_chat_template_run_has_no_delimiter(tmp_path):
    results = {"configs": {"t": {"target_delimiter": " ", "gen_prefix": None}}, "chat_template": "{{ messages }}"}
    path = write(tmp_path, "t", [record(0, [-1.0, -2.0], [" A", " B"], 0, delimiter="")], results=results)
    assert read_samples(path).choices == [[" A", " B"]]


def test_find_samples_keeps_the_newest_run_of_each_task(tmp_path):
    old = write(tmp_path / "m", "t", [record(0, [-1.0, -2.0], CHOICES, 0)], date="2026-01-01T00-00-00.000001")
    new = write(tmp_path / "m", "t", [record(0, [-1.0, -2.0], CHOICES, 0)])
    other = write(tmp_path / "m", "t_ece", [record(0, [-1.0, -2.0], CHOICES, 0)])
    assert find_samples(tmp_path) == ({"t": new, "t_ece": other}, [old])
    with pytest.raises(MissingPathError, match="samples: '.*nowhere'"):
        find_samples(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ParameterError, match="holds no lm-eval samples"):
        find_samples(tmp_path / "empty")


@pytest.mark.parametrize("bad, message", [
    ({"filtered_resps": ["The answer is B."]}, "not a multiple_choice task"),
    ({"target": "[0, 1]"}, "several gold answers"),
    ({"target": "7"}, "target '7' is neither"),
    ({"filtered_resps": [["-1.0", "False"]], "arguments": {"gen_args_0": {"arg_0": "q", "arg_1": " a"}}},
     "needs ≥ 2 choices"),
])
def test_files_that_are_not_multiple_choice_logs(tmp_path, bad, message):
    path = write(tmp_path, "t", [{**record(0, [-1.0, -2.0], CHOICES, 0), **bad}])
    with pytest.raises(ParameterError, match=message) as err:
        read_samples(path)
    assert err.value.parameter == "samples" and "line 1" in str(err.value)


def test_not_json(tmp_path):
    path = tmp_path / f"samples_t_{DATE}.jsonl"
    path.write_text("{not json\n")
    with pytest.raises(ParameterError, match="line 1 is not JSON"):
        read_samples(path)


# ------------------------------------------------------------------------------------------------ the job


def _two_subjects(tmp_path):
    rng = np.random.default_rng(0)
    records = []
    for i in range(40):
        lls = rng.normal(-2.0, 1.0, size=4)
        records.append(record(i, lls.tolist(), ["A", "B", "C", "D"], int(rng.integers(0, 4)),
                              subject="algebra" if i < 25 else "anatomy", acc=0.0))
    for r in records:  # lm-eval's own acc: argmax == gold
        lls = [float(ll) for ll, _ in r["filtered_resps"]]
        r["acc"] = float(np.argmax(lls) == int(r["target"]))
    return write(tmp_path / "out" / "org__model", "mmlu_mix", records)


def test_job_reports_per_task_and_subject(tmp_path):
    from hf_calibration.jobs import LMEvalImportConfig, run_lm_eval_import
    from hf_calibration.metrics import expected_calibration_error

    path = _two_subjects(tmp_path)
    result = run_lm_eval_import(LMEvalImportConfig(samples=str(tmp_path / "out"), output_dir=str(tmp_path / "r"),
                                                   scorings="acc", n_resamples=20, n_bins=10, binning="quantile"))
    metrics = json.loads((tmp_path / "r" / "mmlu_mix" / "acc" / "metrics.json").read_text())
    records = [json.loads(line) for line in path.read_text().splitlines()]
    lls = np.array([[float(ll) for ll, _ in r["filtered_resps"]] for r in records])
    probs = np.exp(lls) / np.exp(lls).sum(axis=1, keepdims=True)
    gold = np.array([int(r["target"]) for r in records])
    # two float64 paths to the same probabilities (scipy's softmax, numpy's here): a 40-term ECE, ~40·eps apart
    assert metrics["signals"]["option_probability"]["conf_ece"]["value"] == pytest.approx(
        expected_calibration_error(gold, probs, n_bins=10, binning="quantile"), abs=1e-13)
    assert metrics["run"]["binning"] == "quantile" and metrics["run"]["n_bins"] == 10
    assert metrics["subject_counts"] == {"algebra": 25, "anatomy": 15}
    assert list(metrics["subjects"]) == ["algebra"]  # anatomy has fewer than 20 questions
    assert metrics["subjects"]["algebra"]["n"] == 25
    assert metrics["lm_eval"]["agreement"] == 1.0
    assert metrics["signals"]["option_probability"]["accuracy"]["value"] == metrics["lm_eval"]["accuracy"]
    assert set(metrics["position_bias"]) == {"A", "B", "C", "D"}
    assert result.paths == {"mmlu_mix acc": tmp_path / "r" / "mmlu_mix" / "acc"}
    assert not (tmp_path / "r" / "mmlu_mix" / "acc_norm").exists()


def test_job_warns_when_it_disagrees_with_lm_eval(tmp_path):
    from hf_calibration.jobs import LMEvalImportConfig, run_lm_eval_import

    path = write(tmp_path, "t", [record(0, [-1.0, -2.0], CHOICES, 0, acc=0.0)])  # logged acc contradicts the lls
    with pytest.warns(ParameterWarning, match="differs from lm-eval's logged acc on 100.0%"):
        run_lm_eval_import(LMEvalImportConfig(samples=str(path), output_dir=str(tmp_path / "r"), scorings="acc",
                                              n_resamples=10))


def test_cli(tmp_path, capsys):
    from hf_calibration.cli import main

    _two_subjects(tmp_path)
    assert main(["lm-eval-import", "--samples", str(tmp_path / "out"), "--output-dir", str(tmp_path / "r"),
                 "--scorings", "acc,acc_bytes", "--n-resamples", "10"]) == 0
    out = capsys.readouterr().out
    assert "mmlu_mix · acc_bytes" in out and "constant_1/K" in out
    assert main(["lm-eval-import", "--samples", str(tmp_path / "out"), "--output-dir", str(tmp_path / "r"),
                 "--scorings", "acc,bogus"]) == 2
    assert "--scorings: 'bogus' is not one of" in capsys.readouterr().err
    assert main(["lm-eval-import", "--samples", str(tmp_path / "out"), "--output-dir", str(tmp_path / "r"),
                 "--tasks", "arc"]) == 2
    assert "--tasks: no samples of ['arc'] under --samples" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ the ECE hook


def test_process_results_and_aggregations():
    from hf_calibration.integrations.lm_eval_metrics import ece, ece_high, ece_low, process_results
    from hf_calibration.metrics import expected_calibration_error

    rng = np.random.default_rng(1)
    lls = rng.normal(-3.0, 1.5, size=(50, 4))
    gold = rng.integers(0, 4, size=50)
    items = []
    for row, g in zip(lls, gold):
        doc = {"answer": "ABCD"[g]} if g % 2 else {"answer": int(g)}  # an index or a letter
        out = process_results(doc, [(float(ll), False) for ll in row])
        assert out["acc"] == float(np.argmax(row) == g)
        items.append(out["ece"])
    probs = np.exp(lls) / np.exp(lls).sum(axis=1, keepdims=True)
    # two float64 paths to the same probabilities; a 50-term ECE differs by at most ~50·eps
    assert ece(items) == pytest.approx(expected_calibration_error(gold, probs, n_bins=15), abs=1e-13)
    assert ece_low(items) <= ece(items) <= ece_high(items)


def test_process_results_needs_an_answer_index():
    from hf_calibration.integrations.lm_eval_metrics import mcqa_results, process_results

    with pytest.raises(TypeError, match="answer: process_results needs"):
        process_results({"answer": "1", "option1": "x"}, [(-1.0, False), (-2.0, False)])  # winogrande's 1-based "1"
    with pytest.raises(ValueError, match=r"gold: must be a choice index in \[0, 2\)"):
        mcqa_results([(-1.0, False), (-2.0, False)], 2)


def test_write_mcqa_task(tmp_path):
    import yaml

    from hf_calibration.integrations.lm_eval_tasks import write_mcqa_task

    rows = [{"question": " 2+2? ", "choices": ["3", "4", "5"], "answer": 1, "subject": "math"}]
    path = write_mcqa_task(rows, tmp_path, "arith", ece=True)
    loader = type("Loader", (yaml.SafeLoader,), {})
    loader.add_constructor("!function", lambda ld, node: ("function", ld.construct_scalar(node)))
    config = yaml.load(path.read_text(), Loader=loader)
    assert config["process_results"] == ("function", "hf_calibration.integrations.lm_eval_metrics.process_results")
    assert [m["metric"] for m in config["metric_list"]] == ["acc", "ece", "ece_low", "ece_high"]
    doc = json.loads((tmp_path / "arith.jsonl").read_text())
    assert doc["prompt"].startswith("2+2?\nA. 3\nB. 4\nC. 5\n") and doc["prompt"].endswith("\nAnswer:")
    assert doc["letters"] == ["A", "B", "C"]
    with pytest.raises(ValueError, match="choices: must be one of"):
        write_mcqa_task(rows, tmp_path, "x", choices="words")


def test_readme_and_docs_show_the_yaml_the_real_run_uses():
    """tests/jobs/test_lm_eval_real.py runs write_mcqa_task(..., ece=True), whose metric lines are ECE_YAML."""
    from pathlib import Path

    from hf_calibration.integrations.lm_eval_tasks import ECE_YAML

    root = Path(__file__).resolve().parents[1]
    for page in ("README.md", "docs/lm_eval.md"):
        assert f"```yaml\n{ECE_YAML}```" in (root / page).read_text(encoding="utf-8"), page


def test_the_hook_needs_only_numpy_and_scipy():
    """docs/lm_eval.md: lm-eval imports the hook in its own environment (vLLM's transformers, say), where
    hf_calibration may be installed without its dependencies."""
    import subprocess
    import sys

    heavy = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "evaluate", "matplotlib", "sklearn",
             "lm_eval", "gguf", "safetensors", "huggingface_hub")
    code = f"""
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {heavy!r}:
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Block())
from hf_calibration.integrations.lm_eval_metrics import ece, process_results
items = [process_results({{"answer": 0}}, [(-1.0, False), (-2.0, True)])["ece"]]
print(ece(items))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert float(out.stdout) == pytest.approx(1 - 1 / (1 + np.exp(-1.0)))  # one right answer at confidence σ(1)
