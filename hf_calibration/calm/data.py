"""MCQA rows (``hf_calibration.data`` schema) → prompt/completion rows for ``CALMTrainer``."""

from __future__ import annotations

from hf_calibration.modeling.prompts import LETTERS, build_mcqa_prompt, option_token_ids, resolve_prompt_format


def mcqa_to_prompt_completion(dataset, tokenizer, *, prompt_format: str = "auto"):
    """Add ``prompt`` (the scoring prompt of ``build_mcqa_prompt``) and ``completion`` (the gold letter).

    The completion is the letter variant that is a single token and follows the prompt the way
    ``score_mcqa`` reads it: "A" after a chat prompt (which ends with the assistant header), " A"
    after a plain prompt ending in "Answer:" (the first of the two that tokenizes to one token).
    The other columns are kept, so ``answer`` stays available for evaluation.

    Parameters
    ----------
    dataset : datasets.Dataset with question, choices, answer (int in [0, len(choices)))
    prompt_format : {"auto", "chat", "plain"}

    Raises ValueError for an answer index outside the choices.
    """
    fmt = resolve_prompt_format(tokenizer, prompt_format)
    k = max(len(c) for c in dataset["choices"])
    variants = option_token_ids(tokenizer, k)
    order = ["{}", " {}"] if fmt == "chat" else [" {}", "{}"]

    def letter_text(j):
        for pattern in order:
            text = pattern.format(LETTERS[j])
            if tokenizer.encode(text, add_special_tokens=False) in ([t] for t in variants[j]):
                return text
        return LETTERS[j]

    texts = [letter_text(j) for j in range(k)]

    def convert(row, idx):
        if not 0 <= row["answer"] < len(row["choices"]):
            raise ValueError(f"dataset: row {idx} has answer {row['answer']!r} outside its {len(row['choices'])} choices")
        return {
            "prompt": build_mcqa_prompt(tokenizer, row["question"], row["choices"], prompt_format=fmt),
            "completion": texts[row["answer"]],
        }

    return dataset.map(convert, with_indices=True)
