"""The learned logit adjustment α = (τ, l) of CALM and a causal-LM wrapper that applies it (docs/methods.md, 'CALM: logit adjustment').

``CALMModel`` wraps a ``peft.PeftModel`` (the LoRA adapter, whose layout on disk and loading are PEFT's) or a
full model, plus its ``LogitAdjustment``; its folder is PEFT's adapter folder (or the full model) with
``logit_adjustment.safetensors`` and ``logit_adjustment_config.json`` beside it (``hf_calibration.integrations.hub.save_artifact``).

Adjusted logits: z'_y = z_y / τ_y + l_y for every covered token id y (multiplicative first, then
additive: the AutoBalance convention, Li et al. NeurIPS 2021); uncovered ids are left unchanged.
τ > 0 through τ = exp(ρ) or τ = softplus(ρ + softplus⁻¹(1)); both give τ = 1 at ρ = 0, so the layer
is the identity at initialisation and weight decay on ρ and l shrinks it back toward the identity.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from hf_calibration.errors import check_choice

ADJUSTMENT_WEIGHTS_NAME = "logit_adjustment.safetensors"
ADJUSTMENT_CONFIG_NAME = "logit_adjustment_config.json"
FORMAT_VERSION = 1  # of logit_adjustment_config.json; bump when the saved layout changes
PAPER_URL = "https://arxiv.org/abs/2608.07419"
MODES = ("vector", "scalar")
PARAMETERIZATIONS = ("exp", "softplus")
_SOFTPLUS_INV_ONE = math.log(math.e - 1.0)  # softplus(x) = 1 at x = log(e - 1)


def temperature_from_rho(rho: torch.Tensor, parameterization: str = "exp") -> torch.Tensor:
    """τ(ρ) > 0 with τ(0) = 1: ``exp(ρ)`` or ``softplus(ρ + log(e − 1))``."""
    if parameterization == "exp":
        return torch.exp(rho)
    return F.softplus(rho + _SOFTPLUS_INV_ONE)


def adjust_logits(logits: torch.Tensor, rho: torch.Tensor, shift: torch.Tensor | None,
                  parameterization: str = "exp") -> torch.Tensor:
    """``logits / τ(ρ) + l`` broadcast over the last axis (the pure function behind ``LogitAdjustment``).

    logits : (..., m) covered columns; rho : (m,) or (1,); shift : (m,) or None (l = 0).
    Computed in float32 (τ is a small correction that bf16 logits would round away).
    """
    out = logits.float() / temperature_from_rho(rho.float(), parameterization)
    return out if shift is None else out + shift.float()


def _check_token_ids(token_ids, vocab_size):
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size <= 0:
        raise ValueError(f"vocab_size: must be a positive integer, got {vocab_size!r}")
    if token_ids is None:
        return None
    ids = [int(t) for t in token_ids]
    if not ids:
        raise ValueError("token_ids: empty; pass None to cover the full vocabulary")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"token_ids: ids must lie in [0, {vocab_size}), got {bad[:5]!r}")
    if len(set(ids)) != len(ids):
        raise ValueError(f"token_ids: duplicate ids in {ids!r}")
    return ids


class LogitAdjustment(nn.Module):
    """α = (τ, l) applied to next-token logits as z / τ + l (CALM; docs/methods.md, 'CALM: logit adjustment').

    Parameters
    ----------
    vocab_size : int > 0
        Size of the logit vectors this layer receives.
    token_ids : sequence of int, optional
        Token ids the adjustment covers (e.g. the option letters " A", "A", …); None covers all
        ``vocab_size`` ids. Stored with the artifact so a reloaded layer says what it covers.
    mode : {"vector", "scalar"}
        "vector": one τ and one l per covered id (the paper's default). "scalar": one shared τ and
        l = 0 (the paper's "learned TS" ablation).
    parameterization : {"exp", "softplus"}
        How ρ maps to τ > 0 (see ``temperature_from_rho``).

    Attributes: ``rho`` (m,) or (1,), ``shift`` (m,) or None, buffer ``token_ids`` (m,) int64 or None.
    Raises ValueError naming the argument for a bad mode, parameterization or out-of-range id.
    """

    def __init__(self, vocab_size: int, token_ids: Sequence[int] | None = None, *, mode: str = "vector",
                 parameterization: str = "exp"):
        super().__init__()
        check_choice(mode, "mode", MODES)
        check_choice(parameterization, "parameterization", PARAMETERIZATIONS)
        ids = _check_token_ids(token_ids, vocab_size)
        self.vocab_size = vocab_size
        self.mode = mode
        self.parameterization = parameterization
        m = vocab_size if ids is None else len(ids)
        self.rho = nn.Parameter(torch.zeros(1 if mode == "scalar" else m))
        self.shift = nn.Parameter(torch.zeros(m)) if mode == "vector" else None
        self.register_buffer("token_ids", None if ids is None else torch.tensor(ids, dtype=torch.long))

    @property
    def temperature(self) -> torch.Tensor:
        """τ, shape (m,) in vector mode, (1,) in scalar mode."""
        return temperature_from_rho(self.rho, self.parameterization)

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        """Adjust full-vocabulary logits (..., vocab_size); returns the same shape and dtype."""
        if logits.shape[-1] != self.vocab_size:
            raise ValueError(f"logits: last axis must be vocab_size={self.vocab_size}, got shape {tuple(logits.shape)}")
        if self.token_ids is None:
            return adjust_logits(logits, self.rho, self.shift, self.parameterization).to(logits.dtype)
        ids = self.token_ids.to(logits.device)
        cols = adjust_logits(logits.index_select(-1, ids), self.rho, self.shift, self.parameterization)
        return logits.index_copy(-1, ids, cols.to(logits.dtype))

    def config_dict(self) -> dict:
        return {
            "format_version": FORMAT_VERSION,
            "vocab_size": self.vocab_size,
            "token_ids": None if self.token_ids is None else self.token_ids.tolist(),
            "mode": self.mode,
            "parameterization": self.parameterization,
            "adjusted_logits": "z / tau + l",
        }

    def save_pretrained(self, save_directory: str | os.PathLike, state_dict: dict | None = None) -> None:
        """Write ``logit_adjustment.safetensors`` (rho, shift) and ``logit_adjustment_config.json``.

        ``state_dict`` (keys "rho", "shift") replaces the live parameters, e.g. the full tensors DeepSpeed
        ZeRO-3 gathered for saving. Raises ValueError when a tensor does not have the layer's shape
        (an empty, still-partitioned ZeRO-3 tensor would otherwise be saved).
        """
        from safetensors.torch import save_file

        folder = Path(save_directory)
        state = {n: p for n, p in self.named_parameters()}
        state.update({n: v for n, v in (state_dict or {}).items() if n in state})
        covered = self.vocab_size if self.token_ids is None else len(self.token_ids)
        tensors = {}
        for name, value in state.items():
            expected = (1,) if name == "rho" and self.mode == "scalar" else (covered,)
            if tuple(value.shape) != expected:
                raise ValueError(
                    f"state_dict: {name} has shape {tuple(value.shape)}, expected {expected}; under DeepSpeed ZeRO-3 "
                    "save through the Trainer with stage3_gather_16bit_weights_on_model_save (zero3_save_16bit_model)"
                )
            tensors[name] = value.detach().float().cpu().contiguous()
        folder.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(folder / ADJUSTMENT_WEIGHTS_NAME), metadata={"format": "pt"})
        (folder / ADJUSTMENT_CONFIG_NAME).write_text(json.dumps(self.config_dict(), indent=2) + "\n", encoding="utf-8")

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike) -> "LogitAdjustment":
        """Read the two files ``save_pretrained`` writes.

        Raises FileNotFoundError naming a missing file; ValueError for a config written by a newer
        release (``format_version``) or weights whose shapes do not match the config.
        """
        from safetensors.torch import load_file

        from hf_calibration.integrations.hub import check_artifact_config

        folder = Path(folder)
        for name in (ADJUSTMENT_CONFIG_NAME, ADJUSTMENT_WEIGHTS_NAME):
            if not (folder / name).is_file():
                raise FileNotFoundError(f"{folder}: no {name} (not a CALM logit-adjustment folder)")
        cfg = json.loads((folder / ADJUSTMENT_CONFIG_NAME).read_text(encoding="utf-8"))
        check_artifact_config(cfg, kind="CALM logit adjustment", max_format_version=FORMAT_VERSION,
                              source=str(folder / ADJUSTMENT_CONFIG_NAME))
        layer = cls(cfg["vocab_size"], cfg["token_ids"], mode=cfg["mode"], parameterization=cfg["parameterization"])
        weights = load_file(str(folder / ADJUSTMENT_WEIGHTS_NAME))
        for name, param in layer.named_parameters():
            if name in weights and weights[name].shape != param.shape:
                raise ValueError(
                    f"{ADJUSTMENT_WEIGHTS_NAME}: {name} has shape {tuple(weights[name].shape)} in {folder}, but its "
                    f"config (vocab_size {layer.vocab_size}, mode {layer.mode!r}) needs {tuple(param.shape)}"
                )
        layer.load_state_dict(weights, strict=False)
        return layer


def lm_head_vocab_size(model: nn.Module) -> int:
    """Rows of the model's LM head; its full size also when DeepSpeed ZeRO-3 has partitioned the weight."""
    weight = model.get_output_embeddings().weight
    return int(getattr(weight, "ds_shape", weight.shape)[0])


class CALMModel(nn.Module):
    """A causal LM (``PreTrainedModel`` or ``PeftModel``) whose output logits pass through a ``LogitAdjustment``.

    The adjustment is applied by a forward hook on the model's output embedding (LM head), so
    ``forward``, ``generate`` and ``logits_to_keep`` all see adjusted logits, and a ``labels`` loss
    computed inside the model is the loss of the adjusted distribution. Attributes the wrapper does
    not define (``config``, ``generation_config``, …) are looked up on the wrapped model, so the
    calibrated model is used like the original.

    ``forward(..., adjust_logits=False)`` returns the raw logits (the trainer applies α itself).
    """

    def __init__(self, model: nn.Module, logit_adjustment: LogitAdjustment):
        super().__init__()
        vocab = lm_head_vocab_size(model)
        if logit_adjustment.vocab_size != vocab:
            raise ValueError(
                f"logit_adjustment: vocab_size {logit_adjustment.vocab_size} does not match the model's LM head ({vocab})"
            )
        self.model = model
        self.logit_adjustment = logit_adjustment
        self._adjust = True
        self._hook = model.get_output_embeddings().register_forward_hook(self._adjust_hook)

    def _adjust_hook(self, module, inputs, output):
        return self.logit_adjustment(output) if self._adjust else output

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["model"], name)

    @contextlib.contextmanager
    def adjustment_enabled(self, enabled: bool):
        previous, self._adjust = self._adjust, enabled
        try:
            yield
        finally:
            self._adjust = previous

    def forward(self, *args, adjust_logits: bool = True, **kwargs):
        with self.adjustment_enabled(adjust_logits):
            return self.model(*args, **kwargs)

    def generate(self, *args, **kwargs):
        return self.model.generate(*args, **kwargs)

    def save_pretrained(self, save_directory: str | os.PathLike, **kwargs) -> None:
        """The wrapped model's ``save_pretrained`` (``PeftModel.save_pretrained``: PEFT's adapter folder; or a full
        model) plus the adjustment files beside it. ``state_dict`` (keys of this wrapper, e.g. what DeepSpeed
        ZeRO-3 gathered) replaces the live weights; other ``kwargs`` go to the wrapped model's ``save_pretrained``."""
        from hf_calibration.integrations.hub import save_artifact

        state_dict = kwargs.pop("state_dict", None)
        adjustment_state = None
        if state_dict is not None:  # keys of the wrapper → keys of the wrapped model and of the adjustment
            adjustment_state = {k[len("logit_adjustment."):]: v for k, v in state_dict.items()
                                if k.startswith("logit_adjustment.")}
            state_dict = {k[len("model."):]: v for k, v in state_dict.items() if k.startswith("model.")}
        save_artifact(self.model, save_directory,
                      lambda folder: self.logit_adjustment.save_pretrained(folder, state_dict=adjustment_state),
                      state_dict=state_dict, **kwargs)

    def load_calibration(self, folder: str | os.PathLike) -> None:
        """Load the adapter (through PEFT) or full-model weights and α that ``save_pretrained`` wrote into this
        model, in place (e.g. a checkpoint of the same run). Raises FileNotFoundError naming a missing file."""
        from safetensors.torch import load_file

        from hf_calibration.integrations.hub import download_folder, load_artifact_weights

        folder = download_folder(folder, required_files=[ADJUSTMENT_WEIGHTS_NAME])
        load_artifact_weights(self.model, folder)
        self.logit_adjustment.load_state_dict(load_file(str(folder / ADJUSTMENT_WEIGHTS_NAME)), strict=False)

    def base_model_name(self) -> str | None:
        """Hub id (or path) of the base model: the PEFT adapter's ``base_model_name_or_path`` or the config's name."""
        from hf_calibration.integrations.hub import base_model_name

        return base_model_name(self.model)

    def push_to_hub(self, repo_id: str, *, metrics: dict | None = None, token: str | None = None,
                    private: bool = False, base_model: str | None = None) -> str:
        """Upload the adapter (or full model), the logit adjustment and a model card to ``repo_id``.

        The card (``hf_calibration.integrations.hub.write_model_card``) carries ``library_name: hf-calibration``, the base
        model, the method (CALM, arXiv 2608.07419), the adjustment's config and ``metrics`` (name → number,
        e.g. {"conf_ece": 0.05}). ``base_model`` defaults to ``base_model_name()``. Returns the commit URL.
        Raises ValueError (before anything is uploaded) for an invalid repo id, no token, or no base model name.
        """
        from hf_calibration.integrations.hub import push_artifact_to_hub

        base_model = base_model or self.base_model_name()
        if not base_model:
            raise ValueError("base_model: the wrapped model has no name_or_path; pass base_model='<hub id>'")
        usage = f"from hf_calibration.calm import CALMModel\n\nmodel = CALMModel.from_pretrained({repo_id!r})"
        return push_artifact_to_hub(
            self, repo_id, base_model=base_model, method="CALM", paper_url=PAPER_URL,
            config=self.logit_adjustment.config_dict(), metrics=metrics, token=token, private=private,
            tags=["logit-adjustment", "bilevel-optimization"], usage=usage,
        )

    @classmethod
    def from_pretrained(cls, pretrained: str | os.PathLike, *, base_model=None, revision: str | None = None,
                        token: str | None = None, **model_kwargs) -> "CALMModel":
        """Load what ``save_pretrained`` (or ``push_to_hub``) wrote: a local folder or a Hub repo id.

        A PEFT adapter folder (``adapter_config.json``) is loaded with ``peft.PeftModel.from_pretrained`` on top of
        ``base_model`` (a loaded model, adapted in place) or of its ``base_model_name_or_path`` (resolved like
        ``hf_calibration.modeling.load_model``, so the packaged offline copies work); a full-model folder loads
        through ``AutoModelForCausalLM`` (``hf_calibration.integrations.hub.load_artifact``). ``model_kwargs`` go to
        ``from_pretrained`` of the base model.

        Raises FileNotFoundError naming the missing logit-adjustment file, ValueError (before any model loads)
        for a config written by a newer release, and for an adjustment whose vocabulary size differs from the
        model's.
        """
        from hf_calibration.integrations.hub import load_artifact

        model, adjustment = load_artifact(
            pretrained, LogitAdjustment.from_pretrained, required_files=[ADJUSTMENT_CONFIG_NAME, ADJUSTMENT_WEIGHTS_NAME],
            base_model=base_model, revision=revision, token=token, **model_kwargs)
        model.eval()
        return cls(model, adjustment)
