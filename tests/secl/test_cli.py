"""The diagnose and secl subcommands end to end on a tiny random model saved to disk."""

import json

import pytest

from hf_calibration.cli import main
from hf_calibration.errors import ParameterError
from hf_calibration.modeling.streams import StreamItem, judge, parse_stream


def _exit_code(argv):
    try:
        return main(argv)
    except SystemExit as exit_:  # argparse's usage errors exit from inside the parser
        return exit_.code


@pytest.fixture()
def tiny_dir(tiny_model_dir):
    return str(tiny_model_dir)


@pytest.mark.parametrize("argv", [
    ["diagnose", "--limit", "0", "--output-dir", "x"],
    ["diagnose", "--limit", "-3", "--output-dir", "x"],
    ["secl", "--limit-per-domain", "0", "--output-dir", "x"],
])
def test_non_positive_limits_exit_2(argv, capsys):
    assert _exit_code(argv) == 2 and "limit" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--dataset", "bogus"], "--dataset: unknown dataset 'bogus'"),
    (["--subjects", "astrology"], "--subjects: unknown MMLU subject or category 'astrology'"),
])
def test_diagnose_bad_data_names_the_option(args, message, tmp_path, capsys):
    assert main(["diagnose", *args, "--output-dir", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"hf-calibration: error: {message}"), err
    assert not (tmp_path / "x").exists()


def test_diagnose_writes_outputs(tiny_dir, tmp_path, capsys):
    out = tmp_path / "diag"
    assert main(["diagnose", "--model", tiny_dir, "--limit", "4", "--n-resamples", "20", "--output-dir", str(out)]) == 0
    d = json.loads((out / "diagnosis.json").read_text())
    assert set(d["signals"]) == {"option_probability", "p_true", "norm_p_true", "verbalized", "dinco"}
    assert d["gap"]["verdict"] in ("helps", "level only", "does not help") and d["run"]["n"] == 4
    assert "constant_accuracy" in d["references"] and set(d["position_bias"]) == set("ABCD")
    assert (out / "reliability_diagrams.png").stat().st_size > 0
    assert len((out / "signals.jsonl").read_text().splitlines()) == 4
    assert "verdict:" in capsys.readouterr().out


def test_secl_stream_writes_outputs(tiny_dir, tmp_path, capsys):
    out = tmp_path / "secl"
    argv = ["secl", "--model", tiny_dir, "--stream", "mmlu:stem,gsm8k", "--limit-per-domain", "2", "--burst-size", "2",
            "--burst-at-start", "--bin-gate-width", "0", "--n-resamples", "20", "--output-dir", str(out)]
    assert main(argv) == 0
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert [r["domain"] for r in records] == ["mmlu:stem"] * 2 + ["gsm8k"] * 2
    assert [r["burst"] for r in records] == [True, True, False, False]
    assert all(0 <= r[k] <= 1 for r in records for k in ("verbalized", "p_true", "norm_p_true", "dinco", "secl"))
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["run"]["counters"]["questions"] == 4 and metrics["summary"]["overall"]["share_in_burst"] == 0.5
    assert (out / "secl_adapter" / "adapter_model.safetensors").exists()
    assert "[overall]" in capsys.readouterr().out


@pytest.mark.parametrize("spec", ["", "mmlu:stem,trivia", "gsm8k:algebra", "mmlu:astrologyy", "mmlu:stem+astrologyy"])
def test_bad_stream(spec):
    with pytest.raises(ParameterError, match="^stream: ") as err:
        parse_stream(spec)
    assert err.value.parameter == "stream" and err.value.value == spec


def test_judge():
    mcqa = StreamItem("mmlu", [], 2, "mcqa", 4)
    assert judge(mcqa, "C") == ("C", True) and judge(mcqa, " B. because") == ("B", False)
    assert judge(mcqa, "I think so") == ("", False)
    assert judge(StreamItem("gsm8k", [], "42", "open"), "The answer is 42.")[1]
    assert parse_stream("mmlu:stem+other,gsm8k") == [("mmlu", "stem,other"), ("gsm8k", None)]


@pytest.mark.parametrize("option, value, field, expected", [
    ("--burst-size", "0", "burst_size", "must be an integer ≥ 1, got 0"),
    ("--num-distractors", "-2", "num_distractors", "must be an integer ≥ 1, got -2"),
    ("--bin-gate-width", "-1", "bin_gate_width", "must be an integer ≥ 0, got -1"),
    ("--tau-n", "0", "tau_n", "got 0.0"),
    ("--ema-rate", "1.5", "ema_rate", "≤ 1, got 1.5"),
    ("--learning-rate", "nan", "learning_rate", "got nan"),
    ("--ph-delta", "-0.5", "ph_delta", "≥ 0, got -0.5"),
    ("--ph-threshold", "inf", "ph_threshold", "must be a finite number, got inf"),  # PageHinkley needs a finite λ
    ("--ph-threshold", "0", "ph_threshold", "> 0, got 0.0"),
    ("--alpha-step", "inf", "alpha_step", "got inf"),
])
def test_secl_config_errors_name_the_option(option, value, field, expected, tmp_path, capsys, no_model_load):
    out = tmp_path / "out"
    assert main(["secl", option, value, "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"hf-calibration: error: {option}: ") and expected in err
    assert field not in err
    assert not out.exists()


def test_secl_unknown_mmlu_subject_fails_before_loading(tmp_path, capsys, no_model_load):
    out = tmp_path / "out"
    assert main(["secl", "--stream", "mmlu:stem,mmlu:astrologyy", "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--stream" in err and "'astrologyy'" in err and "'mmlu:astrologyy'" in err
    assert not out.exists()


def test_secl_serve_open_ended_stream_fails_before_any_load(tmp_path, capsys, no_model_load):
    """Before: ``secl-serve --stream mmlu:stem,gsm8k`` asked the server and loaded the model (tokenizer, local
    copy, both domains' questions) before refusing gsm8k. The refusal now comes at the config, before anything is
    loaded or the server asked (the URL's port 1 has no server: asking it would name --base-url instead)."""
    from hf_calibration.jobs.secl_service import SECLServiceConfig

    out = tmp_path / "out"
    assert main(["secl-serve", "--stream", "mmlu:stem,gsm8k", "--base-url", "http://127.0.0.1:1/v1",
                 "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hf-calibration: error: --stream: ") and "'gsm8k'" in err, err
    assert not out.exists()
    with pytest.raises(ParameterError) as refused:
        SECLServiceConfig(output_dir=str(out), base_url="http://127.0.0.1:1/v1", stream="gsm8k")
    assert refused.value.parameter == "stream" and "'gsm8k'" in str(refused.value)
    SECLServiceConfig(output_dir=str(out), base_url="http://127.0.0.1:1/v1", stream="mmlu:stem,gpqa")  # MCQA only


def test_secl_limit_above_domain_size_warns(tiny_dir, tmp_path, capsys, monkeypatch):
    import hf_calibration.data

    real = hf_calibration.data.load_mcqa
    # a domain with only 2 questions (the packaged ones are 100+; a tiny model keeps the run short)
    monkeypatch.setattr(hf_calibration.data, "load_mcqa", lambda name, **kw: real(name, **{**kw, "limit": 2}))
    out = tmp_path / "secl"
    argv = ["secl", "--model", tiny_dir, "--stream", "mmlu:stem,gsm8k", "--limit-per-domain", "3",
            "--n-resamples", "20", "--output-dir", str(out)]
    assert main(argv) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line.lower()]
    # the size warning once; on 5 questions of a random model the TS row's fit may also say it hit its bound
    assert [w for w in warnings if "limit" in w] == [
        "hf-calibration: warning: --limit-per-domain 3 exceeds the 2 questions of mmlu:stem; using all 2"]
    assert all(w.startswith("hf-calibration: warning: ") for w in warnings), warnings  # one line each, ours
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert [r["domain"] for r in records] == ["mmlu:stem"] * 2 + ["gsm8k"] * 3


def test_secl_options_without_effect_warn_once_by_their_option_names(tiny_dir, tmp_path, capsys):
    out = tmp_path / "secl"
    # a burst longer than the 3-question stream never ends, so its consolidation never runs; a replay minibatch of
    # 5 from a buffer of 4 draws 4
    argv = ["secl", "--model", tiny_dir, "--stream", "mmlu:stem", "--limit-per-domain", "3", "--n-resamples", "20",
            "--burst-at-start", "--burst-size", "5", "--replay-size", "4", "--replay-batch-size", "5",
            "--consolidation-epochs", "1", "--output-dir", str(out)]
    assert main(argv) == 0
    warnings = [w for w in capsys.readouterr().err.splitlines()
                if w.startswith("hf-calibration: warning: --burst-size") or w.startswith("hf-calibration: warning: --replay")]
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith("hf-calibration: warning: --replay-batch-size 5 is above --replay-size 4")
    assert warnings[1].startswith("hf-calibration: warning: --burst-size 5 is longer than the stream's 3 questions")
    assert "--consolidation-epochs" in warnings[1] and (out / "records.jsonl").exists()


@pytest.mark.parametrize("argv, fragments", [
    (["--stream", "mmlu:stem", "--limit-per-domain", "1"], ["--limit-per-domain 1", "at least 2"]),
    (["--stream", "gsm8k", "--limit-per-domain", "1"], ["--limit-per-domain 1", "at least 2"]),
    (["--stream", "mmlu:"], ["--stream", "'mmlu:'"]),
    (["--stream", "mmlu:stem+"], ["--stream", "'mmlu:stem+'"]),
    (["--stream", "mmlu:stem,,gsm8k"], ["--stream", "'mmlu:stem,,gsm8k'"]),
    (["--stream", "gsm8k,"], ["--stream", "'gsm8k,'"]),
    (["--stream", "gsm8k:algebra"], ["--stream", "'gsm8k:algebra'"]),
])
def test_secl_bad_stream_or_size_fails_before_loading(argv, fragments, tmp_path, capsys, no_model_load):
    out = tmp_path / "out"
    assert main(["secl", *argv, "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hf-calibration: error: ") and "Traceback" not in err, err
    assert all(f in err for f in fragments), err
    assert not out.exists()


def test_secl_option_prefix_is_not_an_option(tmp_path, capsys, no_model_load):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_:
        main(["secl", "--limit", "5", "--output-dir", str(out)])  # argparse took it for --limit-per-domain
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "--limit: unknown option" in err, err
    assert not out.exists()
