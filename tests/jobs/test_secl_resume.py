"""A SECL stream run that stops resumes where it stopped (``jobs/stream_checkpoint.py``): a rerun of the same command
gives the records, counters and adapter of a run that never stopped, and keeps nothing from another run."""

import json
import math

import pytest
from safetensors.torch import load_file

import hf_calibration.evaluation.stream as stream_module
from hf_calibration.errors import ParameterError
from hf_calibration.jobs import SECLStreamConfig, run_secl_stream
from hf_calibration.jobs.stream_checkpoint import RunLock, StreamCheckpoint
from hf_calibration.runtime.outputs import partial_path
from hf_calibration.secl import SECLConfig

# a burst over the first four questions with a replay buffer and a consolidation when it ends: every piece of state
# a resumed pass must get back (adapter, AdamW, gate, open burst, counters, replay buffer and its sampler)
SECL = SECLConfig(burst_size=4, bin_gate_width=0, learning_rate=0.1, replay_size=4, replay_batch_size=1,
                  consolidation_epochs=1)


def _config(tmp_path, name, **kwargs):
    return SECLStreamConfig(**{"model": str(tmp_path.parent / "model"), "stream": "mmlu:stem,halueval_qa_lm",
                               "limit_per_domain": 3, "burst_at_start": True, "n_resamples": 20,
                               "output_dir": str(tmp_path / name), **kwargs})


REAL_GENERATE = stream_module._generate


class Stop(Exception):
    pass


def _stopping_after(monkeypatch, calls: int):
    """``evaluation.stream._generate`` that raises Stop at its ``calls + 1``-th call (a run killed there)."""
    real, count = REAL_GENERATE, [0]

    def generate(*args, **kwargs):
        count[0] += 1
        if count[0] > calls:
            raise Stop
        return real(*args, **kwargs)

    monkeypatch.setattr(stream_module, "_generate", generate)


def _same(a: dict, b: dict):
    assert list(a) == list(b) and a["passes"] == b["passes"]
    for key, value in a.items():
        if "seconds" in key or key == "passes":
            continue
        if isinstance(value, float):  # replayed questions' caches are recomputed on resume: float rounding only
            assert math.isclose(value, b[key], rel_tol=1e-5, abs_tol=1e-6) or (math.isnan(value) and math.isnan(
                b[key])), key
        else:
            assert value == b[key], key


@pytest.mark.parametrize("workers", [1, 2])
def test_a_stopped_stream_resumes_where_it_stopped(tiny_model_dir, tmp_path, monkeypatch, workers):
    (tmp_path.parent / "model").exists() or (tmp_path.parent / "model").symlink_to(tiny_model_dir)
    whole = run_secl_stream(_config(tmp_path, "whole"), SECL, progress=False)
    assert whole.run["resumed"] == {"baseline": 0, "secl": 0, "secl_final": 0}
    assert sum(r["updated"] for r in whole.records) >= 2 and whole.counters["bursts"] == 1

    config = _config(tmp_path, "stopped", workers=workers)
    folder = partial_path(config.output_dir, "secl").with_suffix("")
    _stopping_after(monkeypatch, 2)  # in the baseline pass, at its third question
    with pytest.raises(Stop):
        run_secl_stream(config, SECL, progress=False)
    assert len((folder / "baseline.jsonl").read_text().splitlines()) == 2
    assert not (tmp_path / "stopped" / "records.jsonl").exists()  # the result folder stays as it was
    if workers == 1:  # (the SECL pass of a worker process does not see this process's patch)
        _stopping_after(monkeypatch, 4 + 3)  # the baseline's last four, then the SECL pass's fourth question
        with pytest.raises(Stop):
            run_secl_stream(config, SECL, progress=False)
        assert StreamCheckpoint(folder, "").kept("secl") == 3
    monkeypatch.undo()
    resumed = run_secl_stream(config, SECL, progress=False)
    # with a worker, the pool waited for the SECL pass when the baseline pass stopped: it kept all six
    assert resumed.run["resumed"] == ({"baseline": 6, "secl": 3, "secl_final": 0} if workers == 1
                                      else {"baseline": 2, "secl": 6, "secl_final": 0})
    assert "resumed (questions an earlier run" in resumed.table
    assert not folder.exists()  # dropped once the results are in place
    assert resumed.counters == whole.counters
    for a, b in zip(whole.records, resumed.records):
        _same(a, b)
    weights = [load_file(r.paths["secl_adapter"] / "adapter_model.safetensors") for r in (whole, resumed)]
    assert all(float((weights[0][k] - weights[1][k]).abs().max()) < 1e-5 for k in weights[0])
    state = json.loads((resumed.paths["secl_adapter"] / "secl_state.json").read_text())
    assert state["counters"] == whole.counters
    # the saved replay buffer is the pass's, also when a worker process ran it (the hand-over carries it)
    kept = json.loads((whole.paths["secl_adapter"] / "secl_state.json").read_text())["replay"]["items"]
    assert len(kept) == 4 and [i["index"] for i in state["replay"]["items"]] == [i["index"] for i in kept]


def test_a_resumed_run_reads_each_kept_file_once(tiny_model_dir, tmp_path, monkeypatch):
    """At start-up the run counts what each pass kept and the passes then take it: the baseline records and the SECL
    pass's state are read once, not once to count and once more to resume."""
    import hf_calibration.jobs.stream_checkpoint as kept_module

    (tmp_path.parent / "model").exists() or (tmp_path.parent / "model").symlink_to(tiny_model_dir)
    config = _config(tmp_path, "stopped")
    _stopping_after(monkeypatch, 6 + 3)  # the whole baseline pass, then the SECL pass's fourth question
    with pytest.raises(Stop):
        run_secl_stream(config, SECL, progress=False)
    monkeypatch.undo()
    reads = []
    real_lines, real_state = kept_module._kept_lines, kept_module._load_state
    monkeypatch.setattr(kept_module, "_kept_lines", lambda path, *a, **k: reads.append(path.name) or real_lines(
        path, *a, **k))
    monkeypatch.setattr(kept_module, "_load_state", lambda path: reads.append(path.name) or real_state(path))
    resumed = run_secl_stream(config, SECL, progress=False)
    assert resumed.run["resumed"] == {"baseline": 6, "secl": 3, "secl_final": 0}
    assert reads.count("baseline.jsonl") == 1 and reads.count("secl.pt") == 1 and reads.count("secl.jsonl") == 1


def test_a_run_stopped_in_the_final_adapter_reads_keeps_them(tiny_model_dir, tmp_path, monkeypatch):
    """Stopped after 4 of the 6 final-adapter reads, the rerun takes those 4 and reads the other 2 with the adapter the
    SECL pass saved: the records equal an unstopped run's. Reads kept for another adapter are never used."""
    (tmp_path.parent / "model").exists() or (tmp_path.parent / "model").symlink_to(tiny_model_dir)
    whole = run_secl_stream(_config(tmp_path, "whole"), SECL, progress=False)
    config = _config(tmp_path, "stopped")
    real, count = StreamCheckpoint.add_final, [0]

    def add_final(self, *args):
        real(self, *args)
        count[0] += 1
        if count[0] == 4:
            raise Stop

    monkeypatch.setattr(StreamCheckpoint, "add_final", add_final)
    with pytest.raises(Stop):
        run_secl_stream(config, SECL, progress=False)
    monkeypatch.undo()
    folder = partial_path(config.output_dir, "secl").with_suffix("")
    kept = StreamCheckpoint(folder, "")
    lines = (folder / "secl_final.jsonl").read_text().splitlines()
    assert len(lines) == 4 and kept.finals("secl", "another adapter", 6) == []  # and the file is gone
    (folder / "secl_final.jsonl").write_text("\n".join(lines) + "\n")
    resumed = run_secl_stream(config, SECL, progress=False)
    assert resumed.run["resumed"] == {"baseline": 6, "secl": 6, "secl_final": 4}
    assert [r["secl_final"] for r in resumed.records] == [r["secl_final"] for r in whole.records]


@pytest.mark.parametrize("bad, kept", [
    ({"adapter": "a", "index": 2, "confidence": "x"}, 2), ({"adapter": "a", "index": 2}, 2),
    ({"adapter": "a", "index": 2, "confidence": 1.5}, 2), ({"adapter": "a", "index": 2, "confidence": True}, 2),
    ({"adapter": "a", "index": 5, "confidence": 0.5}, 2), ({"adapter": "a", "index": 2, "confidence": 0.5}, 4)])
def test_final_reads_keep_only_the_next_questions_numbers(tmp_path, bad, kept):
    """A final-adapter line whose hash is right but whose content is not the next question's read (index) or not a
    confidence in [0, 1] ends what is kept, and the file is cut there so the next read follows the kept ones; no
    more reads than questions are taken."""
    from hf_calibration.jobs.stream_checkpoint import _line

    path = tmp_path / "secl_final.jsonl"
    good = [{"adapter": "a", "index": i, "confidence": c} for i, c in enumerate([0.25, 1])]
    path.write_text("".join(_line(x) + "\n" for x in good + [bad, {"adapter": "a", "index": 3, "confidence": 0.5}]))
    checkpoint = StreamCheckpoint(tmp_path, "")
    assert checkpoint.finals("secl", "a", 6) == [0.25, 1.0, 0.5, 0.5][:kept]
    assert len(path.read_text().splitlines()) == kept
    assert checkpoint.finals("secl", "a", 1) == [0.25]  # capped at the stream's length


def test_a_second_run_into_the_same_folder_stops_before_loading_the_model(tiny_model_dir, tmp_path, monkeypatch):
    """While one run holds the folder's lock a second one is refused (ParameterError naming output_dir and the
    holder's process id) before the model loads; once the first releases it (or its process ends) a run may start."""
    import os

    import hf_calibration.modeling as modeling

    (tmp_path.parent / "model").exists() or (tmp_path.parent / "model").symlink_to(tiny_model_dir)
    config = _config(tmp_path, "out")
    first = RunLock(config.output_dir)
    loads = []
    monkeypatch.setattr(modeling, "load_model", lambda *a, **k: loads.append(a) or (_ for _ in ()).throw(Stop))
    with pytest.raises(ValueError, match=rf"^output_dir: another run \(process {os.getpid()}\) is writing into"):
        run_secl_stream(config, SECL, progress=False)
    assert loads == [] and first.path.is_file()
    first.release()
    assert not first.path.exists()
    with pytest.raises(Stop):  # the lock is free: the run gets as far as loading the model
        run_secl_stream(config, SECL, progress=False)
    assert len(loads) == 1 and not first.path.exists() and not first.pid_path.exists()  # a run that stops releases it
    RunLock(config.output_dir).release()


def test_the_lock_holds_against_another_process_and_ends_with_it(tmp_path):
    """A run in another process holds the folder (the refusal names that process's id); once that process is
    killed, without releasing, the operating system drops the lock and a new run takes it."""
    import os
    import subprocess
    import sys

    out = tmp_path / "out"
    child = subprocess.Popen([sys.executable, "-c", "import time\n"
                              "from hf_calibration.jobs.stream_checkpoint import RunLock\n"
                              f"lock = RunLock({str(out)!r}); print('held', flush=True); time.sleep(120)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        with pytest.raises(ParameterError, match=rf"^output_dir: another run \(process {child.pid}\) is writing"):
            RunLock(out)
    finally:
        child.kill()
        child.wait()
    lock = RunLock(out)  # the killed holder left its files; the lock itself went with the process
    assert lock.pid_path.read_text().strip() == str(os.getpid())
    lock.release()
    assert not lock.path.exists() and not lock.pid_path.exists()


def test_another_runs_checkpoint_is_never_mixed_in(tmp_path):
    ours = StreamCheckpoint.for_output(tmp_path / "out", {"seed": 0}, [[1, 2], [3]])
    ours.start()
    ours.add_baseline({"x": 1.5, "nan": float("nan")})
    with open(ours.folder / "baseline.jsonl", "a") as f:
        f.write('{"x": 2.')  # a torn last line: the process was killed while writing it
    again = StreamCheckpoint.for_output(tmp_path / "out", {"seed": 0}, [[1, 2], [3]])
    again.start()
    kept = again.baseline()
    assert len(kept) == 1 and kept[0]["x"] == 1.5 and math.isnan(kept[0]["nan"])
    again.add_baseline({"x": 3.0})  # appended after the kept line, the torn one gone
    assert [r["x"] for r in again.baseline()] == [1.5, 3.0]
    for other in ({"seed": 1}, [[1, 2], [4]]):  # another run, or the same options over other prompts
        run, prompts = (other, [[1, 2], [3]]) if isinstance(other, dict) else ({"seed": 0}, other)
        theirs = StreamCheckpoint.for_output(tmp_path / "out", run, prompts)
        assert theirs.key != ours.key
    with open(ours.folder / "baseline.jsonl", "a") as f:
        f.write('{"x": 4.')  # torn again: the refusal below only counts, it leaves the other run's file as it is
    before = (ours.folder / "baseline.jsonl").read_bytes()
    with pytest.raises(ParameterError, match=r"^output_dir: .* keeps 2 finished questions of another run .* "
                                             r"pass overwrite to drop them"):
        theirs.start()  # refused: the other run's progress is kept
    assert (ours.folder / "baseline.jsonl").read_bytes() == before
    assert len(ours.baseline()) == 2
    theirs.start(overwrite=True)
    assert theirs.baseline() == []
    StreamCheckpoint.for_output(tmp_path / "empty", {"seed": 0}, [[1]]).start()  # nothing kept: nothing refused
    assert StreamCheckpoint.for_output(tmp_path / "empty", {"seed": 1}, [[1]]).start() is None


def test_a_line_changed_or_a_state_file_cut_is_not_resumed(tmp_path):
    """A kept line changed by hand ends what is kept there (its hash no longer matches); a SECL pass whose state file
    cannot be read, or whose lines are fewer than its state covers, starts over instead of failing or mixing."""
    checkpoint = StreamCheckpoint.for_output(tmp_path / "out", {"seed": 0}, [[1]])
    checkpoint.start()
    for x in (0.25, 0.5, 0.75):
        checkpoint.add_baseline({"verbalized": x})
    path = checkpoint.folder / "baseline.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], lines[1].replace("0.5", "0.99"), lines[2]]) + "\n")
    assert checkpoint.baseline() == [{"verbalized": 0.25}]  # the changed line and everything after it dropped

    (checkpoint.folder / "secl.jsonl").write_text("")
    for content in (b"", b"\x80garbage" * 100):  # emptied, overwritten
        (checkpoint.folder / "secl.pt").write_bytes(content)
        assert checkpoint.kept("secl") == 0 and checkpoint.resume_pass("secl") is None
        assert not (checkpoint.folder / "secl.pt").exists()


def test_fewer_lines_than_the_state_covers_start_the_pass_over(tiny_model_dir, tmp_path):
    from hf_calibration.modeling import load_model
    from hf_calibration.secl import apply_secl

    model, tokenizer = load_model(str(tiny_model_dir))
    model = apply_secl(model, tokenizer, SECL)
    checkpoint = StreamCheckpoint.for_output(tmp_path / "out", {"seed": 0}, [[1]])
    checkpoint.start()
    for i in range(3):
        checkpoint.save_pass("secl", {"fields": {"secl": 0.5}, "passes": 3}, i + 1, model.secl_snapshot())
    assert checkpoint.kept("secl") == 3
    lines = (checkpoint.folder / "secl.jsonl").read_text().splitlines()
    (checkpoint.folder / "secl.jsonl").write_text("\n".join(lines[:2]) + "\n")  # a line lost, the state says 3
    assert checkpoint.kept("secl") == 0 and checkpoint.resume_pass("secl") is None


def test_another_model_under_the_same_path_gets_another_fingerprint(tiny_tokenizer):
    """A model replaced at the same path resumes nothing of the old one's: the run's fingerprint covers the weights."""
    import torch

    from hf_calibration.jobs.stream_checkpoint import weights_fingerprint
    from tests.tiny import make_tiny_model

    one, same, other = (make_tiny_model(tiny_tokenizer, seed=s) for s in (0, 0, 1))
    assert weights_fingerprint(one) == weights_fingerprint(same) != weights_fingerprint(other)
    with torch.no_grad():
        next(same.parameters())[0, 0] += 1e-3  # one weight moved
    assert weights_fingerprint(same) != weights_fingerprint(one)


def test_final_reads_of_an_unmoved_adapter_are_the_pass_own(tmp_path, tiny_model_dir, monkeypatch):
    """No burst opens (no forced burst, a stream inside the gate's warm-up): the adapter the pass ends with is the one
    it started from, so row "secl_final" takes the pass's own verbalized reads without a second pass; they equal the
    reads a final-adapter pass makes (the same function on the same weights: within float rounding, 1e-6 as in
    test_jobs.py's secl_final test)."""
    (tmp_path.parent / "model").exists() or (tmp_path.parent / "model").symlink_to(tiny_model_dir)
    calls = []
    real = stream_module.final_adapter_pass
    monkeypatch.setattr("hf_calibration.jobs.secl_stream.final_adapter_pass",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    quick = run_secl_stream(_config(tmp_path, "quick", burst_at_start=False), SECL, progress=False)
    assert calls == [] and not any(r["updated"] for r in quick.records)
    assert [r["secl_final"] for r in quick.records] == [r["secl_verbalized"] for r in quick.records]
    digests = iter(range(1000))  # every digest another: the adapter looks moved
    monkeypatch.setattr("hf_calibration.jobs.secl_stream.adapter_digest", lambda model: str(next(digests)))
    read = run_secl_stream(_config(tmp_path, "read", burst_at_start=False), SECL, progress=False)
    assert calls == [1]  # the digest "changed": the final-adapter pass ran
    assert [r["secl_final"] for r in read.records] == pytest.approx([r["secl_final"] for r in quick.records], abs=1e-6)
