"""``hf-calibration serve``'s start-up refusals that need no model server: each is one line naming the option and
exits 2 before the port opens (docs/usage.md, "bad input"; docs/gateway.md, "Flags")."""

from __future__ import annotations

import socket

import pytest

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def _serve(capsys, *args):
    from hf_calibration.cli import main

    rc = main(["serve", "--upstream", "http://127.0.0.1:9/v1", "--model", MODEL, "--check-upstream", "false", *args])
    return rc, capsys.readouterr().err.strip().splitlines()


def test_burst_at_start_without_secl_and_a_state_dir_that_is_a_file_are_refused(tmp_path, capsys):
    rc, err = _serve(capsys, "--secl-burst-at-start")
    assert rc == 2 and len(err) == 1 and err[0].startswith("hf-calibration: error: --secl-burst-at-start: ")
    assert "--secl" in err[0][len("hf-calibration: error: --secl-burst-at-start: "):]
    a_file = tmp_path / "state.txt"
    a_file.write_text("kept\n")
    rc, err = _serve(capsys, "--state-dir", str(a_file))
    assert rc == 2 and len(err) == 1 and err[0].startswith("hf-calibration: error: --state-dir: ")
    assert str(a_file) in err[0] and a_file.read_text() == "kept\n"


@pytest.mark.parametrize("host", ["127.0.0.1"])
def test_a_port_in_use_and_an_unknown_host_are_refused_in_one_line(capsys, host):
    with socket.socket() as busy:
        busy.bind((host, 0))
        busy.listen()
        port = busy.getsockname()[1]
        rc, err = _serve(capsys, "--host", host, "--port", str(port))
    assert rc == 2 and len(err) == 1 and err[0].startswith("hf-calibration: error: --port: ") and str(port) in err[0]
    rc, err = _serve(capsys, "--host", "no-such-host.invalid", "--port", "8100")
    assert rc == 2 and len(err) == 1 and err[0].startswith("hf-calibration: error: --host: ")
    assert "no-such-host.invalid" in err[0]
