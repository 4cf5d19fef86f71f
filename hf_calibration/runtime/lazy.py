"""Names of a package imported from their modules on first use (PEP 562 module ``__getattr__``), so that importing
the package, or reading one command's options, does not load every module's stack (torch, transformers, TRL)."""

from __future__ import annotations


def lazy_exports(package: str, table: dict[str, str]):
    """``(__getattr__, __all__)`` for the package named ``package`` whose public names are all lazy: ``table``'s keys
    (``lazy_getattr``), sorted."""
    return lazy_getattr(package, table), sorted(table)


def lazy_getattr(package: str, table: dict[str, str]):
    """The module ``__getattr__`` of the package named ``package``: each name in ``table`` imported from the module its
    value names on first access and then kept in the package's namespace (later accesses are plain attribute reads).
    Unknown names raise AttributeError naming the package, as Python does."""
    import importlib
    import sys

    def __getattr__(name: str):
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(table[name]), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
