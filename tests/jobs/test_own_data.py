"""`run_evaluate` and `run_diagnose` on the user's own files (a column mapping) with the ECE options, on the tiny
model of tests/tiny.py; bad files and options name their config field before a model loads."""

import json

import numpy as np
import pytest

from hf_calibration.errors import MissingPathError, ParameterError
from hf_calibration.jobs import DiagnoseConfig, EvaluateConfig, run_diagnose, run_evaluate
from hf_calibration.metrics import bootstrap, expected_calibration_error

# 12 questions; the gold letters cycle through A–D, so the expected indices are i % 4
QUESTIONS = [(f"What is {i} plus {i}?", [str(2 * i + d) for d in (0, 1, 2, 3)]) for i in range(12)]
GOLD = [i % 4 for i in range(12)]


def write_csv(path):
    """Option columns A–D and letter answers (one row with a lower-case letter)."""
    lines = ["Question,A,B,C,D,Answer,Topic"]
    for i, ((question, options), gold) in enumerate(zip(QUESTIONS, GOLD)):
        letter = "ABCD"[gold].lower() if i == 5 else "ABCD"[gold]
        lines.append(",".join([question, *options, letter, "odd" if i % 2 else "even"]))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def write_jsonl(path):
    """A list column of options and index answers."""
    rows = [{"prompt": q, "options": o, "label": g} for (q, o), g in zip(QUESTIONS, GOLD)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


FILES = {
    "csv": (write_csv, dict(question_column="Question", choices_column="A,B,C,D", answer_column="Answer",
                            subject_column="Topic")),
    "jsonl": (write_jsonl, dict(question_column="prompt", choices_column="options", answer_column="label")),
}


@pytest.fixture()
def no_model_load(monkeypatch):
    """Bad input must be rejected before a model is loaded: loading fails the test."""
    import hf_calibration.modeling
    import hf_calibration.modeling.loading

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the bad input was rejected")

    # open_backend imports load_model from modeling.loading: both names refuse
    monkeypatch.setattr(hf_calibration.modeling, "load_model", refuse)
    monkeypatch.setattr(hf_calibration.modeling.loading, "load_model", refuse)


@pytest.mark.parametrize("kind", sorted(FILES))
def test_run_evaluate_on_a_local_file_with_quantile_bins(tiny_model_dir, tmp_path, kind):
    write, columns = FILES[kind]
    path = write(tmp_path / f"quiz.{kind}")
    config = EvaluateConfig(model=str(tiny_model_dir), dataset=path, **columns, limit=12, n_resamples=20, n_bins=10,
                            binning="quantile", output_dir=str(tmp_path / "out"))
    result = run_evaluate(config, progress=False)
    metrics = json.loads(result.paths["metrics.json"].read_text())
    run = metrics["run"]
    assert (run["n_bins"], run["binning"], run["norm"]) == (10, "quantile", "l1")
    assert run["dataset"] == path and all(run[name] == value for name, value in columns.items())
    records = [json.loads(line) for line in result.paths["predictions.jsonl"].read_text().splitlines()]
    assert [r["answer"] for r in records] == GOLD  # letters (either case) and indices read as written, in order
    assert {r["source"] for r in records} == {path}
    correct = np.array([r["correct"] for r in records], dtype=int)
    conf = np.array([r["confidence"] for r in records])
    entry = metrics["signals"]["option_probability"]["conf_ece"]
    # recomputed from the written predictions: the same float64 confidences and bins, so equal up to the
    # summation order of 12 terms ≤ 1 (bound 12 · 2.2e-16)
    assert entry["value"] == pytest.approx(expected_calibration_error(correct, conf, n_bins=10, binning="quantile"),
                                           abs=1e-14)
    # …and not what the default bins give (so the options did reach the report)
    assert entry["value"] != pytest.approx(expected_calibration_error(correct, conf), abs=1e-6)
    # the interval too: the same 20 resamples (default_rng(seed)), ECE options passed to every one
    _, low, high = bootstrap(expected_calibration_error, correct, conf, n_resamples=20, seed=0,
                             metric_kwargs=dict(n_bins=10, binning="quantile"))
    assert (entry["low"], entry["high"]) == (pytest.approx(low, abs=1e-14), pytest.approx(high, abs=1e-14))
    assert "conf-ECE: 10 quantile bins, l1" in result.table
    assert result.paths["reliability_diagram.png"].read_bytes()[:4] == b"\x89PNG"


def test_run_diagnose_on_a_local_file_with_the_ece_options(tiny_model_dir, tmp_path, monkeypatch):
    import hf_calibration.jobs.diagnose as job

    seen = {}

    def plot(*args, **kwargs):
        seen["fig"] = plot_diagnosis(*args, **kwargs)
        return seen["fig"]

    plot_diagnosis = job.plot_diagnosis
    monkeypatch.setattr(job, "plot_diagnosis", plot)
    path = write_jsonl(tmp_path / "quiz.jsonl")
    config = DiagnoseConfig(model=str(tiny_model_dir), dataset=path, **FILES["jsonl"][1], limit=6, n_resamples=20,
                            n_bins=4, binning="quantile", norm="l2", output_dir=str(tmp_path / "d"))
    result = run_diagnose(config, progress=False)
    on_disk = json.loads(result.paths["diagnosis.json"].read_text())
    assert (on_disk["run"]["n_bins"], on_disk["run"]["binning"], on_disk["run"]["norm"]) == (4, "quantile", "l2")
    records = [json.loads(line) for line in result.paths["signals.jsonl"].read_text().splitlines()]
    correct = np.array([r["correct"] for r in records], dtype=int)
    for name, report in on_disk["signals"].items():
        conf = np.array([r[name] for r in records])
        expected = expected_calibration_error(correct, conf, n_bins=4, binning="quantile", norm="l2")
        assert report["conf_ece"]["value"] == pytest.approx(expected, abs=1e-14), name  # 6 terms ≤ 1
        assert report["mce"]["value"] == pytest.approx(
            expected_calibration_error(correct, conf, n_bins=4, binning="quantile", norm="max"), abs=1e-14), name
    # the verdict's ΔECE under the same options (it kept 15 equal-width bins before)
    ece = {name: expected_calibration_error(correct, np.array([r[name] for r in records]), n_bins=4, binning="quantile",
                                            norm="l2") for name in ("norm_p_true", "verbalized")}
    assert on_disk["gap"]["delta_ece"]["value"] == pytest.approx(ece["norm_p_true"] - ece["verbalized"], abs=1e-14)
    # the diagrams' bins: every panel's title names the 4 quantile bins
    assert [ax.get_title().endswith("(4 quantile bins)") for ax in seen["fig"].axes if ax.get_title()] == [True] * 4


@pytest.mark.parametrize("text, columns, parameter, fragment", [
    ("Question,A,B,Answer\nq,x,y,A\n", {"answer_column": "Gold"}, "answer_column", "no column 'Gold'"),
    ("Question,A,B,Answer\nq,x,y,Z\n", {}, "answer_column", "'Z' is neither an option letter"),
    ("Question,A,B,Answer\nq,x,y,5\n", {}, "answer_column", "'5' is out of range for its 2 options"),
    ("Question,A,B,Answer\n", {}, "dataset", "holds no questions"),
    ("", {}, "dataset", "is empty"),
])
def test_run_evaluate_names_the_field_of_a_bad_file(tiny_model_dir, tmp_path, no_model_load, text, columns, parameter,
                                                    fragment):
    path = tmp_path / "bad.csv"
    path.write_text(text, encoding="utf-8")
    mapping = {"question_column": "Question", "choices_column": "A,B", "answer_column": "Answer", **columns}
    config = EvaluateConfig(model=str(tiny_model_dir), dataset=str(path), **mapping, limit=4,
                            output_dir=str(tmp_path / "out"))
    with pytest.raises(ParameterError) as err:
        run_evaluate(config, progress=False)
    assert err.value.parameter == parameter and str(err.value).startswith(f"{parameter}: "), err.value
    assert fragment in str(err.value), err.value
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("run, config_class", [(run_evaluate, EvaluateConfig), (run_diagnose, DiagnoseConfig)])
def test_n_bins_is_checked_against_the_questions_of_the_file_before_the_model_loads(tiny_model_dir, tmp_path,
                                                                                    no_model_load, run, config_class):
    """16 bins pass the check against limit (200, the default) but the file has 12 questions: at most max(12, 15) = 15
    (docs/methods.md). Before: diagnose loaded the model and scored every question, then refused n_bins."""
    write, columns = FILES["csv"]
    path = write(tmp_path / "quiz.csv")
    config = config_class(model=str(tiny_model_dir), dataset=path, **columns, n_bins=16, output_dir=str(tmp_path / "o"))
    with pytest.raises(ParameterError) as err:
        run(config, progress=False)
    assert err.value.parameter == "n_bins" and err.value.value == 16
    assert str(err.value).startswith("n_bins: must be ≤ 15 for 12 questions") and str(err.value).endswith("got 16")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["quiz.csv"]


@pytest.mark.parametrize("config_class", [EvaluateConfig, DiagnoseConfig])
@pytest.mark.parametrize("kwargs, parameter", [
    ({"n_bins": 0}, "n_bins"),
    ({"n_bins": 2.5}, "n_bins"),
    ({"binning": "equal"}, "binning"),
    ({"norm": "l3"}, "norm"),
    ({"dataset": "QUIZ.txt"}, "dataset"),  # an unknown extension
    ({"dataset": "missing.csv"}, "dataset"),
    ({"question_column": "Q"}, "question_column"),  # mmlu has its own columns
    ({"dataset": "QUIZ.csv", "split": "test"}, "split"),  # a local file is one split
])
def test_configs_check_the_new_fields_up_front(tmp_path, config_class, kwargs, parameter):
    (tmp_path / "QUIZ.txt").write_text("Question,A,B,Answer\nq,x,y,A\n")
    (tmp_path / "QUIZ.csv").write_text("Question,A,B,Answer\nq,x,y,A\n")
    if "dataset" in kwargs and kwargs["dataset"] != "missing.csv":
        kwargs = {**kwargs, "dataset": str(tmp_path / kwargs["dataset"])}
    with pytest.raises(ParameterError) as err:
        config_class(output_dir="unused", **kwargs)
    assert err.value.parameter == parameter and str(err.value).startswith(f"{parameter}: "), err.value
    if kwargs.get("dataset") == "missing.csv":
        assert isinstance(err.value, MissingPathError)


def test_diagnose_open_ended_takes_no_column_mapping():
    with pytest.raises(ParameterError) as err:
        DiagnoseConfig(output_dir="unused", dataset="gsm8k", question_column="q")
    assert err.value.parameter == "question_column"
