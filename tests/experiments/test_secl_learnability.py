"""experiments/secl_learnability.py at smoke size on the tiny model: items scored once and resumed, the nested
training sets, the derived number of optimizer steps, the constant-accuracy reference by hand, and the linear probe
on synthetic hidden states."""

import json

import numpy as np
import pytest

from experiments import secl_learnability as study
from hf_calibration.modeling.prompts import first_option_letter


def args(model_dir, out, *extra):
    return ["--model", str(model_dir), "--limit", "12", "--n-test", "4", "--sizes", "3,8", "--epochs", "2",
            "--batch-size", "3", "--n-resamples", "20", "--no-probe", "--output-dir", str(out), *extra]


@pytest.fixture(scope="module")
def run(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("learnability")
    return out, study.main(args(tiny_model_dir, out, "--variants", "all_linear"))


def test_items_are_scored_once_per_item(run):
    out, _ = run
    rows = [json.loads(x) for x in (out / "items.jsonl").read_text().splitlines()]
    assert [r["index"] for r in rows] == list(range(12))
    for r in rows:
        # HaluEval QA has two options: the answer and the other one, or both when the answer names neither
        named = first_option_letter(r["text"]) in ("A", "B")
        assert 0 <= r["norm_p_true"] <= 1 and len(r["p_true_options"]) == (2 if named else 3)
        assert set(r["hidden"]) == set(study.CONFIDENCE_POSITIONS)
        assert all(len(h) == 32 for h in r["hidden"]["verbalized_answer"])  # hidden size of the tiny model
        assert len(r["hidden"]["verbalized_answer"]) == len(study.probe_layers(2)) == 2


def test_variants_steps_and_the_constant_reference(run):
    out, result = run
    names = [r["variant"] for r in result["results"]]
    assert names == ["n8_teacher", "n8_gold", "n8_teacher_option_text", "n3_teacher", "n3_gold",
                     "n8_teacher_all_linear"]
    # steps = epochs × ceil(N / batch size)
    assert [r["steps"] for r in result["results"]] == [2 * 3, 2 * 3, 2 * 3, 2 * 1, 2 * 1, 2 * 3]
    rows = [json.loads(x) for x in (out / "items.jsonl").read_text().splitlines()]
    order = np.random.default_rng(0).permutation(12)
    test, pool = order[:4], order[4:]
    y_test = np.array([rows[i]["correct"] for i in test], dtype=float)
    for r in result["results"]:
        acc = np.mean([rows[i]["correct"] for i in pool[: r["n"]]])
        # one bin holds every item: ECE = |constant − held-out accuracy|; Brier by its definition
        assert r["constant_test"]["conf_ece"]["value"] == pytest.approx(abs(acc - y_test.mean()))
        assert r["constant_test"]["brier"]["value"] == pytest.approx(np.mean((acc - y_test) ** 2))
        assert r["train"]["n"] == r["n"] and r["test"]["n"] == 4
    base = np.array([rows[i]["verbalized"] for i in test])
    trained = np.array(result["results"][0]["test_confidences"])
    assert not np.allclose(trained, base, atol=1e-6)  # the adapter was trained
    assert "| n8_teacher | 8 | teacher |" in (out / "report.md").read_text()


def test_a_restart_resumes(run, tiny_model_dir, monkeypatch):
    out, first = run
    lines = (out / "results.jsonl").read_text().splitlines()
    (out / "results.jsonl").write_text("\n".join(lines[:-2]) + "\n")  # as if stopped before the last two
    with (out / "items.jsonl").open("a") as f:
        f.write('{"index": 12, "cut')  # a line cut by the stop

    def no_rescoring(*a, **k):
        raise AssertionError("an item was scored again")

    items = (out / "items.jsonl").read_text()
    monkeypatch.setattr(study, "score_item", no_rescoring)
    second = study.main(args(tiny_model_dir, out, "--variants", "all_linear", "--limit", "12"))
    assert (out / "items.jsonl").read_text() == items[: items.rindex("\n") + 1]
    assert [r["variant"] for r in second["results"]] == [r["variant"] for r in first["results"]]
    for a, b in zip(first["results"][-2:], second["results"][-2:]):  # recomputed from the same seed: the same
        np.testing.assert_allclose(a["test_confidences"], b["test_confidences"], atol=1e-5)


def test_only_trains_the_variants_named(tiny_model_dir, tmp_path):
    result = study.main(args(tiny_model_dir, tmp_path, "--variants", "", "--only", "n3_gold,n8_teacher"))
    assert [r["variant"] for r in result["results"]] == ["n8_teacher", "n3_gold"]


def test_long_variant_takes_its_own_epochs_and_rate(tiny_model_dir, tmp_path):
    result = study.main(args(tiny_model_dir, tmp_path, "--variants", "option_text_long", "--only",
                             "n8_teacher_option_text_e10_lr0.005"))
    (r,) = result["results"]
    assert (r["epochs"], r["lr"], r["restate"]) == (*study.LONG, "option_text")
    assert r["steps"] == study.LONG[0] * 3  # epochs × ceil(8 / batch size 3)
    assert len(r["loss_per_epoch"]) == study.LONG[0]


def test_kl_variant_trains_on_the_kl_loss(tiny_model_dir, tmp_path, monkeypatch):
    from hf_calibration.secl import replay

    losses, real = [], replay.minibatch_step

    def spy(*a, **kw):
        losses.append(kw["loss"])
        return real(*a, **kw)

    monkeypatch.setattr(replay, "minibatch_step", spy)
    result = study.main(args(tiny_model_dir, tmp_path, "--variants", "option_text_kl", "--only",
                             "n8_teacher_option_text_kl"))
    (r,) = result["results"]
    assert (r["loss"], r["restate"]) == ("kl", "option_text")
    assert losses == ["kl"] * r["steps"] == ["kl"] * 6  # 2 epochs × ceil(8 / 3)
    assert r["loss_per_epoch"][0] > 0  # a KL of a target two-point distribution the read does not match


def test_linear_probe_finds_a_separating_direction_and_not_noise():
    rng = np.random.default_rng(0)
    n, layers = 80, [1, 2]
    correct = rng.integers(0, 2, size=n).astype(bool)
    rows = []
    for c in correct:
        signal = rng.normal(size=6) + (3.0 if c else -3.0) * np.eye(6)[0]  # separable along one axis
        noise = rng.normal(size=6)
        hidden = {p: [list(signal), list(noise)] for p in study.CONFIDENCE_POSITIONS}
        rows.append({"correct": bool(c), "hidden": hidden})
    probe = study.linear_probe(rows, list(range(40)), list(range(40, 80)), layers, n_resamples=50, seed=0)
    for p in study.CONFIDENCE_POSITIONS:
        assert probe[f"{p}@1"]["auroc"]["value"] > 0.97
        assert abs(probe[f"{p}@2"]["auroc"]["value"] - 0.5) < 0.25


def test_bad_arguments_exit_2(tmp_path):
    with pytest.raises(SystemExit) as err:
        study.parse_args(["--output-dir", str(tmp_path), "--variants", "bigger"])
    assert err.value.code == 2


def test_sharp_teacher_is_p_true_norm_at_its_tau_by_hand():
    rows = [{"p_true_options": [0.8, 0.6], "norm_p_true": 0.7311}, {"p_true_options": [0.3, 0.5, 0.9],
                                                                  "norm_p_true": 0.0}]
    got = study.teacher_targets(rows, [0, 1], 0.05)
    # softmax(p / τ)[0]: 1 / (1 + e^{(0.6 − 0.8)/0.05}) and e^{0.3/0.05} / Σ_j e^{p_j/0.05}
    assert got[0] == pytest.approx(1 / (1 + np.exp(-4.0)))
    assert got[1] == pytest.approx(np.exp(6) / (np.exp(6) + np.exp(10) + np.exp(18)))
    assert study.teacher_targets(rows, [0, 1], 0.0) == [0.7311, 0.0]  # as scored
    assert study.Variant(8, restate="option_text", tau_n=0.05).name == "n8_teacher_option_text_tau0.05"
