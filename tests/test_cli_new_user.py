"""Issue 52: what a new user's bad input must meet (one line naming the option and the value, exit 2, nothing
already saved lost), on the CLI."""

import json
import os

import numpy as np
import pytest

from hf_calibration.cli import main

from tests.test_cli import _exit_code as _code, _one_line

QUIZ = os.path.join(os.path.dirname(__file__), "..", "examples", "data", "quiz.csv")  # 20 questions, 4 options


# ------------------------------------------------------------------------------------------ 1. --n-bins bounded


def test_n_bins_above_the_limit_is_refused_before_the_model_loads(tiny_model_dir, tmp_path, capsys, no_model_load):
    out = tmp_path / "o"
    assert _code(["evaluate", "--model", str(tiny_model_dir), "--limit", "20", "--n-bins", "1000000",
                  "--output-dir", str(out)]) == 2
    _one_line(capsys, "--n-bins", "1000000", "≤ 20")
    assert not out.exists()


def test_n_bins_above_the_questions_loaded_is_refused_before_the_model_loads(tiny_model_dir, tmp_path, capsys,
                                                                            no_model_load):
    # --limit 500 allows 500 bins, but the file holds 20 questions: refused once they are loaded, no model read
    out = tmp_path / "o"
    assert _code(["evaluate", "--model", str(tiny_model_dir), "--dataset", QUIZ, "--choices-column", "A,B,C,D",
                  "--limit", "500", "--n-bins", "100", "--output-dir", str(out)]) == 2
    _one_line(capsys, "--n-bins", "100", "≤ 20", "20 questions")
    assert not out.exists()


# ------------------------------------------------------------------------------ 2. calm owns its output folder


def _evaluate(model_dir, out):
    return main(["evaluate", "--model", str(model_dir), "--limit", "4", "--n-resamples", "20", "--output-dir", str(out)])


def test_calm_refuses_an_evaluate_folder_before_the_model_loads(tiny_model_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "quiz"
    assert _evaluate(tiny_model_dir, out) == 0
    saved = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    import hf_calibration.modeling

    monkeypatch.setattr(hf_calibration.modeling, "load_model", lambda *a, **k: pytest.fail("model loaded"))
    assert _code(["calm", "--model", str(tiny_model_dir), "--output-dir", str(out)]) == 2
    _one_line(capsys, "--output-dir", str(out), "evaluate", "--overwrite")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == saved


def test_calm_refuses_an_adapter_saved_without_the_marker(tiny_model_dir, tmp_path, capsys, no_model_load):
    # what the README's Python block leaves: CALMTrainer.save_model writes the adapter, no marker of a CLI job
    out = tmp_path / "calm-smollm2"
    out.mkdir()
    (out / "adapter_model.safetensors").write_bytes(b"the Python block's adapter")
    assert _code(["calm", "--model", str(tiny_model_dir), "--output-dir", str(out)]) == 2
    _one_line(capsys, "--output-dir", "adapter_model.safetensors", "--overwrite")
    assert (out / "adapter_model.safetensors").read_bytes() == b"the Python block's adapter"


def test_calm_marks_its_folder_and_evaluate_then_refuses_it(tiny_model_dir, tmp_path, capsys):
    from hf_calibration.calm import CALMConfig
    from hf_calibration.jobs import CALMJobConfig, run_calm
    from hf_calibration.runtime.outputs import read_manifest

    out = tmp_path / "c"
    config = CALMJobConfig(model=str(tiny_model_dir), train_dataset="halueval_qa_lm", n_train=4, n_calibration=4,
                           n_eval=0, lora_r=2)
    training = CALMConfig(output_dir=str(out), max_steps=1, per_device_train_batch_size=2, num_options=2,
                          bf16=False, activation_checkpointing=False, report_to="none", save_strategy="no",
                          use_cpu=True, disable_tqdm=True, max_length=None, dataset_num_proc=None)
    run_calm(config, training)
    manifest = read_manifest(out)
    on_disk = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and p.name != ".hf-calibration.json")
    assert manifest["job"] == "calm" and manifest["files"] == on_disk
    assert "logit_adjustment.safetensors" in manifest["files"]
    adapter = (out / "logit_adjustment.safetensors").read_bytes()
    capsys.readouterr()
    assert _evaluate(tiny_model_dir, out) == 2
    _one_line(capsys, "--output-dir", "holds the results of calm")
    assert (out / "logit_adjustment.safetensors").read_bytes() == adapter


# ---------------------------------------------------------------------- 6. duplicate options, unknown options


@pytest.mark.parametrize("argv, fragment", [(["--bogus"], "--bogus: unknown option"),
                                            (["--bogus", "evaluate"], "--bogus: unknown option"),
                                            (["--verison"], "did you mean --version?"),
                                            (["-q"], "-q: unknown option")])
def test_an_unknown_option_before_the_command_is_named(argv, fragment, capsys):
    assert _code(argv) == 2
    err = _one_line(capsys, fragment)
    assert "COMMAND: required" not in err


def test_duplicate_options_warn_once_naming_the_column(tiny_model_dir, tmp_path, capsys):
    data = tmp_path / "dup.csv"
    data.write_text("question,A,B,C,D,answer\n"
                    "Capital of France?,Paris,Rome,paris ,Berlin,A\n"       # Paris twice (case and space apart)
                    "2 + 2?,3,4,5,6,B\n"
                    "Largest planet?,Jupiter,Mars,Venus,Jupiter,A\n"
                    "Water boils at?,90,100,110,120,B\n")
    out = tmp_path / "o"
    assert main(["evaluate", "--model", str(tiny_model_dir), "--dataset", str(data), "--choices-column", "A,B,C,D",
                 "--limit", "4", "--n-resamples", "20", "--output-dir", str(out)]) == 0
    err = capsys.readouterr().err
    warned = [line for line in err.splitlines() if "warning" in line]
    assert len(warned) == 1, err
    assert "--choices-column" in warned[0] and "2 row(s)" in warned[0] and "row 0, 'Paris' and 'paris '" in warned[0]
    assert (out / "metrics.json").is_file()  # a warning: the run goes on


# --------------------------------------------------------------- 4. hand-edited or truncated files are not taken


def _records(n=12, seed=0):
    """evaluate's predictions.jsonl schema, consistent: correct == (prediction == answer)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        logits = rng.normal(size=4)
        probs = np.exp(logits) / np.exp(logits).sum()
        answer, prediction = int(rng.integers(4)), int(np.argmax(logits))
        out.append({"index": i, "subject": "s", "source": "t", "answer": answer, "prediction": prediction,
                    "correct": prediction == answer, "confidence": float(probs.max()), "probs": probs.tolist(),
                    "option_logits": logits.tolist(), "option_mass": 1.0})
    return out


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_fit_posthoc_refuses_a_correct_that_contradicts_the_answer(tmp_path, capsys):
    records = _records()
    assert any(r["correct"] for r in records) and not all(r["correct"] for r in records)
    records[2]["correct"] = not records[2]["correct"]  # a hand edit: line 3
    preds = _write(tmp_path / "predictions.jsonl", records)
    calib = tmp_path / "hist.json"
    calib.write_text('{"kept": true}')
    assert _code(["fit-posthoc", "--method", "histogram", "--predictions", str(preds), "--output", str(calib),
                  "--overwrite"]) == 2
    _one_line(capsys, "--predictions", str(preds), "line 3", "'correct'", "'answer'")
    assert calib.read_text() == '{"kept": true}'
    records[2]["correct"] = not records[2]["correct"]  # as evaluate wrote it: fitted
    _write(preds, records)
    assert _code(["fit-posthoc", "--method", "histogram", "--predictions", str(preds), "--output", str(calib),
                  "--overwrite"]) == 0


def test_report_refuses_to_rescore_a_truncated_predictions_file(tmp_path, capsys):
    folder = tmp_path / "run"
    folder.mkdir()
    preds = _write(folder / "predictions.jsonl", _records(20))
    text = preds.read_text()
    preds.write_text(text[: len(text) - 40])  # cut inside the last record, as an interrupted copy leaves it
    page = folder / "report.html"
    assert _code(["report", str(folder), "--n-bins", "4"]) == 2
    _one_line(capsys, "DIR: ", str(preds), "line 20", "not JSON")
    assert not page.exists()
    preds.write_text(text)  # whole again: re-scored, all 20 answers
    assert _code(["report", str(folder), "--n-bins", "4"]) == 0
    assert "predictions.jsonl · re-scored" in page.read_text()


def test_report_flags_a_non_numeric_metric_value(tmp_path, capsys):
    folder = tmp_path / "run"
    folder.mkdir()
    table = {"signals": {"model": {"conf_ece": {"value": "0.1x", "low": 0.05, "high": 0.2},
                                   "auroc": {"value": None, "low": None, "high": None}},  # undefined: "—"
                         "constant_accuracy": {"conf_ece": {"value": 0.0, "low": 0.0, "high": 0.0},
                                               "auroc": {"value": 0.5, "low": 0.5, "high": 0.5}}}}
    (folder / "metrics.json").write_text(json.dumps(table))
    assert _code(["report", str(folder)]) == 0
    err = capsys.readouterr().err
    warned = [line for line in err.splitlines() if "warning" in line]
    assert len(warned) == 1 and "1 metric value(s) are not numbers" in warned[0] and "conf_ece = '0.1x'" in warned[0]
    page = (folder / "report.html").read_text()
    assert "not a number: &#x27;0.1x&#x27;" in page
    assert page.count("—") == 1  # the undefined AUROC, and nothing else


def test_a_calibrator_with_a_probability_above_1_is_refused_at_load(tiny_model_dir, tmp_path, capsys,
                                                                    no_model_load):
    from hf_calibration.posthoc import load_calibrator

    preds = _write(tmp_path / "predictions.jsonl", _records(40))
    calib = tmp_path / "hist.json"
    assert _code(["fit-posthoc", "--method", "histogram", "--predictions", str(preds), "--output", str(calib)]) == 0
    saved = json.loads(calib.read_text())
    saved["state"]["bin_values_"][7] = 1.7  # a hand edit
    calib.write_text(json.dumps(saved))
    with pytest.raises(ValueError, match=r"'bin_values_' holds 1.7 at index 7, outside \[0, 1\]"):
        load_calibrator(calib)
    capsys.readouterr()
    out = tmp_path / "o"
    assert _code(["evaluate", "--model", str(tiny_model_dir), "--limit", "4", "--posthoc", str(calib),
                  "--output-dir", str(out)]) == 2
    _one_line(capsys, "--posthoc", str(calib), "1.7")
    assert not out.exists()


# ------------------------------------------------------- 5. a calibrator fitted on 2 options is not used on 4


def _two_option_records(n=40, seed=1):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        logits = rng.normal(size=2)
        answer, prediction = int(rng.integers(2)), int(np.argmax(logits))
        p = float(np.exp(logits.max()) / np.exp(logits).sum())
        out.append({"index": i, "answer": answer, "prediction": prediction, "correct": prediction == answer,
                    "confidence": p, "option_logits": logits.tolist()})
    return out


@pytest.mark.parametrize("method", ["histogram", "isotonic", "platt", "temperature"])
def test_a_calibrator_fitted_on_two_options_is_refused_on_four(method, tiny_model_dir, tmp_path, capsys,
                                                               monkeypatch):
    import hf_calibration.modeling

    preds = _write(tmp_path / "predictions.jsonl", _two_option_records())
    calib = tmp_path / f"{method}.json"
    assert _code(["fit-posthoc", "--method", method, "--predictions", str(preds), "--output", str(calib)]) == 0
    assert json.loads(calib.read_text())["n_options"] == [2]
    loads = []
    monkeypatch.setattr(hf_calibration.modeling, "load_model", lambda *a, **k: loads.append(1) or pytest.fail("load"))
    capsys.readouterr()
    out = tmp_path / "mmlu"
    assert _code(["evaluate", "--model", str(tiny_model_dir), "--limit", "4", "--posthoc", str(calib),
                  "--output-dir", str(out)]) == 2  # MMLU: 4 options
    _one_line(capsys, "--posthoc", str(calib), "fitted on 2 options", "--dataset mmlu has 4")
    assert not out.exists() and not loads


def test_an_old_calibrator_file_without_option_counts_still_loads(tiny_model_dir, tmp_path, capsys):
    preds = _write(tmp_path / "predictions.jsonl", _two_option_records())
    calib = tmp_path / "hist.json"
    assert _code(["fit-posthoc", "--method", "histogram", "--predictions", str(preds), "--output", str(calib)]) == 0
    saved = json.loads(calib.read_text())
    del saved["n_options"]  # as fit-posthoc wrote it before the counts were recorded
    calib.write_text(json.dumps(saved))
    out = tmp_path / "qa"
    assert _code(["evaluate", "--model", str(tiny_model_dir), "--dataset", "halueval_qa", "--limit", "4",
                  "--n-resamples", "20", "--posthoc", str(calib), "--output-dir", str(out)]) == 0
    assert "posthoc_histogram" in json.loads((out / "metrics.json").read_text())["signals"]


# ------------------------------------------------------ 7. the diagram after --posthoc: both curves, the subset


def test_evaluate_with_posthoc_draws_the_calibrated_curve_of_the_subset_scored(tiny_model_dir, tmp_path, capsys,
                                                                                monkeypatch):
    import hf_calibration.reporting.plotting
    from hf_calibration.posthoc import load_calibrator

    fit = tmp_path / "stem"
    assert main(["evaluate", "--model", str(tiny_model_dir), "--subjects", "stem", "--limit", "16",
                 "--n-resamples", "20", "--output-dir", str(fit)]) == 0
    calib = tmp_path / "platt.json"
    assert main(["fit-posthoc", "--method", "platt", "--predictions", str(fit / "predictions.jsonl"),
                 "--output", str(calib)]) == 0
    drawn = []
    plot = hf_calibration.reporting.plotting.plot_reliability_diagram
    monkeypatch.setattr(hf_calibration.reporting.plotting, "plot_reliability_diagram",
                        lambda *a, **k: drawn.append(k) or plot(*a, **k))
    out = tmp_path / "humanities"
    assert main(["evaluate", "--model", str(tiny_model_dir), "--subjects", "humanities", "--limit", "8",
                 "--n-resamples", "20", "--posthoc", str(calib), "--output-dir", str(out)]) == 0
    (kwargs,) = drawn
    assert kwargs["title"] == f"{tiny_model_dir.name} · mmlu: humanities (n=8)"
    assert kwargs["calibrated_label"] == "after platt"
    records = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    y, p = kwargs["calibrated"]
    np.testing.assert_array_equal(y, [int(r["correct"]) for r in records])
    np.testing.assert_allclose(p, load_calibrator(calib).transform([r["confidence"] for r in records]), rtol=1e-12)


def test_calm_eval_bins_above_the_eval_questions_are_refused_before_training(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "c"
    assert _code(["calm", "--model", str(tiny_model_dir), "--train-dataset", "halueval_qa_lm", "--n-train", "4",
                  "--n-calibration", "4", "--n-eval", "2", "--lora-r", "2", "--eval-num-bins", "20", "--max-steps", "1",
                  "--use-cpu", "true", "--bf16", "false", "--report-to", "none", "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err  # the model loads first (the eval questions are fitted to its context)
    errors = [line for line in err.splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0].startswith("hf-calibration: error: --eval-num-bins: must be ≤ 15 for 2 "
                                                    "eval questions") and errors[0].endswith("got 20"), err
    assert "Traceback" not in err and not any(out.rglob("*.safetensors"))
