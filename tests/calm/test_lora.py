import pytest

from hf_calibration.calm import default_lora_config
from hf_calibration.errors import ParameterError


def test_default_lora_config_is_the_one_calm_trains():
    lora = default_lora_config(4)
    # rank 4, scaling 2r, no dropout, the four attention projections of Llama-style models
    assert (lora.r, lora.lora_alpha, lora.lora_dropout) == (4, 8, 0.0)
    assert set(lora.target_modules) == {"q_proj", "k_proj", "v_proj", "o_proj"} and lora.task_type == "CAUSAL_LM"
    with pytest.raises(ParameterError, match="r: must be an integer ≥ 1, got 0"):
        default_lora_config(0)
