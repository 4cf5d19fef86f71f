"""The row schemas every loader returns (a module of its own so the readers of named sets and of the user's
own files share them without importing each other)."""

from datasets import Features, Sequence, Value

MCQA_FEATURES = Features(
    {
        "question": Value("string"),
        "choices": Sequence(Value("string")),
        "answer": Value("int64"),
        "subject": Value("string"),
        "source": Value("string"),
    }
)
OPEN_QA_FEATURES = Features(
    {
        "question": Value("string"),
        "answer": Value("string"),
        "final_answer": Value("string"),
        "subject": Value("string"),
        "source": Value("string"),
    }
)
OPTION_LETTERS = "ABCDEFGHIJ"
"""The option letters a prompt can show (2 to 10 options; ``modeling.prompts`` uses the same ten)."""
