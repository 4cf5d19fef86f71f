"""experiments/secl_decisive.py's SECL rows, on a synthetic stream built so each row's value is known by hand."""

import json

import numpy as np
import pytest

from experiments import secl_decisive


def _stream(n_per_domain=30, seed=0):
    """Reads and records of two domains: the teacher (P(True)Norm) ranks perfectly, the verbalized read is noise,
    SECL's returned confidence equals the teacher's on burst questions and noise elsewhere."""
    rng = np.random.default_rng(seed)
    reads, records = [], []
    for d in ("qa", "mmlu"):
        for k in range(n_per_domain):
            correct = bool(k % 2)
            teacher = 0.8 if correct else 0.2
            verbal = float(rng.uniform(0.3, 0.7))
            burst = k < 10
            reads.append({"domain": d, "index": k, "answer": f"A{k}", "parsed": "A", "option_probs": [0.6, 0.4]})
            records.append({"domain": d, "answer": f"A{k}", "correct": correct, "norm_p_true": teacher,
                            "verbalized": verbal, "secl": teacher if burst else verbal, "burst": burst,
                            "updated": burst and k % 3 == 0, "secl_final": teacher if k % 4 else 0.5,
                            "passes": {"verbalized": 3, "norm_p_true": 3, "secl": 5 if burst else 3}})
    return reads, records


def test_rows_by_hand():
    reads, records = _stream()
    joined = secl_decisive.joined(list(reversed(reads)), records)  # matched by domain and position, not order
    assert [r["option_probs"] for r in joined] == [[0.6, 0.4]] * len(records)
    rows = secl_decisive.secl_confidences(joined)
    conf, passes, keep = rows["teacher_in_bursts"]
    burst = np.array([r["burst"] for r in records])
    assert np.array_equal(conf, np.where(burst, [r["norm_p_true"] for r in records],
                                         [r["verbalized"] for r in records]))
    assert passes.tolist() == [3.0] * len(records) and keep.all()
    # the final adapter's read is reported only on questions no update trained on
    conf, _, keep = rows["secl_held_out"]
    assert keep.tolist() == [not r["updated"] for r in records]


def test_differences_and_verdict():
    runs = [secl_decisive.joined(*_stream(seed=s)) for s in (0, 1)]
    rep = secl_decisive.secl_table(runs, labelled=6, seed=0, n_resamples=200)
    diff = rep["differences"]["secl"]
    # SECL returns the teacher in bursts and noise elsewhere: it ranks below the perfect teacher, at more passes
    assert diff["auroc"]["value"] < 0 and diff["auroc"]["high"] < 0
    assert diff["passes"]["row"] > diff["passes"]["norm_p_true"] == 3.0
    assert diff["verdict"] == "(a) is better"
    assert len(rep["seeds"]) == 2 and set(rep["seeds"][0]) == {"qa", "mmlu"}


def test_mismatched_answers_are_refused(tmp_path, capsys):
    reads, records = _stream()
    reads[3]["answer"] = "something else"
    r, c = tmp_path / "reads.jsonl", tmp_path / "records.jsonl"
    r.write_text("".join(json.dumps(x) + "\n" for x in reads))
    c.write_text("".join(json.dumps(x) + "\n" for x in records))
    with pytest.raises(SystemExit) as err:
        secl_decisive.main(["--run", str(r), str(c)])
    assert err.value.code == 2 and "same answer" in capsys.readouterr().err
