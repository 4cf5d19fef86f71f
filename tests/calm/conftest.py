import pytest
from datasets import Dataset

from hf_calibration.calm import mcqa_to_prompt_completion

WORDS = "the a of and to in is was for on that with as by it at from this be are".split()


@pytest.fixture()
def mcqa_data(tiny_tokenizer):
    rows = [
        {"question": f"which option is correct ? {w}", "choices": ["the", "a", "of", "and"], "answer": i % 4,
         "subject": "x", "source": "tiny"}
        for i, w in enumerate(WORDS[:16])
    ]
    data = mcqa_to_prompt_completion(Dataset.from_list(rows), tiny_tokenizer)
    return data, data.remove_columns("completion")
