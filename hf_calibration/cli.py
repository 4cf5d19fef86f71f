"""``hf-calibration`` command line: one subcommand per job of ``hf_calibration.jobs``, parsed TRL style.

Each subcommand's options are the fields of the job's config dataclasses (``--field-name``; the help is the
field's ``metadata["help"]``), parsed with ``trl.TrlParser``, which also reads ``--config file.yaml`` (field
names as keys; options on the command line override it). A command's module is imported only when that command
runs or shows its help, so ``hf-calibration --help`` and a mistyped command answer at once. Bad input prints one
line ``hf-calibration: error: --option: …`` on stderr and exits with code 2, before any output file is written
and, where the check needs no model, before any model loads; a config's or a job's ``ParameterError`` names the
option through its field (``err.parameter``), never by reading the message. Ctrl-C prints one line and exits with
code 130. Nothing in the library imports this module.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib
import re
import sys
import textwrap
import warnings
from pathlib import Path

from trl import TrlParser

from hf_calibration import __version__
from hf_calibration.errors import ParameterError, ParameterWarning

PROG = "hf-calibration"

DESCRIPTION = ("Calibrated confidence for Hugging Face language models: measure how far a model's confidence is from "
               "its accuracy (ECE, Brier, NLL, AUROC with 95 % intervals), correct it after the fact (temperature "
               "scaling and other post-hoc calibrators), train it in (CALM) or adapt it while serving (SECL).")
EPILOG = f"""examples:
  {PROG} evaluate --output-dir outputs/quiz --limit 100
  {PROG} fit-posthoc --method histogram --predictions outputs/quiz/predictions.jsonl --output outputs/hist.json
  {PROG} report outputs/quiz outputs/other

{PROG} COMMAND --help lists a command's options."""


@dataclasses.dataclass(frozen=True)
class Command:
    """A subcommand: its config dataclasses and job as ``"module:name"`` (imported when the command runs or shows
    its help; an object is taken as is), its one-line help and its description."""

    types: tuple
    job: object
    help: str
    description: str
    usage: str | None = None

    def load(self) -> tuple[tuple, object]:
        return tuple(map(_load, self.types)), _load(self.job)


def _load(target):
    if not isinstance(target, str):
        return target
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


COMMANDS = {
    "evaluate": Command(("hf_calibration.jobs.evaluate:EvaluateConfig",), "hf_calibration.jobs.evaluate:run_evaluate",
                        "score MCQA questions with a model and report calibration metrics",
                        "Score multiple-choice questions by option-letter probabilities; write predictions.jsonl, "
                        "metrics.json and reliability_diagram.png; print a table."),
    "fit-posthoc": Command(("hf_calibration.jobs.fit_posthoc:FitPosthocConfig",),
                           "hf_calibration.jobs.fit_posthoc:run_fit_posthoc",
                           "fit a post-hoc calibrator on the predictions.jsonl written by `evaluate`",
                           "Fit temperature/vector scaling on the option logits, or Platt/isotonic/histogram binning "
                           "on the top-label confidence, and save it as JSON for `evaluate --posthoc`."),
    "calm": Command(("hf_calibration.jobs.calm:CALMJobConfig", "hf_calibration.calm:CALMConfig"),
                    "hf_calibration.jobs.calm:run_calm",
                    "fine-tune a causal LM with CALM (bilevel calibration) on MCQA data",
                    "Train LoRA (or full) weights and a logit adjustment with CALMTrainer on MMLU-style MCQA; S_T and "
                    "S_V come from --train-subjects / --calibration-subjects, the labelled eval split from "
                    "--eval-subjects. Writes the adapter, logit_adjustment.safetensors and a model card to "
                    "--output-dir."),
    "diagnose": Command(("hf_calibration.jobs.diagnose:DiagnoseConfig",), "hf_calibration.jobs.diagnose:run_diagnose",
                        "measure the generation–discrimination gap: will SECL help this model?",
                        "For each question: option probability, P(True) of the predicted answer, P(True)Norm over "
                        "the options, verbalized confidence and a DINCO-style score. Writes diagnosis.json, "
                        "signals.jsonl and reliability_diagrams.png; prints the table and the verdict."),
    "secl": Command(("hf_calibration.jobs.secl_stream:SECLStreamConfig", "hf_calibration.secl.config:SECLConfig"),
                    "hf_calibration.jobs.secl_stream:run_secl_stream",
                    "run a question stream through SECL and compare it with the baselines",
                    "Two passes over the same stream: the baselines (verbalized, P(True), P(True)Norm, DINCO-style; "
                    "Platt/TS with labels, 2-fold) and SECL online. Writes records.jsonl, metrics.json, the "
                    "calibrated adapter (secl_adapter/) and a reliability diagram per domain; prints a table per "
                    "domain and overall."),
    "secl-serve": Command(("hf_calibration.jobs.secl_service:SECLServiceConfig", "hf_calibration.secl.config:SECLConfig"),
                          "hf_calibration.jobs.secl_service:run_secl_service",
                          "SECL beside a vLLM server: one LoRA adapter per stream, trained here, hot-swapped into it",
                          "Answers and confidence reads go to the server (--base-url), the burst's LoRA steps run in a "
                          "local copy of --model; each new adapter version is saved under --output-dir and loaded by "
                          "the server (docs/serving.md). A rerun on the same --output-dir resumes every stream."),
    "report": Command(("hf_calibration.jobs.report:ReportConfig",), "hf_calibration.jobs.report:run_report",
                      "one self-contained HTML page from result folders: tables with intervals, reliability diagrams",
                      "Every metric table (value [95 % interval], constant references marked) and reliability "
                      "diagram of each result folder DIR, folders side by side; no network needed to open it.",
                      usage=f"{PROG} report DIR [DIR ...] [--output FILE] [options]"),
    "lm-eval-import": Command(("hf_calibration.jobs.lm_eval:LMEvalImportConfig",),
                              "hf_calibration.jobs.lm_eval:run_lm_eval_import",
                              "calibration reports of lm-evaluation-harness runs (their --log_samples logs)",
                              "Read lm-eval's samples_<task>_<date>.jsonl of multiple-choice tasks (any backend: HF, "
                              "vLLM, an API) and write evaluate's report per task and scoring (acc, acc_norm): "
                              "metrics.json with 95 % intervals and constant references, predictions.jsonl, "
                              "reliability_diagram.png. No model is loaded."),
    "serve": Command(("hf_calibration.jobs.serve:ServeConfig",), "hf_calibration.jobs.serve:run_serve",
                     "an OpenAI-compatible gateway in front of vLLM that adds a calibrated confidence to every answer",
                     "Forwards /v1/chat/completions, /v1/completions and /v1/models to --upstream and adds to each "
                     "choice a confidence object (the --signal read through the upstream, mapped by --calibrator) "
                     "and abstain (--abstain-risk); /healthz, /metrics; per-stream records under --state-dir "
                     "(docs/gateway.md)."),
}
# Commands whose leading arguments are positional: they fill this config field (report DIR [DIR …]).
POSITIONAL = {"report": "inputs"}
# transformers' TrainingArguments has some 120 options; `calm --help` shows these and the ones this package
# declares (`calm --help-all`: all of them)
COMMON_TRAINING_OPTIONS = ("learning_rate", "num_train_epochs", "max_steps", "per_device_train_batch_size",
                           "gradient_accumulation_steps", "gradient_checkpointing", "bf16", "fp16", "seed",
                           "logging_steps", "save_strategy", "report_to", "lr_scheduler_type", "warmup_ratio",
                           "weight_decay", "max_length", "push_to_hub", "hub_model_id")


def option(field_name: str) -> str:
    """The command-line option of a config field: ``limit_per_domain`` → ``--limit-per-domain``."""
    return "--" + field_name.replace("_", "-")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's "(default: …)" after a help text, except where there is none to say: a required option, or a
    None default (the help says what happens when the option is not given)."""

    def _get_help_string(self, action):
        if action.required or action.default in (None, argparse.SUPPRESS, dataclasses.MISSING) or not action.help:
            return action.help
        return super()._get_help_string(action)


def _one_line(message: str) -> str:
    """argparse's messages in this CLI's wording: "--x: …" (not "argument --x/--x_y: …"), "≥" (not ">=")."""
    message = re.sub(r"^argument ([^ :/]+)(/[^ :]+)?: ", r"\1: ", message)
    message = re.sub(r"^(COMMAND|NAME): invalid choice: '([^']*)' \(choose from (.*)\)$",
                     lambda m: f"unknown {m.group(1).lower()} {m.group(2)!r} (choose from "
                               f"{m.group(3).replace(chr(39), '')})", message)
    message = re.sub(r"^the following arguments are required: (.*)$",
                     lambda m: ", ".join(a.split("/")[0] for a in m.group(1).split(", ")) + ": required", message)
    return message.replace(">=", "≥").replace("<=", "≤")


def _percent_escaped(text):
    """A field's help as argparse prints it literally: argparse %-formats every help string, so a lone "%" ("a cut of x %
    cut") became a format directive and printed the whole argparse action. "%%" and "%(name)s" are kept."""
    if not isinstance(text, str):
        return text
    return re.sub(r"%%|%\(|%", lambda m: m.group(0) if len(m.group(0)) == 2 else "%%", text)


class Parser(TrlParser):
    """``TrlParser`` over a command's config dataclasses (none for the top level): no abbreviations (``--lim``
    is an error, not ``--limit``), the dashed spelling of each option first, and one-line errors.

    ``shown``: the fields ``--help`` lists (None: all); the others are parsed as usual and listed by
    ``--help-all``."""

    def __init__(self, dataclass_types=(), *, shown=None, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(dataclass_types=list(dataclass_types), **kwargs)
        self.formatter_class = kwargs["formatter_class"]  # HfArgumentParser sets its own
        for action in self._actions:  # "--limit-per-domain/--limit_per_domain" in help and errors
            action.option_strings.sort(key=lambda s: "_" in s)
            action.help = _percent_escaped(action.help)
            if action.nargs == "?" and action.const is True:  # a bool field: "--overwrite [true|false]", not
                action.metavar = "true|false"                 # HfArgumentParser's "--overwrite [OVERWRITE]"
        if self.dataclass_types:
            self.add_argument("--config", metavar="FILE", help="YAML file of option values, keyed by field name "
                              f"({self._config_example()}); options given on the command line override it.")
        if shown is not None:
            hidden = [a for a in self._actions if a.option_strings and a.dest not in shown | {"help", "config"}]
            for action in hidden:
                action.full_help, action.help = action.help, argparse.SUPPRESS
            self.add_argument("--help-all", action=_FullHelp, nargs=0, help=f"show all {len(hidden)} other "
                              "options (transformers' TrainingArguments and TRL's SFTConfig) and exit")

    def _config_example(self) -> str:
        """A two-field YAML example made of this command's own first fields (``dataset: mmlu, limit: 500``)."""
        examples = []
        for action in self._actions:
            if not action.option_strings or action.dest == "help":
                continue
            value = next(iter(action.choices)) if action.choices else action.default
            if isinstance(value, (int, str)) and not isinstance(value, bool) and value is not dataclasses.MISSING:
                examples.append(f"{action.dest}: {value}")
        return ", ".join(examples[:2]) or "field: value"

    error_prog = PROG  # the program named in the one-line errors

    def error(self, message):  # one line, exit 2 (argparse's own usage dump is several lines)
        message = _one_line(message)
        named = re.match(r"--([\w-]+): ", message)  # a value --config FILE gave: name the file and the field
        field_ = named and named.group(1).replace("-", "_")
        if field_ in getattr(self, "_from_config", {}):
            message = f"--config: {self._from_config[field_]!r}: {field_}: {message[named.end():]}"
        print(f"{self.error_prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)

    def fields(self) -> set:
        return {f.name for t in self.dataclass_types for f in dataclasses.fields(t)}

    positional: str | None = None  # the config field a command's leading DIR [DIR …] fills (POSITIONAL)

    def option_of(self, name: str) -> str:
        """How the user spells parameter ``name``: "DIR" for the field the leading positional arguments fill, the
        option of another config field, else the name itself."""
        if name == self.positional:
            return "DIR"
        return option(name) if name in self.fields() else name

    def _unknown(self, rest: list[str]) -> str:
        """The message for arguments no option takes: the first, with the nearest option when it looks mistyped."""
        first = rest[0]
        if not first.startswith("--"):
            return f"unrecognized arguments: {' '.join(rest)}"
        known = [s for a in self._actions for s in a.option_strings if s.startswith("--") and "_" not in s]
        near = difflib.get_close_matches(first.split("=")[0], known, n=1)
        return f"{first.split('=')[0]}: unknown option" + (f" (did you mean {near[0]}?)" if near else "")

    def parse(self, args: list[str]) -> tuple:
        """The command's config dataclasses from ``args`` (and ``--config``); a usage error exits with code 2,
        a bad value raises the config's ParameterError. A bad value that came from ``--config FILE`` (a wrong
        type, or one the config's checks refuse) is a usage error naming the file and the field."""
        # --config=FILE is --config FILE (argparse would otherwise leave it to TrlParser, which ignores it)
        args = [part for a in args for part in (a.split("=", 1) if a.startswith("--config=") else (a,))]
        self._from_config = self._read_config(args) if "--config" in args else {}
        try:
            *configs, from_config, rest = self.parse_args_and_config(args, return_remaining_strings=True,
                                                                     separate_remaining_strings=True)
        except ParameterError as err:
            if err.parameter not in self._from_config:
                raise
            self.error(f"--config: {self._from_config[err.parameter]!r}: {err.message()}")
        if from_config:
            self.error(f"--config: unknown fields {', '.join(k[2:] for k in from_config[::2])}")
        if rest:
            self.error(self._unknown(rest))
        return tuple(configs[: len(self.dataclass_types)])

    def _read_config(self, args: list[str]) -> dict:
        """{field: FILE} for the fields ``--config FILE`` sets and the command line does not, after checking that
        FILE is readable YAML holding a mapping."""
        import yaml

        i = args.index("--config")
        if i + 1 == len(args):
            self.error("--config: expected one argument")
        path = args[i + 1]
        try:
            values = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as err:
            self.error(f"--config: {path!r} cannot be read ({err.__class__.__name__})")
        except yaml.YAMLError as err:
            self.error(f"--config: {path!r} is not YAML ({str(err).splitlines()[0]})")
        if not isinstance(values, dict):
            self.error(f"--config: {path!r} must hold a mapping of field names to values")
        given = {a.split("=")[0] for a in args if a.startswith("--")}
        return {name: path for name in values
                if not given & {option(name), "--" + name}}


def script_parser(prog: str, description: str) -> Parser:
    """A parser for a script outside the CLI (``experiments/``, ``examples/``) with the CLI's one-line errors
    ("<prog>: error: --x: …", exit 2, no usage dump) and no abbreviated options."""
    parser = Parser(prog=prog, description=description)
    parser.error_prog = prog
    return parser


class _FullHelp(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        for action in parser._actions:
            if action.help is argparse.SUPPRESS and action.option_strings:
                action.help = getattr(action, "full_help", "")
        parser.print_help()
        parser.exit()


def command_parser(command: str) -> Parser:
    """The parser of one command ("evaluate", …) over its config dataclasses (imported here)."""
    spec = COMMANDS[command]
    types, _ = spec.load()
    shown = None
    if command == "calm":
        shown = {name for t in types for name in _own_fields(t)} | {"output_dir", *COMMON_TRAINING_OPTIONS}
    parser = Parser(types, shown=shown, prog=f"{PROG} {command}", description=spec.description, usage=spec.usage)
    parser.positional = POSITIONAL.get(command)
    for action in parser._actions:
        if command == "calm" and action.dest == "output_dir":  # TrainingArguments would train into ./trainer_output
            action.required, action.full_help = True, action.help
            action.help = "Folder for the adapter, the logit adjustment and the model card (created)."
    return parser


def _own_fields(config_type) -> list[str]:
    """The fields ``config_type`` or a base class of this package declares (not inherited from transformers/TRL)."""
    own = []
    for f in dataclasses.fields(config_type):
        declaring = next(c for c in config_type.__mro__ if f.name in vars(c).get("__annotations__", {}))
        if declaring.__module__.startswith("hf_calibration"):
            own.append(f.name)
    return own


def build_parser() -> Parser:
    """The top-level parser: the commands with their one-line help (each command's own options are parsed by
    ``command_parser``, imported only when that command is given), ``--version``."""
    parser = Parser(prog=PROG, description=textwrap.fill(DESCRIPTION, 100), epilog=EPILOG,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser, metavar="COMMAND")
    for name, spec in COMMANDS.items():
        sub.add_parser(name, help=spec.help, add_help=False)
    return parser


def _route(argv: list[str]) -> tuple[str, list[str]]:
    """(command, the arguments after it); anything else goes through the top-level parser, which prints the help,
    the version or a one-line usage error and exits."""
    if argv and argv[0] in COMMANDS:
        command, rest = argv[0], argv[1:]
        if command in POSITIONAL:  # DIR [DIR …] before the options → --<field> DIR [DIR …]
            k = next((i for i, a in enumerate(rest) if a.startswith("-")), len(rest))
            rest = ([option(POSITIONAL[command]), *rest[:k]] if k else []) + rest[k:]
        return command, rest
    parser = build_parser()
    first = argv[0] if argv else ""
    if first.startswith("-") and first.split("=")[0] not in ("-h", "--help", "--version"):
        # argparse would say "COMMAND: required", hiding the option the user mistyped
        parser.error(f"{parser._unknown([first]).replace('unrecognized arguments: ', '')}"
                     + ("" if first.startswith("--") else ": unknown option") + f"; usage: {PROG} COMMAND [options]")
    parser.parse_args(argv)
    raise SystemExit(2)  # parse_args exits for every argv that reaches it


def parse_command(argv: list[str]) -> tuple[str, tuple]:
    """(command, its config dataclasses) of a command line, without running the job."""
    command, rest = _route(list(argv))
    return command, command_parser(command).parse(rest)


_PACKAGE_DIR = Path(__file__).resolve().parent


def _show_warning(parser: Parser, shown, prog: str, our_dirs: tuple):
    """``warnings.showwarning`` for a command: ours (a ParameterWarning, a degenerate fit, …, from a module under
    ``our_dirs``) as one line ``<prog>: warning: …``, others as Python shows them."""

    def show(message, category, filename, lineno, file=None, line=None):
        if isinstance(message, ParameterWarning):
            print(f"{prog}: warning: {message.message(parser.option_of)}", file=sys.stderr)
        elif any(d in Path(filename).resolve().parents for d in our_dirs):
            print(f"{prog}: warning: {message}", file=sys.stderr)
        else:
            shown(message, category, filename, lineno, file, line)

    return show


def run_parsed(parser: Parser, job, argv: list[str], *, prog: str = PROG, our_dirs: tuple = (_PACKAGE_DIR,)) -> int:
    """Parse ``argv`` with ``parser``, run ``job(*configs)`` and print its table and the files written; a bad value
    (ParameterError, ValueError, OSError) prints one line ``<prog>: error: …`` naming the option and returns 2,
    our warnings print one line each. The shell of every command (and of ``python -m experiments``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("always", ParameterWarning)
        warnings.showwarning = _show_warning(parser, warnings.showwarning, prog, our_dirs)
        try:
            result = job(*parser.parse(argv))
        except ParameterError as err:
            print(f"{prog}: error: {err.message(parser.option_of)}", file=sys.stderr)
            return 2
        except (ValueError, OSError) as err:  # bad values of other parameters, files that cannot be read or written
            print(f"{prog}: error: {_one_line(str(err))}", file=sys.stderr)
            return 2
    if result.table:
        print(result.table)
    print(f"wrote {', '.join(str(p) for p in result.paths.values())}")
    return 0


# Commands that keep what they finished as they go, so that running them again continues (secl: every question of
# each pass, jobs/stream_checkpoint.py; secl-serve: every stream's state).
RESUMABLE = ("secl", "secl-serve")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _main(argv)
    except KeyboardInterrupt:
        again = "; the same command resumes where it stopped" if argv[:1] and argv[0] in RESUMABLE else ""
        print(f"{PROG}: interrupted{again}", file=sys.stderr)
        return 130


def _main(argv: list[str]) -> int:
    command, rest = _route(argv)
    parser = command_parser(command)
    return run_parsed(parser, lambda *configs: COMMANDS[command].load()[1](*configs), rest)


if __name__ == "__main__":
    sys.exit(main())
