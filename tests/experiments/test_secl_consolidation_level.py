"""experiments/secl_consolidation_level.py at smoke size on the tiny model: the points and schedules written once
(a restart adds nothing), the consolidation's step count by hand, the constant-accuracy Brier by hand, and both
learning-rate schedules leaving different adapters from the same burst."""

import json

import numpy as np
import pytest

from experiments import secl_consolidation_level as study


@pytest.fixture(scope="module")
def run(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("consolidation_level")
    argv = ["--model", str(tiny_model_dir), "--burst-domain", "halueval_qa_lm", "--carry-domain", "mmlu:stem",
            "--n", "3", "--seeds", "0", "--output-dir", str(out)]
    return out, argv, study.main(argv)


def test_rows_steps_and_the_constant_reference(run):
    out, _, results = run
    assert [(r["lr_scheduler"], r["point"]) for r in results] == [
        ("none", "identity"), ("constant", "after the burst"), ("constant", "after the consolidation"),
        ("linear", "after the burst"), ("linear", "after the consolidation")]
    done = [r for r in results if r["point"] == "after the consolidation"]
    assert all(r["consolidation"] == {"questions": 3, "steps": 9, "forward_passes": 9} for r in done)
    rows = [json.loads(x) for x in (out / "burst" / "items.jsonl").read_text().splitlines()]
    acc = np.mean([r["correct"] for r in rows])
    for r in results:
        assert r["burst"]["accuracy"] == pytest.approx(acc)
        assert r["burst"]["brier_constant"] == pytest.approx(acc * (1 - acc))
    # the burst is the same for both schedules (same seed, same identity start); the consolidations differ
    burst = [r for r in results if r["point"] == "after the burst"]
    assert burst[0]["burst"]["mean_confidence"] == pytest.approx(burst[1]["burst"]["mean_confidence"], abs=1e-6)
    assert done[0]["burst"]["mean_confidence"] != pytest.approx(done[1]["burst"]["mean_confidence"], abs=1e-6)
    assert "| linear | 0 | after the consolidation |" in (out / "report.md").read_text()


def test_spread_over_seeds_by_hand():
    def row(seed, level, carry):
        dom = {"mean_confidence": level, "mean_c_star": 0.4, "brier": 0.3, "brier_constant": 0.25}
        return {"lr_scheduler": "linear", "seed": seed, "point": "after the consolidation", "burst": dom,
                "carry": {**dom, "mean_confidence": carry}}

    stats = study.spread([row(0, 0.5, 0.2), row(1, 0.7, 0.4), row(2, 0.6, 0.9)])["linear"]["stats"]
    assert stats["burst level − mean c*"] == pytest.approx((0.2, 0.1))  # mean of 0.1, 0.3, 0.2; sd (ddof 1) 0.1
    assert stats["carry mean conf"] == pytest.approx((0.5, np.std([0.2, 0.4, 0.9], ddof=1)))
    assert stats["burst Brier − const."] == pytest.approx((0.05, 0.0))


def test_a_restart_adds_nothing(run):
    out, argv, _ = run
    before = (out / "results.jsonl").read_text()
    study.main(argv)
    assert (out / "results.jsonl").read_text() == before


def test_bad_arguments_name_the_option(capsys):
    with pytest.raises(SystemExit) as exit_:
        study.parse_args(["--n", "1", "--output-dir", "x"])
    assert exit_.value.code == 2 and "--n: must be at least 2, got 1" in capsys.readouterr().err
