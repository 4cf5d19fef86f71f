"""Errors and warnings about one parameter's value, carrying the parameter's name (the lowest layer:
this module imports nothing from the package).

A job's config, a loader or a checker raises ``ParameterError("limit_per_domain", 1, "must be ≥ 2, got 1")``;
``str(err)`` reads "limit_per_domain: must be ≥ 2, got 1", as every ValueError of this library does, and a
front end reads ``err.parameter`` to say which of its own options was wrong (the CLI turns a config field
``limit_per_domain`` into ``--limit-per-domain``). Nobody parses the message.

A reason that mentions a parameter (its own, or one in ``related``) writes it as ``{name}``, e.g.
"got {limit} 1"; ``message(name_of)`` spells each such name through ``name_of`` ("got --limit 1" in the
CLI, "got limit 1" in Python).
"""

from __future__ import annotations

import math
import re
import warnings
from contextlib import contextmanager

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _spell(text: str, names: set, name_of) -> str:
    return _PLACEHOLDER.sub(lambda m: name_of(m.group(1)) if m.group(1) in names else m.group(0), text)


def _rename(text: str, names: dict) -> str:
    return _PLACEHOLDER.sub(lambda m: "{" + names.get(m.group(1), m.group(1)) + "}", text)


class ParameterError(ValueError):
    """A bad value of one parameter (a function argument or a config field).

    Attributes
    ----------
    parameter : str
        The parameter's name, e.g. ``"limit_per_domain"``.
    value : object
        The value given.
    reason : str
        What is wrong, without the name: "must be ≥ 2, got 1". ``{name}`` placeholders for the parameter and
        the ``related`` ones are spelled by ``message``.
    related : tuple of str
        Other parameters the reason mentions.

    A ValueError, so ``except ValueError`` and ``pytest.raises(ValueError, match=...)`` keep working.
    """

    def __init__(self, parameter: str, value, reason: str, *, related=()):
        super().__init__(parameter, value, reason)
        self.parameter, self.value, self.reason, self.related = parameter, value, reason, tuple(related)

    def message(self, name_of=str) -> str:
        """"<parameter>: <reason>" with every parameter name spelled by ``name_of`` (default: as is)."""
        names = {self.parameter, *self.related}
        return f"{name_of(self.parameter)}: {_spell(self.reason, names, name_of)}"

    def __str__(self) -> str:
        return self.message()

    def renamed(self, names: dict) -> "ParameterError":
        """The same error with parameters renamed by ``names`` (old → new), e.g. a library argument to the
        config field it came from; a name not in ``names`` stays."""
        return type(self)(names.get(self.parameter, self.parameter), self.value, _rename(self.reason, names),
                          related=tuple(names.get(r, r) for r in self.related))


class ParameterTypeError(ParameterError, TypeError):
    """A parameter of the wrong type, e.g. a string where an array of numbers is needed (also a TypeError)."""


class MissingPathError(ParameterError, FileNotFoundError):
    """A parameter names a file or folder that does not exist (also a FileNotFoundError)."""


def check_choice(value, name: str, choices):
    """``value`` if it is one of ``choices``, else ParameterError naming ``name``:
    "binning: must be one of 'uniform', 'quantile', got 'equal'". Returns ``value``."""
    if value not in choices:
        raise ParameterError(name, value, f"must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def check_int(value, name: str, *, minimum: int = 1) -> None:
    """ParameterError naming ``name`` unless ``value`` is an int ≥ ``minimum`` (bool is not an int here)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        what = "a positive integer" if minimum == 1 else f"an integer ≥ {minimum}"
        raise ParameterError(name, value, f"must be {what}, got {value!r}")


def check_positive_number(value, name: str) -> None:
    """ParameterError naming ``name`` unless ``value`` is a finite real number > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise ParameterError(name, value, f"must be a finite number > 0, got {value!r}")


class ParameterWarning(UserWarning):
    """A usable but surprising value, e.g. a limit above the questions there are.

    ``text`` is the whole message; it writes parameter names as ``{name}`` (``parameter`` and ``related``),
    spelled by ``message(name_of)``.
    """

    def __init__(self, parameter: str, value, text: str, *, related=()):
        super().__init__(parameter, value, text)
        self.parameter, self.value, self.text, self.related = parameter, value, text, tuple(related)

    def message(self, name_of=str) -> str:
        return _spell(self.text, {self.parameter, *self.related}, name_of)

    def __str__(self) -> str:
        return self.message()

    def renamed(self, names: dict) -> "ParameterWarning":
        return type(self)(names.get(self.parameter, self.parameter), self.value, _rename(self.text, names),
                          related=tuple(names.get(r, r) for r in self.related))


@contextmanager
def renamed_parameters(**names):
    """Inside the block, ParameterErrors and ParameterWarnings about parameter ``old`` name ``names[old]``
    instead: a caller passes its own field to a function and reports errors under the field's name::

        with renamed_parameters(name="dataset"):
            load_mcqa(config.dataset, ...)   # "name: unknown dataset" → "dataset: unknown dataset"
    """
    with warnings.catch_warnings():
        shown = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if isinstance(message, ParameterWarning):
                message = message.renamed(names)
            shown(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        try:
            yield
        except ParameterError as err:
            raise err.renamed(names) from None
