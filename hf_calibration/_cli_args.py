"""Argument types and checks shared by the ``hf-calibration`` subcommands (one home for every cli module)."""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path


def positive(kind, name: str):
    """argparse ``type=`` that parses ``kind`` (int or float) and rejects values ≤ 0, NaN and inf, naming ``name``."""

    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a positive {kind.__name__}, got {text!r}") from None
        if not math.isfinite(value) or value <= 0:
            raise argparse.ArgumentTypeError(f"{name} must be a positive {kind.__name__}, got {text!r}")
        return value

    return parse


def non_negative_int(name: str):
    """argparse ``type=`` for seeds and counts: an integer ≥ 0, naming ``name`` otherwise."""

    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer ≥ 0, got {text!r}") from None
        if value < 0:
            raise argparse.ArgumentTypeError(f"{name} must be an integer ≥ 0, got {text!r}")
        return value

    return parse


def as_option(message: str, options: dict) -> str:
    """Replace a leading "<parameter>:" of a library error with the command-line option it came from."""
    head, sep, rest = message.partition(":")
    return f"{options[head]}:{rest}" if sep and head in options else message


def load_mcqa_from_args(args):
    """``load_mcqa`` on ``--dataset/--subjects/--limit/--seed``; its errors name those options, not its parameters.

    A ``--limit`` above the questions there are is not an error: one warning line on stderr, then all of them.
    """
    from hf_calibration.data import load_mcqa

    try:
        dataset = load_mcqa(args.dataset, subjects=args.subjects, limit=args.limit, seed=args.seed)
    except ValueError as err:
        raise ValueError(as_option(str(err), {"name": "--dataset", "subjects": "--subjects"})) from None
    if len(dataset) < args.limit:
        where = f"--subjects {args.subjects}" if args.subjects else f"--dataset {args.dataset}"
        print(f"hf-calibration: warning: --limit {args.limit}: only {len(dataset)} questions in {where}; "
              f"using {len(dataset)}", file=sys.stderr)
    return dataset


def check_domains(spec: str, option: str, known) -> None:
    """Check a comma-separated list of domains (``secl --stream``, ``experiment --datasets``) before any work.

    Each entry is a name in ``known`` or ``mmlu:<categories or subjects, '+'-joined>``. Raises ValueError naming
    ``option`` and the bad entry: an empty entry (``"a,,b"``, a trailing comma), an unknown name, subjects on a
    domain other than mmlu, an empty subject (``"mmlu:"``, ``"mmlu:stem+"``) or an unknown one. Checked here
    rather than by mapping the library's messages, so the error names the option the user typed.
    """
    from hf_calibration.data import CATEGORIES
    from hf_calibration.data.loaders import resolve_subjects

    for entry in (e.strip() for e in spec.split(",")):
        if not entry:
            raise ValueError(f"{option}: empty entry in {spec!r}; separate the domains by single commas")
        name, colon, subjects = entry.partition(":")
        if name not in known:
            raise ValueError(f"{option}: unknown domain {name!r} in {spec!r}; known: {', '.join(known)}")
        if colon and name != "mmlu":
            raise ValueError(f"{option}: only mmlu takes subjects, got {entry!r}")
        for subject in subjects.split("+") if colon else ():
            if not subject.strip():
                raise ValueError(f"{option}: empty MMLU subject in {entry!r}; write mmlu:<category or subject>"
                                 f"[+…], or mmlu for all of MMLU")
            try:
                resolve_subjects(subject)
            except ValueError:
                raise ValueError(f"{option}: in {entry!r}, unknown MMLU subject or category {subject!r}; "
                                 f"categories are {', '.join(sorted(CATEGORIES))}, subjects are e.g. "
                                 f"'college_physics' (57 in all)") from None


def device(text: str) -> str:
    """argparse ``type=`` for ``--device``: ``auto`` (kept, resolved when the model loads) or a torch device
    this machine has (``cpu``, ``cuda``, ``cuda:1``, ``mps``); see ``modeling.resolve_device``."""
    if text == "auto":
        return text
    from hf_calibration.modeling.loading import resolve_device

    try:
        return resolve_device(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("device: ")) from None  # argparse names --device


def add_device_argument(p) -> None:
    """Register ``--device`` (default ``auto``: the GPU of this process when there is one, else the CPU)."""
    p.add_argument("--device", type=device, default="auto",
                   help="where the model runs: auto (default: CUDA, as cuda:LOCAL_RANK under a launcher, or MPS when "
                        "available, else CPU), cpu, cuda, cuda:N or mps")


def _check_writable_location(path: Path, name: str, raw: str) -> None:
    """The nearest existing ancestor of ``path`` must be a writable directory (checked before any work)."""
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{name}: {raw!r} cannot be created: {str(parent)!r} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{name}: {raw!r} cannot be created: {str(parent)!r} is not writable")


def output_dir(path: str, name: str = "--output-dir") -> Path:
    """``path`` as a folder to write into, checked up front: not empty, not an existing file, creatable."""
    if not path:
        raise ValueError(f"{name}: must name a folder, got {path!r}")
    out = Path(path)
    if out.exists():
        if not out.is_dir():
            raise ValueError(f"{name}: {path!r} exists and is not a directory")
        if not os.access(out, os.W_OK | os.X_OK):
            raise ValueError(f"{name}: {path!r} is not writable")
    else:
        _check_writable_location(out, name, path)
    return out


def output_file(path: str, name: str = "--output") -> Path:
    """``path`` as a file to write, checked up front: not empty, not a directory, its folder creatable."""
    if not path:
        raise ValueError(f"{name}: must name a file, got {path!r}")
    out = Path(path)
    if out.is_dir():
        raise ValueError(f"{name}: {path!r} is a directory; give a file name")
    if out.exists() and not os.access(out, os.W_OK):
        raise ValueError(f"{name}: {path!r} is not writable")
    if not out.exists():
        _check_writable_location(out, name, path)
    return out


def input_file(path: str, name: str) -> Path:
    """``path`` as an existing, readable file, or ValueError naming ``name`` and the value given."""
    p = Path(path)
    if not path or not p.is_file():
        raise ValueError(f"{name}: {path!r} is not a file")
    return p
