"""Nothing lost, nothing mixed: a re-run replaces its own earlier files (stale ones removed) and leaves everything
else; another job's folder, or a file no run of ours wrote, is refused unless --overwrite; an output place that
cannot be written is found before a model loads."""

import json

import pytest

from hf_calibration.cli import main
from hf_calibration.errors import ParameterError
from hf_calibration.runtime.outputs import MANIFEST, AtomicOutputDir, read_manifest
from tests.test_lm_eval_import import _two_subjects


def _error_line(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("hf-calibration: error:")]
    assert len(lines) == 1, lines
    return lines[0]


def test_lm_eval_import_scorings_do_not_delete_each_other(tmp_path, capsys):
    """Before: --scorings acc into the folder of an acc_norm run deleted acc_norm/ (and the other way round)."""
    _two_subjects(tmp_path)
    common = ["lm-eval-import", "--samples", str(tmp_path / "out"), "--output-dir", str(tmp_path / "r"),
              "--n-resamples", "10"]
    assert main([*common, "--scorings", "acc_norm"]) == 0
    norm = (tmp_path / "r" / "mmlu_mix" / "acc_norm" / "metrics.json").read_text()
    assert main([*common, "--scorings", "acc"]) == 0
    assert (tmp_path / "r" / "mmlu_mix" / "acc_norm" / "metrics.json").read_text() == norm
    assert (tmp_path / "r" / "mmlu_mix" / "acc" / "metrics.json").is_file()
    assert main([*common, "--scorings", "acc_norm"]) == 0  # the same scoring again: replaced, acc/ stays
    assert (tmp_path / "r" / "mmlu_mix" / "acc" / "metrics.json").is_file()


def test_rerun_of_the_same_job_removes_its_stale_files(tmp_path):
    """A secl stream re-run with fewer domains left the old domains' diagrams, which report showed as current."""
    out = tmp_path / "stream"
    with AtomicOutputDir(out, "secl") as tmp:
        for name in ("metrics.json", "reliability_mmlu.png", "reliability_gsm8k.png", "secl_adapter/a.safetensors"):
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_text(name)
    (out / "notes.txt").write_text("mine")
    with AtomicOutputDir(out, "secl") as tmp:
        for name in ("metrics.json", "reliability_mmlu.png"):
            (tmp / name).write_text("second " + name)
    assert sorted(p.name for p in out.iterdir()) == sorted([MANIFEST, "metrics.json", "notes.txt",
                                                            "reliability_mmlu.png"])
    assert (out / "metrics.json").read_text() == "second metrics.json"
    assert read_manifest(out) == {"job": "secl", "files": ["metrics.json", "reliability_mmlu.png"]}


def test_another_jobs_folder_or_a_foreign_file_is_refused(tmp_path):
    out = tmp_path / "d"
    with AtomicOutputDir(out, "diagnose") as tmp:
        (tmp / "diagnosis.json").write_text("{}")
    with pytest.raises(ParameterError, match=r"holds the results of diagnose \(diagnosis.json\)") as err:
        with AtomicOutputDir(out, "evaluate") as tmp:
            (tmp / "metrics.json").write_text("{}")
    assert err.value.parameter == "output_dir" and sorted(p.name for p in out.iterdir()) == [MANIFEST,
                                                                                              "diagnosis.json"]
    with AtomicOutputDir(out, "evaluate", overwrite=True) as tmp:  # replaced: the diagnose files go
        (tmp / "metrics.json").write_text("{}")
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "metrics.json"]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "metrics.json").write_text("my own notes")
    with pytest.raises(ParameterError, match="exists and was not written by evaluate"):
        with AtomicOutputDir(mine, "evaluate") as tmp:
            (tmp / "metrics.json").write_text("{}")
    assert (mine / "metrics.json").read_text() == "my own notes"


def test_evaluate_into_a_diagnose_folder_is_refused_before_the_model_loads(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "d"
    assert main(["diagnose", "--model", str(tiny_model_dir), "--dataset", "halueval_qa_lm", "--limit", "4",
                 "--n-resamples", "10", "--output-dir", str(out)]) == 0
    before = sorted(p.name for p in out.iterdir())
    capsys.readouterr()
    import hf_calibration.modeling

    loaded = []
    real = hf_calibration.modeling.load_model
    hf_calibration.modeling.load_model = lambda *a, **k: loaded.append(1) or real(*a, **k)
    try:
        assert main(["evaluate", "--model", str(tiny_model_dir), "--limit", "4", "--n-resamples", "10",
                     "--output-dir", str(out)]) == 2
    finally:
        hf_calibration.modeling.load_model = real
    line = _error_line(capsys)
    assert line.startswith(f"hf-calibration: error: --output-dir: {str(out)!r} holds the results of diagnose")
    assert "--overwrite" in line and not loaded and sorted(p.name for p in out.iterdir()) == before


@pytest.mark.parametrize("argv, option", [
    (["evaluate", "--output-dir", "/proc/hfcal/run"], "--output-dir"),
    (["diagnose", "--output-dir", "/proc/hfcal/run"], "--output-dir"),
    (["secl", "--output-dir", "/proc/hfcal/run"], "--output-dir"),
    (["fit-posthoc", "--method", "platt", "--predictions", "p.jsonl", "--output", "/proc/hfcal/ts.json"], "--output"),
])
def test_unwritable_output_place_is_named_before_the_model_loads(argv, option, no_model_load, capsys):
    """Before: '[Errno 2] No such file or directory: …/.hfcal_…' after the model had loaded and scored."""
    assert main(argv) == 2
    line = _error_line(capsys)
    assert line.startswith(f"hf-calibration: error: {option}: '/proc/hfcal/") and "cannot be created" in line, line


def test_fit_posthoc_does_not_overwrite_a_file_it_did_not_write(tiny_model_dir, tmp_path, capsys):
    assert main(["evaluate", "--model", str(tiny_model_dir), "--limit", "24", "--n-resamples", "10",
                 "--output-dir", str(tmp_path / "fit")]) == 0
    predictions = str(tmp_path / "fit" / "predictions.jsonl")
    precious = tmp_path / "thesis.json"
    precious.write_text('{"chapter": 1}')
    assert main(["fit-posthoc", "--method", "platt", "--predictions", predictions, "--output", str(precious)]) == 2
    assert "exists and is not a calibrator saved by fit-posthoc" in _error_line(capsys)
    assert precious.read_text() == '{"chapter": 1}'
    calib = tmp_path / "platt.json"
    assert main(["fit-posthoc", "--method", "platt", "--predictions", predictions, "--output", str(calib)]) == 0
    assert main(["fit-posthoc", "--method", "isotonic", "--predictions", predictions, "--output", str(calib)]) == 0
    assert json.loads(calib.read_text())["method"] == "isotonic"  # its own earlier file: replaced
    assert main(["fit-posthoc", "--method", "platt", "--predictions", predictions, "--output", str(precious),
                 "--overwrite"]) == 0
    assert json.loads(precious.read_text())["method"] == "platt"


def test_report_on_a_truncated_metrics_json_with_a_diagram_is_an_error(tmp_path, capsys):
    """Before: exit 0, "0 tables and 1 diagrams", nothing on stderr."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "metrics.json").write_text('{"signals": {"option_probability": {"conf_ece": ')
    (folder / "reliability_diagram.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    assert main(["report", str(folder), "--output", str(tmp_path / "r.html")]) == 2
    line = _error_line(capsys)
    assert "found no result" in line and "not valid JSON" in line and not (tmp_path / "r.html").exists()


def test_report_default_output_is_inside_the_first_folder(tiny_model_dir, tmp_path, capsys, monkeypatch):
    """Before: report.html written into the current folder (the checkout) without a word."""
    from hf_calibration.jobs import ReportConfig, run_report

    assert main(["evaluate", "--model", str(tiny_model_dir), "--limit", "12", "--n-resamples", "10",
                 "--output-dir", str(tmp_path / "quiz")]) == 0
    monkeypatch.chdir(tmp_path)
    assert main(["report", "quiz"]) == 0
    assert "quiz/report.html" in capsys.readouterr().out and not (tmp_path / "report.html").exists()
    result = run_report(ReportConfig(inputs=str(tmp_path / "quiz")))  # one folder as a string, not its letters
    assert result.paths["report"] == tmp_path / "quiz" / "report.html"
    other = tmp_path / "notes.html"
    other.write_text("<html>my notes</html>")
    with pytest.raises(ParameterError, match="is not a report written by"):
        run_report(ReportConfig(inputs=["quiz"], output=str(other)))
    assert other.read_text() == "<html>my notes</html>"
