"""``python -m experiments NAME [options]``: one subcommand per headline table, parsed by the library's
``hf_calibration.cli.Parser`` (TRL style: options are the config fields, ``--config file.yaml`` reads them).

Each experiment's ``--help`` lists only the options it accepts (``ACCEPTED``); the others are not options of that
command. Bad input prints one line ``experiments: error: …`` on stderr and exits with code 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import hf_calibration

from hf_calibration.cli import Parser, run_parsed
from hf_calibration.secl.config import SECLConfig

from experiments.calm_config import CALMExperimentConfig
from experiments.run import ExperimentConfig, run_experiment

PROG = "experiments"
_OUR_DIRS = (Path(hf_calibration.__file__).resolve().parent, Path(__file__).resolve().parent)
COMMON = ("output_dir", "models", "datasets", "seed", "device", "n_resamples", "overwrite")
# The ExperimentConfig fields each experiment reads (CALMExperimentConfig's are all calm's).
ACCEPTED = {
    "diagnose": COMMON + ("limit", "limit_open", "batch_size"),
    "secl": COMMON + ("limit", "workers"),
    "calm": COMMON + ("batch_size",),
}
EXPERIMENTS = {
    "diagnose": ((ExperimentConfig,), "the generation–discrimination gap of SmolLM2 and Qwen on MMLU, HaluEval, GSM8K"),
    "secl": ((ExperimentConfig, SECLConfig), "a Qwen stream through SECL with the label-free and supervised "
             "baselines (SECL's options as hf-calibration secl takes them)"),
    "calm": ((ExperimentConfig, CALMExperimentConfig), "CALM with LoRA against SFT, TS and the other baselines"),
}


class ExperimentParser(Parser):
    """``hf_calibration.cli.Parser`` (its one-line wording of argparse's errors) with this program's name in them."""

    error_prog = PROG


def _drop_options(parser: argparse.ArgumentParser, names: set) -> None:
    """Remove the options of the config fields ``names``; the fields keep their defaults (set on the parser, so
    the dataclass parser still finds every field in the parsed namespace)."""
    for action in [a for a in parser._actions if a.dest in names]:
        parser.set_defaults(**{action.dest: action.default})
        parser._remove_action(action)
        for group in parser._action_groups:
            if action in group._group_actions:
                group._group_actions.remove(action)
        for flag in action.option_strings:
            parser._option_string_actions.pop(flag, None)


def build_parser() -> ExperimentParser:
    """The parser of ``python -m experiments``; the subparser of each experiment is in its ``commands``."""
    parser = ExperimentParser(prog=f"python -m {PROG}", description="The project's headline tables, one command "
                              "each, into results/NAME/; sub-runs resume.")
    sub = parser.add_subparsers(dest="experiment", required=True, parser_class=ExperimentParser, metavar="NAME")
    parser.commands = {}
    others = {f.name for f in dataclasses.fields(ExperimentConfig)}
    for name, (types, help_) in EXPERIMENTS.items():
        leaf = parser.commands[name] = sub.add_parser(name, dataclass_types=types, help=help_, description=help_)
        for action in leaf._actions:
            if action.dest == "name":  # the NAME chosen by the subcommand, not an option
                action.default, action.required, action.choices, action.help = name, False, [name], argparse.SUPPRESS
        _drop_options(leaf, others - set(ACCEPTED[name]) - {"name"})
    return parser


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not argv or argv[0] not in parser.commands:
        parser.parse_args(argv)  # the help, or a one-line usage error; exits
        return 2
    return run_parsed(parser.commands[argv[0]], _run, argv[1:], prog=PROG, our_dirs=_OUR_DIRS)


def _run(config: ExperimentConfig, options=None):
    """``run_experiment`` with the experiment's own options: calm's ``CALMExperimentConfig`` or secl's
    ``SECLConfig``."""
    if isinstance(options, SECLConfig):
        return run_experiment(config, secl=options)
    return run_experiment(config, options)
