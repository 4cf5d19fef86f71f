"""SECLConfig.burst_confidence "teacher": inside a burst ``generate`` returns the pseudo-label c* it has just
computed, outside bursts the verbalized read; nothing that is learnt changes (the same adapter, gate decisions and
update targets as the default "verbalized", read from a model run side by side on the same questions)."""

import numpy as np
import pytest
import torch

import hf_calibration.secl.step as step_module
from hf_calibration.errors import ParameterError
from hf_calibration.secl.config import SECLConfig
from hf_calibration.secl.mixin import apply_secl
from tests.secl.test_options import CHOICES, answer_a, encode

BURST = 3  # questions in the burst; two more follow it
SCHEDULE = dict(burst_size=BURST, learning_rate=1e-2, bin_gate_width=0, replay_size=BURST, replay_batch_size=1,
                consolidation_epochs=1, restate="option_text")


def test_bad_value_names_the_field():
    with pytest.raises(ParameterError, match="burst_confidence: must be 'verbalized' or 'teacher', got 'student'"):
        SECLConfig(burst_confidence="student")
    assert SECLConfig().burst_confidence == "verbalized"  # the paper's


def _stream(tiny_model, tiny_tokenizer, mode):
    """BURST + 2 questions from the same identity adapter (torch seeded), a burst opened at the first; → (returned
    confidences, records, adapter parameters)."""
    import copy

    torch.manual_seed(0)
    secl = apply_secl(copy.deepcopy(tiny_model), tiny_tokenizer, SECLConfig(burst_confidence=mode, **SCHEDULE))
    secl.start_burst()
    returned, records = [], []
    for _ in range(BURST + 2):
        out = answer_a(secl, tiny_tokenizer, secl_choices=[CHOICES])
        returned.append(float(out.confidences[0]))
        records.append(secl.secl_records[0].to_dict())
    return returned, records, [p.detach().clone() for p in secl.secl_adapter_params()]


def test_teacher_in_the_burst_verbalized_outside_and_the_same_training(tiny_model, tiny_tokenizer, monkeypatch):
    monkeypatch.setattr(step_module, "bin_gate_passes", lambda *a, **k: True)  # every burst question updates
    got_v, rec_v, params_v = _stream(tiny_model, tiny_tokenizer, "verbalized")
    got_t, rec_t, params_t = _stream(tiny_model, tiny_tokenizer, "teacher")
    assert [r["in_burst"] for r in rec_t] == [True] * BURST + [False] * 2
    assert all(r["updated"] for r in rec_t[:BURST])
    for k in range(BURST + 2):
        # the verbalized read is the same in both runs: nothing learnt differs
        assert rec_t[k]["verbalized"] == pytest.approx(rec_v[k]["verbalized"], abs=1e-6)
        assert got_v[k] == pytest.approx(rec_v[k]["verbalized"], abs=1e-6)
        assert rec_t[k]["target"] == rec_v[k]["target"] or abs(rec_t[k]["target"] - rec_v[k]["target"]) < 1e-6
        if k < BURST:
            assert got_t[k] == pytest.approx(rec_t[k]["norm_p_true"], abs=1e-6)
            assert got_t[k] != pytest.approx(rec_t[k]["verbalized"], abs=1e-3)  # the two differ on this model
        else:
            assert got_t[k] == pytest.approx(got_v[k], abs=1e-6) and rec_t[k]["norm_p_true"] is None
    for a, b in zip(params_v, params_t):
        torch.testing.assert_close(a, b)
    assert any(float(p.abs().max()) > 0 for p in params_t[1::2])  # the adapter moved (B left zero)


def test_the_returned_c_star_is_the_teachers_by_hand(tiny_model, tiny_tokenizer, monkeypatch):
    """c* returned in the burst = softmax(P(True) / tau_n)[answer] over the two options, P(True) = p_yes / (p_yes +
    p_no) of each option read by a separate call (the base model's: scope "confidence" reads the teacher with the
    adapter off, so the adapter the burst trained does not change it)."""
    monkeypatch.setattr(step_module, "bin_gate_passes", lambda *a, **k: True)
    got, records, _ = _stream(tiny_model, tiny_tokenizer, "teacher")
    torch.manual_seed(0)
    fresh = apply_secl(tiny_model, tiny_tokenizer, SECLConfig(**SCHEDULE))
    prompt = encode(tiny_tokenizer)["input_ids"][0].tolist()
    label = fresh.secl_pseudo_label(prompt, [tiny_tokenizer.convert_tokens_to_ids("A")], choices=CHOICES)
    pt, tau = label["p_true"], SECLConfig().tau_n
    hand = np.exp(pt[0] / tau) / (np.exp(pt[0] / tau) + np.exp(pt[1] / tau))
    for k in range(BURST):
        assert got[k] == pytest.approx(hand, abs=1e-5)
