"""A planted signal SECL must learn (issue 51 item 6): a change that breaks learning fails here, not only in a
three-hour study.

A synthetic two-option stream on the tiny random model: the answer is forced to "A", and whether it is right is
planted in option A's word (one of six "right" words or six "wrong" ones). A perfect teacher replaces P(True)Norm
(c* = 1 for a right answer, 0 for a wrong one; ``_secl_label``, the one home of SECL's pseudo-label, patched on the
instance). One burst over the training questions (public API: ``apply_secl``, ``SECLConfig``, ``start_burst``,
``generate``), then the student's verbalized read on held-out questions — other question words and other second
options, no step trained on them — must rank the right answers above the wrong ones.

The bar is derived, not measured. The held-out answers share the twelve option-A words, so a read with no signal
that depends on the word alone still ranks the words in some order; the null is therefore a permutation of which
six words are "right" (all C(12, 6) = 924 assignments, equally likely without signal). The test passes only when
the read's AUROC under the planted assignment is reached or beaten by at most ``FALSE_PASS`` = 1 % of them, so a
read without the planted signal passes with probability at most 1 % (the smallest attainable is 1/924). The same
held-out questions read before the burst must not pass it (the planted signal is what is learnt, not something
the random model already had).
"""

import copy
import itertools

import numpy as np
import torch

from hf_calibration.metrics import confidence_auroc
from hf_calibration.secl import SECLConfig, apply_secl

RIGHT = ["magazine", "city", "office", "company", "number", "fiber"]
WRONG = ["hotel", "family", "eggs", "day", "bolts", "white"]
TRAIN_WORDS = ["the", "of", "and", "to", "in", "is"]
HELD_OUT_WORDS = ["for", "on", "that", "with", "as", "by"]
SECOND = {"train": ["head", "started"], "held_out": ["blue", "total"]}
FALSE_PASS = 0.01


def _questions(words, seconds, seed):
    """Every (option-A word, question word, second option) of the split, shuffled: (text, option texts, right)."""
    rows = [(f"which option is correct ? {q} A. {a} B. {s}", [a, s], a in RIGHT)
            for a, q, s in itertools.product(RIGHT + WRONG, words, seconds)]
    order = np.random.default_rng(seed).permutation(len(rows))
    return [rows[i] for i in order]


def _encode(tokenizer, text):
    chat = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                         add_generation_prompt=True)
    return tokenizer([chat], return_tensors="pt", add_special_tokens=False)


def _read(model, tokenizer, question, *, update):
    """SECL's returned confidence for one question whose answer is forced to "A"."""
    a = tokenizer.convert_tokens_to_ids("A")
    out = model.generate(**_encode(tokenizer, question[0]), max_new_tokens=1, do_sample=False,
                         return_dict_in_generate=True, prefix_allowed_tokens_fn=lambda batch, ids: [a],
                         secl_choices=[question[1]], secl_update=update)
    return float(out.confidences[0])


def _null_share(words, conf) -> float:
    """Share of the C(12, 6) assignments of "right" to six option-A words whose item-level AUROC reaches the
    planted assignment's (exact permutation p-value; module docstring)."""
    conf = np.asarray(conf)
    planted = confidence_auroc(np.array([w in RIGHT for w in words]), conf)
    every = [confidence_auroc(np.array([w in combo for w in words]), conf)
             for combo in map(set, itertools.combinations(RIGHT + WRONG, len(RIGHT)))]
    return float(np.mean(np.array(every) >= planted - 1e-12))


def test_the_student_learns_a_planted_ranking_from_one_burst(tiny_model, tiny_tokenizer):
    train = _questions(TRAIN_WORDS, SECOND["train"], seed=0)[:48]
    held_out = _questions(HELD_OUT_WORDS, SECOND["held_out"], seed=1)[:40]
    y = np.array([right for _, _, right in held_out])
    words = [choices[0] for _, choices, _ in held_out]
    assert set(words) == set(RIGHT + WRONG)  # every word is held out at least once

    torch.manual_seed(0)
    config = SECLConfig(burst_size=len(train), restate="option_text", bin_gate_width=0, learning_rate=1e-2,
                        replay_size=len(train), replay_batch_size=4)
    secl = apply_secl(copy.deepcopy(tiny_model), tiny_tokenizer, config)
    planted = {}

    def perfect_teacher(prompt, answer_ids, distractors, choices, prompt_context=None):
        c = planted[tuple(prompt)]
        return {"p_true": np.array([c, 1.0 - c]), "norm_p_true": c, "n_distractors": 1, "forward_passes": 0}

    secl._secl_label = perfect_teacher
    for text, _, right in train:
        planted[tuple(_encode(tiny_tokenizer, text)["input_ids"][0].tolist())] = float(right)

    before = [_read(secl, tiny_tokenizer, q, update=False) for q in held_out]
    assert _null_share(words, before) > FALSE_PASS, \
        f"the random model already ranks the held-out answers (AUROC {confidence_auroc(y, np.array(before)):.3f})"
    secl.start_burst()
    updated = 0
    for q in train:
        _read(secl, tiny_tokenizer, q, update=True)
        updated += bool(secl.secl_records[0].updated)
    assert updated == len(train)  # c* is 0 or 1, the read near 0.5: the bin gate (width 0) passes every question
    after = [_read(secl, tiny_tokenizer, q, update=False) for q in held_out]
    auroc = confidence_auroc(y, np.array(after))
    assert _null_share(words, after) <= FALSE_PASS, \
        f"held-out AUROC after the burst {auroc:.3f}: a read without the planted signal reaches it more often than {FALSE_PASS}"
