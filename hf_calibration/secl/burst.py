"""SECL's burst: the pseudo-label c* = P(True)Norm of an answer against its distractors, the bin gate and the
update steps on the directional target (docs/methods.md, "SECL: P(True)Norm", "SECL: bin gate", "SECL:
directional target"; Hedna et al. 2026, arXiv 2604.09624).

``SECLBurstMixin`` holds the burst's model reads and training on a ``SECLModel`` (``mixin.py``): the pseudo-label
(``secl_pseudo_label``), the update steps (``secl_update``) and the consolidation (``secl_consolidation``). The
decisions around them (the bin gate, the replay buffer, the counters) are ``secl.step.secl_step``'s.
"""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np
import torch

from hf_calibration.metrics.binning import uniform_bin_index
from hf_calibration.modeling.prompts import LETTERS, first_option_letter
from hf_calibration.secl.confidence import (
    PLAIN_P_TRUE_PREFIX,
    assistant_answer_ids,
    cache_row,
    mcqa_answer_text,
    norm_p_true,
    p_true_from_logprobs,
)
from hf_calibration.secl.replay import ReplayItem, consolidate, update_steps


def confidence_bin(c: float, n_bins: int) -> int:
    """Equal-width bin of c in [0, 1], by :func:`hf_calibration.metrics.uniform_bin_index` (edges k/B as
    in ECE and the reliability diagram; 1.0 belongs to the last bin). Raises ValueError for NaN."""
    # the verbalized confidence is a float32 weighted sum, which can overshoot 1 by a rounding error
    return int(uniform_bin_index(min(max(c, 0.0), 1.0), n_bins))


def same_option(answer: str, distractor: str) -> bool:
    """Whether ``distractor`` names the option ``answer`` already chose, so it is not its own alternative.

    Equal texts (case and surrounding space ignored), or a one-letter distractor ("A") equal to the first
    standalone option letter A–J in the answer's first 40 characters ("A", "A. Paris", "The answer is A"),
    the rule ``modeling.streams.judge`` grades answers by.
    """
    a, d = answer.strip(), distractor.strip()
    if a.lower() == d.lower():
        return True
    return len(d) == 1 and d.upper() in LETTERS and first_option_letter(a) == d.upper()


def bin_gate_passes(c: float, c_star: float, *, n_bins: int, width: int) -> bool:
    """True when the update should run: |bin(c) − bin(c*)| > width (docs/methods.md, "SECL: bin gate")."""
    return abs(confidence_bin(c, n_bins) - confidence_bin(c_star, n_bins)) > width


class SECLBurstMixin:
    """The burst of ``SECLGenerationMixin``: pseudo-labels, the bin gate and the update steps (module docstring)."""

    def secl_pseudo_label(self, prompt, answer_ids, distractors=None, *, choices=None, prompt_cache=None) -> dict:
        """SECL's pseudo-label for one answer, without touching the adapter or the gate. In the "confidence"
        scope it is read with the adapter off: the base model's P(True)Norm, however the adapter has moved.

        prompt, answer_ids : token ids (the answer without its end-of-turn token). distractors : list of
        alternative answers (str), shown as they are. choices : the MCQA option texts in letter order: the
        answer's option (the first option letter it names) and up to K others, each shown as "<letter>. <text>"
        as ``diagnose`` shows them (``confidence.mcqa_answer_text``). Neither → K deduplicated beam-search
        alternatives.
        Returns {"p_true": (1 + k,) P(True) of the answer then the k distractors, "norm_p_true": c*,
        "n_distractors": k, "forward_passes": reads (+ beams)}. ValueError for both distractors and choices,
        or a number of choices outside 2..10.

        prompt_cache : optional cache (batch 1) whose first ``len(prompt)`` positions hold ``prompt`` run as the
            teacher reads it (adapter off; e.g. ``generate``'s returned ``cache`` for a batch of one unpadded
            prompt, while the adapter is the identity or in the "confidence" scope); the prompt is then not run
            again (the P(True) reads continue it). Not modified. ValueError if it holds fewer positions.
        """
        context = None
        if prompt_cache is not None:
            if prompt_cache.get_seq_length() < len(prompt):
                raise ValueError(f"prompt_cache: holds {prompt_cache.get_seq_length()} positions, the prompt has "
                                 f"{len(prompt)}")
            context = (cache_row(prompt_cache, 0, len(prompt)), torch.ones(len(prompt), dtype=torch.long))
        return self._secl_label(prompt, answer_ids, distractors, choices, context)

    def _secl_label(self, prompt, answer_ids, distractors, choices, prompt_context=None) -> dict:
        """``secl_pseudo_label``; prompt_context : (cache, mask) of the prompt computed as the teacher reads it
        (``generate``'s in the "confidence" scope), so the prompt is not run again."""
        if choices is not None and distractors is not None:
            raise ValueError("choices: the options are the distractors; pass choices or distractors, not both")
        if choices is not None and not 2 <= len(choices) <= len(LETTERS):
            raise ValueError(f"choices: need 2 to {len(LETTERS)} options, got {len(choices)}")
        cfg = self.secl_config
        was_training = self.training
        self.eval()
        with torch.no_grad(), self._secl_base():
            candidates, passes = self.secl_candidates(list(prompt), list(answer_ids), distractors, choices)
            conts = [self.secl_followup(ids, text, cfg.p_true_template, PLAIN_P_TRUE_PREFIX) for ids, text in candidates]
            # all candidates in one forward pass, on the prompt's cache (run here when none is given)
            lp, _ = self.secl_reads([list(prompt)], None if prompt_context is None else [prompt_context],
                                    batch_size=len(conts)).rows([conts])
            pt, _ = p_true_from_logprobs(lp, self.secl_tokens)
        if was_training:
            self.train()
        pt = pt.cpu().numpy().astype(np.float64)
        return {"p_true": pt, "norm_p_true": float(norm_p_true(pt[None], tau=cfg.tau_n)[0, 0]),
                "n_distractors": len(candidates) - 1, "forward_passes": passes + len(conts)}

    def secl_candidates(self, prompt, answer_ids, distractors, choices) -> tuple[list, int]:
        """The answer then its distractors as (assistant turn ids, text restated in the P(True) turn), and the
        forward passes spent finding them (the beam search)."""
        cfg, tok, fmt = self.secl_config, self.secl_tokenizer, self.secl_prompt_format
        k, own = cfg.num_distractors, self.secl_answer_text(answer_ids)
        if choices is not None:
            # as diagnose asks (confidence.mcqa_signals): the letter is the turn, "<letter>. <text>" is asked about
            chosen, own = self.secl_option(own, choices)
            others = [j for j in range(len(choices)) if j != chosen][:k]
            return [(answer_ids, own)] + [(assistant_answer_ids(tok, LETTERS[j], fmt),
                                           mcqa_answer_text(LETTERS[j], choices[j], cfg.answer_max_chars))
                                          for j in others], 0
        if distractors is None:
            alt_ids, passes = self._secl_alternatives(prompt, answer_ids)
            return [(answer_ids, own)] + [(a, self.secl_answer_text(a)) for a in alt_ids], passes
        alts = [d for d in dict.fromkeys(distractors) if not same_option(own, d)][:k]
        return [(answer_ids, own)] + [(assistant_answer_ids(tok, d, fmt), d) for d in alts], 0

    @contextlib.contextmanager
    def secl_training(self, state=None):
        """The AdamW of ``state`` (a ``secl.state.SECLState``; default the model's own ``secl_state``) over the
        adapter's LoRA weights, with the model in train mode; on leaving, also on an error, the gradients are dropped
        and the model is back in eval mode (where every SECL read runs)."""
        opt = (state or self.secl_state).optimizer(self.secl_adapter_params())
        self.train()
        try:
            yield opt
        finally:
            opt.zero_grad(set_to_none=True)
            self.eval()

    def secl_update(self, item: ReplayItem, buffer, *, state=None) -> tuple[int, list]:
        """``steps_per_update`` steps on ``item`` (its ``target`` set) with minibatches drawn from ``buffer`` (a
        ``secl.replay.ReplayBuffer`` of earlier burst questions; ``secl.replay.update_steps``) and the AdamW of
        ``state`` (default the model's own), then ``item`` joins the buffer with its target recomputed later.
        Returns (forward passes, the stream indices replayed at each step)."""
        cfg = self.secl_config
        with self.secl_training(state) as opt:
            steps, replayed = update_steps(self, item, buffer, opt, steps=cfg.steps_per_update,
                                           alpha_step=cfg.alpha_step, delta=cfg.delta, loss=cfg.confidence_loss)
        buffer.add(dataclasses.replace(item, target=None))
        return steps, replayed

    def secl_consolidation(self, buffer, *, burst: int, state=None) -> dict:
        """``consolidation_epochs`` over ``buffer`` (a ``secl.replay.ReplayBuffer``) in minibatches of
        ``consolidation_batch_size`` (``secl.replay.consolidate``, seeded by the burst's number ``burst``) with the
        AdamW of ``state`` (default the model's own). Returns {questions, steps, forward_passes}."""
        cfg = self.secl_config
        with self.secl_training(state) as opt:
            passes, steps = consolidate(self, buffer, opt, epochs=cfg.consolidation_epochs,
                                        batch_size=cfg.consolidation_batch_size, alpha_step=cfg.alpha_step,
                                        delta=cfg.delta, seed=burst, lr_scheduler=cfg.consolidation_lr_scheduler,
                                        loss=cfg.confidence_loss)
        return {"questions": len(buffer), "steps": steps, "forward_passes": passes}
