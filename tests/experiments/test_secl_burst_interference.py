"""experiments/secl_burst_interference.py at smoke size on the tiny model: the rows written once (a restart adds
nothing), the forward passes and consolidated questions of each arm by hand, the held-out and burst sets apart,
and the two arms leaving different adapters from the same first burst."""

import json

import numpy as np
import pytest

from experiments import secl_burst_interference as study


@pytest.fixture(scope="module")
def run(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("burst_interference")
    argv = ["--model", str(tiny_model_dir), "--first-domain", "halueval_qa_lm", "--second-domain", "mmlu:stem",
            "--burst", "3", "--held-out", "3", "--seeds", "0", "--output-dir", str(out)]
    return out, argv, study.main(argv)


def test_arms_passes_and_sets(run):
    out, _, results = run
    assert [r["arm"] for r in results] == ["identity", "first burst only", "cleared", "kept"]
    # a burst of 3: one read and one step per question (6), then 3 epochs over the buffer, one pass per question
    first, cleared, kept = results[1:]
    assert first["passes"] == 3 * 2 + 3 * 3
    assert (cleared["consolidated"], cleared["passes"]) == (3, 3 * 2 + 3 * 3)  # the second burst only
    assert (kept["consolidated"], kept["passes"]) == (6, 3 * 2 + 3 * 6)  # both bursts rehearsed
    rows = [json.loads(x) for x in (out / "first" / "items.jsonl").read_text().splitlines()]
    assert len(rows) == 6
    for r in results:
        assert r["first burst"]["accuracy"] == pytest.approx(np.mean([x["correct"] for x in rows[:3]]))
        assert r["held-out"]["accuracy"] == pytest.approx(np.mean([x["correct"] for x in rows[3:]]))
        acc = r["held-out"]["accuracy"]
        assert r["held-out"]["brier_constant"] == pytest.approx(acc * (1 - acc))
    # the same first burst, two different consolidations of the second
    assert cleared["held-out"]["mean_confidence"] != pytest.approx(kept["held-out"]["mean_confidence"], abs=1e-7)
    assert "| kept | 1 |" in (out / "report.md").read_text()


def test_a_restart_adds_nothing(run):
    out, argv, _ = run
    before = (out / "results.jsonl").read_text()
    study.main(argv)
    assert (out / "results.jsonl").read_text() == before


@pytest.mark.parametrize("argv, message", [(["--burst", "1"], "--burst: must be at least 2, got 1"),
                                           (["--held-out", "0"], "--held-out: must be at least 2, got 0")])
def test_bad_arguments_name_the_option(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        study.parse_args([*argv, "--output-dir", "x"])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_auroc_se_by_hand():
    # A = 0.5, 10 and 10: Q1 = Q2 = 1/3, SE² = [0.25 + 9/12 + 9/12] / 100 = 0.0175
    assert study.auroc_se(0.5, 10, 10) == pytest.approx(np.sqrt(0.0175))
    # A = 0.8, 4 and 6: Q1 = 0.8/1.2, Q2 = 1.28/1.8; SE² = [0.16 + 3(Q1 − 0.64) + 5(Q2 − 0.64)] / 24
    q1, q2 = 0.8 / 1.2, 1.28 / 1.8
    assert study.auroc_se(0.8, 4, 6) == pytest.approx(np.sqrt((0.16 + 3 * (q1 - 0.64) + 5 * (q2 - 0.64)) / 24))


def test_report_states_the_difference_against_cleared(run):
    out, _, results = run
    report = (out / "report.md").read_text()
    cleared, kept = results[2]["held-out"]["auroc"], results[3]["held-out"]["auroc"]
    assert f"| kept | 1 | {kept - cleared:+.3f} |" in report  # "+nan" when the 3 held-out answers are one class
    assert study.auroc_se(0.7, 0, 5) != study.auroc_se(0.7, 0, 5)  # one class: NaN
