"""``ModelReads``: the reads and training one SECL step asks for (``secl.step.SECLReads``), in process on a
``SECLModel``. Every read goes through the in-process ``TransformersBackend`` (``SECLGenerationMixin.secl_reads``:
its ``CachedPrefixReads``), started from ``generate``'s key/value cache of the prompt and the answer
(``secl_verbalized`` / ``secl_answer_context`` / ``secl_pseudo_label`` build the follow-ups), so outside a burst a
question costs one forward pass over the follow-up turn; the update steps' read is the same cached read with
gradients. The served counterpart, through an
``OpenAICompatibleBackend``, is ``secl.service.ServedReads``.
"""

from __future__ import annotations

import torch

from hf_calibration.secl.replay import item_confidence
from hf_calibration.secl.step import SECLReads


class ModelReads(SECLReads):
    """``secl.step.SECLReads`` in process, on a ``SECLModel``, for one question: the cached reads.

    context : the (cache, prefix mask, cached answer tokens) of the prompt and the answer (``generate``'s, made
    whole by ``secl_answer_context`` in the "confidence" scope): the confidence follow-up runs on it (no prompt or
    answer token again), and in the "confidence" scope the update steps and the replayed reads too. prompt_context
    : (cache, mask) of the prompt as the teacher reads it ("confidence" scope), on which the P(True) candidates run.
    The update steps train the model's adapter with the state's AdamW.
    """

    def __init__(self, model, context=None, prompt_context=None):
        self.model, self.context, self.prompt_context = model, context, prompt_context

    def verbalized(self, question):
        m = self.model
        with torch.no_grad():
            conf, greedy, passes = m.secl_verbalized(question.prompt, question.answer_ids, context=self.context,
                                                     restated=self.restated(question))
        return float(conf[0]), greedy, passes

    def restated(self, question):
        return self.model.secl_restated(question.answer_ids, question.choices)

    def pseudo_label(self, question):
        label = self.model._secl_label(question.prompt, question.answer_ids, question.distractors, question.choices,
                                       self.prompt_context)
        return (float(label["p_true"][0]), label["norm_p_true"], label["n_distractors"], label["forward_passes"])

    def replay_context(self, question):
        # "all": an update changes the adapter under generate's cache, so the steps run everything again
        return self.context if self.model.secl_config.adapter_scope == "confidence" else None

    def update(self, state, item):
        return self.model.secl_update(item, state.replay, state=state)

    def confidence_after(self, state, item):
        with torch.no_grad():  # for the record only: not part of SECL's cost
            return float(item_confidence(self.model, item)[0][0])

    def consolidate(self, state):
        return self.model.secl_consolidation(state.replay, burst=state.counters["bursts"], state=state)
