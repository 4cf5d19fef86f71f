"""`python -m experiments NAME` on a tiny random model and a handful of items (smoke + consistency)."""

import json
import shutil
from pathlib import Path

import numpy as np
import scipy.stats
import pytest

from experiments.cli import main


def _read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_diagnose_experiment_writes_every_sub_run_and_resumes(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "diag"
    argv = ["diagnose", "--models", str(tiny_model_dir), "--datasets", "mmlu,halueval_qa_lm,gsm8k",
            "--limit", "4", "--limit-open", "3", "--n-resamples", "20", "--output-dir", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "constant_accuracy" in printed and "AUROC" in printed and "ΔAUROC" in printed
    alias = tiny_model_dir.name
    for name in ("mmlu", "halueval_qa_lm", "gsm8k"):
        assert (out / alias / name / "diagnosis.json").is_file()
        assert (out / alias / name / "reliability_diagrams.png").stat().st_size > 0
    metrics = json.loads((out / "metrics.json").read_text())
    # the table's accuracy is the share of correct items in the per-item file
    signals = _read_jsonl(out / alias / "mmlu" / "signals.jsonl")
    acc = metrics["results"][alias]["mmlu"]["signals"]["verbalized"]["accuracy"]["value"]
    assert acc == pytest.approx(np.mean([r["correct"] for r in signals]))
    # gold positions balanced: 4 MMLU items → one per letter
    assert sorted(r["answer"] for r in signals) == [0, 1, 2, 3]
    records = _read_jsonl(out / alias / "gsm8k" / "records.jsonl")
    assert len(records) == 3 and all("norm_p_true" in r and "secl" not in r for r in records)
    # the length control is the hand-computed "pick the shorter answer" accuracy of the same items
    from hf_calibration.data import load_mcqa

    rows = load_mcqa("halueval_qa_lm", limit=4, seed=0, balance_gold=True)
    expected = np.mean([len(r["choices"][r["answer"]]) < len(r["choices"][1 - r["answer"]]) for r in rows])
    assert metrics["results"][alias]["halueval_qa_lm"]["run"]["length_only_accuracy"] == pytest.approx(expected)
    # a second call reads the sub-runs back instead of recomputing them
    stamp = (out / alias / "mmlu" / "diagnosis.json").stat().st_mtime_ns
    assert main(argv) == 0
    assert "read " in capsys.readouterr().out
    assert (out / alias / "mmlu" / "diagnosis.json").stat().st_mtime_ns == stamp


def test_secl_experiment_table_and_pngs(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "secl"
    assert main(["secl", "--models", str(tiny_model_dir), "--datasets", "halueval_qa_lm,gsm8k",
                 "--limit", "2", "--n-resamples", "20", "--workers", "2", "--output-dir", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "SECL" in printed and "trained on" in printed and "constant_accuracy" in printed
    alias = tiny_model_dir.name
    records = _read_jsonl(out / alias / "records.jsonl")
    assert [r["domain"] for r in records] == ["halueval_qa_lm"] * 2 + ["gsm8k"] * 2
    assert (out / alias / "reliability_halueval_qa_lm.png").is_file() and (out / alias / "reliability_gsm8k.png").is_file()
    summary = json.loads((out / "metrics.json").read_text())["results"][alias]["summary"]
    assert summary["overall"]["share_trained"] == pytest.approx(np.mean([r["updated"] for r in records]))
    # the SECL table: SECL with answers untouched (the default scope) and with answers adapted (scope "all")
    assert all("secl" in r and "secl_all" in r for r in records)
    assert "secl_all" in summary["overall"]["signals"] and "SECL (scope all)" in printed
    assert json.loads((out / "metrics.json").read_text())["results"][alias]["run"]["workers"] == 2


def test_secl_experiment_takes_secl_options_and_reads_back_only_a_run_with_them(tiny_model_dir, tmp_path, capsys):
    """SECL's options reach the streams (the consolidation schedule of docs/secl_results.md); a sub-run read back
    without them is refused with one line naming the first option that differs, nothing overwritten."""
    out = tmp_path / "secl"
    argv = ["secl", "--models", str(tiny_model_dir), "--datasets", "halueval_qa_lm", "--limit", "2",
            "--n-resamples", "20", "--output-dir", str(out)]
    schedule = ["--restate", "option_text", "--tau-n", "0.05", "--replay-size", "4", "--replay-batch-size", "0",
                "--consolidation-epochs", "2"]
    assert main(argv + schedule) == 0
    alias = tiny_model_dir.name
    config = json.loads((out / "metrics.json").read_text())["results"][alias]["run"]["config"]
    assert (config["restate"], config["tau_n"], config["replay_size"], config["consolidation_epochs"]) == (
        "option_text", 0.05, 4, 2)
    records = _read_jsonl(out / alias / "records.jsonl")
    assert all(r["burst"] for r in records)  # the burst at the start takes both questions
    capsys.readouterr()
    stamp = (out / alias / "records.jsonl").stat().st_mtime_ns
    assert main(argv + schedule) == 0 and "read " in capsys.readouterr().out
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("experiments: error: --tau-n:"), err
    assert "0.05" in err[0] and "--overwrite" in err[0]
    assert (out / alias / "records.jsonl").stat().st_mtime_ns == stamp


def test_calm_experiment_smoke(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "calm"
    sizes = ("--n-train 4 --n-calibration 4 --n-validation 4 --n-test 4 --n-ood 4 --max-steps 1 --train-batch-size 2 "
             "--methods uncalibrated ts sft bome").split()
    assert main(["calm", "--models", str(tiny_model_dir), "--n-resamples", "20",
                 "--output-dir", str(out), *sizes]) == 0
    printed = capsys.readouterr().out
    assert "CALM" in printed and "ref: const = val acc" in printed
    items = _read_jsonl(out / "items.jsonl")
    assert {r["split"] for r in items} == {"validation", "id_test", "mmlu_stem", "halueval_qa"}
    report = json.loads((out / "metrics.json").read_text())
    test_items = [r for r in items if r["split"] == "id_test"]
    acc = np.mean([r["bome_prediction"] == r["answer"] for r in test_items])
    assert report["tables"]["bome"]["id_test"]["accuracy"]["value"] == pytest.approx(acc)
    assert (out / "reliability_id_test.png").is_file() and (out / "table.md").is_file()
    # trained on length-matched HaluEval (2 options): L_tr and the entropy read A and B only
    assert json.loads((out / "scores" / "bome.json").read_text())["num_options"] == 2
    # the validation curve: one point per evaluation, its conf-ECE the value the selection rule read
    selection = json.loads((out / "scores" / "sft.json").read_text())["selection"]
    assert [p["step"] for p in selection["validation_curve"]] == [s for s, _ in selection["evaluated"]]
    assert [p["conf_ece"] for p in selection["validation_curve"]] == [v for _, v in selection["evaluated"]]
    assert "### validation curve" in (out / "table.md").read_text()
    # experiments/calm_sensitivity.py reads the folder: its dev conf-ECE is the report's validation row
    import runpy

    sensitivity = runpy.run_path(str(Path(__file__).parents[2] / "experiments" / "calm_sensitivity.py"))
    row = sensitivity["summarize"](out, n_resamples=20)
    assert row["dev_conf_ece"] == pytest.approx(report["tables"]["bome"]["validation"]["conf_ece"]["value"], abs=1e-12)
    assert row["test_accuracy_share"] == pytest.approx(
        report["tables"]["bome"]["id_test"]["accuracy"]["value"] / report["tables"]["sft"]["id_test"]["accuracy"]["value"])
    assert sensitivity["main"]([str(out / "scores")]) == 2  # not an experiment folder: one error line
    assert sensitivity["main"]([str(out), "--n-resamples", "0"]) == 2
    assert sensitivity["main"]([str(out), "--output", str(out)]) == 2  # a folder, not a file


def test_calm_splits_are_disjoint_and_each_balanced_on_its_own():
    from dataclasses import replace

    from experiments.calm_config import CALMExperimentConfig
    from experiments.calm import build_splits

    config = CALMExperimentConfig(n_train=10, n_calibration=6, n_validation=7, n_test=9, n_ood=8, balance_gold=True)
    splits = build_splits("halueval_qa_lm", config)
    plain = build_splits("halueval_qa_lm", replace(config, balance_gold=False))
    for name, n in (("train", 10), ("calibration", 6), ("validation", 7), ("id_test", 9), ("mmlu_stem", 8),
                    ("halueval_qa", 8)):
        split = splits[name]
        k = len(split[0]["choices"])
        counts = sorted(split["answer"].count(j) for j in range(k))
        assert counts == sorted([n // k + (j < n % k) for j in range(k)]), (name, counts)  # e.g. 7 → [3, 4]
        assert split["question"] == plain[name]["question"]  # the same questions, only the gold letter moved
        for a, b in zip(split, plain[name]):
            assert a["choices"][a["answer"]] == b["choices"][b["answer"]] and sorted(a["choices"]) == sorted(b["choices"])
    questions = [set(splits[n]["question"]) for n in ("train", "calibration", "validation", "id_test")]
    assert sum(map(len, questions)) == len(set().union(*questions)) == 32


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["diagnose", "--datasets", "mmlu,nope"], "--datasets"),
        (["secl", "--datasets", "mmlu,nope"], "--datasets: unknown domain 'nope'"),
        (["calm", "--limit", "5"], "--limit"),
        (["diagnose", "--models", ","], "--models"),
        (["secl", "--limit-open", "3"], "--limit-open"),
        (["calm", "--n-train", "0"], "--n-train: must be a positive integer, got 0"),
        (["calm", "--ood-domains", "nope"], "--ood-domains: unknown domain 'nope'"),
        (["secl", "--device", "gpu0"], "--device: not a torch device, got 'gpu0'"),
        (["secl", "--device", "meta"], "--device: must be auto, cpu, cuda, cuda:N or mps, got 'meta'"),
        (["diagnose", "--models", ""], "--models: must not be empty, got ''"),
        (["diagnose", "--datasets", ","], "--datasets: must not be empty, got ','"),
        (["secl", "--n-train", "4"], "--n-train: unknown option"),  # calm's option
        (["diagnose", "--tau-n", "0.05"], "--tau-n: unknown option"),  # SECL's options are secl's only
        # argparse's own messages in the library CLI's wording ("--x: …", not "argument --x/--x_y: …")
        (["secl", "--consolidation-lr-scheduler", "cosine"], "experiments: error: --consolidation-lr-scheduler: "
                                                             "invalid choice: 'cosine'"),
        (["calm", "--open-ended", "nope"], "experiments: error: --open-ended: invalid choice: 'nope'"),
        (["secl", "--consolidation-epochs", "2"], "--consolidation-epochs"),  # needs --replay-size
        # not an option of calm (its --help does not list it): a usage error naming it
        (["calm", "--workers", "2"], "--workers: unknown option"),
        (["secl", "--workers", "4"], "--workers: only secl runs passes in parallel"),
        (["secl", "--workers", "0"], "--workers: must be a positive integer, got 0"),
        (["calm", "--n-train", "abc"], "--n-train"),
        (["calm", "--seeds", "0,x"], "--seeds: must be distinct integers in [0, 2**32 - 1] separated by commas, got '0,x'"),
        (["calm", "--seeds", "0,²"], "--seeds: must be distinct integers"),
        (["calm", "--seeds", "4294967296"], "--seeds: must be distinct integers"),
        (["calm", "--seed", "4294967296"], "--seed: must be at most 2**32 - 1"),
        (["calm", "--open-domains", "halueval_qa_open,"], "--open-domains: must be distinct names among"),
        (["calm", "--open-ended", "only", "--methods", "cft"], "--methods: the open-ended setting runs"),
        (["calm", "--seeds", "1,1"], "--seeds: must be distinct integers"),
        (["calm", "--open-ended", "yes"], "--open-ended"),
        (["calm", "--eta", "1.5"], "--eta: must be in (0, 1], got 1.5"),
        (["calm", "--upper-gradient", "theta"], "experiments: error: --upper-gradient: invalid choice: 'theta'"),
        (["calm", "--open-domains", "gsm8k_open,nope"], "--open-domains: must be distinct names among"),
        (["calm", "--open-samples", "0"], "--open-samples: must be a positive integer, got 0"),
        (["calm", "--open-ended", "also", "--open-samples", "101"], "--open-samples: must be at most 100"),
        (["calm", "--open-ended", "only", "--open-max-new-tokens", "5000"],
         "--open-max-new-tokens: must be at most 1024, got 5000"),
        (["calm", "--open-samples", "3"], "--open-samples: acts only on the open-ended setting, which "
                                                        "--open-ended off leaves out"),
        (["calm", "--open-equivalence", "embedding"], "--open-equivalence: acts only on the open-ended"),
        (["calm", "--open-equivalence", "nli"], "--open-equivalence"),
        (["calm", "--seeds", "-1"], "--seeds: must be distinct integers"),
        (["calm", "--seeds", "0,1", "--seed", "3"], "--seed: give either --seed or the calm option"),
        (["diagnose", "--models", "/no/such/model"], "--models: '/no/such/model' is not a folder"),
    ],
)
def test_bad_input_exits_2_with_one_line(argv, fragment, tmp_path, capsys):
    try:
        code = main([*argv, "--output-dir", str(tmp_path / "x")])
    except SystemExit as exit_:  # argparse type errors exit from inside parse_args
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0]
    assert not (tmp_path / "x").exists()


def test_unknown_experiment_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["nope"])
    assert exc.value.code == 2


@pytest.mark.parametrize(
    "argv, prefix, value",
    [
        (["calm", "--datasets", "nope"], "--datasets:", "'nope'"),
        (["calm", "--datasets", "mmlu:astrologyy"], "--datasets:", "'astrologyy'"),
        (["calm", "--datasets", "mmlu:"], "--datasets:", "'mmlu:'"),
        (["calm", "--datasets", "gsm8k"], "--datasets:", "'gsm8k'"),  # not MCQA: nothing to train on
        (["calm", "--datasets", "mmlu:stem,gpqa"], "--datasets:", "'gpqa'"),
        (["calm", "--models", "a,b"], "--models:", "'b'"),
        (["calm", "--models", "some-org/not-a-model"], "--models:", "'some-org/not-a-model'"),
        (["secl", "--datasets", "mmlu:"], "--datasets:", "'mmlu:'"),
        (["secl", "--datasets", "gsm8k:algebra"], "--datasets:", "'gsm8k:algebra'"),
        (["secl", "--datasets", "mmlu:stem+astrologyy"], "--datasets:", "'astrologyy'"),
        (["secl", "--datasets", "gsm8k", "--limit", "1"], "--limit:", "--limit 1"),
        (["diagnose", "--datasets", "mmlu,halueval_qa", "--limit-open", "3"], "--limit-open:",
         "--limit-open 3"),
    ],
)
def test_bad_input_names_the_option_typed(argv, prefix, value, tmp_path, capsys, no_model_load):
    try:
        code = main([*argv, "--output-dir", str(tmp_path / "x")])
    except SystemExit as exit_:
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"experiments: error: {prefix}") and value in err[0], err
    assert "--stream" not in err[0] and "--limit-per-domain" not in err[0], err
    assert not (tmp_path / "x").exists()


def test_calm_option_prefix_is_not_an_option(tmp_path, capsys, no_model_load):
    with pytest.raises(SystemExit) as exit_:
        main(["calm", "--n-tr", "4", "--output-dir", str(tmp_path / "x")])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1 and "--n-tr: unknown option" in err[0], err  # not --n-train
    assert not (tmp_path / "x").exists()


def test_sub_run_folder_blocked_by_a_file_fails_before_loading(tiny_model_dir, tmp_path, capsys, no_model_load):
    out = tmp_path / "diag"
    out.mkdir()
    blocker = out / tiny_model_dir.name  # where the model's sub-runs go
    blocker.write_text("keep me")
    code = main(["diagnose", "--models", str(tiny_model_dir), "--datasets", "mmlu", "--limit", "4",
                 "--output-dir", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("experiments: error: --output-dir:"), err
    assert str(blocker) in err[0] and "not a directory" in err[0], err
    assert sorted(out.iterdir()) == [blocker] and blocker.read_text() == "keep me"


def test_calm_experiment_output_dir_under_a_file(tmp_path, capsys, no_model_load, monkeypatch):
    import hf_calibration.modeling

    monkeypatch.setattr(hf_calibration.modeling, "resolve_model_path", lambda name: name)  # no packaged-model copy

    (tmp_path / "afile").write_text("keep me")
    out = tmp_path / "afile" / "run"
    assert main(["calm", "--datasets", "halueval_qa_lm", "--n-train", "2", "--n-calibration", "2",
                 "--n-validation", "2", "--n-test", "2", "--n-ood", "2", "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("experiments: error: --output-dir:") and str(out) in err[0], err
    assert (tmp_path / "afile").read_text() == "keep me"


def test_calm_paired_comparisons_against_the_metrics_on_the_same_draws():
    """CALM − TS and CALM − SFT: the point values are the metric differences, the intervals those of a hand loop
    over default_rng(seed).integers(0, n, (R, n)) shared by both methods."""
    from experiments.calm_claims import paired_comparisons, pooled_difference
    from hf_calibration.metrics import expected_calibration_error

    rng = np.random.default_rng(3)
    labels = {"id_test": rng.integers(0, 4, 50)}
    probs = {m: {"id_test": rng.dirichlet(np.ones(4) * a, 50)} for m, a in (("bome", 1.0), ("ts", 3.0), ("sft", 0.5))}
    out = paired_comparisons(probs, labels, ("id_test",), n_resamples=100, seed=7)
    assert list(out["id_test"]) == ["bome − ts", "bome − sft"]

    def top(m):
        p = probs[m]["id_test"]
        return (p.argmax(1) == labels["id_test"]).astype(int), p.max(1)

    for pair, other in (("bome − ts", "ts"), ("bome − sft", "sft")):
        (ya, ca), (yb, cb) = top("bome"), top(other)
        d = out["id_test"][pair]
        assert d["conf_ece"]["value"] == pytest.approx(expected_calibration_error(ya, ca) - expected_calibration_error(yb, cb),
                                                       abs=1e-12)
        assert d["accuracy"]["value"] == pytest.approx(ya.mean() - yb.mean(), abs=1e-12)
        # BCa (metrics.bootstrap_interval) on the draws default_rng(7).integers(0, 50, (100, 50)): scipy's, where
        # its interval holds the value
        bca = scipy.stats.bootstrap((np.arange(50),), lambda i: expected_calibration_error(ya[i], ca[i])
                                    - expected_calibration_error(yb[i], cb[i]), paired=True, vectorized=False,
                                    n_resamples=100, method="BCa", rng=np.random.default_rng(7)).confidence_interval
        value = d["conf_ece"]["value"]
        low, high = min(bca.low, value), max(bca.high, value)
        assert (d["conf_ece"]["low"], d["conf_ece"]["high"]) == (pytest.approx(low, abs=1e-12),
                                                                 pytest.approx(high, abs=1e-12))
        # one seed, one split: the pooled interval of the claim check is this one
        pooled = pooled_difference([(probs, labels)], ("id_test",), "bome", other, n_resamples=100, seed=7)
        assert [pooled[k] for k in ("value", "low", "high")] == [d["conf_ece"][k] for k in ("value", "low", "high")]
    del probs["sft"]
    assert list(paired_comparisons(probs, labels, ("id_test",), n_resamples=10, seed=0)["id_test"]) == ["bome − ts"]


def test_seeds_table_cell_leaves_undefined_seeds_out():
    """The seeds tables' "mean (min–max)" cell: an AUROC undefined on one seed's split (every answer wrong) is left
    out and counted, not printed as nan (values by hand)."""
    from experiments.common import mean_range as _mean_range

    assert _mean_range([0.2, 0.4, 0.9]) == "0.500 (0.200–0.900)"
    assert _mean_range([0.7, None, 0.5]) == "0.600 (0.500–0.700) (2 of 3 seeds)"
    assert _mean_range([float("nan"), 0.25, None]) == "0.250 (1 of 3 seeds)"
    assert _mean_range([None, float("nan")]) == "—"
    assert _mean_range([0.125]) == "0.125"


def test_calm_experiment_over_seeds_pools_them(tiny_model_dir, tmp_path, capsys):
    """--seeds 0,1: one folder per seed, each seed its own splits; the pooled table's per-seed values are each
    seed's own report, and the claim check is printed."""
    out = tmp_path / "calm"
    sizes = ("--n-train 4 --n-calibration 4 --n-validation 4 --n-test 6 --n-ood 6 --max-steps 1 --train-batch-size 2 "
             "--methods uncalibrated ts sft bome --ood-domains mmlu:stem").split()
    assert main(["calm", "--models", str(tiny_model_dir), "--n-resamples", "20", "--seeds", "0,1",
                 "--output-dir", str(out), *sizes]) == 0
    printed = capsys.readouterr().out
    assert "claim check (pooled over 2 seeds)" in printed and "OOD conf-ECE of CALM below TS" in printed
    per_seed = {s: json.loads((out / f"seed_{s}" / "report.json").read_text()) for s in (0, 1)}
    assert json.loads((out / "seed_1" / "run.json").read_text())["seed"] == 1
    pooled = json.loads((out / "seeds.json").read_text())
    for split in ("id_test", "mmlu_stem"):
        for pair in ("bome − ts", "bome − sft"):
            d = pooled["pooled"][split][pair]["conf_ece"]
            own = [per_seed[s]["paired"][split][pair]["conf_ece"]["value"] for s in (0, 1)]
            assert d["per_stratum"] == pytest.approx(own, abs=1e-12)
            assert d["value"] == pytest.approx(np.mean(own), abs=1e-12)
    acc = [per_seed[s]["tables"]["bome"]["id_test"]["accuracy"]["value"] for s in (0, 1)]
    assert pooled["summary"]["id_test"]["bome"]["accuracy"] == pytest.approx(acc)
    assert [c["claim"] for c in pooled["claims"]][-1].startswith("lowest mean Semantic-ECE")
    assert json.loads((out / "metrics.json").read_text())["run"]["seed"] == "0,1"


def _probs_with(rng, labels, accuracy, confidence):
    """Two-option probabilities whose argmax is right on a share ``accuracy`` of the items, top prob ``confidence``."""
    n = len(labels)
    right = np.arange(n) < round(accuracy * n)
    top = np.where(right, labels, 1 - labels)
    p = np.full((n, 2), 1 - confidence)
    p[np.arange(n), top] = confidence
    return p


def test_calm_claim_check_decides_on_hand_made_runs():
    """CALM calibrated out of domain (confidence = accuracy), TS and SFT overconfident: ECE differences are
    hand-computable (one bin each) and decided; accuracy 0.70 against SFT's 0.72 is above 95 % of it (0.684), a
    CALM at 0.50 against SFT's 0.90 decisively below (0.855)."""
    from experiments.calm_claims import calm_claim_check as claim_check, pooled_difference

    rng = np.random.default_rng(0)
    n = 2000
    labels = {s: rng.integers(0, 2, n) for s in ("id_test", "ood")}
    conf = {"bome": 0.7, "ts": 0.95, "sft": 0.9}
    acc = {"bome": 0.7, "ts": 0.7, "sft": 0.72}
    probs = {m: {s: _probs_with(rng, labels[s], acc[m], conf[m]) for s in labels} for m in conf}
    runs = [(probs, labels)] * 2
    d = pooled_difference(runs, ["ood"], "bome", "ts", n_resamples=50, seed=0)
    assert d["value"] == pytest.approx(0.0 - 0.25, abs=1e-9)  # |0.7 − 0.7| − |0.95 − 0.7|
    rows, _ = claim_check(runs, ["ood"], n_resamples=100, seed=0)
    held = {claim: h for claim, h, _ in rows}
    assert held["OOD conf-ECE of CALM below TS"] is True and held["OOD conf-ECE of CALM below SFT"] is True
    # 0.70 − 0.95 · 0.72 = +0.016: the interval's half-width at n = 2000 × 2 seeds is ≈ 0.02, so undecided or held
    assert held["in-domain accuracy of CALM ≥ 95% of SFT's"] in (True, None)
    assert held["lowest mean Semantic-ECE, open-ended cross-domain"] == "not run"
    acc.update(bome=0.5, sft=0.9)
    probs = {m: {s: _probs_with(rng, labels[s], acc[m], conf[m]) for s in labels} for m in conf}
    rows, evidence = claim_check([(probs, labels)], ["ood"], n_resamples=100, seed=0)
    held = {claim: h for claim, h, _ in rows}
    assert held["in-domain accuracy of CALM ≥ 95% of SFT's"] is False
    assert evidence["bome − 0.95·sft id accuracy"]["value"] == pytest.approx(0.5 - 0.95 * 0.9, abs=1e-9)
    del probs["ts"]
    rows, _ = claim_check([(probs, labels)], ["ood"], n_resamples=10, seed=0)
    assert rows[0][1] == "not run"


def test_calm_experiment_open_ended_only(tiny_model_dir, tmp_path, capsys):
    """--open-ended only: answers for every method in open_ended/answers/, the Sem-ECE table, and each row's
    values equal to semantic_confidences on the saved answers (accuracy and Sem-ECE recomputed here)."""
    from experiments.calm_open import load_open_domain, parse_answer
    from hf_calibration.metrics import expected_calibration_error, semantic_confidences

    out = tmp_path / "calm"
    sizes = ("--n-train 4 --n-calibration 2 --n-validation 3 --n-test 4 --n-ood 3 --max-steps 2 --select-every 1 "
             "--train-batch-size 2 --open-samples 3 --open-max-new-tokens 4 --methods uncalibrated ts sft bome").split()
    assert main(["calm", "--models", str(tiny_model_dir), "--n-resamples", "20", "--open-ended", "only",
                 "--output-dir", str(out), *sizes]) == 0
    printed = capsys.readouterr().out
    assert "open-ended" in printed and "Sem-ECE" in printed
    report = json.loads((out / "open_ended" / "report.json").read_text())
    assert set(report["tables"]) == {"uncalibrated", "ts", "sft", "bome"}
    assert set(report["tables"]["bome"]) == {"id_test", "gsm8k_open"}
    rows = load_open_domain("gsm8k_open", limit=3, seed=0)
    answers = json.loads((out / "open_ended" / "answers" / "sft.json").read_text())["splits"]["gsm8k_open"]
    assert len(answers["samples"]) == 3 and all(len(s) == 3 for s in answers["samples"])
    conf, correct = semantic_confidences([[parse_answer("gsm8k_open", s) for s in ss] for ss in answers["samples"]],
                                         [r["reference"] for r in rows],
                                         answers=[parse_answer("gsm8k_open", g) for g in answers["greedy"]])
    table = report["tables"]["sft"]["gsm8k_open"]
    assert table["accuracy"]["value"] == pytest.approx(correct.mean())
    assert table["conf_ece"]["value"] == pytest.approx(expected_calibration_error(correct, conf))
    # TS: the uncalibrated greedy answers, a fitted temperature
    ts = json.loads((out / "open_ended" / "answers" / "ts.json").read_text())
    unc = json.loads((out / "open_ended" / "answers" / "uncalibrated.json").read_text())
    assert ts["splits"]["id_test"]["greedy"] == unc["splits"]["id_test"]["greedy"] and ts["info"]["temperature"] > 0
    assert report["claim"]["claim"].startswith("lowest mean Semantic-ECE")
    acc = {m: report["tables"][m]["id_test"]["accuracy"]["value"] for m in ("bome", "sft")}
    assert report["accuracy_share"]["value"] == pytest.approx(acc["bome"] - 0.95 * acc["sft"], abs=1e-12)
    assert "in-domain accuracy of CALM ≥ 95% of SFT's (open-ended)" in (out / "open_ended" / "report.md").read_text()
    # the report phase reads everything back
    assert main(["calm", "--models", str(tiny_model_dir), "--n-resamples", "20", "--open-ended", "only",
                 "--phase", "report", "--output-dir", str(out), *sizes]) == 0


def test_calm_experiment_open_ended_over_seeds_pools_them(tiny_model_dir, tmp_path, capsys):
    """--open-ended only --seeds 0,1: each seed's own open-ended run into seed_<s>/open_ended/, then the table over
    the seeds from the saved answers: each seed's value is that seed's report (another computation path:
    calibration_report), the pooled CALM − method Sem-ECE is the equal-weight mean of its (seed, OOD domain)
    strata, and the accuracy claim pools the seeds' in-domain splits. A report with a seed's answers missing is
    one line and rewrites nothing."""
    out = tmp_path / "calm"
    argv = ["calm", "--models", str(tiny_model_dir), "--n-resamples", "20", "--open-ended", "only",
            "--seeds", "0,1", "--output-dir", str(out),
            *("--n-train 4 --n-calibration 2 --n-validation 3 --n-test 4 --n-ood 3 --max-steps 1 --select-every 1 "
              "--train-batch-size 2 --open-samples 3 --open-max-new-tokens 4 --methods uncalibrated sft bome").split()]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "open-ended over seeds 0, 1" in printed and "pooled over 2 seeds" in printed
    pooled = json.loads((out / "open_ended_seeds.json").read_text())
    per_seed = {s: json.loads((out / f"seed_{s}" / "open_ended" / "report.json").read_text()) for s in (0, 1)}
    for split in ("id_test", "gsm8k_open"):
        for m in ("uncalibrated", "sft", "bome"):
            for key, theirs in (("accuracy", "accuracy"), ("sem_ece", "conf_ece")):
                assert pooled["summary"][split][m][key] == pytest.approx(
                    [per_seed[s]["tables"][m][split][theirs]["value"] for s in (0, 1)], abs=1e-12)
    for m in ("uncalibrated", "sft"):
        d = pooled["paired_ood"][m]
        strata = [per_seed[s]["paired"]["gsm8k_open"][f"bome − {m}"]["value"] for s in (0, 1)]
        assert d["per_split"] == pytest.approx(strata, abs=1e-12)
        assert d["value"] == pytest.approx(np.mean(strata), abs=1e-12)
    acc = {m: [per_seed[s]["tables"][m]["id_test"]["accuracy"]["value"] for s in (0, 1)] for m in ("bome", "sft")}
    assert pooled["accuracy_share"]["value"] == pytest.approx(
        np.mean(acc["bome"]) - 0.95 * np.mean(acc["sft"]), abs=1e-12)  # equal-size strata: the mean of the seeds'
    assert pooled["claim"]["claim"].startswith("lowest mean Semantic-ECE")
    (out / "seed_1" / "open_ended" / "answers" / "sft.json").unlink()
    before = (out / "seed_0" / "open_ended" / "report.json").stat().st_mtime_ns
    assert main([*argv, "--phase", "report"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("experiments: error: --phase: the open-ended method(s) sft"), err
    assert (out / "seed_0" / "open_ended" / "report.json").stat().st_mtime_ns == before


def test_calm_experiment_open_ended_also_over_seeds_puts_the_pooled_row_in_the_claim_check(tiny_model_dir, tmp_path,
                                                                                           capsys):
    out = tmp_path / "calm"
    assert main(["calm", "--models", str(tiny_model_dir), "--n-resamples", "20", "--open-ended", "also",
                 "--seeds", "0,1", "--output-dir", str(out),
                 *("--n-train 4 --n-calibration 2 --n-validation 3 --n-test 4 --n-ood 3 --max-steps 1 --select-every 1 "
                   "--train-batch-size 2 --open-samples 2 --open-max-new-tokens 3 --ood-domains mmlu:stem "
                   "--methods uncalibrated sft bome").split()]) == 0
    assert "open-ended over seeds 0, 1" in capsys.readouterr().out
    row = json.loads((out / "seeds.json").read_text())["claims"][-1]
    pooled = json.loads((out / "open_ended_seeds.json").read_text())["claim"]
    assert row == pooled and "× 2 seed(s)" in row["evidence"]


def test_open_domains_load_with_references():
    """HaluEval QA open-ended: the right answer as reference, the knowledge in the question; GSM8K: the number
    after '####' (hand-checked first rows of the packaged copies)."""
    from hf_calibration.data.loaders import halueval_packaged_records
    from experiments.calm_open import load_open_domain, parse_answer

    rows = load_open_domain("halueval_qa_open", seed=0)
    raw = halueval_packaged_records("qa")
    assert len(rows) == len(raw) == 10000
    first = raw[0]
    match = [r for r in rows if r["reference"] == first["right_answer"].strip() and first["question"].strip() in r["question"]]
    assert match and first["knowledge"].strip() in match[0]["question"]
    gsm = load_open_domain("gsm8k_open", seed=0)
    assert len(gsm) == 1319 and all(r["reference"] for r in gsm)
    assert parse_answer("gsm8k_open", "The answer is 1,000.\nMore text 7") == "1000"
    assert parse_answer("halueval_qa_open", "\n  Paris \nbecause") == "Paris"


def test_open_generation_reuses_the_prompt_cache_and_equals_plain_generate(tiny_model_dir):
    """Greedy and sampled answers from the shared prompt cache are the tokens of two plain ``generate`` calls
    (left-padded batch of prompts of different lengths, the same torch seed)."""
    import torch

    from hf_calibration import modeling
    from experiments.calm_open import generate_answers
    from hf_calibration.modeling.prompts import build_prompt

    model, tok = modeling.load_model(str(tiny_model_dir))
    questions = ["a b c", "d e f g h i j k", "l"]
    greedy, samples = generate_answers(model, tok, questions, n_samples=3, max_new_tokens=5, batch_size=3, seed=4)
    tok.padding_side = "left"
    enc = tok([build_prompt(tok, q) for q in questions], return_tensors="pt", padding=True, add_special_tokens=False)
    w = enc["input_ids"].shape[1]
    pad = tok.pad_token_id or tok.eos_token_id
    torch.manual_seed(4)
    g = model.generate(**enc, do_sample=False, max_new_tokens=5, pad_token_id=pad)
    s = model.generate(**enc, do_sample=True, top_k=0, top_p=1.0, num_return_sequences=3, max_new_tokens=5,
                       pad_token_id=pad)
    assert greedy == tok.batch_decode(g[:, w:], skip_special_tokens=True)
    texts = tok.batch_decode(s[:, w:], skip_special_tokens=True)
    assert samples == [texts[0:3], texts[3:6], texts[6:9]]


def test_calm_report_checks_before_writing_and_keeps_the_run_settings(tiny_model_dir, tmp_path, capsys):
    """A trained folder: reporting with other OOD sets or sizes is one line naming the option; a report over seeds
    with one seed missing rewrites nothing; --methods ts alone scores the uncalibrated model it needs."""
    out = tmp_path / "calm"
    options = {"--n-train": "4", "--n-calibration": "2", "--n-validation": "3", "--n-test": "4", "--n-ood": "3",
               "--max-steps": "1", "--select-every": "1", "--train-batch-size": "2", "--n-resamples": "20",
               "--ood-domains": "mmlu:stem", "--seeds": "0,1", "--methods": "ts"}

    def run(phase, **change):
        argv = [x for k, v in {**options, **change}.items() for x in (k, v)]
        return main(["calm", "--models", str(tiny_model_dir), "--phase", phase, "--output-dir", str(out),
                     *argv])

    assert run("train") == 0
    assert (out / "seed_1" / "scores" / "uncalibrated.npz").is_file()  # ts needs it
    capsys.readouterr()
    for change, prefix in [({"--ood-domains": "mmlu:humanities"}, "--ood-domains: "), ({"--n-test": "5"}, "--n-test: "),
                           ({"--seeds": "0,1,2"}, "--phase: no method has been scored")]:
        before = sorted(p.name for p in (out / "seed_0").iterdir())
        code = run("report", **change)
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and err[0].startswith(f"experiments: error: {prefix}"), (change, err)
        assert sorted(p.name for p in (out / "seed_0").iterdir()) == before  # no report written
    assert run("report") == 0


def test_calm_open_ended_report_without_answers_writes_nothing(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "calm"
    code = main(["calm", "--models", str(tiny_model_dir), "--open-ended", "only", "--phase", "report",
                 "--output-dir", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--phase" in err[0] and "no answers" in err[0], err
    assert not out.exists()
    code = main(["calm", "--models", str(tmp_path / "nope"), "--open-ended", "also",
                 "--output-dir", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("experiments: error: --models:"), err
    assert not out.exists()


def test_calm_splits_warn_when_n_ood_exceeds_a_domain():
    """A huge --n-ood is cut to the OOD domain's size with a warning naming n_ood (the ID sizes are an error)."""
    from hf_calibration.errors import ParameterWarning
    from experiments.calm import build_splits, load_domain
    from experiments.calm_config import CALMExperimentConfig

    n = len(load_domain("gpqa"))
    config = CALMExperimentConfig(n_train=2, n_calibration=2, n_validation=2, n_test=2, n_ood=n + 5,
                                  ood_domains="gpqa")
    with pytest.warns(ParameterWarning, match=f"n_ood {n + 5} exceeds the {n} questions of 'gpqa'; using all {n}"):
        splits = build_splits("halueval_qa_lm", config)
    assert len(splits["gpqa"]) == n


def test_calm_corrupt_score_file_names_the_output_folder(tmp_path, capsys, no_model_load, monkeypatch):
    """A truncated scores/<method>.npz (a run killed while writing) is one error line naming --output-dir and the
    file, not a traceback; nothing is written."""
    import hf_calibration.modeling

    monkeypatch.setattr(hf_calibration.modeling, "resolve_model_path", lambda name: name)
    out = tmp_path / "run"
    (out / "scores").mkdir(parents=True)
    (out / "scores" / "uncalibrated.npz").write_bytes(b"PK\x03\x04 truncated")
    (out / "scores" / "uncalibrated.json").write_text("{}")
    before = sorted(p.name for p in out.rglob("*"))
    assert main(["calm", "--datasets", "halueval_qa_lm", "--methods", "uncalibrated", "--n-train", "2",
                 "--n-calibration", "2", "--n-validation", "2", "--n-test", "2", "--n-ood", "2",
                 "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("experiments: error: --output-dir:"), err
    assert "uncalibrated.npz' is not a readable score file" in err[0] and "--overwrite" in err[0]
    assert sorted(p.name for p in out.rglob("*")) == before


def test_calm_run_stopped_while_scoring_scores_the_kept_model_without_training_again(tiny_model_dir, tmp_path,
                                                                                     capsys, monkeypatch):
    """A run stopped after training but before a method's scores were written resumes from
    ``runs/<method>/trained``: the reloaded model (LoRA through PEFT, α from its safetensors) gives the scores the
    model in memory gave, and nothing is trained again."""
    import experiments.calm

    out = tmp_path / "calm"
    argv = ["calm", "--models", str(tiny_model_dir), "--n-resamples", "20", "--output-dir", str(out),
            *("--n-train 4 --n-calibration 4 --n-validation 4 --n-test 4 --n-ood 4 --max-steps 2 "
              "--train-batch-size 2 --methods uncalibrated sft bome").split()]
    assert main(argv) == 0
    first = {m: dict(np.load(out / "scores" / f"{m}.npz")) for m in ("sft", "bome")}
    trained = {m: json.loads((out / "runs" / m / "trained" / "train_info.json").read_text()) for m in first}
    assert not list((out / "runs").rglob(".trained.partial"))
    for m in first:  # the stop: trained, not scored
        (out / "scores" / f"{m}.npz").unlink()
        (out / "scores" / f"{m}.json").unlink()

    def refuse(*args, **kwargs):
        raise AssertionError("trained again")

    monkeypatch.setattr(experiments.calm, "train_method", refuse)
    assert main(argv) == 0
    capsys.readouterr()
    for m, arrays in first.items():
        again = np.load(out / "scores" / f"{m}.npz")
        assert sorted(again.files) == sorted(arrays)
        for key, value in arrays.items():
            np.testing.assert_allclose(again[key], value, rtol=1e-5, atol=1e-5, err_msg=f"{m} {key}")
        info = json.loads((out / "scores" / f"{m}.json").read_text())
        assert info["trained_in_an_earlier_run"] is True
        assert info["selection"] == trained[m]["selection"] and info["log"] == trained[m]["log"]
    # a kept folder without its info is one error line naming --output-dir and the folder; nothing trains
    (out / "scores" / "bome.npz").unlink()
    (out / "runs" / "bome" / "trained" / "train_info.json").unlink()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("experiments: error: --output-dir:"), err
    assert "has no train_info.json" in err[0] and "--overwrite" in err[0]


@pytest.mark.parametrize("moved", [False, True], ids=["in_place", "folder_moved"])
def test_calm_run_stopped_while_training_goes_on_from_the_last_checkpoint(tiny_model_dir, tmp_path, capsys,
                                                                          monkeypatch, moved):
    """A run killed after bome's checkpoint at step 2 (of 4; ``select_every`` 2) trains steps 3 and 4 only on the
    rerun, from that checkpoint, and ends with the model, the selection and the scores of a run never stopped; also
    when its folder was moved between the two: the checkpoint's ``best_model_checkpoint`` names the old folder, the
    Trainer drops it on resume and finds the best step again in the new folder at its next save (from
    ``best_global_step``), so the step kept before the stop is still restored."""
    from transformers import TrainerCallback

    import experiments.calm

    def argv(out):
        return ["calm", "--models", str(tiny_model_dir), "--n-resamples", "20", "--output-dir", str(out),
                *("--n-train 4 --n-calibration 4 --n-validation 4 --n-test 4 --n-ood 4 --max-steps 4 "
                  "--train-batch-size 1 --methods uncalibrated bome --seed 1").split()]

    whole = tmp_path / "whole"
    assert main(argv(whole)) == 0
    # the selection keeps step 2, the checkpoint before the stop, so a resume that lost it would end elsewhere
    assert json.loads((whole / "scores" / "bome.json").read_text())["selection"]["selected_step"] == 2
    train_method = experiments.calm.train_method

    class Killed(Exception):
        pass

    class KillAfterSave(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            raise Killed(state.global_step)

    class CountSteps(TrainerCallback):
        steps = []

        def on_step_end(self, args, state, control, **kwargs):
            self.steps.append(state.global_step)

    def with_callback(callback):
        def train(*args, **kwargs):
            return train_method(*args, **kwargs, callbacks=[callback])
        return train

    stopped = tmp_path / "stopped"
    monkeypatch.setattr(experiments.calm, "train_method", with_callback(KillAfterSave()))
    with pytest.raises(Killed):
        main(argv(stopped))
    assert (stopped / "runs" / "bome" / "checkpoint-2" / "trainer_state.json").is_file()
    assert not (stopped / "runs" / "bome" / "trained").exists() and not (stopped / "scores" / "bome.npz").exists()
    if moved:
        shutil.move(stopped, tmp_path / "moved")
        stopped = tmp_path / "moved"
    monkeypatch.setattr(experiments.calm, "train_method", with_callback(CountSteps()))
    assert main(argv(stopped)) == 0
    capsys.readouterr()
    assert CountSteps.steps == [3, 4]
    info = json.loads((stopped / "scores" / "bome.json").read_text())
    expected = json.loads((whole / "scores" / "bome.json").read_text())
    assert info["resumed_from_step"] == 2 and expected["resumed_from_step"] == 0
    assert info["selection"] == expected["selection"] and info["log"] == expected["log"]
    again, first = np.load(stopped / "scores" / "bome.npz"), np.load(whole / "scores" / "bome.npz")
    assert sorted(again.files) == sorted(first.files)
    for key in first.files:
        np.testing.assert_allclose(again[key], first[key], rtol=1e-5, atol=1e-6, err_msg=key)


def test_score_file_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """``write_npz_atomic``: a write that fails midway leaves an earlier complete file as it was and no partial
    file beside it; a write that succeeds reads back equal."""
    from experiments.calm import write_npz_atomic

    path = tmp_path / "uncalibrated.npz"
    write_npz_atomic(path, {"id_test_logits": np.arange(6.0).reshape(3, 2)})
    assert np.array_equal(np.load(path)["id_test_logits"], np.arange(6.0).reshape(3, 2))

    def half_written(f, **arrays):
        f.write(b"PK\x03\x04 half")
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", half_written)
    with pytest.raises(OSError, match="disk full"):
        write_npz_atomic(path, {"id_test_logits": np.zeros((3, 2))})
    monkeypatch.undo()
    assert np.array_equal(np.load(path)["id_test_logits"], np.arange(6.0).reshape(3, 2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["uncalibrated.npz"]


def test_calm_experiment_entropy_domain_vocab(tiny_model_dir, tmp_path, capsys, monkeypatch):
    """--entropy-domain vocab (the sensitivity variant) reaches CALM's trainer only: bome's L_tr and H read the full
    next-token distribution and α covers every token id; SFT keeps the option letters. run.json records it, and a
    report with the other domain is one line naming the option."""
    import hf_calibration.calm as calm

    seen = {}
    train = calm.CALMTrainer.train

    def record(self, *args, **kwargs):
        result = train(self, *args, **kwargs)
        seen[self.args.method] = (self.args.entropy_domain, self.model.logit_adjustment.temperature.numel(),
                                  self.model.config.vocab_size)
        return result

    monkeypatch.setattr(calm.CALMTrainer, "train", record)
    out = tmp_path / "calm"
    argv = ["calm", "--models", str(tiny_model_dir), "--n-resamples", "20", "--output-dir", str(out),
            *("--n-train 4 --n-calibration 4 --n-validation 4 --n-test 4 --n-ood 4 --max-steps 1 "
              "--train-batch-size 2 --ood-domains mmlu:stem --methods sft bome").split()]
    assert main([*argv, "--entropy-domain", "vocab"]) == 0
    assert seen["bome"][0] == "vocab" and seen["bome"][1] == seen["bome"][2]  # α over the whole vocabulary
    assert seen["sft"][0] == "options"
    assert json.loads((out / "run.json").read_text())["entropy_domain"] == "vocab"
    capsys.readouterr()
    assert main([*argv, "--phase", "report"]) == 2  # the default 'options' is not the run's setting
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("experiments: error: --entropy-domain: "), err


def tiny_levers(monkeypatch, levers, tiny_model_dir):
    """experiments.calm_levers at a tiny model's sizes, with two of its settings."""
    monkeypatch.setattr(levers, "COMMON", ["--models", str(tiny_model_dir), "--n-calibration", "4", "--n-validation",
                                           "4", "--n-test", "4", "--n-ood", "4", "--select-every", "1",
                                           "--train-batch-size", "2", "--n-resamples", "20"])
    monkeypatch.setattr(levers, "SETTINGS", {
        "defaults": levers.Setting([], 4, 1, shares=()),
        "upper_adjustment": levers.Setting(["--upper-gradient", "adjustment"], 4, 1)})


def test_calm_levers_share_the_baselines_and_report_the_rule(tiny_model_dir, tmp_path, capsys, monkeypatch):
    """experiments.calm_levers (issue 51 item 5): a 48-question setting reads the defaults' base-model and SFT
    scores (same splits) and trains its own CALM with its lever; the report's CALM − base OOD conf-ECE is the
    mean over the OOD sets of the two methods' ECE computed here from items.jsonl."""
    from experiments import calm_levers as levers
    from hf_calibration.metrics import expected_calibration_error

    tiny_levers(monkeypatch, levers, tiny_model_dir)
    out = tmp_path / "levers"
    assert levers.main(["run", "--output-dir", str(out)]) == 0
    base, lever = out / "defaults" / "seed_0", out / "upper_adjustment" / "seed_0"
    for name in sorted(p.name for p in (base / "scores").iterdir() if p.name.split(".")[0] in ("uncalibrated", "sft")):
        assert (lever / "scores" / name).read_bytes() == (base / "scores" / name).read_bytes()
    assert json.loads((lever / "run.json").read_text())["upper_gradient"] == "adjustment"
    assert json.loads((base / "run.json").read_text())["upper_gradient"] == "all"
    capsys.readouterr()
    assert levers.main(["report", "--output-dir", str(out), "--n-resamples", "20"]) == 0
    assert "| upper_adjustment | seed_0 |" in capsys.readouterr().out
    rows = json.loads((out / "report.json").read_text())
    items = _read_jsonl(lever / "items.jsonl")
    ood = sorted({r["split"] for r in items} - {"validation", "id_test"})

    def ece(method, split):
        rs = [r for r in items if r["split"] == split]
        return expected_calibration_error(np.array([r[f"{method}_prediction"] == r["answer"] for r in rs], int),
                                          np.array([r[f"{method}_confidence"] for r in rs]))

    by_hand = np.mean([ece("bome", s) - ece("uncalibrated", s) for s in ood])
    assert rows["upper_adjustment"]["bome − uncalibrated"]["value"] == pytest.approx(by_hand, abs=1e-12)
    # the rule's verdict from the three intervals' signs (docs/calm_results.md)
    for row in rows.values():
        sides = [(row["bome − uncalibrated"], "below"), (row["bome − ts"], "below"), (row["bome − 0.95·sft"], "above")]
        good = [d["high"] < 0 if side == "below" else d["low"] > 0 for d, side in sides]
        bad = [d["low"] > 0 if side == "below" else d["high"] < 0 for d, side in sides]
        assert row["verdict"] == ("held" if all(good) else "not held" if any(bad) else "undecided")
    with pytest.raises(SystemExit) as exit_:
        levers.main(["run", "--output-dir", str(out), "--settings", "nope"])
    assert exit_.value.code == 2
    assert "--settings: unknown setting 'nope'" in capsys.readouterr().err


def test_calm_levers_report_refuses_a_missing_output_dir_in_one_line(tmp_path, capsys):
    """``report`` on a folder ``run`` never wrote is bad input: exit 2 and one line naming --output-dir and the
    value, and nothing created there (before, a FileNotFoundError traceback writing report.json)."""
    from experiments import calm_levers as levers

    missing = tmp_path / "never_run"
    with pytest.raises(SystemExit) as exit_:
        levers.main(["report", "--output-dir", str(missing), "--settings", "train_272"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--output-dir" in err[0] and repr(str(missing)) in err[0]
    assert not missing.exists()


def test_calm_levers_setting_run_alone_scores_the_baselines_it_reads_first(tiny_model_dir, tmp_path, monkeypatch):
    """A 48-question setting run before ``defaults`` (or on a new machine, where outputs/ is gone) scores the base
    model and SFT in ``defaults`` first, without its CALM, then reads them; before, it stopped at a missing folder."""
    from experiments import calm_levers as levers

    tiny_levers(monkeypatch, levers, tiny_model_dir)
    out = tmp_path / "levers"
    assert levers.main(["run", "--output-dir", str(out), "--settings", "upper_adjustment"]) == 0
    base, lever = out / "defaults" / "seed_0", out / "upper_adjustment" / "seed_0"
    assert sorted(p.stem for p in (base / "scores").glob("*.npz")) == ["sft", "uncalibrated"]
    assert not (base / "runs" / "bome").exists()
    assert sorted(p.stem for p in (lever / "scores").glob("*.npz")) == ["bome", "sft", "uncalibrated"]
    for name in ("sft.npz", "uncalibrated.npz"):
        assert (lever / "scores" / name).read_bytes() == (base / "scores" / name).read_bytes()
    kept = (base / "scores" / "sft.npz").stat().st_mtime_ns
    assert levers.main(["run", "--output-dir", str(out), "--settings", "defaults"]) == 0  # trains its CALM only
    assert (base / "scores" / "sft.npz").stat().st_mtime_ns == kept
    assert (base / "scores" / "bome.npz").is_file()


def test_length_balanced_extra_is_outside_the_matched_set_with_the_shorter_answer_right_on_half():
    """``length_balanced_extra`` (the amended train_480 lever, docs/calm_results.md) against the raw HaluEval QA
    records: the questions are outside the length-matched set, half have the right answer the longer (at the largest
    size, every such question outside it), the other splits of ``build_splits`` do not move; bad sizes are refused
    naming ``extra_train``."""
    from hf_calibration.data import load_mcqa
    from hf_calibration.data.loaders import halueval_packaged_records
    from hf_calibration.errors import ParameterError

    from experiments.calm import build_splits, length_balanced_extra
    from experiments.calm_config import CALMExperimentConfig

    matched = set(load_mcqa("halueval_qa_lm")["question"])
    raw = {f"Knowledge: {r['knowledge'].strip()}\nQuestion: {r['question'].strip()}": r
           for r in halueval_packaged_records("qa")}
    longer = {q for q, r in raw.items()
              if q not in matched and len(r["right_answer"].strip()) > len(r["hallucinated_answer"].strip())}
    extra = length_balanced_extra("halueval_qa_lm", 2 * len(longer), seed=3)
    assert len(extra) == 2 * len(longer) and not set(extra["question"]) & matched
    for row in extra:
        r = raw[row["question"]]
        assert row["choices"][row["answer"]] == r["right_answer"].strip()
    assert set(extra["question"]) >= longer  # every one of them, and as many with the right answer the shorter
    for n, words in ((2 * len(longer) + 2, f"at most {2 * len(longer)}"), (5, "must be even")):
        with pytest.raises(ParameterError, match=words) as e:
            length_balanced_extra("halueval_qa_lm", n)
        assert e.value.parameter == "extra_train" and e.value.value == n
    with pytest.raises(ParameterError, match="length-matched HaluEval"):
        length_balanced_extra("mmlu", 4)
    sizes = dict(n_train=8, n_calibration=8, n_validation=8, n_test=8, n_ood=4, ood_domains="halueval_dialogue_lm")
    plain = build_splits("halueval_qa_lm", CALMExperimentConfig(**sizes), seed=1)
    more = build_splits("halueval_qa_lm", CALMExperimentConfig(**sizes, extra_train=6), seed=1)
    for name in ("calibration", "validation", "id_test", "halueval_dialogue_lm"):
        assert more[name]["question"] == plain[name]["question"], name
    assert len(more["train"]) == 14 and set(plain["train"]["question"]) < set(more["train"]["question"])


def test_calm_levers_extra_training_setting_reads_the_base_model_and_trains_its_own_sft(tiny_model_dir, tmp_path,
                                                                                       monkeypatch):
    """A setting that adds training questions (``--extra-train``, as train_272) shares ``defaults``' splits, so it
    reads the base model's scores; its SFT trains on its own larger S_T, so SFT's scores are not copied, and run
    alone it scores only the base model in ``defaults`` (before, it trained the defaults' SFT it never reads)."""
    from experiments import calm_levers as levers

    tiny_levers(monkeypatch, levers, tiny_model_dir)
    monkeypatch.setattr(levers, "COMMON", [*levers.COMMON, "--datasets", "halueval_qa_lm", "--ood-domains",
                                           "halueval_dialogue_lm"])
    more = levers.Setting(["--extra-train", "4"], 4, 1, shares=("uncalibrated",))
    monkeypatch.setattr(levers, "SETTINGS", {**levers.SETTINGS, "more": more})
    out = tmp_path / "levers"
    assert levers.main(["run", "--output-dir", str(out), "--settings", "more"]) == 0
    base, lever = out / "defaults" / "seed_0", out / "more" / "seed_0"
    assert sorted(p.stem for p in (base / "scores").glob("*.npz")) == ["uncalibrated"]
    assert not (base / "runs" / "sft").exists()
    assert (lever / "scores" / "uncalibrated.npz").read_bytes() == (base / "scores" / "uncalibrated.npz").read_bytes()
    assert sorted(p.stem for p in (lever / "scores").glob("*.npz")) == ["bome", "sft", "uncalibrated"]
    stored = json.loads((lever / "run.json").read_text())
    assert stored["extra_train"] == 4 and stored["sizes"]["train"] == 8
    assert json.loads((base / "run.json").read_text())["sizes"]["train"] == 4
    # the defaults' own SFT, trained later on its 4 questions, is not the one the setting trained on 8
    assert levers.main(["run", "--output-dir", str(out), "--settings", "defaults"]) == 0
    assert (lever / "scores" / "sft.npz").read_bytes() != (base / "scores" / "sft.npz").read_bytes()


@pytest.mark.parametrize("base, ts, share, verdict", [
    ((-0.2, -0.1), (-0.2, -0.01), (0.01, 0.1), "held"),
    ((-0.2, -0.1), (-0.2, 0.01), (0.01, 0.1), "undecided"),
    ((0.03, 0.16), (0.07, 0.2), (-0.49, -0.34), "not held"),  # every interval on the wrong side
    ((-0.2, -0.1), (-0.2, -0.01), (-0.1, -0.01), "not held"),  # the accuracy alone
])
def test_calm_levers_rule_verdict(base, ts, share, verdict):
    from experiments.calm_levers import rule_verdict

    def iv(pair):
        return {"low": pair[0], "high": pair[1]}

    assert rule_verdict(iv(base), iv(ts), iv(share)) == verdict
