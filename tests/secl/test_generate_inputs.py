"""SECLModel.generate without prompt ids (neither ``inputs`` nor ``input_ids``, or ``input_ids=None``) is a
ParameterError naming ``input_ids``, not a bare KeyError/AttributeError, and the stream's counters are unchanged."""

from __future__ import annotations

import pytest
import torch

from hf_calibration.errors import ParameterError
from hf_calibration.secl.config import SECLConfig
from hf_calibration.secl.mixin import apply_secl


def test_generate_without_prompt_ids_names_input_ids(tiny_model, tiny_tokenizer):
    model = apply_secl(tiny_model, tiny_tokenizer, SECLConfig(burst_size=2))
    before = dict(model.secl_counters)
    for kwargs in ({"attention_mask": torch.ones(1, 3, dtype=torch.long)}, {"input_ids": None}):
        with pytest.raises(ParameterError) as err:
            model.generate(max_new_tokens=2, **kwargs)
        assert err.value.parameter == "input_ids"
    assert dict(model.secl_counters) == before
