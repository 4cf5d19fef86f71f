import argparse

import pytest

from hf_calibration.calm.cli import _split_config, add_calm_parser


def parse(argv):
    parser = argparse.ArgumentParser(prog="hf-calibration")
    add_calm_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["calm", *argv])


def test_config_fields_become_options(tmp_path):
    args = parse(["--output-dir", str(tmp_path), "--method", "iterate", "--inner-steps", "3", "--eta", "0.25",
                  "--train-subjects", "stem", "--n-train", "8", "--bf16", "false"])
    config = _split_config(args)
    assert (config.method, config.inner_steps, config.eta, config.bf16) == ("iterate", 3, 0.25, False)
    assert args.func.__name__ == "run_calm" and args.n_train == 8


def test_bad_values_raise_value_error_naming_the_option(tmp_path):
    with pytest.raises(ValueError, match="eta"):
        _split_config(parse(["--output-dir", str(tmp_path), "--eta", "2"]))
    args = parse(["--output-dir", str(tmp_path), "--train-subjects", "astrology"])
    with pytest.raises(ValueError, match="--train-subjects"):
        args.func(args)
    args = parse(["--output-dir", str(tmp_path), "--n-train", "0"])
    with pytest.raises(ValueError, match="--n-train"):
        args.func(args)
