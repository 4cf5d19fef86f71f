"""``hf-calibration`` command line: one subcommand per job of ``hf_calibration.jobs``, parsed TRL style.

Each subcommand's options are the fields of the job's config dataclasses (``--field-name``; the help is the
field's ``metadata["help"]``), parsed with ``trl.TrlParser``, which also reads ``--config file.yaml`` (field
names as keys; options on the command line override it). Bad input prints one line
``hf-calibration: error: …`` on stderr and exits with code 2, before any output file is written and, where
the check needs no model, before any model loads; a config's or a job's ``ParameterError`` names the option
through its field (``err.parameter``), never by reading the message. Nothing in the library imports this module.
"""

from __future__ import annotations

import dataclasses
import sys
import warnings
from pathlib import Path

from trl import TrlParser

from hf_calibration.calm import CALMConfig
from hf_calibration.errors import ParameterError, ParameterWarning
from hf_calibration.jobs import (CALMJobConfig, DiagnoseConfig, EvaluateConfig, FitPosthocConfig, LMEvalImportConfig,
                                 ReportConfig, SECLStreamConfig, run_calm, run_diagnose, run_evaluate, run_fit_posthoc,
                                 run_lm_eval_import, run_report, run_secl_stream)
from hf_calibration.jobs.secl_service import SECLServiceConfig, run_secl_service
from hf_calibration.secl import SECLConfig

PROG = "hf-calibration"

# command → (config dataclasses, job function, help, description)
COMMANDS = {
    "evaluate": ((EvaluateConfig,), run_evaluate,
                 "score MCQA questions with a model and report calibration metrics",
                 "Score multiple-choice questions by option-letter probabilities; write predictions.jsonl, "
                 "metrics.json and reliability_diagram.png; print a table."),
    "fit-posthoc": ((FitPosthocConfig,), run_fit_posthoc,
                    "fit a post-hoc calibrator on the predictions.jsonl written by `evaluate`",
                    "Fit temperature/vector scaling on the option logits, or Platt/isotonic/histogram binning on the "
                    "top-label confidence, and save it as JSON for `evaluate --posthoc`."),
    "calm": ((CALMJobConfig, CALMConfig), run_calm,
             "fine-tune a causal LM with CALM (bilevel calibration) on MCQA data",
             "Train LoRA (or full) weights and a logit adjustment with CALMTrainer on MMLU-style MCQA; S_T and S_V "
             "come from --train-subjects / --calibration-subjects, the labelled eval split from --eval-subjects. "
             "Writes the adapter, logit_adjustment.safetensors and a model card to --output-dir."),
    "diagnose": ((DiagnoseConfig,), run_diagnose,
                 "measure the generation–discrimination gap: will SECL help this model?",
                 "For each question: option probability, P(True) of the predicted answer, P(True)Norm over the "
                 "options, verbalized confidence and a DINCO-style score. Writes diagnosis.json, signals.jsonl and "
                 "reliability_diagrams.png; prints the table and the verdict."),
    "secl": ((SECLStreamConfig, SECLConfig), run_secl_stream,
             "run a question stream through SECL and compare it with the baselines",
             "Two passes over the same stream: the baselines (verbalized, P(True), P(True)Norm, DINCO-style; "
             "Platt/TS with labels, 2-fold) and SECL online. Writes records.jsonl, metrics.json, the calibrated "
             "adapter (secl_adapter/) and a reliability diagram per domain; prints a table per domain and overall."),
    "secl-serve": ((SECLServiceConfig, SECLConfig), run_secl_service,
                   "SECL beside a vLLM server: one LoRA adapter per stream, trained here, hot-swapped into the server",
                   "Answers and confidence reads go to the server (--base-url), the burst's LoRA steps run in a local "
                   "copy of --model; each new adapter version is saved under --output-dir and loaded by the server "
                   "(docs/serving.md). A rerun on the same --output-dir resumes every stream."),
    "report": ((ReportConfig,), run_report,
               "one self-contained HTML page from result folders: tables with intervals, reliability diagrams",
               "hf-calibration report DIR [DIR ...] --output report.html: every metric table (value [95 % interval], "
               "constant references marked) and reliability diagram of each folder, folders side by side; no network "
               "needed to open it."),
    "lm-eval-import": ((LMEvalImportConfig,), run_lm_eval_import,
                       "calibration reports of lm-evaluation-harness runs (their --log_samples logs)",
                       "Read lm-eval's samples_<task>_<date>.jsonl of multiple-choice tasks (any backend: HF, vLLM, "
                       "an API) and write evaluate's report per task and scoring (acc, acc_norm): metrics.json "
                       "with 95 % intervals and constant references, predictions.jsonl, reliability_diagram.png. "
                       "No model is loaded."),
}
# Commands whose leading arguments are positional: they fill this config field (report DIR [DIR …]).
POSITIONAL = {"report": "inputs"}


def option(field_name: str) -> str:
    """The command-line option of a config field: ``limit_per_domain`` → ``--limit-per-domain``."""
    return "--" + field_name.replace("_", "-")


class Parser(TrlParser):
    """``TrlParser`` over a command's config dataclasses (none for the top level): no abbreviations (``--lim``
    is an error, not ``--limit``), the dashed spelling of each option first, and one-line errors."""

    def __init__(self, dataclass_types=(), **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(dataclass_types=list(dataclass_types), **kwargs)
        for action in self._actions:  # "--limit-per-domain/--limit_per_domain" in help and errors
            action.option_strings.sort(key=lambda s: "_" in s)
        if self.dataclass_types:
            self.add_argument("--config", metavar="FILE", help="YAML file of option values, keyed by field name "
                              "(limit_per_domain: 5); options given on the command line override it")

    def error(self, message):  # one line, exit 2 (argparse's own usage dump is several lines)
        print(f"{PROG}: error: {message}", file=sys.stderr)
        raise SystemExit(2)

    def fields(self) -> set:
        return {f.name for t in self.dataclass_types for f in dataclasses.fields(t)}

    def option_of(self, name: str) -> str:
        """How the user spells parameter ``name``: the option of a config field, else the name itself."""
        return option(name) if name in self.fields() else name

    def parse(self, args: list[str]) -> tuple:
        """The command's config dataclasses from ``args`` (and ``--config``); a usage error exits with code 2,
        a bad value raises the config's ParameterError."""
        import yaml

        # --config=FILE is --config FILE (argparse would otherwise leave it to TrlParser, which ignores it)
        args = [part for a in args for part in (a.split("=", 1) if a.startswith("--config=") else (a,))]
        if "--config" in args:
            i = args.index("--config")
            if i + 1 == len(args):
                self.error("argument --config: expected one argument")
            path = args[i + 1]
            try:
                values = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError) as err:
                self.error(f"--config: {path!r} cannot be read ({err.__class__.__name__})")
            except yaml.YAMLError as err:
                self.error(f"--config: {path!r} is not YAML ({str(err).splitlines()[0]})")
            if not isinstance(values, dict):
                self.error(f"--config: {path!r} must hold a mapping of field names to values")
        *configs, from_config, rest = self.parse_args_and_config(args, return_remaining_strings=True,
                                                                 separate_remaining_strings=True)
        if from_config:
            self.error(f"--config: unknown fields {', '.join(k[2:] for k in from_config[::2])}")
        if rest:
            self.error(f"unrecognized arguments: {' '.join(rest)}")
        return tuple(configs[: len(self.dataclass_types)])


def build_parser() -> Parser:
    """The top-level parser, every command a subparser over its config dataclasses; the subparsers by command
    ("evaluate", …) are in its ``commands``."""
    parser = Parser(prog=PROG, description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    parser.commands = {name: sub.add_parser(name, dataclass_types=types, help=help_, description=description)
                       for name, (types, _, help_, description) in COMMANDS.items()}
    return parser


def _route(parser: Parser, argv: list[str]) -> tuple[str, Parser, list[str]]:
    """(command, its parser, the arguments after it); anything else goes through the top-level parser, which
    prints the help or a one-line usage error and exits."""
    for n in (2, 1):
        command = " ".join(argv[:n])
        if len(argv) >= n and command in parser.commands:
            rest = argv[n:]
            if command in POSITIONAL:  # DIR [DIR …] before the options → --<field> DIR [DIR …]
                k = next((i for i, a in enumerate(rest) if a.startswith("-")), len(rest))
                rest = ([option(POSITIONAL[command]), *rest[:k]] if k else []) + rest[k:]
            return command, parser.commands[command], rest
    parser.parse_args(argv)
    raise SystemExit(2)  # parse_args exits for every argv that reaches it


def parse_command(argv: list[str]) -> tuple[str, tuple]:
    """(command, its config dataclasses) of a command line, without running the job."""
    command, parser, rest = _route(build_parser(), list(argv))
    return command, parser.parse(rest)


_PACKAGE_DIR = Path(__file__).resolve().parent


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command, parser, rest = _route(build_parser(), argv)
    with warnings.catch_warnings():
        warnings.simplefilter("always", ParameterWarning)
        shown = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if isinstance(message, ParameterWarning):
                print(f"{PROG}: warning: {message.message(parser.option_of)}", file=sys.stderr)
            elif _PACKAGE_DIR in Path(filename).resolve().parents:  # ours (a degenerate fit, …): one line too
                print(f"{PROG}: warning: {message}", file=sys.stderr)
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        try:
            configs = parser.parse(rest)
            result = COMMANDS[command][1](*configs)
        except ParameterError as err:
            print(f"{PROG}: error: {err.message(parser.option_of)}", file=sys.stderr)
            return 2
        except (ValueError, OSError) as err:  # bad values of other parameters, files that cannot be read or written
            print(f"{PROG}: error: {err}", file=sys.stderr)
            return 2
    if result.table:
        print(result.table)
    print(f"wrote {', '.join(str(p) for p in result.paths.values())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
