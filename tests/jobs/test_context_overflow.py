"""Inputs longer than the model's context: the question's middle is cut (options, answer slot and chat markup
kept), or the item skipped, or the run stopped naming it, before the model sees anything; one warning per run.
On a tiny Llama whose context is 96 tokens, and on the packaged SmolLM2 (8,192) with a 25,000-token question."""

import json
import warnings

import pytest

from hf_calibration.cli import main
from hf_calibration.errors import ParameterError, ParameterWarning
from hf_calibration.modeling.context import CUT_MARKER, context_length, fit_to_context
from hf_calibration.modeling.prompts import build_mcqa_prompt
from tests.tiny import make_tiny_model

CONTEXT = 96
HEAD, TAIL = "magazine started first city", "which option is correct ?"
LONG = f"{HEAD} " + "the company hotel family " * 60 + TAIL  # ~250 tokens of the tiny vocabulary


@pytest.fixture(scope="module")
def short_model_dir(tmp_path_factory, tiny_tokenizer):
    path = tmp_path_factory.mktemp("tiny-96")
    make_tiny_model(tiny_tokenizer, max_position_embeddings=CONTEXT).save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    return path


def _n(tokenizer, text):
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def _quiz(tmp_path, questions):
    path = tmp_path / "quiz.jsonl"
    path.write_text("".join(json.dumps({"question": q, "choices": ["eggs", "day", "number", "office"], "answer": 1})
                            + "\n" for q in questions), encoding="utf-8")
    return str(path)


def test_cut_keeps_options_markup_head_and_tail(tiny_tokenizer):
    choices = ["eggs", "day", "number", "office"]
    texts = ["which option is correct ?", LONG, LONG.replace("family", "eggs")]

    def build(i, q):
        return build_mcqa_prompt(tiny_tokenizer, q, choices, prompt_format="chat")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit = fit_to_context(tiny_tokenizer, texts, build=build, limit=CONTEXT, reserve=3)
    assert fit.kept == [0, 1, 2] and fit.overflowed == [1, 2] and fit.texts[0] == texts[0]
    for i in (1, 2):
        prompt = build(i, fit.texts[i])
        assert _n(tiny_tokenizer, prompt) + 3 <= CONTEXT
        assert CUT_MARKER.strip() in fit.texts[i] and fit.texts[i].startswith(HEAD) and fit.texts[i].endswith(TAIL)
        assert prompt.startswith("<|im_start|>user\n") and prompt.endswith("<|im_start|>assistant\n")
        assert all(f"{letter}. {c}" in prompt for letter, c in zip("ABCD", choices))
    [warning] = [w.message for w in caught]  # one warning for the call, counting both, naming the first
    assert isinstance(warning, ParameterWarning) and "2 of 3 questions" in str(warning)
    assert f"question 1 ({_n(tiny_tokenizer, build(1, LONG)):,} tokens)" in str(warning)


def test_skip_and_error(tiny_tokenizer):
    def build(i, q):
        return build_mcqa_prompt(tiny_tokenizer, q, ["eggs", "day"], prompt_format="plain")

    with pytest.warns(ParameterWarning, match="1 of 2 questions .* skipped"):
        fit = fit_to_context(tiny_tokenizer, ["day", LONG], build=build, limit=CONTEXT, on_overflow="skip")
    assert fit.kept == [0] and fit.texts == ["day"]
    with pytest.raises(ParameterError, match="question 1 is .* tokens") as err:
        fit_to_context(tiny_tokenizer, ["day", LONG], build=build, limit=CONTEXT, on_overflow="error")
    assert err.value.parameter == "on_overflow"


def test_options_alone_too_long_are_dropped(tiny_tokenizer):
    def build(i, q):
        return build_mcqa_prompt(tiny_tokenizer, q, ["eggs " * 100, "day"], prompt_format="plain")

    with pytest.warns(ParameterWarning, match="1 dropped: their options alone do not fit"):
        fit = fit_to_context(tiny_tokenizer, [LONG], build=build, limit=CONTEXT)
    assert fit.kept == []


def test_context_length_reads_the_config(tiny_tokenizer):
    assert context_length(make_tiny_model(tiny_tokenizer, max_position_embeddings=CONTEXT)) == CONTEXT


def test_evaluate_cuts_with_one_warning(short_model_dir, tmp_path, capsys):
    """Before: the whole prompt went to the model (a position past its embeddings: an IndexError on this Llama,
    a 10-minute run on SmolLM2)."""
    data = _quiz(tmp_path, ["which option is correct ?", LONG, LONG])
    out = tmp_path / "run"
    assert main(["evaluate", "--model", str(short_model_dir), "--dataset", data, "--limit", "3", "--n-resamples", "10",
                 "--output-dir", str(out)]) == 0
    err = capsys.readouterr().err
    assert err.count("are longer than the model's context") == 1 and "2 of 3 questions" in err
    [line] = [ln for ln in err.split("\n") if "context" in ln]
    assert line.startswith("hf-calibration: warning: --on-overflow") or line.startswith("hf-calibration: warning: 2")
    assert "--on-overflow skip drops them, error stops" in line
    assert len((out / "predictions.jsonl").read_text().splitlines()) == 3


def test_evaluate_skip_and_error(short_model_dir, tmp_path, capsys):
    data = _quiz(tmp_path, ["which option is correct ?", LONG, "day"])
    assert main(["evaluate", "--model", str(short_model_dir), "--dataset", data, "--limit", "3", "--n-resamples", "10",
                 "--output-dir", str(tmp_path / "skip"), "--on-overflow", "skip"]) == 0
    assert len((tmp_path / "skip" / "predictions.jsonl").read_text().splitlines()) == 2
    capsys.readouterr()
    assert main(["evaluate", "--model", str(short_model_dir), "--dataset", data, "--limit", "3", "--n-resamples", "10",
                 "--output-dir", str(tmp_path / "error"), "--on-overflow", "error"]) == 2
    err = capsys.readouterr().err
    [line] = [ln for ln in err.split("\n") if "error" in ln]
    assert line.startswith("hf-calibration: error: --on-overflow: question 1 is "), err
    assert not (tmp_path / "error").exists()


def test_diagnose_fits_the_follow_up_turns(short_model_dir, tmp_path, capsys):
    """diagnose appends the restated answer and a follow-up turn to the MCQA prompt: those must fit too."""
    data = _quiz(tmp_path, [LONG, "which option is correct ?"])
    out = tmp_path / "d"
    assert main(["diagnose", "--model", str(short_model_dir), "--dataset", data, "--limit", "2", "--n-resamples",
                 "10", "--output-dir", str(out)]) == 0
    assert "1 of 2 questions" in capsys.readouterr().err
    assert len((out / "signals.jsonl").read_text().splitlines()) == 2


def test_secl_stream_items_fit(tiny_tokenizer):
    """The stream's prompts plus the answer, the follow-up turn and the distractors fit the context (HaluEval's
    documents are longer than this tiny model's 512 tokens)."""
    from hf_calibration.jobs.secl_stream import stream_context
    from hf_calibration.secl.config import SECLConfig
    from hf_calibration.modeling.streams import build_stream

    model = make_tiny_model(tiny_tokenizer)
    options = stream_context(model, tiny_tokenizer, SECLConfig(), max_new_tokens=4, on_overflow="truncate")
    assert options["context"] == 512 and options["reserve"] > 2 * 4 + 32
    with pytest.warns(ParameterWarning, match="of 3 questions are longer"):
        items = build_stream(tiny_tokenizer, "halueval_summarization", limit_per_domain=3, **options)
    assert len(items) == 3
    assert all(len(item.prompt_ids) + options["reserve"] <= 512 for item in items)


def test_real_model_25000_token_question(real_model, tmp_path, capsys, monkeypatch):
    """A 25,000-token question on SmolLM2 (8,192): cut to a prompt of at most 8,192 tokens keeping the options and
    the chat markup; ``skip`` ends the run with the warning, ``error`` with one line and nothing written (before: a
    25,000-token forward pass, killed after ten minutes). A full run with the cut question is one 8,192-token
    forward pass (timed in the report, not here: no timed assertions)."""
    model, tokenizer = real_model
    words = "The committee reviewed the annual budget and the plans for the new library building. "
    question = words * (26_000 // (_n(tokenizer, words) - 1)) + "Which of the following is true?"
    assert _n(tokenizer, question) >= 25_000
    choices = ["eggs", "day", "number", "office"]

    def build(i, q):
        return build_mcqa_prompt(tokenizer, q, choices)

    with pytest.warns(ParameterWarning, match="1 of 1 questions are longer than the model's context of 8,192"):
        fit = fit_to_context(tokenizer, [question], build=build, limit=context_length(model, tokenizer))
    prompt = build(0, fit.texts[0])
    assert 8_000 < _n(tokenizer, prompt) <= 8_192
    assert prompt.endswith("D. office\nAnswer with the letter of the correct option only.<|im_end|>\n"
                           "<|im_start|>assistant\n")
    assert fit.texts[0].startswith(words) and fit.texts[0].endswith("Which of the following is true?")

    data = _quiz(tmp_path, [question, "What is 2 + 2?"])
    monkeypatch.setattr("hf_calibration.modeling.load_model", lambda *a, **k: (model, tokenizer))
    assert main(["evaluate", "--dataset", data, "--limit", "2", "--n-resamples", "10", "--on-overflow", "skip",
                 "--output-dir", str(tmp_path / "run")]) == 0
    assert "1 of 2 questions are longer than the model's context of 8,192 tokens" in capsys.readouterr().err
    assert len((tmp_path / "run" / "predictions.jsonl").read_text().splitlines()) == 1
    assert main(["evaluate", "--dataset", data, "--limit", "2", "--output-dir", str(tmp_path / "error"),
                 "--on-overflow", "error"]) == 2
    assert "--on-overflow: question 0 is " in capsys.readouterr().err and not (tmp_path / "error").exists()


def test_lm_eval_task_prompts_fit(tiny_tokenizer, tmp_path):
    from hf_calibration.integrations.lm_eval_tasks import write_mcqa_task

    rows = [{"question": LONG, "choices": ["eggs", "day"], "answer": 0}, {"question": "day ?", "choices": ["a", "b"],
                                                                          "answer": 1}]
    with pytest.warns(ParameterWarning, match="1 of 2 questions"):
        write_mcqa_task(rows, tmp_path, "t", tokenizer=tiny_tokenizer, max_length=CONTEXT)
    docs = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert len(docs) == 2 and docs[1]["prompt"].startswith("day ?")
    assert _n(tiny_tokenizer, docs[0]["prompt"] + " A") <= CONTEXT and docs[0]["prompt"].endswith("\nAnswer:")
    assert "A. eggs\nB. day" in docs[0]["prompt"]


def test_calm_training_rows_fit(tiny_tokenizer):
    """TRL cuts a too-long row's end, the completion (the gold letter) with it: the question is cut instead."""
    from hf_calibration.jobs.calm import CALMJobConfig, _datasets

    model = make_tiny_model(tiny_tokenizer, max_position_embeddings=CONTEXT)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        data = _datasets(CALMJobConfig(n_train=6, n_calibration=4, n_eval=0), 0, tiny_tokenizer, model, None)
    assert len(data["train"]) == 6
    for row in data["train"]:
        assert _n(tiny_tokenizer, row["prompt"] + row["completion"]) + 1 <= CONTEXT


def test_served_secl_stream_is_the_in_process_one_fitted_to_the_server(tiny_tokenizer, tmp_path):
    """``secl-serve`` asks the questions the in-process stream job asks (the same ids, gold letters moved under
    ``balance_gold``) and fits them to the smaller of the model's and the server's context (before: no fitting, so
    a question longer than vLLM's ``--max-model-len`` stopped the run; no ``balance_gold``, so another stream)."""
    from collections import Counter

    from hf_calibration.errors import ParameterError
    from hf_calibration.jobs.secl_service import SECLServiceConfig, served_stream
    from hf_calibration.jobs.secl_stream import stream_context
    from hf_calibration.modeling.streams import build_stream
    from hf_calibration.secl import SECLConfig, apply_secl

    trainer = apply_secl(make_tiny_model(tiny_tokenizer), tiny_tokenizer, SECLConfig())
    config = SECLServiceConfig(output_dir=str(tmp_path), base_url="http://127.0.0.1:1/v1", stream="mmlu:stem",
                               limit_per_domain=8, balance_gold=True, max_new_tokens=4)
    local = build_stream(tiny_tokenizer, "mmlu:stem", limit_per_domain=8, seed=0, balance_gold=True,
                         **stream_context(trainer, tiny_tokenizer, trainer.secl_config, max_new_tokens=4,
                                          on_overflow="truncate"))
    served = served_stream(config, trainer, tiny_tokenizer, None)
    assert [i.prompt_ids for i in served] == [i.prompt_ids for i in local]
    assert Counter(i.gold for i in served) == {0: 2, 1: 2, 2: 2, 3: 2}  # 8 questions, 4 letters: balanced
    reserve = stream_context(trainer, tiny_tokenizer, trainer.secl_config, max_new_tokens=4,
                             on_overflow="truncate")["reserve"]
    with pytest.warns(ParameterWarning, match="longer"):
        short = served_stream(config, trainer, tiny_tokenizer, 200)  # a server context below the model's 512
    assert max(len(i.prompt_ids) for i in local) + reserve > 200  # the check below can fail
    assert all(len(i.prompt_ids) + reserve <= 200 for i in short)
    for options, name in (({"on_overflow": "cut"}, "on_overflow"), ({"balance_gold": "yes"}, "balance_gold")):
        with pytest.raises(ParameterError) as err:
            SECLServiceConfig(output_dir=str(tmp_path), base_url="http://127.0.0.1:1/v1", **options)
        assert err.value.parameter == name
