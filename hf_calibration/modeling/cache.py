"""Key/value-cache plumbing for reading next-token distributions after a shared prefix (transformers ``Cache``).

A prompt (a question and the model's answer) is run once (``prefix_pass``) and its cache is shared by every
follow-up read of that prompt: batched continuations (``continuation_logprobs``), one continuation and one more
token in the same pass (``continuation_then_token``), a longer cache (``extend_cache``), a row of a batched
``generate`` cache (``cache_row``), or the cache repeated along the batch for ``generate`` (``repeat_cache``).
Caches are copied shallowly: cache layers replace their tensors (``torch.cat``) rather than write into them, so
the prefix tensors are shared, never modified. Every read equals the unbatched, uncached computation.
"""

from __future__ import annotations

import copy
from typing import Sequence

import torch

__all__ = ["cache_row", "continuation_logprobs", "continuation_then_token", "extend_cache", "followup_logprobs",
           "prefix_pass", "repeat_cache"]


def _forward_last(model, input_ids, attention_mask, position_ids, past=None):
    """Log-softmax of the next token after each row's last position, (n, V) float32."""
    out = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
        cache=past, use_cache=past is not None, logits_to_keep=1,
    )
    return torch.log_softmax(out.logits[:, -1, :].float(), dim=-1)


def prefix_pass(model, prefix_ids: Sequence[int], *, requires_grad: bool = False):
    """Run ``prefix_ids`` once (batch 1). Returns (log-softmax of the next token (V,), cache, length)."""
    device = next(model.parameters()).device
    with torch.set_grad_enabled(requires_grad):
        prefix = torch.as_tensor([list(prefix_ids)], dtype=torch.long, device=device)
        out = model(input_ids=prefix, use_cache=True, logits_to_keep=1)
    return torch.log_softmax(out.logits[0, -1].float(), dim=-1), out.cache, prefix.shape[1]


def repeat_cache(cache, repeats: int):
    """A copy of ``cache`` repeated along the batch; the prefix tensors are shared, not copied.

    Shallow copies suffice because cache layers replace their tensors (``torch.cat``) rather than
    writing into them; deep copies would also fail on tensors that carry gradients. ``repeats=1``
    copies no tensor at all (``repeat_interleave(1)`` would).
    """
    new = copy.copy(cache)
    new.layers = [copy.copy(layer) for layer in cache.layers]
    if repeats != 1:
        new.batch_repeat_interleave(repeats)
    return new


def cache_row(cache, index: int, keep: int):
    """Row ``index`` of a batched cache, cut to its first ``keep`` positions (prefix tensors shared).

    A batch of one is only cropped (a view), not indexed (a copy).
    """
    new = copy.copy(cache)
    new.layers = [copy.copy(layer) for layer in cache.layers]
    keys = getattr(new.layers[0], "keys", None) if new.layers else None
    if not (index == 0 and keys is not None and keys.shape[0] == 1):
        new.batch_select_indices(torch.tensor([index]))
    if keep < new.get_seq_length():
        new.crop(keep - new.get_seq_length())
    return new


def extend_cache(model, cache, n_prefix: int, tokens: Sequence[int], *, prefix_mask: torch.Tensor | None = None,
                 start_position: int | None = None):
    """A copy of ``cache`` (batch 1, ``n_prefix`` positions) with ``tokens`` run on it: one forward pass, no
    gradients, no logits kept beyond one. ``cache`` is not modified. ``prefix_mask`` and ``start_position`` as in
    ``continuation_logprobs``. Returns the longer cache."""
    device = next(model.parameters()).device
    if prefix_mask is None:
        prefix_mask = torch.ones(n_prefix, dtype=torch.long)
    if start_position is None:
        start_position = int(prefix_mask.sum())
    with torch.no_grad():
        ids = torch.as_tensor([list(tokens)], dtype=torch.long, device=device)
        mask = torch.cat([prefix_mask.to(device), torch.ones(len(tokens), dtype=torch.long, device=device)])[None]
        positions = (start_position + torch.arange(len(tokens), device=device))[None]
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=repeat_cache(cache, 1),
                    use_cache=True, logits_to_keep=1)
    return out.cache


def continuation_logprobs(
    model,
    cache,
    n_prefix: int,
    continuations: Sequence[Sequence[int]],
    *,
    batch_size: int = 8,
    requires_grad: bool = False,
    pad_id: int = 0,
    prefix_mask: torch.Tensor | None = None,
    start_position: int | None = None,
) -> torch.Tensor:
    """Next-token log-softmax (m, V) after ``prefix + continuation`` for each continuation.

    ``cache`` (from ``prefix_pass``) is shared by every batch. Continuations are left-padded *after*
    the prefix (masked, positions counted over real tokens only), so every row ends at the last
    position and only that position's logits are computed (``logits_to_keep=1``); each row equals the
    unbatched, uncached computation. ``prefix_mask`` (n_prefix,) marks padding inside a cache taken
    from a batched ``generate`` (default: all real); ``start_position`` is the position of the first
    continuation token (default: the number of real prefix tokens).
    """
    device = next(model.parameters()).device
    if prefix_mask is None:
        prefix_mask = torch.ones(n_prefix, dtype=torch.long)
    if start_position is None:
        start_position = int(prefix_mask.sum())
    chunks = []
    with torch.set_grad_enabled(requires_grad):
        for start in range(0, len(continuations), batch_size):
            batch = [list(c) for c in continuations[start : start + batch_size]]
            if any(len(c) == 0 for c in batch):
                raise ValueError("continuations: every continuation needs at least one token")
            width = max(len(c) for c in batch)
            ids = torch.full((len(batch), width), pad_id, dtype=torch.long, device=device)
            mask = torch.zeros((len(batch), n_prefix + width), dtype=torch.long, device=device)
            mask[:, :n_prefix] = prefix_mask.to(device)
            for i, c in enumerate(batch):
                ids[i, width - len(c):] = torch.as_tensor(c)
                mask[i, n_prefix + width - len(c):] = 1
            positions = (start_position + mask[:, n_prefix:].cumsum(-1) - 1).clamp(min=start_position)
            past = repeat_cache(cache, len(batch))
            chunks.append(_forward_last(model, ids, mask, positions, past=past))
    if not chunks:
        raise ValueError("continuations: empty")
    return torch.cat(chunks)


def continuation_then_token(
    model,
    cache,
    n_prefix: int,
    continuation: Sequence[int],
    token: int | None,
    *,
    requires_grad: bool = False,
    prefix_mask: torch.Tensor | None = None,
    start_position: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Next-token log-softmax (1, V) after ``prefix + continuation``, and (1, V) after one more ``token``.

    Both come from one forward pass over ``continuation + [token]`` on ``cache``: the logits at its
    last two positions (causal attention makes the first one blind to ``token``). This is the
    two-step read of "10" at the price of one more token in the pass rather than a second pass.
    ``token=None`` reads only the first. ``cache`` is not modified.
    """
    device = next(model.parameters()).device
    if prefix_mask is None:
        prefix_mask = torch.ones(n_prefix, dtype=torch.long)
    if start_position is None:
        start_position = int(prefix_mask.sum())
    tokens = list(continuation) + ([] if token is None else [token])
    with torch.set_grad_enabled(requires_grad):
        ids = torch.as_tensor([tokens], dtype=torch.long, device=device)
        mask = torch.cat([prefix_mask.to(device), torch.ones(len(tokens), dtype=torch.long, device=device)])[None]
        positions = (start_position + torch.arange(len(tokens), device=device))[None]
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=repeat_cache(cache, 1),
                    use_cache=True, logits_to_keep=1 if token is None else 2)
        lp = torch.log_softmax(out.logits[0].float(), dim=-1)
    if token is None:
        return lp[-1:], None
    return lp[-2:-1], lp[-1:]


def followup_logprobs(
    model,
    prefix_ids: Sequence[int],
    continuations: Sequence[Sequence[int]],
    *,
    batch_size: int = 8,
    requires_grad: bool = False,
    pad_id: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``prefix_pass`` then ``continuation_logprobs``: (prefix (V,), continuations (m, V)) log-softmax."""
    prefix_lp, cache, n = prefix_pass(model, prefix_ids, requires_grad=requires_grad)
    conts = continuation_logprobs(model, cache, n, continuations, batch_size=batch_size,
                                  requires_grad=requires_grad, pad_id=pad_id)
    return prefix_lp, conts
