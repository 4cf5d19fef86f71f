"""An undefined difference is not a verdict: when every answer is wrong (diagnose --dataset gsm8k at a small
limit), ΔAUROC and ΔECE are undefined and the verdict is "undecided" with the reason, not "does not help"."""

import numpy as np

from hf_calibration.secl.diagnose import format_diagnosis, generation_discrimination_gap


def test_all_wrong_answers_are_undecided():
    rng = np.random.default_rng(0)
    gap = generation_discrimination_gap(np.zeros(6, dtype=int), rng.uniform(size=6), rng.uniform(size=6),
                                        n_resamples=20)
    assert gap["verdict"] == "undecided" and gap["secl_expected_to_help"] is None
    assert "every one of the 6 answers is wrong" in gap["explanation"]
    text = format_diagnosis({"signals": {}, "references": {}, "gap": gap})
    assert "ΔAUROC undefined" in text and "nan" not in text and "does not help" not in text
