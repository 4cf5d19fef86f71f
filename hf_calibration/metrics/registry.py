"""The batched metrics: one registry through which the bootstrap evaluates a metric on many resamples at once.

Each metric of :mod:`hf_calibration.metrics` registers a :class:`BatchedMetric` under a short name ("conf_ece",
"brier", ...) and, where it has one, its public function (``expected_calibration_error``, ...). Its ``impl``
evaluates the metric on already validated inputs, once (``weights=None``, result of shape (1,)) or on R resamples
at once (``weights``: (R, n) resample counts, result of shape (R,)). The public function calls the same ``impl``
with ``weights=None``, so a point estimate and its resamples share one code path.

A new metric joins the bootstrap by registering itself::

    register("my_metric", my_impl, function=my_metric, options=my_options)

after which ``bootstrap(my_metric, ...)`` evaluates it vectorised over resamples; an unregistered callable is
called once per resample.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable


def no_options() -> dict:
    """The ``options`` of a metric without keyword options."""
    return {}


@dataclass(frozen=True)
class BatchedMetric:
    """A metric's vectorised implementation.

    Attributes
    ----------
    name : str
        Short name, the key of :func:`calibration_report`'s entries (e.g. ``"conf_ece"``).
    impl : callable
        ``impl(inputs, weights, **options) -> ndarray``: ``inputs`` an ``Inputs`` of ``prepare``; ``weights``
        None (shape (1,) out) or (R, n) resample counts (shape (R,) out).
    options : callable
        Keyword options → validated dict (raises the ``ParameterError`` family on bad values).
    multiclass : bool or None
        What ``prepare`` must enforce: (n, K) only (True), (n,) only (False), or either (None).
    function : callable or None
        The public function it is the twin of, if any.
    """

    name: str
    impl: Callable
    options: Callable = no_options
    multiclass: bool | None = None
    function: Callable | None = None

    def bind(self, **options) -> Callable:
        """``impl`` with ``options`` validated and fixed: a callable ``(inputs, weights) -> ndarray``."""
        return functools.partial(self.impl, **self.options(**options))


_BY_NAME: dict[str, BatchedMetric] = {}
_BY_FUNCTION: dict[Callable, BatchedMetric] = {}


def register(name: str, impl: Callable, *, options: Callable = no_options, multiclass: bool | None = None,
             function: Callable | None = None) -> BatchedMetric:
    """Register ``impl`` under ``name`` (and ``function``); returns the :class:`BatchedMetric`."""
    entry = BatchedMetric(name, impl, options, multiclass, function)
    _BY_NAME[name] = entry
    if function is not None:
        _BY_FUNCTION[function] = entry
    return entry


def batched_metric(metric) -> BatchedMetric | None:
    """The :class:`BatchedMetric` of a registered name or public function; None for anything else."""
    if isinstance(metric, str):
        return _BY_NAME.get(metric)
    try:
        return _BY_FUNCTION.get(metric)
    except TypeError:  # an unhashable callable is never registered
        return None
