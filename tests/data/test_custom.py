"""Your own multiple-choice data: local JSON / JSON Lines / CSV / Parquet files and Hub ids through ``load_mcqa``,
and ``to_mcqa`` on a Dataset in memory. Every file is written here, a few rows each, so the expected rows are
read off the text."""

import json
import time

import pytest
from datasets import Dataset

from hf_calibration.data import MCQA_FEATURES, dataset_kind, load_mcqa, to_mcqa
from hf_calibration.errors import MissingPathError, ParameterError

CSV = """Question,A,B,C,D,Answer,Topic
What is 2 + 2?,3,4,5,6,B,math
Capital of France?,Paris,Rome,Oslo,,a,geography
Half of 1?,0.50,2,NA,None,A,math
"""
LETTERS_CSV = dict(question_column="Question", choices_column="A,B,C,D", answer_column="Answer")


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_csv_with_option_columns_and_letter_answers(tmp_path):
    path = _write(tmp_path, "quiz.csv", CSV)
    ds = load_mcqa(path, **LETTERS_CSV, subject_column="Topic")
    assert ds.features == MCQA_FEATURES
    assert ds.to_list() == [
        {"question": "What is 2 + 2?", "choices": ["3", "4", "5", "6"], "answer": 1, "subject": "math", "source": path},
        # the empty D cell: this row has three options; "a" is the letter A
        {"question": "Capital of France?", "choices": ["Paris", "Rome", "Oslo"], "answer": 0, "subject": "geography",
         "source": path},
        # every cell as written: not 0.5, not a missing value
        {"question": "Half of 1?", "choices": ["0.50", "2", "NA", "None"], "answer": 0, "subject": "math",
         "source": path},
    ]


def test_jsonl_with_a_list_column_and_index_answers(tmp_path):
    rows = [{"q": "Sky colour?", "opts": ["green", "blue"], "gold": 1, "t": "nature"},
            {"q": "3 * 3?", "opts": ["6", "9", "12"], "gold": 1, "t": "math"},
            {"q": "Which is a prime?", "opts": ["4", "6", "7", "8", "9"], "gold": "2", "t": "math"}]
    path = _write(tmp_path, "quiz.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    ds = load_mcqa(path, question_column="q", choices_column="opts", answer_column="gold")
    assert ds["choices"] == [r["opts"] for r in rows] and ds["answer"] == [1, 1, 2]
    assert ds["subject"] == ["quiz"] * 3  # no subject column: the file's stem


def test_json_array_and_parquet_files(tmp_path):
    rows = [{"question": f"q{i}", "choices": ["x", "y", "z"], "answer": i % 3} for i in range(6)]
    json_path = _write(tmp_path, "quiz.json", json.dumps(rows))
    parquet_path = str(tmp_path / "quiz.parquet")
    Dataset.from_list(rows).to_parquet(parquet_path)
    expected = [(r["question"], r["choices"], r["answer"]) for r in rows]
    for path in (json_path, parquet_path):  # the schema's own column names are the defaults
        ds = load_mcqa(path)
        assert list(zip(ds["question"], ds["choices"], ds["answer"])) == expected


def test_limit_is_stratified_by_the_subject_column_and_balance_gold_applies(tmp_path):
    lines = ["Question,A,B,Answer,Topic"] + [f"q{i},x{i},y{i},A,{'ab'[i % 2]}" for i in range(10)]
    path = _write(tmp_path, "quiz.csv", "\n".join(lines) + "\n")
    ds = load_mcqa(path, question_column="Question", choices_column="A,B", answer_column="Answer",
                   subject_column="Topic", limit=4, seed=0, balance_gold=True)
    assert sorted(ds["subject"]) == ["a", "a", "b", "b"]  # 5 and 5 rows → 2 and 2
    assert sorted(ds["answer"]) == [0, 0, 1, 1]  # every gold was A; balanced over two letters
    assert all(row["choices"][row["answer"]].startswith("x") for row in ds)  # the right option moved with its label


def test_to_mcqa_on_a_dataset_in_memory():
    raw = Dataset.from_dict({"Q": ["a?", "b?"], "opts": [["1", "2"], ["3", "4"]], "gold": ["B", "0"]})
    ds = to_mcqa(raw, question_column="Q", choices_column="opts", answer_column="gold", default_subject="s",
                 source="mem")
    assert ds.to_list() == [{"question": "a?", "choices": ["1", "2"], "answer": 1, "subject": "s", "source": "mem"},
                            {"question": "b?", "choices": ["3", "4"], "answer": 0, "subject": "s", "source": "mem"}]


@pytest.mark.parametrize("text, columns, parameter, fragments", [
    (CSV, {**LETTERS_CSV, "answer_column": "Gold"}, "answer_column", ["'Gold'", "Question, A, B, C, D, Answer, Topic"]),
    (CSV, {**LETTERS_CSV, "choices_column": "A,B,E"}, "choices_column", ["'E'"]),
    (CSV, {**LETTERS_CSV, "subject_column": "Area"}, "subject_column", ["'Area'"]),
    ("Question,A,B,Answer\nq,x,y,Z\n", {**LETTERS_CSV, "choices_column": "A,B"}, "answer_column", ["row 0", "'Z'"]),
    ("Question,A,B,Answer\nq,x,y,C\n", {**LETTERS_CSV, "choices_column": "A,B"}, "answer_column",
     ["'C'", "out of range for its 2 options", "A–B", "0–1"]),
    ("Question,A,B,Answer\nq,x,y,0\nq,x,y,2\n", {**LETTERS_CSV, "choices_column": "A,B"}, "answer_column",
     ["row 1", "'2'", "out of range"]),
    ("Question,A,B,C,Answer\nq,x,,z,A\n", {**LETTERS_CSV, "choices_column": "A,B,C"}, "choices_column", ["row 0"]),
    ("Question,A,B,Answer\nq,x,,A\n", {**LETTERS_CSV, "choices_column": "A,B"}, "choices_column", ["need 2 to 10"]),
    ("Question,A,B,Answer\n,x,y,A\n", {**LETTERS_CSV, "choices_column": "A,B"}, "question_column",
     ["row 0", "missing"]),
    ("Question,A,Answer\nq,x|y,A\n", {**LETTERS_CSV, "choices_column": "A"}, "choices_column", ["holding a list"]),
])
def test_malformed_rows_and_columns_name_their_parameter(tmp_path, text, columns, parameter, fragments):
    path = _write(tmp_path, "bad.csv", text)
    with pytest.raises(ParameterError) as err:
        load_mcqa(path, **columns)
    assert err.value.parameter == parameter and str(err.value).startswith(f"{parameter}: "), err.value
    assert all(f in str(err.value) for f in fragments), str(err.value)


def test_an_index_answer_out_of_range_in_jsonl(tmp_path):
    path = _write(tmp_path, "q.jsonl", json.dumps({"question": "q", "choices": ["x", "y", "z"], "answer": 3}) + "\n")
    with pytest.raises(ParameterError, match="answer 3 is out of range for its 3 options") as err:
        load_mcqa(path)
    assert err.value.parameter == "answer_column" and err.value.value == "answer"


@pytest.mark.parametrize("name, text, error, fragment", [
    ("empty.csv", "", ParameterError, "is empty"),
    ("empty.jsonl", "", ParameterError, "is empty"),
    ("header.csv", "Question,A,B,Answer\n", ParameterError, "holds no questions (only a header)"),
    ("blank.jsonl", "\n\n", ParameterError, "holds no questions"),
    ("none.json", "[]", ParameterError, "holds no questions"),
    ("broken.jsonl", '{"question": "q"\n', ParameterError, "is not a readable jsonl file"),
    ("quiz.txt", "Question,A,B,Answer\n", ParameterError, "unknown extension '.txt'"),
    ("quiz.xlsx", "", ParameterError, "unknown extension '.xlsx'"),
])
def test_bad_files_name_the_dataset(tmp_path, name, text, error, fragment):
    path = _write(tmp_path, name, text)
    with pytest.raises(error) as err:
        load_mcqa(path)
    assert err.value.parameter == "name" and err.value.value == path and fragment in str(err.value), err.value


def test_paths_that_are_not_files(tmp_path):
    with pytest.raises(MissingPathError) as err:
        load_mcqa(str(tmp_path / "missing.csv"))
    assert err.value.parameter == "name" and isinstance(err.value, FileNotFoundError)
    with pytest.raises(ParameterError, match="is a folder"):
        load_mcqa(str(tmp_path))


@pytest.mark.parametrize("name, kind", [("mmlu", "named"), ("owner/my-set", "hub"), ("owner/set.v2", "hub")])
def test_dataset_kind(name, kind):
    assert dataset_kind(name) == kind


@pytest.mark.parametrize("name, kwargs, parameter", [
    ("mmlu", {"question_column": "Question"}, "question_column"),  # a named set has its own columns
    ("mmlu", {"split": "test"}, "split"),
    ("FILE", {"split": "test"}, "split"),  # a local file is one split
    ("FILE", {"dataset_config": "main"}, "dataset_config"),
    ("FILE", {"choices_column": ","}, "choices_column"),
    ("FILE", {"answer_column": ""}, "answer_column"),
    ("mmlu2", {}, "name"),
])
def test_arguments_that_do_not_apply_are_rejected_before_reading(tmp_path, name, kwargs, parameter):
    name = _write(tmp_path, "quiz.csv", CSV) if name == "FILE" else name
    with pytest.raises(ParameterError) as err:
        load_mcqa(name, **kwargs)
    assert err.value.parameter == parameter, err.value


def test_a_hub_id_offline_fails_at_once_in_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises(ParameterError) as err:
        load_mcqa("someone/their-quiz", question_column="Question")
    assert time.perf_counter() - start < 2.0  # no huggingface_hub retries (~47 s)
    message = str(err.value)
    assert err.value.parameter == "name" and "\n" not in message
    assert "'someone/their-quiz'" in message and "offline" in message and ".csv" in message


def test_a_hub_id_online_reads_the_test_split_and_maps_columns(monkeypatch):
    """The Hub path without a network: the Hub answers through stand-ins for datasets' two calls."""
    import datasets

    import hf_calibration.data.loaders as loaders

    table = Dataset.from_dict({"prompt": ["a?"], "options": [["x", "y"]], "label": [1]})
    calls = []
    monkeypatch.setattr(loaders, "hub_available", lambda: True)
    monkeypatch.setattr(datasets, "get_dataset_split_names", lambda hub_id, config: ["train", "test"])
    monkeypatch.setattr(datasets, "load_dataset", lambda *args, **kwargs: calls.append((args, kwargs)) or table)
    ds = load_mcqa("owner/quiz", question_column="prompt", choices_column="options", answer_column="label")
    assert calls == [(("owner/quiz", None), {"split": "test"})]
    assert ds.to_list() == [{"question": "a?", "choices": ["x", "y"], "answer": 1, "subject": "owner/quiz",
                             "source": "owner/quiz:test"}]
    with pytest.raises(ParameterError, match="no split 'dev'; its splits are train, test") as err:
        load_mcqa("owner/quiz", split="dev")
    assert err.value.parameter == "split"
    with pytest.raises(ParameterError, match="no packaged copy") as err:
        load_mcqa("owner/quiz", source="packaged")
    assert err.value.parameter == "source"


def test_docstring_examples_run():
    import doctest

    import hf_calibration.data.custom as custom

    result = doctest.testmod(custom, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 0


def test_csv_row_with_more_cells_than_the_header_is_named(tmp_path):
    """Before: blamed on --answer-column (the extra cell shifted into the answer)."""
    path = _write(tmp_path, "more.csv", "question,A,B,C,answer\nq1,a,b,c,A,extra\nq2,a,b,c,B\n")
    with pytest.raises(ParameterError, match=r"line 2: 6 cells but the header has 5") as err:
        load_mcqa(str(path), choices_column="A,B,C", limit=2)
    assert err.value.parameter == "name"


def test_choices_column_naming_a_column_twice_is_refused(tmp_path):
    path = _write(tmp_path, "ok.csv", "question,A,B,C,answer\nq1,a,b,c,A\nq2,a,b,c,B\n")
    with pytest.raises(ParameterError, match="names the column 'A' twice") as err:
        load_mcqa(str(path), choices_column="A,A,B", limit=2)
    assert err.value.parameter == "choices_column"


def test_malformed_jsonl_is_our_line_only(tmp_path, capfd):
    """Before: datasets' "Failed to load JSON from file …" log line came first."""
    path = _write(tmp_path, "bad.jsonl", '{"question":"q","choices":["a","b"],"answer":0}\n{bad json\n')
    with pytest.raises(ParameterError, match="is not a readable jsonl file"):
        load_mcqa(str(path), limit=2)
    assert "Failed to load JSON" not in capfd.readouterr().err
