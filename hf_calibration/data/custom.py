"""The user's own multiple-choice data: a local JSON / JSON Lines / CSV / Parquet file or a Hub dataset, read
with ``datasets.load_dataset`` and its columns mapped onto the MCQA schema (``to_mcqa``).

The mapping names the columns that hold the question, the options and the answer (and optionally a subject):

- the options are one column holding a list per row (JSON, JSON Lines, Parquet, most Hub sets) or several
  columns, one option each ("A,B,C,D", as MMLU-style CSV files lay them out); a row may leave trailing option
  cells empty when it has fewer options;
- the answer is an option index counting from 0 (an int, or digits in a CSV) or an option letter "A"–"J"
  (either case).

A CSV is read with every cell as text, as written: "0.50" stays "0.50" and "NA" stays "NA" (pandas would
otherwise turn them into 0.5 and a missing value).
"""

from __future__ import annotations

import csv
import math
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Sequence

from datasets import Dataset, Features, Value
from datasets.exceptions import DatasetsError

from hf_calibration.data.schema import MCQA_FEATURES, OPTION_LETTERS
from hf_calibration.errors import ParameterError, ParameterWarning

MCQA_FILE_FORMATS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
"""File extension → the ``datasets`` builder that reads it: ``load_dataset(builder, data_files=path)``."""

_EXTENSIONS = ", ".join(MCQA_FILE_FORMATS)
COLUMN_DEFAULTS = {"question_column": "question", "choices_column": "choices", "answer_column": "answer",
                   "subject_column": None}
"""The columns ``to_mcqa`` reads when not told otherwise: the MCQA schema's own names (as cais/mmlu has them)."""


def file_builder(path: str) -> str:
    """The ``datasets`` builder of a file by its extension (``MCQA_FILE_FORMATS``); ParameterError naming ``name``
    (``load_mcqa``'s argument) for any other extension."""
    suffix = Path(path).suffix.lower()
    if suffix not in MCQA_FILE_FORMATS:
        raise ParameterError("name", path, f"{path!r} has the unknown extension {suffix or '(none)'!r}; use one of "
                             f"{_EXTENSIONS}")
    return MCQA_FILE_FORMATS[suffix]


def check_columns(*, question_column=None, choices_column=None, answer_column=None, subject_column=None) -> dict:
    """The column mapping with ``COLUMN_DEFAULTS`` for the arguments left None, and ``choices_column`` as a
    list of names ("A,B,C,D" → ["A", "B", "C", "D"]; one name: a list column).

    Raises ParameterError naming the argument when a value is not a non-empty column name (for
    ``choices_column``: a name, comma-separated names or a list of names, none empty).
    """
    given = {"question_column": question_column, "choices_column": choices_column, "answer_column": answer_column,
             "subject_column": subject_column}
    columns = {name: COLUMN_DEFAULTS[name] if value is None else value for name, value in given.items()}
    choices = columns["choices_column"]
    names = choices.split(",") if isinstance(choices, str) else choices
    if not isinstance(names, (list, tuple)) or not names or not all(isinstance(c, str) and c.strip() for c in names):
        raise ParameterError("choices_column", choices, "must name one list column or several option columns "
                             f"('A,B,C,D'), got {choices!r}")
    columns["choices_column"] = [c.strip() for c in names]
    twice = next((c for i, c in enumerate(columns["choices_column"]) if c in columns["choices_column"][:i]), None)
    if twice is not None:  # "A,A,B" would show the same option twice
        raise ParameterError("choices_column", choices, f"names the column {twice!r} twice, got {choices!r}")
    for name in ("question_column", "answer_column", "subject_column"):
        value = columns[name]
        if value is not None and not (isinstance(value, str) and value.strip()):
            raise ParameterError(name, value, f"must be a column name, got {value!r}")
    return columns


def _text(value) -> str | None:
    """A cell as text; None for a missing cell (None, NaN, empty or blank)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    text = str(value)
    return text if text.strip() else None


def _answer_index(value, n_options: int, where: str, column: str) -> int:
    """The option index of an answer cell: an int or digits (counting from 0), or a letter A–J."""
    def bad(reason):
        return ParameterError("answer_column", column, f"{where}: the answer {value!r} {reason}")

    if isinstance(value, str) and value.strip().isdigit():
        index = int(value)
    elif isinstance(value, str) and len(value.strip()) == 1 and value.strip().upper() in OPTION_LETTERS:
        index = OPTION_LETTERS.index(value.strip().upper())
    elif isinstance(value, int) and not isinstance(value, bool):
        index = value
    else:
        raise bad("is neither an option letter (A, B, …) nor an option index (0, 1, …)")
    if not 0 <= index < n_options:
        raise bad(f"is out of range for its {n_options} options: letters A–{OPTION_LETTERS[n_options - 1]} or "
                  f"indices 0–{n_options - 1} (counting from 0)")
    return index


def to_mcqa(
    dataset: Dataset,
    *,
    question_column: str = "question",
    choices_column: str | Sequence[str] = "choices",
    answer_column: str = "answer",
    subject_column: str | None = None,
    default_subject: str = "",
    source: str = "",
) -> Dataset:
    """Map the rows of any ``datasets.Dataset`` onto the MCQA schema of ``load_mcqa``.

    Parameters
    ----------
    dataset : datasets.Dataset
        E.g. ``load_dataset("csv", data_files="quiz.csv", split="train")``.
    question_column : str
        The column of the question text.
    choices_column : str or list of str
        One column holding a list of options per row, or several columns holding one option each, as a list
        or comma-separated ("A,B,C,D"). Trailing empty option cells are dropped (a row with fewer options);
        an empty cell before a filled one is an error. 2 to 10 options per row.
    answer_column : str
        The column of the correct option: an index counting from 0 (int, or digits in text) or a letter
        "A"–"J" (either case).
    subject_column : str, optional
        A column to use as ``subject`` (``load_mcqa``'s ``limit`` stratifies by it); otherwise every row gets
        ``default_subject``.
    default_subject, source : str
        The ``subject`` of rows without one, and the ``source`` of every row (where the rows came from; also
        named in error messages).

    Returns
    -------
    datasets.Dataset with the features ``MCQA_FEATURES``: question (str), choices (list of str), answer (int64,
    index into choices), subject (str), source (str), one row per input row, in order.

    Raises
    ------
    ParameterError (a ValueError) naming the argument and its value: ``question_column``, ``choices_column``,
    ``answer_column`` or ``subject_column`` for a column the dataset lacks (the message lists its columns), a
    missing question, a choices column that holds no lists, a row with an empty option before a filled one or
    with fewer than 2 or more than 10 options, an answer that is no option letter or index or is out of range
    for its row (the message gives the row, counting from 0, and the value); ``dataset`` when it has no rows.

    Examples
    --------
    >>> from datasets import Dataset
    >>> raw = Dataset.from_dict({"Question": ["2 + 2 = ?"], "A": ["3"], "B": ["4"], "C": ["5"], "Answer": ["B"]})
    >>> to_mcqa(raw, question_column="Question", choices_column="A,B,C", answer_column="Answer")[0]
    {'question': '2 + 2 = ?', 'choices': ['3', '4', '5'], 'answer': 1, 'subject': '', 'source': ''}
    """
    columns = check_columns(question_column=question_column, choices_column=choices_column,
                            answer_column=answer_column, subject_column=subject_column)
    name = f"{source!r}" if source else "the dataset"
    _check_present(dataset, columns, choices_column, name)
    if len(dataset) == 0:
        raise ParameterError("dataset", source or None, f"{name} holds no questions")
    question, options, answer, subject = (columns[k] for k in COLUMN_DEFAULTS)
    read = [c for c in dict.fromkeys([question, *options, answer, subject]) if c is not None]
    rows = [_mcqa_row(row, f"row {i} of {name}", columns, choices_column, default_subject, source)
            for i, row in enumerate(dataset.select_columns(read))]
    _warn_duplicate_options(rows, name, choices_column)
    return Dataset.from_list(rows, features=MCQA_FEATURES)


def _warn_duplicate_options(rows: list[dict], name: str, choices_column) -> None:
    """One ParameterWarning naming ``choices_column`` when rows offer the same option twice (equal after
    stripping and case folding): the model's probability of that answer splits between its letters, and a
    prediction of the other copy counts as wrong."""
    repeated = []
    for i, row in enumerate(rows):
        seen = {}
        for text in row["choices"]:
            key = text.strip().casefold()
            if key in seen:
                repeated.append((i, seen[key], text))
                break
            seen[key] = text
    if repeated:
        i, first, again = repeated[0]
        warnings.warn(ParameterWarning("choices_column", choices_column, f"{{choices_column}}: {len(repeated)} "
                                       f"row(s) of {name} offer the same option twice (first: row {i}, {first!r} and "
                                       f"{again!r}); "
                                       "its probability splits between the copies, and only the answer's letter "
                                       "counts as right"), stacklevel=3)


def _check_present(dataset: Dataset, columns: dict, choices_column, name: str) -> None:
    """Raise a ParameterError for the first named column that ``dataset`` lacks (listing its columns)."""
    present = dataset.column_names
    for parameter, value in columns.items():
        missing = [c for c in (value if isinstance(value, list) else [value]) if c is not None and c not in present]
        if missing:
            raise ParameterError(parameter, choices_column if parameter == "choices_column" else value,
                                 f"no column {missing[0]!r} in {name}; its columns are {', '.join(present)}")


def _mcqa_row(row: dict, where: str, columns: dict, choices_column, default_subject: str, source: str) -> dict:
    """One input row (located by ``where`` in error messages) as an MCQA row."""
    question, options, answer, subject = (columns[k] for k in COLUMN_DEFAULTS)
    text = _text(row[question])
    if text is None:
        raise ParameterError("question_column", question, f"{where}: the question is missing")
    cells = row[options[0]] if len(options) == 1 else [row[c] for c in options]
    if not isinstance(cells, list) or (len(options) > 1 and any(isinstance(c, (list, dict)) for c in cells)):
        raise ParameterError("choices_column", choices_column, f"{where}: {options} holds {cells!r}; name one "
                             "column holding a list of options, or one column per option ('A,B,C,D')")
    texts = [_text(c) for c in cells]
    while texts and texts[-1] is None:  # a row with fewer options than there are option columns
        texts.pop()
    if None in texts or not 2 <= len(texts) <= len(OPTION_LETTERS):
        raise ParameterError("choices_column", choices_column, f"{where}: options {cells!r}; need 2 to "
                             f"{len(OPTION_LETTERS)} options, without empty ones before the last")
    return {"question": text, "choices": texts, "answer": _answer_index(row[answer], len(texts), where, answer),
            "subject": (_text(row[subject]) if subject else None) or default_subject, "source": source}


def _first_line(err: BaseException) -> str:
    cause = err.__cause__ or err
    text = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
    return text[:300]


@contextmanager
def _quiet_progress():
    """No "Generating train split" bar and no log line of datasets' own ("Failed to load JSON from file …")
    while a local file is read: an error then stays on one line, ours."""
    import datasets
    from datasets.utils import logging as datasets_logging

    shown, verbosity = datasets.is_progress_bar_enabled(), datasets_logging.get_verbosity()
    datasets.disable_progress_bars()
    datasets_logging.set_verbosity(datasets_logging.CRITICAL)
    try:
        yield
    finally:
        datasets_logging.set_verbosity(verbosity)
        if shown:
            datasets.enable_progress_bars()


def _csv_columns(path: str) -> list[str]:
    """The header of a CSV file; ParameterError naming ``name`` when it has none, cannot be read, or a row has
    more cells than the header (a comma inside an unquoted option: the cells would shift into other columns)."""
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            reader = csv.reader(f)
            header = next((line for line in reader if line), None)
            for row in reader:
                if header is not None and len(row) > len(header):
                    raise ParameterError("name", path, f"{path!r} line {reader.line_num}: {len(row)} cells but the "
                                         f"header has {len(header)} (quote a cell that holds a comma)")
    except UnicodeDecodeError as err:
        raise ParameterError("name", path, f"{path!r} is not UTF-8 text ({err.reason} at byte {err.start})") from None
    except csv.Error as err:
        raise ParameterError("name", path, f"{path!r} is not a readable CSV file ({err})") from None
    if header is None:
        raise ParameterError("name", path, f"{path!r} holds no questions")
    return header


def read_mcqa_file(path: str) -> Dataset:
    """The rows of a local .json, .jsonl, .csv or .parquet file as ``datasets`` reads them (its builder for the
    extension, split "train"), columns unmapped; a CSV's cells all as text.

    Raises ParameterError naming ``name`` (``load_mcqa``'s argument) for an unknown extension, an empty file, a
    file without rows (a CSV header alone, "[]") or a file its builder cannot read (the builder's reason is in
    the message).
    """
    from datasets import load_dataset_builder

    builder_name = file_builder(path)
    if Path(path).stat().st_size == 0:
        raise ParameterError("name", path, f"{path!r} is empty")
    options = {}
    if builder_name == "csv":  # every cell as written ("0.50", "NA"), not as pandas would guess its type
        options = dict(features=Features({c: Value("string") for c in _csv_columns(path)}), keep_default_na=False)
    try:
        with _quiet_progress():
            builder = load_dataset_builder(builder_name, data_files=path, **options)
            builder.download_and_prepare()
    except StopIteration:  # the JSON builder on a file of blanks
        raise ParameterError("name", path, f"{path!r} holds no questions") from None
    except (DatasetsError, ValueError, OSError) as err:
        raise ParameterError("name", path,
                             f"{path!r} is not a readable {Path(path).suffix[1:]} file ({_first_line(err)})") from None
    if not builder.info.splits or not builder.info.splits["train"].num_examples:
        header_only = " (only a header)" if builder_name == "csv" else ""
        raise ParameterError("name", path, f"{path!r} holds no questions{header_only}")
    return builder.as_dataset(split="train")


def read_mcqa_hub(hub_id: str, *, dataset_config: str | None = None, split: str | None = None) -> tuple[Dataset, str]:
    """(rows of one split of a Hub dataset, the split's name), columns unmapped. ``split`` None: "test" when the
    dataset has it, else its only split. Call it online only (``_offline.hub_available``).

    Raises ParameterError naming ``name`` when the Hub cannot give the dataset (not found, gated, a
    configuration to choose: the Hub's reason is in the message) and ``split`` for a split it lacks.
    """
    from datasets import get_dataset_split_names, load_dataset

    try:
        splits = get_dataset_split_names(hub_id, dataset_config)
    except (DatasetsError, ValueError, OSError) as err:
        raise ParameterError("name", hub_id, f"{hub_id!r} cannot be read from the Hub ({_first_line(err)})") from None
    if split is None:
        split = "test" if "test" in splits else splits[0] if len(splits) == 1 else None
        if split is None:
            raise ParameterError("split", None, f"{hub_id!r} has the splits {', '.join(splits)} and none is 'test'; "
                                 "choose one")
    if split not in splits:
        raise ParameterError("split", split, f"{hub_id!r} has no split {split!r}; its splits are {', '.join(splits)}")
    try:
        return load_dataset(hub_id, dataset_config, split=split), split
    except (DatasetsError, ValueError, OSError) as err:
        raise ParameterError("name", hub_id, f"{hub_id!r} cannot be read from the Hub ({_first_line(err)})") from None
