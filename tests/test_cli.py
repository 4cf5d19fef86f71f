"""The `hf-calibration` CLI on a tiny local model: outputs, post-hoc round trip, and bad input."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from hf_calibration.cli import main


def _evaluate(model_dir, out, *extra):
    return main(["evaluate", "--model", str(model_dir), "--limit", "24", "--n-resamples", "50",
                 "--batch-size", "8", "--output-dir", str(out), *extra])


def test_evaluate_writes_outputs(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert _evaluate(tiny_model_dir, out) == 0
    printed = capsys.readouterr().out
    assert "conf-ECE" in printed and "constant_accuracy" in printed
    records = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    metrics = json.loads((out / "metrics.json").read_text())
    assert len(records) == 24
    assert (out / "reliability_diagram.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    correct = np.array([r["correct"] for r in records])
    report = metrics["signals"]["option_probability"]
    assert report["accuracy"]["value"] == pytest.approx(correct.mean())
    for key in ("conf_ece", "cw_ece", "smece", "mce", "ace", "brier", "nll", "auroc", "aurc", "brier_multiclass",
                "nll_multiclass"):
        entry = report[key]
        assert entry["low"] <= entry["value"] <= entry["high"], key
    assert metrics["run"]["prompt_format"] == "chat"
    # the model row's Brier is that of its top-label confidence (comparable with the references)
    conf = np.array([r["confidence"] for r in records])
    assert report["brier"]["value"] == pytest.approx(np.mean((conf - correct) ** 2))
    assert "brier_multiclass" in report and "nll_multiclass" in report
    # constant reference at the measured accuracy a: ECE 0 on the same items, Brier a(1 - a), AUROC 0.5
    ref = metrics["signals"]["constant_accuracy"]
    a = correct.mean()
    assert ref["conf_ece"]["value"] == pytest.approx(0.0, abs=1e-12)
    assert ref["brier"]["value"] == pytest.approx(a * (1 - a))
    assert ref["auroc"]["value"] == pytest.approx(0.5)


def test_same_seed_same_predictions(tiny_model_dir, tmp_path):
    assert _evaluate(tiny_model_dir, tmp_path / "a") == 0
    assert _evaluate(tiny_model_dir, tmp_path / "b") == 0
    assert (tmp_path / "a" / "predictions.jsonl").read_text() == (tmp_path / "b" / "predictions.jsonl").read_text()


@pytest.mark.parametrize("method", ["temperature", "vector", "platt", "isotonic", "histogram"])
def test_fit_posthoc_then_evaluate_with_it(tiny_model_dir, tmp_path, capsys, method):
    assert _evaluate(tiny_model_dir, tmp_path / "fit") == 0
    calib = tmp_path / f"{method}.json"
    assert main(["fit-posthoc", "--method", method, "--predictions", str(tmp_path / "fit" / "predictions.jsonl"),
                 "--output", str(calib)]) == 0
    assert json.loads(calib.read_text())["method"] == method
    assert _evaluate(tiny_model_dir, tmp_path / "after", "--posthoc", str(calib), "--seed", "1") == 0
    metrics = json.loads((tmp_path / "after" / "metrics.json").read_text())
    assert f"posthoc_{method}" in metrics["signals"]
    assert f"posthoc_{method}" in capsys.readouterr().out


def _bad(argv, capsys, fragment):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hf-calibration: error:"), err
    assert "Traceback" not in err
    assert fragment in err, err


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--dataset", "mmlu-pro"], "mmlu-pro"),
        (["--subjects", "astrology"], "astrology"),
        (["--limit", "0"], "--limit"),
        (["--limit", "-3"], "-3"),
        (["--batch-size", "0"], "--batch-size"),
        (["--model", "./no/such/model"], "./no/such/model"),
        (["--model", "some-org/not-a-model"], "some-org/not-a-model"),
        (["--device", "tpu9"], "--device"),
        (["--device", "cuda:99"], "cuda:99"),  # no CUDA here, or not 100 of them
        (["--device", "meta"], "--device: must be auto, cpu, cuda, cuda:N or mps, got 'meta'"),
        (["--model", "/no/such/model"], "--model: '/no/such/model' is not a folder"),
    ],
)
def test_evaluate_bad_input(tiny_model_dir, tmp_path, capsys, args, fragment):
    out = tmp_path / "out"
    argv = ["evaluate", "--model", str(tiny_model_dir), "--output-dir", str(out), *args]
    if "--limit" not in args:
        argv += ["--limit", "4"]
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse type errors exit from inside parse_args
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and fragment in err, err
    assert not out.exists()


def test_output_dir_that_is_a_file(tiny_model_dir, tmp_path, capsys):
    f = tmp_path / "taken"
    f.write_text("keep me")
    _bad(["evaluate", "--model", str(tiny_model_dir), "--limit", "4", "--output-dir", str(f)], capsys, "taken")
    assert f.read_text() == "keep me"


def test_fit_posthoc_bad_predictions(tmp_path, capsys):
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"answer": 1}\nnot json\n')
    _bad(["fit-posthoc", "--method", "temperature", "--predictions", str(bad), "--output", str(tmp_path / "t.json")],
         capsys, "line 1")
    _bad(["fit-posthoc", "--method", "temperature", "--predictions", str(tmp_path / "none.jsonl"),
          "--output", str(tmp_path / "t.json")], capsys, "none.jsonl")
    assert not (tmp_path / "t.json").exists()


def _predictions(path, rows):
    path.write_text("".join(json.dumps({"answer": a, "correct": c, "confidence": conf, "option_logits": logits}) + "\n"
                            for a, c, conf, logits in rows))
    return str(path)


@pytest.mark.parametrize("method", ["temperature", "vector", "platt"])
def test_fit_posthoc_on_all_right_predictions_names_the_file(tmp_path, capsys, method):
    rows = [(0, True, 0.6, [1.0, 0.5]), (1, True, 0.7, [0.2, 1.0]), (0, True, 0.9, [2.0, 0.1])]
    path = _predictions(tmp_path / "p.jsonl", rows)
    _bad(["fit-posthoc", "--method", method, "--predictions", path, "--output", str(tmp_path / "t.json")], capsys,
         "all 3 predictions")
    assert not (tmp_path / "t.json").exists()


def test_temperature_at_its_bound_is_refused_in_one_line(tmp_path, capsys):
    """Right and wrong answers whose logits carry no information: temperature scaling runs to its bound (T ≈ 2.2e4)
    and would give every question 1/K; before, a raw RuntimeWarning and a calibrator that `evaluate --posthoc`
    applied silently (its "calibrated" row equal to the 1/K reference)."""
    rows = [(0, True, 0.6, [1.0, 0.6]), (1, False, 0.6, [1.0, 0.6])] * 4
    path = _predictions(tmp_path / "p.jsonl", rows)
    _bad(["fit-posthoc", "--method", "temperature", "--predictions", path, "--output", str(tmp_path / "t.json")],
         capsys, "--predictions: temperature on")
    assert not (tmp_path / "t.json").exists()


def test_entry_point_prints_one_line_and_exits_2(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "hf_calibration.cli", "evaluate", "--dataset", "nope", "--output-dir", str(tmp_path / "o")],
        capture_output=True, text=True, env={"HF_HUB_OFFLINE": "1", "PATH": ""}, timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["hf-calibration: error: --dataset: unknown dataset 'nope'; choose one of "
                                                "['gpqa', 'halueval_dialogue', 'halueval_dialogue_lm', 'halueval_qa', "
                                                "'halueval_qa_lm', 'halueval_summarization', 'halueval_summarization_lm', "
                                                "'mmlu'], a local .json/.jsonl/.csv/.parquet file or a Hub id (owner/name)"]


@pytest.mark.parametrize(
    "make, fragment",
    [
        (lambda tmp: ("--output-dir", str(tmp / "afile" / "out")), "not a directory"),
        (lambda tmp: ("--output-dir", ""), "--output-dir"),
        (lambda tmp: ("--seed", "-1"), "--seed"),
        (lambda tmp: ("--posthoc", str(tmp)), "--posthoc"),
        (lambda tmp: ("--posthoc", str(tmp / "corrupt.json")), "--posthoc"),
    ],
)
def test_evaluate_bad_locations_and_files_fail_before_scoring(tiny_model_dir, tmp_path, capsys, make, fragment):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "corrupt.json").write_text('{"method": "temperature", "format_version": 1, "state": {"temperature_": -1}}')
    flag, value = make(tmp_path)
    argv = ["evaluate", "--model", str(tiny_model_dir), "--limit", "4", "--output-dir", str(tmp_path / "o"), flag, value]
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and fragment in err and "Traceback" not in err, err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "line, fragment",
    [
        ("42", "not a JSON object"),
        ('{"answer": 1, "correct": true, "confidence": 0.5, "option_logits": null}', "option_logits"),
        ('{"answer": "B", "correct": true, "confidence": 0.5, "option_logits": [1, 2]}', "'answer'"),
        ('{"answer": 1, "correct": "yes", "confidence": 0.5, "option_logits": [1, 2]}', "'correct'"),
        ('{"answer": 1, "correct": true, "confidence": NaN, "option_logits": [1, 2]}', "'confidence'"),
        ('{"answer": 1, "correct": true, "confidence": 0.5, "option_logits": ["a", 2]}', "option_logits"),
        ('{"answer": 7, "correct": true, "confidence": 0.5, "option_logits": [1, 2]}', "out of range"),
    ],
)
def test_fit_posthoc_rejects_malformed_records(tmp_path, capsys, line, fragment):
    bad = tmp_path / "p.jsonl"
    bad.write_text(line + "\n")
    _bad(["fit-posthoc", "--method", "platt", "--predictions", str(bad), "--output", str(tmp_path / "c.json")],
         capsys, fragment)
    assert not (tmp_path / "c.json").exists()


def test_rerun_into_the_same_folder_replaces_outputs(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    (out / "reliability_diagram.png").mkdir(parents=True)  # a folder no run of ours wrote, where a file goes
    (out / "reliability_diagram.png" / "junk").write_text("x")
    assert _evaluate(tiny_model_dir, out) == 2  # not replaced silently
    assert "exists and was not written by evaluate" in capsys.readouterr().err
    assert _evaluate(tiny_model_dir, out, "--overwrite") == 0
    assert (out / "reliability_diagram.png").is_file()
    capsys.readouterr()
    assert _evaluate(tiny_model_dir, out, "--n-bins", "10") == 0  # its own earlier run, other ECE options: replaced
    assert json.loads((out / "metrics.json").read_text())["run"]["n_bins"] == 10
    # other questions (another seed) are another run's results: refused without --overwrite (issue 52), one line
    assert _evaluate(tiny_model_dir, out, "--seed", "1") == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--output-dir" in err and "--overwrite" in err and "seed 0, now 1" in err


# ---------------------------------------------------------------- issue 14: bad input found late or not at all


def test_no_model_load_refuses_every_loader(tiny_model_dir, no_model_load):
    """The shared ``no_model_load`` fixture (tests/conftest.py) fails a test at any model load, whichever way the
    code reaches it: before, each file had its own copy, most patching ``hf_calibration.modeling.load_model`` only,
    so a load through ``modeling.loading`` (``backends.registry``), ``resolve_model_path``'s conversion of the
    packaged model, or transformers/PEFT directly went through. ``resolve_model_path`` of a folder, a check, runs."""
    import peft
    import transformers

    import hf_calibration.modeling
    import hf_calibration.modeling.loading as loading

    folder = str(tiny_model_dir)
    for load in (lambda: hf_calibration.modeling.load_model(folder), lambda: loading.load_model(folder),
                 lambda: loading._convert_packaged("HuggingFaceTB/SmolLM2-135M-Instruct"),
                 lambda: transformers.AutoModelForCausalLM.from_pretrained(folder),
                 lambda: transformers.LlamaForCausalLM.from_pretrained(folder),
                 lambda: peft.PeftModel.from_pretrained(None, folder)):
        with pytest.raises(AssertionError, match="a model load was attempted"):
            load()
    assert hf_calibration.modeling.resolve_model_path(folder) == folder


def _exit_code(argv):
    try:
        return main(argv)
    except SystemExit as exit_:  # argparse's errors exit from inside parse_args
        return exit_.code


def _one_line(capsys, *fragments):
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hf-calibration: error:") and "Traceback" not in err, err
    assert all(f in err for f in fragments), err
    return err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders; the file-parent cases cover it")
def test_output_dir_under_a_read_only_folder(tiny_model_dir, tmp_path, capsys, no_model_load):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        assert _exit_code(["evaluate", "--model", str(tiny_model_dir), "--limit", "4",
                           "--output-dir", str(locked / "run")]) == 2
        _one_line(capsys, "--output-dir", str(locked / "run"), "not writable")
        assert not (locked / "run").exists()
    finally:
        locked.chmod(0o700)


def test_evaluate_posthoc_fitted_for_another_option_count(tiny_model_dir, tmp_path, capsys, no_model_load):
    from hf_calibration.posthoc import VectorScaler

    rng = np.random.default_rng(0)
    calib = tmp_path / "vector4.json"
    VectorScaler().fit(rng.normal(size=(40, 4)), np.arange(40) % 4).save(calib)  # fitted on 4 options (MMLU)
    out = tmp_path / "o"
    code = _exit_code(["evaluate", "--model", str(tiny_model_dir), "--dataset", "halueval_qa", "--limit", "4",
                       "--posthoc", str(calib), "--output-dir", str(out)])
    assert code == 2
    _one_line(capsys, "--posthoc", str(calib), "4 options", "2")  # HaluEval QA has 2 options
    assert not out.exists()


@pytest.mark.parametrize("correct", [True, False])
@pytest.mark.parametrize("method", ["platt", "isotonic", "histogram"])
def test_fit_posthoc_one_class_names_predictions(tmp_path, capsys, method, correct):
    preds = tmp_path / "preds.jsonl"
    preds.write_text("".join(json.dumps({"answer": 0, "correct": correct, "confidence": 0.5 + i / 20,
                                         "option_logits": [1.0, 0.0]}) + "\n" for i in range(5)))
    out = tmp_path / "c.json"
    assert main(["fit-posthoc", "--method", method, "--predictions", str(preds), "--output", str(out)]) == 2
    _one_line(capsys, "--predictions", str(preds), "right" if correct else "wrong")
    assert not out.exists()


@pytest.mark.parametrize("args, fragment", [
    (["--lim", "4"], "--lim"),  # a prefix of --limit: argparse took it for --limit
    (["--limit", "4", "--output", "elsewhere"], "--output"),  # a prefix of --output-dir
])
def test_option_prefixes_are_not_options(tiny_model_dir, tmp_path, capsys, no_model_load, args, fragment):
    out = tmp_path / "o"
    assert _exit_code(["evaluate", "--model", str(tiny_model_dir), "--output-dir", str(out), *args]) == 2
    _one_line(capsys, fragment)
    assert not out.exists() and not (tmp_path / "elsewhere").exists()


def test_calm_option_prefixes_are_not_options(tmp_path, capsys, no_model_load):
    out = tmp_path / "o"
    assert _exit_code(["calm", "--n-tr", "4", "--output-dir", str(out)]) == 2  # --n-train
    _one_line(capsys, "--n-tr")
    assert _exit_code(["calm", "--learning", "1e-3", "--output-dir", str(out)]) == 2  # CALMConfig's --learning-rate
    _one_line(capsys, "--learning")
    assert not out.exists()


def test_evaluate_limit_above_the_subjects_warns_and_continues(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["evaluate", "--model", str(tiny_model_dir), "--subjects", "astronomy", "--limit", "100000",
                 "--n-resamples", "20", "--batch-size", "32", "--output-dir", str(out)]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("hf-calibration:")]
    # MMLU's test split has 152 astronomy questions (Hendrycks et al. 2021)
    assert err == ["hf-calibration: warning: --limit 100000: only 152 questions in --subjects astronomy; using 152"]
    assert len((out / "predictions.jsonl").read_text().splitlines()) == 152


def test_fit_posthoc_on_a_signal_the_file_lacks_or_an_unknown_signal_is_refused(tmp_path, capsys):
    """fit-posthoc --signal p_true on evaluate's predictions (which hold the option probability under
    'confidence', no p_true) is refused naming --predictions, not fitted on the option probability and recorded as
    p_true; an unknown signal names --signal; nothing is written."""
    preds = tmp_path / "predictions.jsonl"
    preds.write_text("".join(json.dumps({"answer": 0, "correct": i % 2 == 0, "confidence": 0.5 + i / 20,
                                         "option_logits": [1.0, 0.0]}) + "\n" for i in range(8)))
    out = tmp_path / "cal.json"
    _bad(["fit-posthoc", "--method", "platt", "--signal", "p_true", "--predictions", str(preds), "--output",
          str(out)], capsys, "--predictions")
    _bad(["fit-posthoc", "--method", "platt", "--signal", "nosuch", "--predictions", str(preds), "--output",
          str(out)], capsys, "--signal")
    assert not out.exists()
    assert main(["fit-posthoc", "--method", "platt", "--signal", "option_probability", "--predictions", str(preds),
                 "--output", str(out)]) == 0
    assert json.loads(out.read_text())["fitted_on"]["signal"] == "option_probability"
