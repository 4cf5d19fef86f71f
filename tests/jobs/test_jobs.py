"""Every job function called directly, without the command line, on the tiny model of tests/tiny.py."""

import json
import math

import numpy as np
import pytest

from hf_calibration.calm import CALMConfig
from hf_calibration.errors import MissingPathError, ParameterError, ParameterWarning
from hf_calibration.jobs import (CALMJobConfig, DiagnoseConfig, EvaluateConfig, FitPosthocConfig, SECLStreamConfig,
                                 run_calm, run_diagnose, run_evaluate, run_fit_posthoc, run_secl_stream)
from hf_calibration.secl import SECLConfig


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


@pytest.fixture(scope="module")
def evaluated(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("evaluate") / "run"
    config = EvaluateConfig(model=str(tiny_model_dir), limit=12, n_resamples=20, output_dir=str(out))
    return run_evaluate(config, progress=False)


def test_run_evaluate(evaluated):
    result = evaluated
    assert set(result.paths) == {"predictions.jsonl", "metrics.json", "reliability_diagram.png"}
    assert all(p.is_file() and p.parent == result.output_dir for p in result.paths.values())
    # the file holds {"run": run, **metrics}; the in-memory numbers are the file's
    on_disk = json.loads(result.paths["metrics.json"].read_text())
    assert on_disk["run"] == result.run and on_disk["signals"].keys() == result.metrics["signals"].keys()
    records = [json.loads(line) for line in result.paths["predictions.jsonl"].read_text().splitlines()]
    accuracy = np.mean([r["correct"] for r in records])
    assert result.metrics["signals"]["option_probability"]["accuracy"]["value"] == pytest.approx(accuracy)
    assert result.scores.correct.mean() == pytest.approx(accuracy) and result.run["n"] == 12
    assert "conf-ECE" in result.table and "constant_accuracy" in result.table


def test_run_evaluate_checks_before_the_model_loads(tiny_model_dir, tmp_path, no_model_load):
    out = tmp_path / "o"
    with pytest.raises(MissingPathError) as err:
        run_evaluate(EvaluateConfig(model=str(tiny_model_dir), limit=4, posthoc=str(tmp_path), output_dir=str(out)))
    assert err.value.parameter == "posthoc" and isinstance(err.value, FileNotFoundError)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ParameterError) as err:
        run_evaluate(EvaluateConfig(model=str(tiny_model_dir), limit=4, output_dir=str(tmp_path / "afile" / "o")))
    assert err.value.parameter == "output_dir" and "not a directory" in str(err.value)
    assert not out.exists()


@pytest.mark.parametrize("kwargs, parameter", [
    ({"dataset": "mmlu-pro"}, "dataset"),  # load_mcqa's `name`, reported as the config's field
    ({"subjects": "astrology"}, "subjects"),
    ({"limit": 0}, "limit"),
    ({"seed": -1}, "seed"),
    ({"device": "meta"}, "device"),
    ({"prompt_format": "markdown"}, "prompt_format"),
])
def test_evaluate_config_names_the_field(kwargs, parameter):
    with pytest.raises(ParameterError) as err:
        EvaluateConfig(output_dir="unused", **kwargs)
    assert err.value.parameter == parameter and str(err.value).startswith(f"{parameter}: ")


# every job config's path field, with the other fields it needs: (config name, those fields, the path field)
PATH_FIELDS = [
    ("EvaluateConfig", {}, "output_dir"),
    ("DiagnoseConfig", {}, "output_dir"),
    ("SECLStreamConfig", {}, "output_dir"),
    ("SECLServiceConfig", {"base_url": "http://127.0.0.1:1/v1"}, "output_dir"),
    ("LMEvalImportConfig", {"samples": "unused"}, "output_dir"),
    ("LMEvalImportConfig", {"output_dir": "unused"}, "samples"),
    ("FitPosthocConfig", {"method": "temperature", "output": "unused.json"}, "predictions"),
    ("FitPosthocConfig", {"method": "temperature", "predictions": "unused.jsonl"}, "output"),
    ("ReportConfig", {"inputs": ["unused"]}, "output"),
    ("ReportConfig", {}, "inputs"),
    ("ServeConfig", {"upstream": "http://127.0.0.1:1/v1"}, "state_dir"),
]


@pytest.mark.parametrize("name, others, parameter", PATH_FIELDS)
@pytest.mark.parametrize("value", [5, 2.5, b"out", ("out",)])
def test_a_path_field_that_is_not_a_path_is_refused_at_construction(tmp_path, monkeypatch, name, others, parameter,
                                                                    value):
    """Before: EvaluateConfig(output_dir=5) was accepted, and the job wrote into a folder named "5"."""
    import hf_calibration.jobs as jobs
    from hf_calibration.errors import ParameterTypeError

    monkeypatch.chdir(tmp_path)
    given = [value] if parameter == "inputs" else value
    with pytest.raises(ParameterTypeError) as err:
        getattr(jobs, name)(**others, **{parameter: given})
    assert err.value.parameter == parameter and err.value.value == value and isinstance(err.value, TypeError)
    what = {"output": "file", "predictions": "file", "samples": "file or folder"}.get(parameter, "folder")
    assert str(err.value) == (f"{parameter}: must be a path naming a {what} (a string or pathlib.Path), got {value!r} "
                              f"({type(value).__name__})")
    assert list(tmp_path.iterdir()) == []  # nothing created, not even a folder named "5"


def test_every_job_config_with_a_path_field_checks_it():
    """A new job config with an ``output_dir`` must be in PATH_FIELDS (and so check it at construction)."""
    import dataclasses

    import hf_calibration.jobs as jobs

    configs = [name for name in jobs.__all__ if name.endswith("Config")]
    with_dir = {name for name in configs if "output_dir" in {f.name for f in dataclasses.fields(getattr(jobs, name))}}
    assert with_dir == {"EvaluateConfig", "DiagnoseConfig", "SECLStreamConfig", "SECLServiceConfig", "LMEvalImportConfig"}
    assert with_dir <= {name for name, _, parameter in PATH_FIELDS if parameter == "output_dir"}


def test_a_path_output_dir_is_taken(tmp_path):
    from pathlib import Path

    config = EvaluateConfig(output_dir=tmp_path / "o")
    assert isinstance(config.output_dir, Path)
    with pytest.raises(ParameterError) as err:
        EvaluateConfig(output_dir="")
    assert err.value.parameter == "output_dir" and str(err.value) == "output_dir: must name a folder, got ''"


def test_run_evaluate_warns_when_the_limit_exceeds_the_questions(tiny_model_dir, tmp_path):
    config = EvaluateConfig(model=str(tiny_model_dir), subjects="astronomy", limit=100000, n_resamples=20,
                            batch_size=32, output_dir=str(tmp_path / "o"))
    with pytest.warns(ParameterWarning) as record:
        result = run_evaluate(config, progress=False)
    [warning] = [w.message for w in record if isinstance(w.message, ParameterWarning)]
    # MMLU's test split has 152 astronomy questions (Hendrycks et al. 2021)
    assert warning.parameter == "limit" and str(warning) == "limit 100000: only 152 questions in subjects astronomy; using 152"
    assert result.run["n"] == 152


def test_run_fit_posthoc(evaluated, tmp_path):
    from scipy.special import log_softmax

    logits, labels = evaluated.scores.option_logits, evaluated.scores.labels

    def nll(temperature):
        return -log_softmax(logits / temperature, axis=1)[np.arange(len(labels)), labels].mean()

    grid = np.exp(np.linspace(-10, 10, 201))
    out = tmp_path / "ts.json"
    config = FitPosthocConfig(method="temperature", predictions=str(evaluated.paths["predictions.jsonl"]),
                              output=str(out))
    if np.argmin([nll(t) for t in grid]) == len(grid) - 1:
        # on a random model the NLL can fall all the way to T's upper bound: every answer then gets 1/K, refused
        with pytest.raises(ParameterError, match="the same confidence 1/K") as err:
            run_fit_posthoc(config)
        assert err.value.parameter == "predictions" and not out.exists()
        return
    result = run_fit_posthoc(config)
    assert result.paths == {"calibrator": out} and json.loads(out.read_text())["method"] == "temperature"
    t = result.metrics["temperature_"]
    assert result.run["n"] == 12 and "temperature_=" in result.table
    # the fitted T minimises the NLL of the option logits over the scaler's range [e^-10, e^10]: no T on a grid
    # does better
    assert all(nll(t) <= nll(temperature) + 1e-9 for temperature in grid)


def test_run_fit_posthoc_names_the_predictions(tmp_path):
    bad = tmp_path / "p.jsonl"
    bad.write_text("not json\n")
    with pytest.raises(ParameterError) as err:
        run_fit_posthoc(FitPosthocConfig(method="platt", predictions=str(bad), output=str(tmp_path / "c.json")))
    assert err.value.parameter == "predictions" and "line 1" in str(err.value)
    assert not (tmp_path / "c.json").exists()


def test_run_diagnose_mcqa(tiny_model_dir, tmp_path):
    from hf_calibration.data import load_mcqa

    config = DiagnoseConfig(model=str(tiny_model_dir), dataset="halueval_qa_lm", limit=4, n_resamples=20,
                            balance_gold=True, output_dir=str(tmp_path / "d"))
    result = run_diagnose(config, progress=False)
    assert set(result.paths) == {"diagnosis.json", "signals.jsonl", "reliability_diagrams.png"}
    assert set(result.metrics["signals"]) == {"option_probability", "p_true", "norm_p_true", "verbalized", "dinco"}
    assert result.metrics["signals"]["verbalized"]["accuracy"]["value"] == pytest.approx(result.signals.correct.mean())
    # the length control: "pick the shorter answer", computed by hand on the same rows
    rows = load_mcqa("halueval_qa_lm", limit=4, seed=0, balance_gold=True)
    shorter = np.mean([len(r["choices"][r["answer"]]) < len(r["choices"][1 - r["answer"]]) for r in rows])
    assert result.run["length_only_accuracy"] == pytest.approx(shorter)
    assert "verdict:" in result.table and "position bias" in result.table


def test_run_diagnose_open_ended_with_a_loaded_model(tiny_model, tiny_tokenizer, tmp_path, no_model_load):
    config = DiagnoseConfig(model="tiny", dataset="gsm8k", limit=3, n_resamples=20, output_dir=str(tmp_path / "g"))
    result = run_diagnose(config, model=tiny_model, tokenizer=tiny_tokenizer, progress=False)
    records = [json.loads(line) for line in result.paths["records.jsonl"].read_text().splitlines()]
    assert len(records) == 3 and all("norm_p_true" in r and "secl" not in r for r in records)
    assert set(result.metrics["signals"]) == {"verbalized", "p_true", "norm_p_true", "dinco"}
    assert "verdict:" in result.table and "position bias" not in result.table


@pytest.mark.parametrize("kwargs, parameter", [({"subjects": "stem"}, "subjects"), ({"balance_gold": True}, "balance_gold"),
                                               ({"tau_n": 0.0}, "tau_n"), ({"dataset": "trivia"}, "dataset")])
def test_diagnose_config_names_the_field(kwargs, parameter):
    with pytest.raises(ParameterError) as err:
        DiagnoseConfig(output_dir="unused", **{"dataset": "gsm8k", **kwargs})
    assert err.value.parameter == parameter


def test_run_secl_stream(tiny_model_dir, tmp_path):
    config = SECLStreamConfig(model=str(tiny_model_dir), stream="mmlu:stem,gsm8k", limit_per_domain=2,
                              burst_at_start=True, n_resamples=20, output_dir=str(tmp_path / "s"))
    result = run_secl_stream(config, SECLConfig(burst_size=2, bin_gate_width=0), progress=False)
    assert [r["domain"] for r in result.records] == ["mmlu:stem"] * 2 + ["gsm8k"] * 2
    assert [r["burst"] for r in result.records] == [True, True, False, False]  # a burst of 2 from the first question
    assert result.metrics["summary"]["overall"]["share_in_burst"] == 0.5 and result.counters["questions"] == 4
    assert set(result.paths) == {"records.jsonl", "metrics.json", "secl_adapter", "reliability_mmlu_stem.png",
                                 "reliability_gsm8k.png"}
    assert all(p.exists() for p in result.paths.values())
    assert result.run["config"]["burst_size"] == 2 and "[overall]" in result.table


@pytest.mark.parametrize("kwargs, parameter, fragment", [
    ({"stream": "mmlu:stem,,gsm8k"}, "stream", "empty entry"),
    ({"stream": "gsm8k", "limit_per_domain": 1}, "limit_per_domain", "got limit_per_domain 1 for 1 domain(s)"),
])
def test_secl_stream_config_names_the_field(kwargs, parameter, fragment):
    with pytest.raises(ParameterError) as err:
        SECLStreamConfig(output_dir="unused", **kwargs)
    assert err.value.parameter == parameter and fragment in str(err.value)


def test_secl_config_rejects_an_infinite_threshold():
    with pytest.raises(ParameterError) as err:  # PageHinkley needs a finite λ
        SECLConfig(ph_threshold=math.inf)
    assert err.value.parameter == "ph_threshold"


def test_run_calm(tiny_model_dir, tmp_path):
    config = CALMJobConfig(model=str(tiny_model_dir), train_dataset="halueval_qa_lm", n_train=4, n_calibration=4,
                           n_eval=2, lora_r=2)
    training = CALMConfig(output_dir=str(tmp_path / "c"), max_steps=1, per_device_train_batch_size=2, num_options=2,
                          bf16=False, activation_checkpointing=False, report_to="none", save_strategy="no",
                          use_cpu=True, disable_tqdm=True, max_length=None, dataset_num_proc=None)
    result = run_calm(config, training)
    assert result.run["steps"] == 1 and result.run["sizes"] == {"train": 4, "calibration": 4, "eval": 2}
    assert (result.paths["model"] / "logit_adjustment.safetensors").is_file()
    assert any(k.startswith("eval_") for k in result.metrics) and "trained 1 steps" in result.table


@pytest.mark.parametrize("kwargs, parameter", [({"train_subjects": "astrology"}, "train_subjects"),
                                               ({"n_train": 0}, "n_train"), ({"n_eval": -1}, "n_eval"),
                                               ({"train_dataset": "gpqa", "eval_subjects": "stem"}, "eval_subjects")])
def test_calm_job_config_names_the_field(kwargs, parameter):
    with pytest.raises(ParameterError) as err:
        CALMJobConfig(**kwargs)
    assert err.value.parameter == parameter


def test_secl_stream_reports_the_final_adapter(tiny_model_dir, tmp_path):
    """Row "secl_final": every answer read again with the adapter the stream ended with. Past the last update the
    stream's own reads already used that adapter, so there the two agree; its Brier is the hand mean."""
    config = SECLStreamConfig(model=str(tiny_model_dir), stream="mmlu:stem", limit_per_domain=4, burst_at_start=True,
                              n_resamples=20, output_dir=str(tmp_path / "s"))
    result = run_secl_stream(config, SECLConfig(burst_size=2, bin_gate_width=0, learning_rate=0.05), progress=False)
    recs = result.records
    assert [r["updated"] for r in recs] == [True, True, False, False]
    for r in recs[2:]:  # after the burst: no update since, the same adapter
        assert r["secl_final"] == pytest.approx(r["secl"], abs=1e-6)
    assert recs[0]["secl_final"] != pytest.approx(recs[0]["secl"], abs=1e-6)  # read before the second update
    row = result.metrics["summary"]["overall"]["signals"]["secl_final"]
    hand = np.mean([(r["secl_final"] - r["secl_correct"]) ** 2 for r in recs])
    assert row["brier"]["value"] == pytest.approx(hand)
    assert row["forward_passes"] == np.mean([r["passes"]["verbalized"] for r in recs])
    assert "SECL, final adapter" in result.table
