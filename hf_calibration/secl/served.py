"""The multiple-choice confidence signals read through a ``ScoringBackend`` (a model in process or behind a server).

``mcqa_signals_with`` computes what ``confidence.mcqa_signals`` computes (option probability, P(True),
P(True)Norm, verbalized, DINCO-style) from the same token ids: every prompt is the MCQA prompt followed by the
follow-up turn's ids, concatenated without re-tokenising, and each read asks the backend for the next-token
log-probabilities of exactly the tokens the signal reads (option letters, Yes/No, the digits, "0" after "1")
plus the most likely token (the greedy verbalized number). ``TokenLogprobs.dense`` places them in a row that the
shared ``verbalized_from_logprobs`` / ``p_true_from_logprobs`` read as they read a full log-softmax row.

No key/value cache is shared (a server keeps its own prefix cache), so ``forward_passes`` counts the same
logical reads and ``seconds`` the wall time through the backend.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from hf_calibration.errors import renamed_parameters
from hf_calibration.modeling.prompts import LETTERS, build_mcqa_prompt, option_token_ids
from hf_calibration.secl.confidence import (CONFIDENCE_TEMPLATE, DEFAULT_TAU_N, P_TRUE_TEMPLATE,
                                            PLAIN_CONFIDENCE_PREFIX, PLAIN_P_TRUE_PREFIX, ConfidenceTokens,
                                            MCQASignals, assistant_answer_ids, dinco_score, followup_ids,
                                            mcqa_answer_text, norm_p_true, p_true_from_logprobs,
                                            verbalized_from_logprobs)


def _read_ids(tokens: ConfidenceTokens, variants) -> list[int]:
    ids = [t for v in variants for t in v] + [t for v in tokens.digits for t in v]
    ids += list(tokens.ten) + list(tokens.zero_after_one) + list(tokens.yes) + list(tokens.no)
    return list(dict.fromkeys(ids))


def _followup(tokenizer, letter: str, text: str, fmt: str, prefix: str) -> list[int]:
    return assistant_answer_ids(tokenizer, letter, fmt) + followup_ids(tokenizer, text, prompt_format=fmt,
                                                                       plain_prefix=prefix)


def _question_prompts(tokenizer, row, fmt, templates):
    """The MCQA prompt's ids and the K P(True) follow-up prompts (the verbalized ones need the prediction)."""
    prompt = tokenizer.encode(build_mcqa_prompt(tokenizer, row["question"], row["choices"], prompt_format=fmt),
                              add_special_tokens=False)
    answers = [mcqa_answer_text(LETTERS[j], row["choices"][j]) for j in range(len(row["choices"]))]
    p_true = [prompt + _followup(tokenizer, LETTERS[j], templates[1].replace("{answer}", answers[j]), fmt,
                                 PLAIN_P_TRUE_PREFIX) for j in range(len(answers))]
    return prompt, answers, p_true


def _read(backend, prompts, ids, checkpoint, what: str):
    """``backend.next_token_logprobs(prompts, ids)``, each prompt kept in ``checkpoint`` when there is one."""
    if checkpoint is None:
        return backend.next_token_logprobs(prompts, ids)
    from hf_calibration.modeling.backends.checkpoint import next_token_logprobs_kept

    return next_token_logprobs_kept(backend, prompts, ids, checkpoint, what=what)


def mcqa_signals_with(backend, tokenizer, dataset, *, tau_n: float = DEFAULT_TAU_N, prompt_format: str = "auto",
                      confidence_template: str = CONFIDENCE_TEMPLATE, p_true_template: str = P_TRUE_TEMPLATE,
                      progress: bool = True, checkpoint=None) -> MCQASignals:
    """``confidence.mcqa_signals`` through ``backend`` (module docstring); same returns, same errors. All prompts of
    a pass are sent together (the backend runs them concurrently) and checked against its context first.
    ``checkpoint`` : optional ``ScoreCheckpoint`` keeping each read of the three passes as it arrives (the reads
    it holds are not sent again: ``modeling.backends.checkpoint``)."""
    from hf_calibration.secl.confidence import check_signal_inputs

    rows, tokens, fmt = check_signal_inputs(tokenizer, dataset, tau_n=tau_n, prompt_format=prompt_format,
                                            confidence_template=confidence_template, p_true_template=p_true_template)
    k_max, n = max(len(r["choices"]) for r in rows), len(rows)
    variants = option_token_ids(tokenizer, k_max)
    ids = _read_ids(tokens, variants)
    vocab = backend.vocab_size
    built = [_question_prompts(tokenizer, r, fmt, (confidence_template, p_true_template)) for r in rows]
    backend.check_lengths([p for b in built for p in [b[0], *b[2]]], extra=1)
    t0 = time.perf_counter()
    first = _read(backend, [b[0] for b in built], ids, checkpoint, "option reads").dense(ids, vocab)
    option_probs, option_mass = np.zeros((n, k_max)), np.zeros(n)
    for i, row in enumerate(rows):
        k = len(row["choices"])
        letter_lp = torch.stack([torch.logsumexp(first[i, list(v)], dim=0) for v in variants[:k]])
        option_probs[i, :k] = torch.softmax(letter_lp, dim=0).numpy()
        option_mass[i] = float(torch.exp(torch.logsumexp(letter_lp, dim=0)))
    prediction = option_probs.argmax(axis=1)
    t1 = time.perf_counter()
    flat = [p for b in built for p in b[2]]
    lp_true = _read(backend, flat, ids, checkpoint, "P(True) reads (after all option reads)").dense(ids, vocab)
    p, m = p_true_from_logprobs(lp_true, tokens)
    pt, pt_mass = np.full((n, k_max), np.nan), np.full((n, k_max), np.nan)
    at = 0
    for i, row in enumerate(rows):
        k = len(row["choices"])
        pt[i, :k], pt_mass[i, :k] = p[at:at + k].numpy(), m[at:at + k]
        at += k
    t2 = time.perf_counter()
    verbal = [b[0] + _followup(tokenizer, LETTERS[prediction[i]], confidence_template.replace(
        "{answer}", b[1][prediction[i]]), fmt, PLAIN_CONFIDENCE_PREFIX) for i, b in enumerate(built)]
    reads = verbal + ([v + [tokens.digits[1][0]] for v in verbal] if tokens.two_step else [])
    backend.check_lengths(reads, extra=1)
    lp_v = _read(backend, reads, ids, checkpoint, "verbalized reads (after all option and P(True) reads)"
                 ).dense(ids, vocab)
    verb, greedy, verb_mass = verbalized_from_logprobs(lp_v[:n], tokens, lp_v[n:] if tokens.two_step else None)
    t3 = time.perf_counter()
    return _signals(rows, option_probs, option_mass, prediction, pt, pt_mass, verb.numpy().astype(np.float64),
                    greedy, verb_mass, tokens, fmt, tau_n, (t1 - t0, t2 - t1, t3 - t2))


def _signals(rows, option_probs, option_mass, prediction, pt, pt_mass, verb, greedy, verb_mass, tokens, fmt, tau_n,
             times) -> MCQASignals:
    """``MCQASignals`` as ``confidence.mcqa_signals`` assembles it."""
    n = len(rows)
    labels = np.array([int(r["answer"]) for r in rows])
    norm = norm_p_true(pt, tau=tau_n)
    idx = np.arange(n)
    n_opts = np.array([len(r["choices"]) for r in rows])
    s_opt, s_pt, s_verb = (t / n for t in times)
    return MCQASignals(
        option_probs=option_probs, prediction=prediction, labels=labels, correct=prediction == labels,
        confidence={"option_probability": option_probs[idx, prediction], "p_true": pt[idx, prediction],
                    "norm_p_true": norm[idx, prediction], "verbalized": verb,
                    "dinco": dinco_score(pt, prediction, option_probs[idx, prediction])},
        p_true_options=pt, norm_p_true_options=norm, verbalized_greedy=greedy,
        mass={"option_probability": option_mass, "p_true": pt_mass[idx, prediction],
              "norm_p_true": np.nanmean(pt_mass, axis=1), "verbalized": verb_mass,
              "dinco": np.nanmean(pt_mass, axis=1)},
        forward_passes={"option_probability": 1.0, "p_true": 2.0, "norm_p_true": float(1 + n_opts.mean()),
                        "verbalized": float(3 if tokens.two_step else 2), "dinco": float(1 + n_opts.mean())},
        seconds={"option_probability": s_opt, "p_true": s_opt + s_pt / n_opts.mean(), "norm_p_true": s_opt + s_pt,
                 "verbalized": s_opt + s_verb, "dinco": s_opt + s_pt},
        prompt_format=fmt, tau_n=float(tau_n))


def diagnose_served(config, dataset, run: dict, *, progress: bool = True, checkpoint=None,
                    **ece) -> tuple[dict, MCQASignals]:
    """``secl.diagnose.diagnose`` through the server a diagnose job's config names (``backend`` openai,
    ``base_url``, ``served_model``); records the server (and its engine and read path) in ``run``. The server is checked before any question;
    each read is kept in ``checkpoint`` (a ``ScoreCheckpoint``) when given."""
    from hf_calibration.modeling.backends import open_server_backend
    from hf_calibration.secl.diagnose import summarize

    start = time.perf_counter()
    tokenizer, backend = open_server_backend(config.model, config.base_url, config.served_model,
                                             max_in_flight=config.batch_size)
    run.update(backend="openai", base_url=config.base_url, served_model=config.served_model or config.model,
               load_seconds=round(time.perf_counter() - start, 1))
    if getattr(backend, "capabilities", None) is not None:  # engine and read path (engines.Capabilities)
        run["server"] = backend.capabilities.record()
    try:
        with renamed_parameters(prompts="dataset"):  # a question longer than the server's context
            signals = mcqa_signals_with(backend, tokenizer, dataset, tau_n=config.tau_n,
                                        prompt_format=config.prompt_format, progress=progress,
                                        checkpoint=checkpoint)
    finally:
        backend.close()
    return summarize(signals, n_resamples=config.n_resamples, seed=config.seed, **ece), signals
