"""Argument types shared by the ``hf-calibration`` subcommands (one home, used by every cli module)."""

from __future__ import annotations

import argparse
from pathlib import Path


def positive(kind, name: str):
    """argparse ``type=`` that parses ``kind`` (int or float) and rejects values ≤ 0, naming ``name``."""

    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a positive {kind.__name__}, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{name} must be a positive {kind.__name__}, got {text!r}")
        return value

    return parse


def output_dir(path: str, name: str = "--output-dir") -> Path:
    """``path`` as a folder to write into; ValueError when it exists and is not a directory."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{name}: {path!r} exists and is not a directory")
    return out
