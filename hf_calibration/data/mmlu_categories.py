"""MMLU subject → category table of the MMLU authors (Hendrycks et al. 2021, ``categories.py``).

Each of the 57 subjects maps to a subcategory, and each subcategory to one of the four categories
``stem``, ``humanities``, ``social_sciences`` and ``other`` (the subject groups of our evaluation protocol).
"""

SUBCATEGORIES = {
    "abstract_algebra": "math",
    "anatomy": "health",
    "astronomy": "physics",
    "business_ethics": "business",
    "clinical_knowledge": "health",
    "college_biology": "biology",
    "college_chemistry": "chemistry",
    "college_computer_science": "computer science",
    "college_mathematics": "math",
    "college_medicine": "health",
    "college_physics": "physics",
    "computer_security": "computer science",
    "conceptual_physics": "physics",
    "econometrics": "economics",
    "electrical_engineering": "engineering",
    "elementary_mathematics": "math",
    "formal_logic": "philosophy",
    "global_facts": "other",
    "high_school_biology": "biology",
    "high_school_chemistry": "chemistry",
    "high_school_computer_science": "computer science",
    "high_school_european_history": "history",
    "high_school_geography": "geography",
    "high_school_government_and_politics": "politics",
    "high_school_macroeconomics": "economics",
    "high_school_mathematics": "math",
    "high_school_microeconomics": "economics",
    "high_school_physics": "physics",
    "high_school_psychology": "psychology",
    "high_school_statistics": "math",
    "high_school_us_history": "history",
    "high_school_world_history": "history",
    "human_aging": "health",
    "human_sexuality": "culture",
    "international_law": "law",
    "jurisprudence": "law",
    "logical_fallacies": "philosophy",
    "machine_learning": "computer science",
    "management": "business",
    "marketing": "business",
    "medical_genetics": "health",
    "miscellaneous": "other",
    "moral_disputes": "philosophy",
    "moral_scenarios": "philosophy",
    "nutrition": "health",
    "philosophy": "philosophy",
    "prehistory": "history",
    "professional_accounting": "other",
    "professional_law": "law",
    "professional_medicine": "health",
    "professional_psychology": "psychology",
    "public_relations": "politics",
    "security_studies": "politics",
    "sociology": "culture",
    "us_foreign_policy": "politics",
    "virology": "health",
    "world_religions": "philosophy",
}

_CATEGORY_OF_SUBCATEGORY = {
    "stem": ("physics", "chemistry", "biology", "computer science", "math", "engineering"),
    "humanities": ("history", "philosophy", "law"),
    "social_sciences": ("politics", "culture", "economics", "geography", "psychology"),
    "other": ("other", "business", "health"),
}

CATEGORIES = {
    category: tuple(s for s, sub in SUBCATEGORIES.items() if sub in subs)
    for category, subs in _CATEGORY_OF_SUBCATEGORY.items()
}
