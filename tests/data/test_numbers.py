"""The one number rule (``data.numbers``) on the cases where the three earlier rules disagreed; every expected value
below is read off the rule by hand (an optional sign, digits with thousands commas and a fraction, or a bare
fraction; a trailing period is the sentence's)."""

import pytest

from hf_calibration.data.numbers import extract_final_number, normalize_number, parse_number, same_number
from hf_calibration.metrics.semantic import lexical_equivalent


@pytest.mark.parametrize("text, value, canonical", [
    (".5", 0.5, "0.5"),
    ("1,000", 1000.0, "1000"),
    ("-3", -3.0, "-3"),
    ("2.", 2.0, "2"),
    ("$1,000.00", 1000.0, "1000"),
])
def test_a_number_alone(text, value, canonical):
    assert parse_number(text) == value
    assert normalize_number(text) == canonical


@pytest.mark.parametrize("text, expected", [
    ("it costs .5 dollars", "0.5"),       # the earlier loader rule read "5"
    ("about 1,000 people", "1000"),
    ("the change is -3", "-3"),
    ("The answer is 2.", "2"),
    ("#### 1,000", "1000"),
    ("no number here", None),
])
def test_the_last_number_in_a_text(text, expected):
    assert extract_final_number(text) == expected


@pytest.mark.parametrize("a, b, same", [
    (".5", "0.5", True), ("1,000", "1000", True), ("-3", "3", False), ("2.", "2", True), ("2.5", "2.50", True),
    ("abc", "abc", True), ("abc", "2", False),
])
def test_the_stream_and_semantic_ece_agree(a, b, same):
    assert same_number(a, b) is same
    if parse_number(a) is not None and parse_number(b) is not None:
        assert lexical_equivalent(a, b) is same


def test_not_one_number():
    assert parse_number("3 apples") is None and parse_number("1e3") is None and parse_number("") is None
