"""What the jobs share: the config fields they have in common, the checks their configs and functions make
(each raising ``ParameterError`` naming the field), and the result every job returns.

The field helpers give one help text per field, so ``hf-calibration <command> --help`` and the config
docstrings say the same thing everywhere.
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from hf_calibration.errors import (MissingPathError, ParameterError, ParameterTypeError,  # noqa: F401
                                   ParameterWarning, check_choice, check_int, check_positive_number,
                                   renamed_parameters)
from hf_calibration.metrics.validation import check_n_bins
from hf_calibration.metrics.binning import BINNINGS
from hf_calibration.metrics.ece import NORMS
from hf_calibration.modeling.context import OVERFLOW_POLICIES
from hf_calibration.modeling.prompts import PROMPT_FORMATS

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


# ------------------------------------------------------------------------------------------- fields


def model_field(default: str = DEFAULT_MODEL):
    return field(default=default, metadata={
        "help": "Hub id or local folder (offline: the packaged SmolLM2 / Qwen2.5-Coder copies)."})


def subjects_field():
    return field(default=None, metadata={
        "help": "MMLU subjects and/or categories, comma-separated (stem, humanities, social_sciences, other)."})


def output_dir_field(help: str = "Folder for the outputs (created)."):
    """A job's ``output_dir``; its config's ``__post_init__`` calls ``check_path(self.output_dir, "output_dir")``
    (tests/jobs/test_jobs.py checks that every job config does)."""
    return field(metadata={"help": help})


def seed_field(help: str = "Sampling and bootstrap seed."):
    return field(default=0, metadata={"help": help})


def batch_size_field(help: str = "Prompts per forward pass.", default: int = 8):
    return field(default=default, metadata={"help": help})


def device_field():
    return field(default="auto", metadata={
        "help": "Where the model runs: auto (CUDA, as cuda:LOCAL_RANK under a launcher, or MPS when available, "
                "else CPU), cpu, cuda, cuda:N or mps."})


def backend_field():
    from hf_calibration.modeling.backends.registry import REGISTRY

    named = "; ".join(f"{name} ({entry.help})" for name, entry in REGISTRY.items())
    return field(default="transformers", metadata={
        "help": f"Where the model is scored: {named}. Through a server the tokenizer and chat template still come "
                "from --model (docs/serving.md).", "choices": list(REGISTRY)})


def base_url_field():
    return field(default=None, metadata={
        "help": "URL of the OpenAI-compatible server for --backend openai, e.g. http://127.0.0.1:8000/v1."})


def served_model_field():
    return field(default=None, metadata={
        "help": "Name the server serves the model (or a LoRA adapter) under, for --backend openai (when not given: "
                "--model)."})


def prompt_format_field():
    return field(default="auto", metadata={
        "help": "Chat template or plain prompt (auto: chat when the tokenizer has a template).",
        "choices": list(PROMPT_FORMATS)})


def balance_gold_field():
    return field(default=False, metadata={
        "help": "Move each MCQA question's correct option so every letter is gold equally often."})


def on_overflow_field():
    return field(default="truncate", metadata={
        "help": "A question longer than the model's context: truncate (cut its text in the middle; the options, "
                "answer slot and chat markup are kept; one warning counts them), skip (drop it) or error (stop "
                "before anything is scored or written, naming it).", "choices": list(OVERFLOW_POLICIES)})


def fit_mcqa_to_context(dataset, model, tokenizer, *, prompt_format: str, on_overflow: str, reserve=0,
                        limit: int | None = None):
    """``dataset`` (MCQA rows) with every prompt fitted to the model's context (``modeling.context``): the
    questions that do not fit cut in the middle, or dropped, or a ParameterError naming ``on_overflow``.

    reserve : tokens the step adds after the MCQA prompt (an int, or a function of a row's choices giving one):
        0 for the option-letter read of ``evaluate``, the follow-up turns of ``diagnose``.
    limit : a context shorter than the model's to fit to (CALM's ``max_length``)."""
    from hf_calibration.modeling.context import context_length, fit_to_context
    from hf_calibration.modeling.prompts import build_mcqa_prompt, resolve_prompt_format

    fmt = resolve_prompt_format(tokenizer, prompt_format)
    choices = dataset["choices"]
    context = context_length(model, tokenizer)
    if limit is not None:
        context = limit if context is None else min(limit, context)
    fit = fit_to_context(tokenizer, dataset["question"], limit=context,
                         build=lambda i, q: build_mcqa_prompt(tokenizer, q, choices[i], prompt_format=fmt),
                         reserve=reserve if isinstance(reserve, int) else [reserve(c) for c in choices],
                         on_overflow=on_overflow)
    if not fit.overflowed:
        return dataset
    if not fit.kept:
        raise ParameterError("on_overflow", on_overflow, f"none of the {len(dataset)} questions fits in the model's "
                             f"context of {fit.limit:,} tokens")
    texts = fit.texts
    return dataset.select(fit.kept).map(lambda row, j: {"question": texts[j]}, with_indices=True)


def n_resamples_field():
    return field(default=1000, metadata={"help": "Bootstrap resamples for the 95 percent intervals."})


def dataset_field(default: str, named: str):
    """The ``dataset`` of a job that scores multiple-choice questions: ``named`` lists its named sets."""
    return field(default=default, metadata={
        "help": f"{named}; or your own multiple-choice data: a local .json, .jsonl, .csv or .parquet file, or a Hub "
                "dataset id owner/name (online), its columns given by --question-column, --choices-column and "
                "--answer-column."})


# Your own data (a local file or a Hub dataset): how its rows map onto the MCQA schema (``data.to_mcqa``).
CUSTOM_DATA_FIELDS = ("split", "dataset_config", "question_column", "choices_column", "answer_column",
                      "subject_column")


def split_field():
    return field(default=None, metadata={
        "help": "Split of a Hub dataset (when not given: test if it has one, else its only split)."})


def dataset_config_field():
    return field(default=None, metadata={"help": "Configuration (subset) of a Hub dataset, as load_dataset's name."})


def question_column_field():
    return field(default=None, metadata={"help": "Column of the question in your own data (when not given: question)."})


def choices_column_field():
    return field(default=None, metadata={
        "help": "Column holding a list of options per row, or one column per option comma-separated (A,B,C,D), "
                "in your own data (when not given: choices). A row may leave trailing option cells empty."})


def answer_column_field():
    return field(default=None, metadata={
        "help": "Column of the correct option in your own data (when not given: answer): an index counting from 0 "
                "or a letter A-J."})


def subject_column_field():
    return field(default=None, metadata={
        "help": "Column to use as the subject (--limit samples stratified by it) in your own data (when not given: "
                "the file name or Hub id)."})


def custom_data_options(config) -> dict:
    """The ``CUSTOM_DATA_FIELDS`` of a job config, as keyword arguments of ``load_mcqa``."""
    return {name: getattr(config, name) for name in CUSTOM_DATA_FIELDS}


# The binned metrics' options (``metrics.expected_calibration_error``'s own): conf-ECE, its interval, the diagrams.
ECE_DEFAULTS = {"n_bins": 15, "binning": "uniform", "norm": "l1"}


def n_bins_field():
    return field(default=ECE_DEFAULTS["n_bins"], metadata={
        "help": "Bins of the binned metrics: conf-ECE and its bootstrap interval, MCE, ACE, cw-ECE, and the "
                "reliability diagram; at most max(questions, 15) (docs/methods.md, 'Binned ECE family')."})


def binning_field():
    return field(default=ECE_DEFAULTS["binning"], metadata={
        "help": "Bins of conf-ECE, MCE and the reliability diagram: uniform (equal width) or quantile (equal mass).",
        "choices": list(BINNINGS)})


def norm_field():
    return field(default=ECE_DEFAULTS["norm"], metadata={
        "help": "Norm of conf-ECE over the bins: l1 (ECE), l2 (RMSCE) or max (MCE).", "choices": list(NORMS)})


def check_ece_options(config, n: int | None = None) -> None:
    """ParameterError naming ``n_bins``, ``binning`` or ``norm`` of a config with the three ECE fields; with ``n``
    (the questions scored, or at most scored: ``limit``) ``n_bins`` must be ≤ max(n, 15) (``metrics.max_bins``)."""
    check_int(config.n_bins, "n_bins")
    if n is not None:
        check_n_bins(config.n_bins, n, of="questions")
    check_choice(config.binning, "binning", BINNINGS)
    check_choice(config.norm, "norm", NORMS)


def ece_options(config) -> dict:
    """``n_bins``, ``binning`` and ``norm`` of a job config, as keyword arguments of ``reports`` functions."""
    return {name: getattr(config, name) for name in ECE_DEFAULTS}


# ------------------------------------------------------------------------------------------- checks


def check_device(device: str) -> str:
    """``auto`` (kept: resolved when the model loads, so a launcher's LOCAL_RANK counts) or a torch device this
    machine has, normalised (see ``modeling.resolve_device``); ParameterError naming ``device``."""
    if device == "auto":
        return device
    from hf_calibration.modeling.loading import resolve_device

    return resolve_device(device)


def check_non_empty(value, name: str) -> None:
    """A text option that was given must say something: ``""`` or ``","`` is an error, not the default."""
    if value is not None and not str(value).replace(",", "").strip():
        raise ParameterError(name, value, f"must not be empty, got {value!r}")


def _check_writable_location(path: Path, name: str, raw: str) -> None:
    """The nearest existing ancestor of ``path`` must be a writable directory (checked before any work)."""
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ParameterError(name, raw, f"{raw!r} cannot be created: {str(parent)!r} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ParameterError(name, raw, f"{raw!r} cannot be created: {str(parent)!r} is not writable")
    _probe(parent, name, raw, "cannot be created")


def _probe(folder: Path, name: str, raw: str, what: str) -> None:
    """Create and remove a folder in ``folder``: permissions do not tell (root may write anywhere, yet not under
    /proc or on a read-only mount), and the job must fail here, not after the model has run."""
    import tempfile

    try:
        os.rmdir(tempfile.mkdtemp(dir=folder, prefix=".hfcal-probe-"))
    except OSError as err:
        raise ParameterError(name, raw, f"{raw!r} {what} ({err.strerror or err.__class__.__name__})") from None


def overwrite_field():
    return field(default=False, metadata={
        "help": "Replace another job's results, or files no run of this package wrote, in the output folder "
                "(otherwise refused; an earlier run of the same job is replaced, its stale files removed, except "
                "an evaluate run of other data or another model, which is refused too)."})


def check_path(path, name: str, *, what: str = "folder") -> str:
    """``path``, a str or an ``os.PathLike`` (``pathlib.Path``), as a non-empty string. ParameterTypeError (also a
    TypeError) naming ``name`` for another type (``output_dir=5`` would otherwise become a folder named "5"),
    ParameterError for None or "". Touches no file: a job config calls it at construction for its path fields,
    and ``check_output_dir`` / ``check_output_file`` / ``check_input_file`` call it first."""
    value = os.fspath(path) if isinstance(path, os.PathLike) else path
    if value is None or value == "":
        raise ParameterError(name, path, f"must name a {what}, got {path!r}")
    if not isinstance(value, str):
        raise ParameterTypeError(name, path, f"must be a path naming a {what} (a string or pathlib.Path), got "
                                 f"{path!r} ({type(path).__name__})")
    return value


def check_output_dir(path, name: str = "output_dir") -> Path:
    """``path`` as a folder to write into, checked up front (nothing is created): a str or PathLike
    (``check_path``), not empty, not an existing file, creatable and writable. ParameterError naming ``name``."""
    raw = check_path(path, name)
    out = Path(raw)
    if out.exists():
        if not out.is_dir():
            raise ParameterError(name, raw, f"{raw!r} exists and is not a directory")
        if not os.access(out, os.W_OK | os.X_OK):
            raise ParameterError(name, raw, f"{raw!r} is not writable")
        _probe(out, name, raw, "is not writable")
    else:
        _check_writable_location(out, name, raw)
    return out


def check_output_file(path, name: str = "output") -> Path:
    """``path`` as a file to write, checked up front: a str or PathLike (``check_path``), not empty, not a
    directory, its folder creatable."""
    raw = check_path(path, name, what="file")
    out = Path(raw)
    if out.is_dir():
        raise ParameterError(name, raw, f"{raw!r} is a directory; give a file name")
    if out.exists() and not os.access(out, os.W_OK):
        raise ParameterError(name, raw, f"{raw!r} is not writable")
    if not out.exists():
        _check_writable_location(out, name, raw)
    return out


def check_input_file(path, name: str) -> Path:
    """``path`` as an existing file, or MissingPathError (a ParameterError) naming ``name`` and the value
    (ParameterTypeError for a value that is not a path: ``check_path``)."""
    raw = "" if path is None or path == "" else check_path(path, name, what="file")
    if not raw or not Path(raw).is_file():
        raise MissingPathError(name, raw, f"{raw!r} is not a file")
    return Path(raw)


# --------------------------------------------------------------------------------------------- data


def load_mcqa_for(dataset: str, *, subjects=None, limit: int, seed: int, balance_gold: bool = False,
                  default_limit: int | None = None, **custom):
    """``load_mcqa`` for a job whose config has the fields ``dataset``, ``subjects``, ``limit`` (and, in
    ``custom``, those of ``CUSTOM_DATA_FIELDS``: ``custom_data_options(config)``); its errors name those fields.
    A ``limit`` above the questions there are is not an error: one ParameterWarning, then all; none for your own
    data at the job's ``default_limit`` (a --limit the user never gave)."""
    from hf_calibration.data import MCQA_DATASETS, load_mcqa

    with renamed_parameters(name="dataset"):
        rows = load_mcqa(dataset, subjects=subjects, limit=limit, seed=seed, balance_gold=balance_gold, **custom)
    if len(rows) < limit and not (limit == default_limit and dataset not in MCQA_DATASETS):
        field_, value = ("subjects", subjects) if subjects else ("dataset", dataset)
        warnings.warn(ParameterWarning("limit", limit, f"{{limit}} {limit}: only {len(rows)} questions in {{{field_}}} "
                                                       f"{value}; using {len(rows)}", related=(field_,)), stacklevel=2)
    return rows


def progress_line(text: str, progress: bool) -> None:
    """A line about a long job's progress on stdout, when ``progress``."""
    if progress:
        print(text, file=sys.stdout, flush=True)


# ------------------------------------------------------------------------------------------- result


@dataclass(kw_only=True)
class MCQAScoringConfig:
    """The fields and checks of every job that scores multiple-choice questions with a model (evaluate,
    diagnose): where to write, which model, which questions (a named set, a file with its column mapping, or
    a Hub id), the seed, the device, the prompt, the bootstrap and the ECE options. A job's config subclasses
    it, sets ``dataset``'s and ``limit``'s defaults and help, and calls ``check_scoring_fields`` in its
    ``__post_init__``."""

    # dataset, limit and batch_size: each job redefines them with its own default and help (a redefined
    # field keeps its place here, so --help lists the options in this order)
    output_dir: str = output_dir_field()
    model: str = model_field()
    dataset: str = dataset_field("mmlu", "mmlu, gpqa or a HaluEval set")
    question_column: str | None = question_column_field()
    choices_column: str | None = choices_column_field()
    answer_column: str | None = answer_column_field()
    subject_column: str | None = subject_column_field()
    split: str | None = split_field()
    dataset_config: str | None = dataset_config_field()
    subjects: str | None = subjects_field()
    limit: int = field(default=200, metadata={"help": "Number of questions."})
    seed: int = seed_field()
    batch_size: int = batch_size_field()
    device: str = device_field()
    backend: str = backend_field()
    base_url: str | None = base_url_field()
    served_model: str | None = served_model_field()
    prompt_format: str = prompt_format_field()
    on_overflow: str = on_overflow_field()
    n_resamples: int = n_resamples_field()
    n_bins: int = n_bins_field()
    binning: str = binning_field()
    norm: str = norm_field()
    overwrite: bool = overwrite_field()

    def default_limit(self) -> int:
        """The ``limit`` this job has when none is given."""
        return type(self).__dataclass_fields__["limit"].default

    def check_scoring_fields(self) -> None:
        """ParameterError naming the first bad shared field (output folder, sizes, prompt format, seed, ECE
        options)."""
        from hf_calibration.modeling.prompts import PROMPT_FORMATS

        check_path(self.output_dir, "output_dir")
        for name in ("limit", "batch_size", "n_resamples"):
            check_int(getattr(self, name), name)
        check_choice(self.prompt_format, "prompt_format", PROMPT_FORMATS)
        check_choice(self.on_overflow, "on_overflow", OVERFLOW_POLICIES)
        check_non_empty(self.subjects, "subjects")
        check_int(self.seed, "seed", minimum=0)
        check_ece_options(self, self.limit)
        from hf_calibration.modeling.backends.registry import check_backend_options

        check_backend_options(self.backend, self.base_url, self.served_model)


@dataclass(kw_only=True)
class JobResult:
    """What every job returns.

    metrics : the numbers written to the job's metrics file (``metrics.json``, ``diagnosis.json``), which
        holds ``{"run": run, **metrics}``.
    run : what ran: model, data, sizes, seed, prompt format, wall times.
    paths : every file or folder the job wrote, by name.
    output_dir : the folder written into.
    table : the text the command line prints.
    """

    metrics: dict
    run: dict
    paths: dict[str, Path]
    output_dir: Path
    table: str = ""
