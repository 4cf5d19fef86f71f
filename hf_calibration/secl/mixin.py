"""``SECLGenerationMixin``: label-free test-time calibration of the verbalized confidence (docs/methods.md, "SECL"; Hedna et al. 2026).

``apply_secl(model, tokenizer, config)`` (or ``SECLModel.wrap``) puts a LoRA adapter on the query and
value projections of the upper layers with ``peft.get_peft_model`` and returns a ``SECLModel``: the
``peft.PeftModel`` (which owns the adapter, its layout on disk and its loading) plus SECL's state.
``SECLModel(SECLGenerationMixin, AdaptedModel)``: the mixin precedes the class whose ``generate`` is the
PeftModel's plain generation, so SECL's ``generate`` runs first and reaches it through ``super()``; every
other call and attribute goes to the adapted transformers model, so the SECL model is used like the
original. Each prompt of a (batched) ``generate`` call is one item of the stream:

1. the answer is generated as usual; its mean token entropy updates the entropy gate (``drift.py``);
   its verbalized confidence c is read in a follow-up turn (``confidence.py``) that restates the decoded
   answer, or with ``restate="option_text"`` the chosen option as "A. <option text>";
2. an alarm opens a burst of ``burst_size`` questions; outside bursts nothing else happens;
3. inside a burst: P(True) of the answer and of K distractors (``secl_choices=`` per prompt: the MCQA
   options, each shown as "B. <option text>"; ``secl_distractors=``: alternative answers as text; otherwise
   K deduplicated beam-search alternatives) gives the pseudo-label c* = P(True)Norm; when bin(c) and
   bin(c*) differ by more than ``bin_gate_width`` the adapters take ``steps_per_update`` AdamW steps on
   MSE(c, ĉ), ĉ = c + α_step·clip(c* − c, −δ, δ) (detached); with ``replay_size`` > 0 each step is on a
   minibatch with earlier questions of the burst (``replay.py``); with ``burst_confidence="teacher"`` the
   confidence returned for a burst question is c* (its verbalized read still trains).

Where the adapter acts (``SECLConfig.adapter_scope``). "confidence" (the default; docs/methods.md, "SECL: product defaults"):
the answer, its beam-search alternatives and the teacher's P(True) reads run with the adapter off (PEFT's
``disable_adapter()``); only the follow-up turn that reads c runs with it on, over the key/value cache of
the prompt and the answer computed with it off, and the update steps train exactly that read. So the
answers are the base model's token for token, and c* is the base model's P(True)Norm however far the
adapter has moved. "all" (the paper): the adapter is on for everything, and an update step backpropagates
through the whole conversation.

Adapters accumulate over the stream; ``reset_calibration()`` restores the identity adapter (B = 0, A as
when the SECL model was built). Counters (``secl_counters``) and per-item records of the last call
(``secl_records``) are kept. ``save_pretrained`` writes PEFT's adapter folder (``PeftModel.save_pretrained``,
readable by ``peft.PeftModel.from_pretrained``) with ``secl_config.json`` and ``secl_state.json`` beside it
(``hf_calibration.integrations.hub.save_artifact``).

Forward passes are counted as in ``confidence.py``: one per generation and one per next-token read
(verbalized: 1, or 2 when "10" is two tokens; P(True): one per candidate; the beam search for
alternatives: one per beam; an update step: one forward with its backward), whatever the scope. Outside
bursts the real extra work is one forward pass over the follow-up turn on ``generate``'s own cache (both
reads of a two-token "10" come from it): no prompt or answer token is run again, and for a batch of one the
cache is cropped, not copied. ``generate`` never runs the last token it produced; when the answer was cut
by ``max_new_tokens`` (not ended by an end-of-turn token) that token is run first, in the "confidence"
scope on its own with the adapter off (a one-token call, part of the same read, not counted again). In a
burst, the P(True) candidates are scored in one batched call; in the "confidence" scope on ``generate``'s
cache of the prompt (no prompt pass), and the update steps run the follow-up turn alone on the answer's cache.
Every one of these reads is the in-process backend's (``secl_reads``: ``TransformersBackend``'s
``CachedPrefixReads``, started from ``generate``'s cache); only generation runs outside it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers.generation.utils import GenerateDecoderOnlyOutput

from hf_calibration.errors import ParameterError
from hf_calibration.modeling.backends.base import CachedPrefixReads, TransformersBackend
from hf_calibration.modeling.prompts import LETTERS, first_option_letter, resolve_prompt_format
from hf_calibration.secl.adapted import AdaptedModel
from hf_calibration.secl.burst import (  # noqa: F401  (confidence_bin, same_option, bin_gate_passes: re-exported)
    SECLBurstMixin, bin_gate_passes, confidence_bin, same_option)
from hf_calibration.secl.config import SECLConfig
from hf_calibration.secl.confidence import (
    PLAIN_CONFIDENCE_PREFIX, ConfidenceTokens, cache_row, confidence_distribution, followup_ids, mcqa_answer_text,
    verbalized_from_logprobs)
from hf_calibration.secl.reads import ModelReads
from hf_calibration.secl.replay import ReplayBuffer, directional_target  # noqa: F401  (directional_target: re-exported)
from hf_calibration.secl.state import (  # noqa: F401  (COUNTERS, FORMAT_VERSION, write_secl_files: re-exported)
    COUNTERS, FORMAT_VERSION, STATE_NAME, SECLState, read_secl_state, write_secl_files)
from hf_calibration.secl.step import SECLQuestion, SECLRecord, answer_length, secl_step

# PEFT's default name: PeftModel.save_pretrained writes any other adapter into a subfolder named after it,
# which PeftModel.from_pretrained(base, folder) would not find.
ADAPTER_NAME = "default"
PAPER_URL = "https://arxiv.org/abs/2604.09624"


@dataclass
class SECLGenerateOutput(GenerateDecoderOnlyOutput):
    """``GenerateDecoderOnlyOutput`` plus ``confidences``: (batch,) confidence in [0, 1] of each answer: its
    verbalized read before any update that answer triggered (in a burst with ``burst_confidence`` "teacher": c*)."""

    confidences: torch.FloatTensor | None = None


def _decoder_layers(model) -> int:
    n = getattr(model.config, "num_hidden_layers", None)
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"model: config.num_hidden_layers must be a positive integer, got {n!r}")
    return n


def _check_targets(model, config: SECLConfig, layers: list[int]) -> None:
    names = [name for name, _ in model.named_modules()]
    missing = []
    for i in layers:
        for proj in config.target_modules:
            if not any(n.endswith(f".{proj}") and f"layers.{i}." in n for n in names):
                missing.append(f"layer {i} {proj}")
    if missing:
        raise ValueError(
            f"model: no {', '.join(config.target_modules)} projection found for {', '.join(missing[:6])}"
            f"{' …' if len(missing) > 6 else ''}; set target_modules to this architecture's names"
        )


class SECLGenerationMixin(SECLBurstMixin):
    """Overrides ``generate`` with SECL (module docstring). Build instances with ``apply_secl``.

    Placed before a class whose ``generate`` is plain generation and which holds the adapter in
    ``peft_model`` (a ``peft.PeftModel`` with one LoRA adapter, ``ADAPTER_NAME``): ``SECLModel``.
    """

    # -- set up ---------------------------------------------------------------------------------
    def _secl_setup(self, tokenizer, config: SECLConfig) -> None:
        self.secl_config = config
        self.secl_tokenizer = tokenizer
        self.secl_tokens = ConfidenceTokens.from_tokenizer(tokenizer)
        self.secl_prompt_format = resolve_prompt_format(tokenizer, config.prompt_format)
        self.secl_state = SECLState.new(config)
        self.secl_records: list[SECLRecord] = []
        # the identity adapter: LoRA's ΔW = B·A is 0 with B = 0 (a new adapter is initialised so; a loaded one keeps A)
        self.secl_set_identity(self.secl_adapter_state())

    # the stream's state, read-only views (the state is ``secl_state``; ``secl.step.secl_step`` advances it)
    @property
    def secl_gate(self):
        return self.secl_state.gate

    @property
    def secl_counters(self) -> dict:
        return self.secl_state.counters

    @property
    def secl_burst_left(self) -> int:
        return self.secl_state.burst_left

    @property
    def secl_replay(self) -> ReplayBuffer:
        return self.secl_state.replay

    def secl_set_identity(self, adapter: dict) -> None:
        """Take ``adapter`` (name → tensor, as ``secl_adapter_state``; its B is zeroed) as the identity adapter that
        ``reset_calibration`` restores, e.g. another process's, so both start from the same LoRA A."""
        self.secl_initial_adapter = {k: torch.zeros_like(v) if "lora_B" in k else v.detach().clone()
                                     for k, v in adapter.items()}

    def secl_adapter_params(self):
        """The adapter's LoRA parameters (those SECL trains), in a fixed order."""
        # by name, not requires_grad: PEFT's disable_adapter() switches requires_grad off while it is active
        return [p for n, p in self.peft_model.named_parameters() if "lora_" in n and f".{ADAPTER_NAME}." in n]

    def _secl_base(self):
        """The context in which answers, their alternatives and the teacher are computed: PEFT's
        ``disable_adapter()`` in the "confidence" scope, a no-op in the "all" scope (module docstring)."""
        if self.secl_config.adapter_scope == "confidence":
            return self.peft_model.disable_adapter()
        return contextlib.nullcontext()

    def secl_reads(self, prefixes, caches=None, *, requires_grad: bool = False, batch_size: int = 1):
        """Every model read of SECL goes through this: ``TransformersBackend(self).prefix_reads``'s cached reads
        (``modeling.backends.base.CachedPrefixReads``) after ``prefixes`` (token ids), each starting from its cache
        in ``caches`` when given (``generate``'s, or one made whole by ``secl_answer_context``), with gradients for
        the update steps' read. batch_size : follow-ups per forward pass (the P(True) candidates: all in one).
        The adapter is as the caller has it (``_secl_base`` turns it off)."""
        backend = TransformersBackend(self, batch_size=batch_size, pad_id=self.secl_tokenizer.pad_token_id or 0)
        return CachedPrefixReads(backend, prefixes, caches=caches, requires_grad=requires_grad)

    def set_secl_config(self, config: SECLConfig) -> None:
        """Use ``config`` from now on, for the model's reads and its stream's steps (``secl_state.config``); the
        state (gate, counters, buffer, optimizer) is kept. The adapter's layout (rank, layers) is not changed."""
        if not isinstance(config, SECLConfig):
            raise TypeError(f"config: must be a SECLConfig, got {type(config).__name__}")
        self.secl_config = self.secl_state.config = config

    @contextlib.contextmanager
    def secl_scope(self, scope: str | None):
        """Run the block with ``SECLConfig.adapter_scope`` = ``scope`` ("confidence" or "all"; None: unchanged), the
        model's own config restored afterwards, also on an error."""
        own = self.secl_config
        if scope is not None:
            self.set_secl_config(own.replaced(adapter_scope=scope))
        try:
            yield self
        finally:
            self.set_secl_config(own)

    def secl_adapter_state(self) -> dict:
        """The adapter's weights, keyed as PEFT saves them (name → tensor, live, not copied)."""
        from peft import get_peft_model_state_dict

        # SECL never resizes the embeddings; without False PEFT looks the base model's config up on the Hub
        # (offline: a warning the user cannot act on) to find out.
        return get_peft_model_state_dict(self.peft_model, adapter_name=ADAPTER_NAME, save_embedding_layers=False)

    def secl_set_adapter(self, adapter: dict) -> None:
        """Put ``adapter`` (name → tensor, as ``secl_adapter_state`` returns) into the model's LoRA adapter (copied)."""
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(self.peft_model, {k: v.clone() for k, v in adapter.items()},
                                  adapter_name=ADAPTER_NAME)

    def secl_optimizer(self):
        """The AdamW over the adapter's LoRA weights (the state's, ``SECLState.optimizer``; made on first use,
        dropped by ``reset_calibration``)."""
        return self.secl_state.optimizer(self.secl_adapter_params())

    def reset_calibration(self, *, counters: bool = False) -> None:
        """Restore the identity adapter exactly (B = 0, A as when the SECL model was built: PEFT's initial A
        for ``apply_secl``, the loaded A for ``SECLModel.from_pretrained``); forget the optimizer state, the gate,
        the open burst and the replay buffer (``SECLState.reset``). counters : also zero ``secl_counters`` (a new
        stream)."""
        self.secl_set_adapter(self.secl_initial_adapter)
        self.secl_state.reset(counters=counters)

    def start_burst(self) -> None:
        """Open a calibration burst now, as an alarm would (e.g. at a known domain boundary; ``SECLState.start_burst``)."""
        self.secl_state.start_burst()

    # -- the state with the adapter: the one checkpoint of a stream ---------------------------------------------------
    def secl_snapshot(self) -> dict:
        """{"adapter": the adapter's weights (CPU copies), "state": ``secl_state.state_dict()``}: everything this stream
        needs to go on exactly where it is (``load_secl_snapshot``). The stream job's checkpoint and its worker
        processes keep this; ``save_pretrained`` writes the same as files."""
        return {"adapter": {k: v.detach().cpu().clone() for k, v in self.secl_adapter_state().items()},
                "state": self.secl_state.state_dict()}

    def load_secl_snapshot(self, snapshot: dict) -> None:
        """Restore what ``secl_snapshot`` returned: the adapter's weights and the state (gate, open burst, counters,
        replay buffer, optimizer)."""
        self.secl_set_adapter(snapshot["adapter"])
        self.secl_state.load_state_dict(snapshot["state"])

    # -- saving ---------------------------------------------------------------------------------
    def save_pretrained(self, save_directory, **kwargs) -> None:
        """Write the calibrated adapter with ``PeftModel.save_pretrained`` (PEFT's adapter folder:
        ``adapter_model.safetensors`` and ``adapter_config.json``, loadable by ``peft.PeftModel.from_pretrained``
        and pushable to the Hub like any adapter) plus ``secl_config.json`` and ``secl_state.json`` (gate, open burst,
        counters, the replay buffer's questions without caches: an open burst or a "stream" replay_scope goes on
        after ``from_pretrained`` as it would have) beside it. ``kwargs`` go to ``PeftModel.save_pretrained``."""
        from hf_calibration.integrations.hub import save_artifact

        save_artifact(self.peft_model, save_directory, self._secl_save_state, **kwargs)

    def _secl_save_state(self, folder: Path) -> None:
        write_secl_files(folder, self.secl_config, self.secl_state)

    def load_calibration(self, folder) -> None:
        """Load an adapter and gate state written by ``save_pretrained`` (a local folder or a Hub repo id) into
        this SECL model.

        The adapter is read by PEFT (``PeftModel.load_adapter``). FileNotFoundError names a missing file;
        ValueError for state written by a newer release (``format_version``), before anything is loaded.
        """
        from hf_calibration.integrations.hub import ADAPTER_WEIGHTS_NAME, download_folder, load_artifact_weights

        folder = download_folder(folder, required_files=[ADAPTER_WEIGHTS_NAME, STATE_NAME])
        state = read_secl_state(folder)
        load_artifact_weights(self.peft_model, folder)
        self.secl_state.load_state_dict(state)

    def push_to_hub(self, repo_id: str, *, metrics: dict | None = None, token: str | None = None,
                    private: bool = False, base_model: str | None = None) -> str:
        """Upload the adapted adapter, the SECL config and gate state, and a model card to ``repo_id``.

        The card carries ``library_name: hf-calibration``, the base model (default: the adapter's
        ``base_model_name_or_path``), the method (SECL, arXiv 2604.09624), the SECL config and ``metrics``. Returns the
        commit URL; ValueError (before any upload) for an invalid repo id, no token, or no base model name.
        """
        from hf_calibration.integrations.hub import base_model_name, push_artifact_to_hub

        base_model = base_model or base_model_name(self.peft_model)
        if not base_model:
            raise ValueError("base_model: the model has no name_or_path; pass base_model='<hub id>'")
        usage = ("from transformers import AutoModelForCausalLM, AutoTokenizer\n"
                 "from hf_calibration.secl.mixin import SECLModel\n\n"
                 f"base = AutoModelForCausalLM.from_pretrained({base_model!r})\n"
                 f"tokenizer = AutoTokenizer.from_pretrained({base_model!r})\n"
                 f"model = SECLModel.from_pretrained(base, tokenizer, {repo_id!r})")
        return push_artifact_to_hub(self, repo_id, base_model=base_model, method="SECL", paper_url=PAPER_URL,
                                    config=self.secl_config.to_dict(), metrics=metrics, token=token,
                                    private=private, tags=["test-time-calibration", "verbalized-confidence"],
                                    usage=usage)

    # -- the stream -----------------------------------------------------------------------------
    def generate(self, inputs=None, *args, secl_choices=None, secl_distractors=None, secl_update: bool = True,
                 **kwargs):
        """``generate`` with SECL on each prompt (module docstring).

        secl_choices : optional list (one per prompt) of the MCQA option texts in letter order (None for a
            prompt that is not multiple choice); P(True)Norm then compares the chosen option with up to K
            others, each shown as "<letter>. <option text>" (``confidence.mcqa_answer_text``, as ``diagnose``).
        secl_distractors : optional list (one per prompt) of alternative answers (str) for P(True)Norm, shown
            as they are. Without either → K beam-search alternatives. secl_update : False turns SECL off for
            this call (plain generation plus the verbalized confidence; the gate is not updated).
        Returns what ``generate`` returns; with ``return_dict_in_generate=True`` a ``SECLGenerateOutput``
        carrying ``confidences``. Only one returned sequence per prompt is supported. In the default
        "confidence" scope the sequences are the base model's (the adapter is off while they are generated).
        ValueError for ``num_return_sequences`` other than 1, lists of the wrong length, or both
        ``secl_choices`` and ``secl_distractors``.
        """
        if kwargs.get("num_return_sequences", 1) != 1:
            raise ValueError(f"num_return_sequences: SECL needs 1, got {kwargs['num_return_sequences']!r}")
        input_ids = inputs if inputs is not None else kwargs.pop("input_ids", None)
        if not torch.is_tensor(input_ids):
            raise ParameterError("input_ids", input_ids, "SECL's generate needs the prompts' token ids (a tensor, as "
                                 f"``inputs`` or ``input_ids``), got {type(input_ids).__name__}")
        if inputs is None:
            inputs = input_ids
        attention_mask = kwargs.get("attention_mask")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        for name, given in (("secl_choices", secl_choices), ("secl_distractors", secl_distractors)):
            if given is not None and len(given) != len(input_ids):
                raise ValueError(f"{name}: need one list per prompt ({len(input_ids)}), got {len(given)}")
        if secl_choices is not None and secl_distractors is not None:
            raise ValueError("secl_choices: the options are the distractors; pass secl_choices or secl_distractors, "
                             "not both")
        want_dict = kwargs.pop("return_dict_in_generate", False)
        want_scores = kwargs.pop("output_scores", False)
        with self._secl_base():
            out = super().generate(inputs, *args, return_dict_in_generate=True, output_scores=True, **kwargs)
        n_prompt = input_ids.shape[1]
        base_cache = self.secl_config.adapter_scope == "confidence"
        eos = self.secl_stop_ids(kwargs)
        cache = getattr(out, "cache", None)
        # one device-to-host transfer each for the ids, the mask and the per-step entropies of the batch
        answers = out.sequences[:, n_prompt:].tolist()
        prompt_ids, prompt_mask = input_ids.tolist(), attention_mask.cpu()
        step_entropy = self.secl_step_entropies(out.scores)
        confidences, records = [], []
        for i, answer in enumerate(answers):
            prompt = [t for t, m in zip(prompt_ids[i], prompt_mask[i].tolist()) if m]
            length = answer_length(answer, eos)
            entropy = float(step_entropy[: max(length, 1), i].mean()) if len(step_entropy) else 0.0
            distractors = None if secl_distractors is None else list(secl_distractors[i])
            choices = None if secl_choices is None or secl_choices[i] is None else list(secl_choices[i])
            context = prompt_context = None
            if cache is not None and hasattr(cache, "layers"):
                # generate's cache holds the prompt and all answer tokens but the last: reuse it
                keep = min(cache.get_seq_length(), n_prompt + length)
                mask = torch.cat([prompt_mask[i], torch.ones(keep - n_prompt, dtype=torch.long)])
                context = (cache_row(cache, i, keep), mask, keep - n_prompt)
                if base_cache:  # computed with the adapter off, as the teacher is: its prompt part serves P(True)
                    prompt_context = (cache_row(cache, i, n_prompt), prompt_mask[i])
            record = self._secl_step(SECLQuestion(prompt, answer[:length], entropy, choices, distractors), secl_update,
                                     context, prompt_context)
            confidences.append(record.confidence)
            records.append(record)
        self.secl_records = records
        conf = torch.tensor(confidences, dtype=torch.float32)
        if not want_dict:
            return out.sequences
        fields = {k: getattr(out, k, None) for k in ("sequences", "scores", "logits", "attentions", "hidden_states", "cache")}
        if not want_scores:
            fields["scores"] = None
        return SECLGenerateOutput(**fields, confidences=conf)

    def secl_stop_ids(self, generate_kwargs: dict | None = None) -> set:
        """Token ids that end an answer: eos and pad ids of ``generate_kwargs``, the generation config and the
        tokenizer."""
        kwargs = generate_kwargs or {}
        ids = set()
        for source in (kwargs.get("eos_token_id"), self.generation_config.eos_token_id, self.secl_tokenizer.eos_token_id,
                       kwargs.get("pad_token_id"), self.generation_config.pad_token_id):
            if source is None:
                continue
            ids.update(source if isinstance(source, (list, tuple)) else [source])
        return ids

    @staticmethod
    def secl_step_entropies(step_scores) -> torch.Tensor:
        """Entropy (nats) of each step's next-token distribution, (steps, batch) float32 on the CPU;
        an answer's gate input is the mean over its own steps."""
        if not step_scores:
            return torch.zeros(0)
        logp = torch.log_softmax(torch.stack(step_scores).float(), dim=-1)  # (steps, batch, V)
        ent = -(torch.exp(logp) * torch.where(torch.isfinite(logp), logp, torch.zeros_like(logp))).sum(-1)
        return ent.cpu()

    def secl_answer_text(self, answer_ids) -> str:
        """The decoded answer as the follow-up turns restate it (its last ``answer_max_chars`` characters)."""
        text = self.secl_tokenizer.decode(answer_ids, skip_special_tokens=True).strip()
        limit = self.secl_config.answer_max_chars
        return text if len(text) <= limit else "…" + text[-limit:]

    def secl_option(self, own: str, choices) -> tuple[int | None, str]:
        """(index of the option ``own`` names or None, its text as "<letter>. <option text>" or ``own``)."""
        letter = first_option_letter(own)
        if choices is None or letter is None or LETTERS.index(letter) >= len(choices):
            return None, own
        j = LETTERS.index(letter)
        return j, mcqa_answer_text(letter, choices[j], self.secl_config.answer_max_chars)

    def secl_restated(self, answer_ids, choices) -> str:
        """What the confidence turn restates (``SECLConfig.restate``): the decoded answer, or its option's text."""
        own = self.secl_answer_text(answer_ids)
        return self.secl_option(own, choices)[1] if self.secl_config.restate == "option_text" else own

    def _secl_answer_ids(self, answer_ids) -> list[int]:
        # an empty answer is stated as a space, so the follow-up turn still follows an assistant turn
        return list(answer_ids) or self.secl_tokenizer.encode(" ", add_special_tokens=False)

    def secl_followup(self, answer_ids, answer_text, template, plain_prefix) -> list[int]:
        """Token ids after the prompt: the assistant turn ``answer_ids`` then the user turn ``template`` with
        ``{answer}`` = ``answer_text`` (the confidence or P(True) question; ``plain_prefix`` in the plain format)."""
        return self._secl_answer_ids(answer_ids) + followup_ids(
            self.secl_tokenizer, template.replace("{answer}", answer_text), prompt_format=self.secl_prompt_format,
            plain_prefix=plain_prefix)

    def secl_answer_context(self, prompt, answer_ids, context=None):
        """(cache, prefix mask, answer tokens cached) over the prompt and the whole answer, computed as the
        answer was (``_secl_base``: the adapter off in the "confidence" scope), without gradients.

        context : ``generate``'s (cache, mask, answer tokens cached), extended by the answer tokens it lacks
        (the last token ``generate`` produced, which it never ran; or the space standing for an empty answer);
        None → one pass over the prompt and the answer.

        Reusing this cache for the confidence read is exact for what the "confidence" scope means: the adapter
        acts on the follow-up turn's own tokens (LoRA on q/v changes their queries and values in the adapted
        layers) while they attend to the base model's keys and values of the prompt and the answer. The other
        reading, the whole conversation re-run through the adapter for the read, is a different function, not a
        cheaper or dearer way to the same one: LoRA on v would change the values the answer's tokens expose in
        the adapted layers, and every hidden state above the first of them. It would cost one more pass over
        prompt and answer per question and let the adapter reinterpret the answer; we take the first: the
        adapter is a head on the base model's own conversation, and training runs that same read.
        """
        answer = self._secl_answer_ids(answer_ids)
        if context is not None and context[2] == len(answer):
            return context  # already whole (the answer ended at end-of-turn, or extended before)
        with self._secl_base():
            cache, mask = self.secl_reads([list(prompt) + answer],
                                          None if context is None else [context[:2]]).prefix_cache(0)
        return cache, mask, len(answer)

    def secl_verbalized(self, prompt, answer_ids, *, requires_grad=False, context=None, restated=None):
        """(confidence tensor (1,), greedy, forward passes) of the answer; with gradients when asked.

        context : (cache, prefix_mask, n_cached_answer_tokens), e.g. from ``generate``, whose cache already
            holds the prompt and the answer's first tokens; then only the rest is run (no prompt pass).
        In the "confidence" scope the prompt and the whole answer always come from a cache computed with the
        adapter off (``secl_answer_context``) and only the follow-up turn runs, with the adapter on (and the
        gradients, when asked). In the "all" scope without a context, everything runs with the adapter on and
        gradients flow through the whole conversation. restated : the text the turn restates (``secl_restated``;
        default the decoded answer).
        """
        first, second, passes = self._secl_confidence_logprobs(prompt, answer_ids, requires_grad, context, restated)
        conf, greedy, _ = verbalized_from_logprobs(first, self.secl_tokens, second)
        return conf, float(greedy[0]), passes

    def secl_confidence_distribution(self, prompt, answer_ids, *, requires_grad=False, context=None,
                                     restated=None):
        """(log-probabilities (1, 11) of the values 0, 0.1, …, 1, forward passes): the distribution whose mean
        ``secl_verbalized`` returns, from the same arguments (``SECLConfig.confidence_loss`` "kl" trains it)."""
        first, second, passes = self._secl_confidence_logprobs(prompt, answer_ids, requires_grad, context, restated)
        return confidence_distribution(first, self.secl_tokens, second), passes

    def _secl_confidence_logprobs(self, prompt, answer_ids, requires_grad, context, restated):
        """The follow-up turn's next-token log-probabilities (the number's, and after "1" when "10" is two
        tokens, else None) and the forward passes; ``secl_verbalized``'s arguments."""
        tokens = self.secl_tokens
        text = self.secl_answer_text(answer_ids) if restated is None else restated
        cont = self.secl_followup(answer_ids, text, self.secl_config.confidence_template, PLAIN_CONFIDENCE_PREFIX)
        if self.secl_config.adapter_scope == "confidence":
            context = self.secl_answer_context(prompt, answer_ids, context)
        prefix, caches = list(prompt), None
        if context is not None:  # the prompt and the answer's first ``cached`` tokens are in the cache
            cache, mask, cached = context
            prefix, caches = prefix + self._secl_answer_ids(answer_ids)[:cached], [(cache, mask)]
            cont = cont[cached:]
        first, second = self.secl_reads([prefix], caches, requires_grad=requires_grad).rows(
            [[cont]], then_token=tokens.digits[1][0] if tokens.two_step else None)
        return first, second, 2 if tokens.two_step else 1

    def _secl_alternatives(self, prompt, answer_ids) -> tuple[list, int]:
        """K deduplicated beam-search alternatives to the answer (open-ended distractors)."""
        k = self.secl_config.num_distractors
        ids = torch.tensor([prompt], device=next(self.parameters()).device)
        beams = GenerationMixinCall.generate(
            self, ids, attention_mask=torch.ones_like(ids), num_beams=k + 1, num_return_sequences=k + 1,
            do_sample=False, max_new_tokens=self.secl_config.distractor_max_new_tokens,
            pad_token_id=self.secl_tokenizer.pad_token_id,
        )
        own = self.secl_answer_text(answer_ids)
        seen, alts = {own.strip().lower()}, []
        eos = self.secl_stop_ids()
        for row in beams[:, len(prompt):].tolist():
            row = row[: answer_length(row, eos)]
            key = self.secl_answer_text(row).strip().lower()
            if key and key not in seen:
                seen.add(key)
                alts.append(row)
        return alts[:k], k + 1

    def _secl_step(self, question: SECLQuestion, update_enabled, context=None, prompt_context=None) -> SECLRecord:
        """One question through ``secl.step.secl_step`` on this model's state, its reads on ``generate``'s cache."""
        was_training = self.training
        if was_training:  # eval() walks every module: skip it when there is nothing to switch
            self.eval()
        if self.secl_config.adapter_scope == "confidence":
            # one cache of prompt and answer (adapter off) for every read and update step of this answer
            context = self.secl_answer_context(question.prompt, question.answer_ids, context)
        try:
            return secl_step(self.secl_state, ModelReads(self, context, prompt_context), question,
                             update=update_enabled)
        finally:
            if was_training:
                self.train()


class GenerationMixinCall:
    """The model class's own ``generate`` (bypassing SECL), for internal beam searches."""

    @staticmethod
    def generate(model, *args, **kwargs):
        return super(SECLGenerationMixin, model).generate(*args, **kwargs)


def _check_plain(model) -> None:
    if isinstance(model, SECLGenerationMixin):
        raise ValueError("model: SECL is already applied to this model")
    if hasattr(model, "peft_config"):
        raise ValueError(f"model: already carries PEFT adapters ({', '.join(model.peft_config)}); SECL adds its own "
                         "LoRA adapter to a model without any (a model SECL was applied to keeps its adapter: load "
                         "a fresh copy)")


def apply_secl(model, tokenizer, config: SECLConfig | None = None) -> "SECLModel":
    """Add SECL to a transformers causal LM: ``peft.get_peft_model`` with SECL's LoRA config, wrapped in a
    ``SECLModel``, which is returned.

    LoRA adapters (initialised to the identity: B = 0) go on ``config.target_modules`` of
    ``config.layers_for(num_layers)``; PEFT injects them into ``model``'s modules in place and freezes every
    other parameter. Raises ValueError (before ``model`` is changed) when the model already carries PEFT
    adapters, lacks the targeted projections in those layers, or the tokenizer lacks single-token digits or
    Yes/No; TypeError when ``config`` is not a SECLConfig.
    """
    from peft import LoraConfig, get_peft_model

    from hf_calibration.integrations.hub import peft_checkpointing_warning_silenced

    config = config or SECLConfig()
    if not isinstance(config, SECLConfig):
        raise TypeError(f"config: must be a SECLConfig, got {type(config).__name__}")
    _check_plain(model)
    layers = config.layers_for(_decoder_layers(model))
    _check_targets(model, config, layers)
    ConfidenceTokens.from_tokenizer(tokenizer)
    lora = LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=0.0,
                      target_modules=list(config.target_modules), layers_to_transform=layers, bias="none",
                      task_type="CAUSAL_LM")
    with peft_checkpointing_warning_silenced():
        peft_model = get_peft_model(model, lora, adapter_name=ADAPTER_NAME)
    return SECLModel(peft_model, tokenizer, config)


class SECLModel(SECLGenerationMixin, AdaptedModel):
    """A causal LM with SECL: ``peft_model`` (the ``peft.PeftModel`` holding SECL's LoRA adapter) and SECL's
    state; ``generate`` runs SECL (module docstring). Build with ``apply_secl`` / ``SECLModel.wrap`` or
    ``SECLModel.from_pretrained``; ``SECLModel(peft_model, tokenizer, config)`` wraps a PeftModel whose active
    adapter (``ADAPTER_NAME``) is SECL's.
    """

    def __init__(self, peft_model, tokenizer, config: SECLConfig):
        AdaptedModel.__init__(self, peft_model)
        self._secl_setup(tokenizer, config)
        self.eval()

    @staticmethod
    def wrap(model, tokenizer, config: SECLConfig | None = None) -> "SECLModel":
        return apply_secl(model, tokenizer, config)

    @classmethod
    def from_pretrained(cls, model, tokenizer, folder, *, revision=None, token=None) -> "SECLModel":
        """SECL on ``model`` with what ``save_pretrained`` (or ``push_to_hub``) wrote: the adapter, loaded with
        ``peft.PeftModel.from_pretrained`` (into ``model``, in place), the SECL config and the gate state.

        ``folder``: a local folder or a Hub repo id. FileNotFoundError names a missing file; ValueError for state
        written by a newer release (``format_version``) or a model that already carries PEFT adapters, before
        ``model`` is changed.
        """
        from hf_calibration.integrations.hub import ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME, load_artifact
        from hf_calibration.secl.config import CONFIG_NAME

        _check_plain(model)
        ConfidenceTokens.from_tokenizer(tokenizer)
        peft_model, (config, state) = load_artifact(
            folder, lambda f: (SECLConfig.from_pretrained(f), read_secl_state(f)), base_model=model,
            required_files=[CONFIG_NAME, ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME, STATE_NAME], is_trainable=True,
            adapter_name=ADAPTER_NAME, revision=revision, token=token)
        secl = cls(peft_model, tokenizer, config)
        secl.secl_state.load_state_dict(state)
        return secl
