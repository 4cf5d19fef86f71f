"""``evaluate`` in process: a stopped run keeps its scored batches and the rerun resumes (the read loop a served run
uses, ``modeling.backends.base.read_next_tokens``); a rerun with other data into the same folder is refused
without ``--overwrite``."""

from __future__ import annotations

import json
import warnings

import pytest

from hf_calibration.cli import main
from hf_calibration.errors import ParameterError
from hf_calibration.jobs import EvaluateConfig, run_evaluate
from hf_calibration.modeling.backends import TransformersBackend
from hf_calibration.runtime.outputs import partial_path

LIMIT, BATCH = 7, 2


@pytest.fixture()
def calls(monkeypatch):
    """Counts ``TransformersBackend.next_token_logprobs`` calls and prompts; ``stop_at`` set → Ctrl-C at that call."""
    state = {"calls": 0, "prompts": 0, "stop_at": None}
    real = TransformersBackend.next_token_logprobs

    def counted(self, prompts, token_ids):
        state["calls"] += 1
        if state["calls"] == state["stop_at"]:
            raise KeyboardInterrupt
        state["prompts"] += len(prompts)
        return real(self, prompts, token_ids)

    monkeypatch.setattr(TransformersBackend, "next_token_logprobs", counted)
    return state


def _config(model_dir, out, **kw):
    return EvaluateConfig(model=str(model_dir), output_dir=str(out), limit=kw.pop("limit", LIMIT),
                          batch_size=BATCH, n_resamples=20, **kw)


def test_stopped_in_process_run_keeps_scored_batches_and_resumes(calls, tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    calls["stop_at"] = 3  # two batches scored, Ctrl-C during the third
    with pytest.raises(KeyboardInterrupt):
        run_evaluate(_config(tiny_model_dir, out), progress=False)
    kept = partial_path(out, "evaluate")
    assert not out.exists() and len(kept.read_text().splitlines()) == 1 + 2 * BATCH  # header + two batches
    calls.update(calls=0, prompts=0, stop_at=None)
    result = run_evaluate(_config(tiny_model_dir, out), progress=False)
    assert calls["prompts"] == LIMIT - 2 * BATCH  # the kept questions are not scored again
    assert not kept.exists() and result.run["n"] == LIMIT
    calls.update(calls=0, prompts=0)
    run_evaluate(_config(tiny_model_dir, tmp_path / "whole"), progress=False)
    assert calls["prompts"] == LIMIT
    # the longest-first order splits the questions into the same batches whether or not the run stopped, and the
    # kept floats read back bit-for-bit: the same kernel on the same batches, exact
    assert (out / "predictions.jsonl").read_text() == (tmp_path / "whole" / "predictions.jsonl").read_text()


def test_other_data_into_an_evaluate_folder_is_refused_without_overwrite(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    run_evaluate(_config(tiny_model_dir, out, limit=4), progress=False)
    before = (out / "predictions.jsonl").read_text()
    with pytest.raises(ParameterError) as err:
        run_evaluate(_config(tiny_model_dir, out, limit=4, seed=1), progress=False)
    assert err.value.parameter == "output_dir" and "overwrite" in err.value.related
    assert "seed 0, now 1" in str(err.value)
    assert (out / "predictions.jsonl").read_text() == before  # nothing replaced
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rc = main(["evaluate", "--output-dir", str(out), "--model", str(tiny_model_dir), "--limit", "4",
                   "--dataset", "gpqa", "--n-resamples", "20"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "--output-dir" in lines[0] and "--overwrite" in lines[0], lines
    assert (out / "predictions.jsonl").read_text() == before
    # the same run again (other ECE options) replaces its own results; other data with --overwrite is allowed
    run_evaluate(_config(tiny_model_dir, out, limit=4, n_bins=5), progress=False)
    assert json.loads((out / "metrics.json").read_text())["run"]["n_bins"] == 5
    result = run_evaluate(_config(tiny_model_dir, out, limit=4, seed=1, overwrite=True), progress=False)
    assert json.loads((out / "metrics.json").read_text())["run"]["seed"] == 1 and result.run["n"] == 4
