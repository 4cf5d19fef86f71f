"""SECL's update steps: minibatches of the current burst question and earlier ones replayed from a buffer.

The paper takes one gradient step on the current question's MSE(c, ĉ) (Hedna et al. 2026, step 6). With
``SECLConfig.replay_size`` > 0 the burst's earlier questions are kept (the token ids, the restated answer,
the pseudo-label c* and, in the "confidence" scope, the cache of prompt and answer computed with the adapter
off) and every update step is on a minibatch: the current question and ``replay_batch_size`` earlier ones
drawn without replacement. A replayed question's target is recomputed from its confidence under the current
adapter, ĉ = c + α_step·clip(c* − c, −δ, δ) (``directional_target``), since the c its first target was
built from is stale; the current question keeps the target read before the update, as without replay.
The minibatch loss is the mean of the items' losses (squared errors, or with ``SECLConfig.confidence_loss`` "kl"
the KL divergence of the read's distribution over 0..10 to a two-point target: ``item_loss``); each item is run
and backpropagated on its own (no padding of caches of different lengths), which gives the gradient of the mean.

With ``SECLConfig.consolidation_epochs`` > 0 the buffer is also trained on when a burst ends (``consolidate``):
that many epochs over every kept burst question in seeded random minibatches, the targets recomputed in each pass
(docs/methods.md, "consolidation"; an extension, not in the paper). Its cost is paid once per burst, so a schedule
can take many more steps on the burst's questions than one per question within the same forward-pass budget.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from hf_calibration.secl.confidence import confidence_kl, expected_value

CONFIDENCE_LOSSES = ("mse", "kl")


@dataclass
class ReplayItem:
    """One question for an update step.

    prompt, answer_ids : token ids; restated : the answer as the confidence turn restates it; c_star : the
    pseudo-label in [0, 1]; context : the (cache, prefix mask, cached answer tokens) of prompt and answer with
    the adapter off ("confidence" scope; read, never modified) or None (run everything); index : the question's
    position in the stream (records); target : a fixed target, or None to recompute it from c* at each step.
    """

    prompt: list
    answer_ids: list
    restated: str
    c_star: float
    context: tuple | None = None
    index: int = -1
    target: float | None = None


# ReplayItem fields a saved buffer leaves out: the cache (tensors, rebuilt from the token ids when needed) and the
# fixed target (a kept question's target is recomputed from c* at every step).
_NOT_SAVED = ("context", "target")


class ReplayBuffer:
    """The last ``capacity`` burst questions (oldest dropped first); ``sample`` draws ``batch_size`` of them
    uniformly without replacement (all of them when fewer are kept) from a generator seeded with ``seed``, which
    ``clear`` restarts, so a stream replays the same questions every time it is run. ``capacity`` 0 keeps none."""

    def __init__(self, capacity: int, batch_size: int, seed: int = 0):
        self.capacity, self.batch_size, self.seed = capacity, batch_size, seed
        self.clear()

    def clear(self) -> None:
        self.items: list[ReplayItem] = []
        self._rng = np.random.default_rng(self.seed)

    def __len__(self) -> int:
        return len(self.items)

    def add(self, item: ReplayItem) -> None:
        if self.capacity == 0:
            return
        self.items.append(item)
        del self.items[: max(0, len(self.items) - self.capacity)]

    def state_dict(self) -> dict:
        """The kept questions (without their caches) and the sampler's state, as JSON-serialisable values:
        {"items": [{prompt, answer_ids, restated, c_star, index}], "rng": numpy's bit-generator state}."""
        keep = [f.name for f in dataclasses.fields(ReplayItem) if f.name not in _NOT_SAVED]
        return {"items": [{k: getattr(item, k) for k in keep} for item in self.items],
                "rng": self._rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        """Restore what ``state_dict`` wrote (the items come back without a cache: ``context`` None)."""
        self.items = [ReplayItem(**item) for item in state["items"]]
        self._rng.bit_generator.state = state["rng"]

    def sample(self) -> list[ReplayItem]:
        if len(self.items) <= self.batch_size:
            return list(self.items)
        picks = self._rng.choice(len(self.items), size=self.batch_size, replace=False)
        return [self.items[i] for i in sorted(picks)]


def directional_target(c: float, c_star: float, *, alpha_step: float, delta: float) -> float:
    """ĉ = c + α_step·clip(c* − c, −δ, δ) (Hedna et al. 2026, step 6)."""
    return c + alpha_step * max(-delta, min(delta, c_star - c))


def item_confidence(model, item: ReplayItem, *, requires_grad: bool = False):
    """The verbalized confidence (tensor (1,)) of ``item`` under ``model``'s current adapter, and the forward
    passes of the read (1, or 2 when "10" is two tokens: counted as the stream counts them)."""
    conf, _, passes = model.secl_verbalized(item.prompt, item.answer_ids, requires_grad=requires_grad,
                                             context=item.context, restated=item.restated)
    return conf, passes


def item_loss(model, item: ReplayItem, *, alpha_step: float, delta: float, loss: str = "mse") -> torch.Tensor:
    """The update loss of one item (a scalar tensor with its graph). The target is the item's ``target`` when
    set, else ĉ = c + α_step·clip(c* − c, −δ, δ) from its confidence c in this very read (detached).

    loss "mse": (c − ĉ)², the paper's (Hedna et al. 2026, step 6). "kl": KL(q ‖ p) of the read's distribution
    p over the values 0, 0.1, …, 1 against q, the distribution with mass on the two values around ĉ and mean ĉ
    (``confidence.confidence_kl``); its gradient does not vanish when p sits on one value (docs/methods.md,
    "SECL: the confidence loss"). Raises ValueError for another ``loss``."""
    if loss not in CONFIDENCE_LOSSES:
        raise ValueError(f"loss: {loss!r} (expected one of {CONFIDENCE_LOSSES})")
    log_weights, _ = model.secl_confidence_distribution(item.prompt, item.answer_ids, requires_grad=True,
                                                        context=item.context, restated=item.restated)
    conf = expected_value(log_weights)[0]  # the read secl_verbalized returns, from the same distribution
    target = item.target if item.target is not None else directional_target(
        float(conf.detach()), item.c_star, alpha_step=alpha_step, delta=delta)
    return (conf - target) ** 2 if loss == "mse" else confidence_kl(log_weights[0], min(1.0, max(0.0, target)))


def minibatch_step(model, items: list, optimizer, *, alpha_step: float, delta: float,
                   loss: str = "mse") -> tuple[float, int]:
    """One optimizer step on the mean of ``item_loss`` over ``items`` (``ReplayItem``); returns (loss, forward
    passes: one per item, the read with its backward, as ``mixin`` counts an update step).
    ``alpha_step=1, delta=1`` with ``target=None`` is plain MSE (or KL) to c*."""
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for item in items:
        value = item_loss(model, item, alpha_step=alpha_step, delta=delta, loss=loss) / len(items)
        value.backward()
        total += float(value.detach())
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total, len(items)


def update_steps(model, current: ReplayItem, buffer: ReplayBuffer, optimizer, *, steps: int, alpha_step: float,
                 delta: float, loss: str = "mse") -> tuple[int, list]:
    """``steps`` minibatch steps on ``current`` (its ``target`` set) and, each step, a fresh draw from ``buffer``
    (earlier questions only: add ``current`` afterwards). Returns (forward passes, the stream indices replayed
    at each step: a list of ``steps`` lists)."""
    passes, replayed = 0, []
    for _ in range(steps):
        earlier = buffer.sample()
        _, n = minibatch_step(model, [current] + earlier, optimizer, alpha_step=alpha_step, delta=delta, loss=loss)
        passes += n
        replayed.append([item.index for item in earlier])
    return passes, replayed


def consolidate(model, buffer: ReplayBuffer, optimizer, *, epochs: int, batch_size: int, alpha_step: float,
                delta: float, seed: int = 0, lr_scheduler: str = "constant", loss: str = "mse") -> tuple[int, int]:
    """``epochs`` passes over every question in ``buffer``, each a random permutation (``numpy`` generator seeded
    with ``seed``) cut into minibatches of ``batch_size`` (the last one smaller), one ``minibatch_step`` each (its
    ``loss``),
    targets recomputed from c* (items' ``target`` is ignored). ``lr_scheduler`` "linear": step k of the S steps
    runs at (1 − k/S) times the optimizer's learning rate (``torch.optim.lr_scheduler.LinearLR`` down to 0), which
    is restored afterwards, also on an error; "constant": the rate as it is. Returns (forward passes: epochs ×
    len(buffer), optimizer steps S = epochs × ⌈len(buffer) / batch_size⌉). An empty buffer costs nothing."""
    rng = np.random.default_rng(seed)
    items = [dataclasses.replace(item, target=None) for item in buffer.items]
    total = epochs * -(-len(items) // batch_size)
    rates = [group["lr"] for group in optimizer.param_groups]
    schedule = (torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1.0, end_factor=0.0, total_iters=total)
                if lr_scheduler == "linear" and total else None)
    passes = steps = 0
    try:
        for _ in range(epochs if items else 0):
            order = rng.permutation(len(items))
            for start in range(0, len(items), batch_size):
                _, n = minibatch_step(model, [items[i] for i in order[start:start + batch_size]], optimizer,
                                      alpha_step=alpha_step, delta=delta, loss=loss)
                passes, steps = passes + n, steps + 1
                if schedule is not None:
                    schedule.step()
    finally:
        for group, rate in zip(optimizer.param_groups, rates):
            group["lr"] = rate
    return passes, steps
