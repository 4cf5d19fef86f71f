"""Vectorised twins of the public metrics, used by the bootstrap.

Each registered metric has an implementation ``impl(inputs, weights, **options) -> ndarray`` that
evaluates the metric on already validated inputs, either once (``weights=None``, shape (1,)) or on R
resamples at once (``weights``: (R, n) resample counts, shape (R,)). The public function calls the
same implementation with ``weights=None``, so the point estimate and the resamples share one code path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Batched:
    impl: Callable
    options: Callable  # keyword options -> validated dict (raises on bad values)
    multiclass: bool | None  # what ``prepare`` must enforce: (n, K) only, (n,) only, or either


_REGISTRY: dict[Callable, Batched] = {}


def register(public: Callable, impl: Callable, options: Callable, multiclass: bool | None = None) -> None:
    _REGISTRY[public] = Batched(impl, options, multiclass)


def lookup(metric: Callable) -> Batched | None:
    return _REGISTRY.get(metric)
