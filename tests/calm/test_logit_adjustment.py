import pytest
import torch

from hf_calibration.calm import CALMModel, LogitAdjustment
from tests.tiny import make_tiny_model


def test_identity_at_initialisation(tiny_tokenizer):
    layer = LogitAdjustment(len(tiny_tokenizer), [3, 5, 7])
    z = torch.randn(2, 4, len(tiny_tokenizer))
    assert torch.equal(layer(z), z)
    assert torch.equal(LogitAdjustment(11, mode="scalar", parameterization="softplus")(z[..., :11]), z[..., :11])


@pytest.mark.parametrize("parameterization", ["exp", "softplus"])
def test_covered_ids_get_z_over_tau_plus_l(parameterization):
    layer = LogitAdjustment(6, [1, 4], parameterization=parameterization)
    with torch.no_grad():
        layer.rho.copy_(torch.tensor([0.5, -0.3]))
        layer.shift.copy_(torch.tensor([0.2, -1.0]))
    tau = torch.exp(torch.tensor([0.5, -0.3])) if parameterization == "exp" else \
        torch.log1p(torch.exp(torch.tensor([0.5, -0.3]) + torch.log(torch.tensor(torch.e - 1.0))))
    z = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]])
    expected = z.clone()
    expected[0, 1] = 2.0 / tau[0] + 0.2
    expected[0, 4] = 5.0 / tau[1] - 1.0
    torch.testing.assert_close(layer(z), expected)


def test_wrapper_logits_and_generate_use_adjustment(tiny_tokenizer):
    model = make_tiny_model(tiny_tokenizer)
    vocab = len(tiny_tokenizer)
    layer = LogitAdjustment(vocab)
    with torch.no_grad():
        layer.rho.uniform_(-1, 1)
        layer.shift.uniform_(-2, 2)
    ids = torch.tensor([tiny_tokenizer.encode("which option is correct ?")])
    raw = model(input_ids=ids).logits
    calm = CALMModel(model, layer)
    tau = torch.exp(layer.rho.detach())
    torch.testing.assert_close(calm(input_ids=ids).logits, raw / tau + layer.shift.detach())
    torch.testing.assert_close(calm(input_ids=ids, adjust_logits=False).logits, raw)
    out = calm.generate(input_ids=ids, max_new_tokens=1, do_sample=False, pad_token_id=tiny_tokenizer.pad_token_id)
    assert out[0, -1].item() == int((raw[0, -1] / tau + layer.shift.detach()).argmax())
    assert calm.config is model.config


def test_save_and_load_round_trip(tmp_path, tiny_tokenizer):
    layer = LogitAdjustment(len(tiny_tokenizer), [2, 9], mode="vector")
    with torch.no_grad():
        layer.rho.fill_(0.25)
        layer.shift.fill_(-0.5)
    layer.save_pretrained(tmp_path)
    loaded = LogitAdjustment.from_pretrained(tmp_path)
    assert loaded.token_ids.tolist() == [2, 9]
    torch.testing.assert_close(loaded.rho, layer.rho)
    torch.testing.assert_close(loaded.shift, layer.shift)


@pytest.mark.parametrize("kwargs, match", [
    ({"token_ids": [0, 99]}, "token_ids"),
    ({"token_ids": [1, 1]}, "token_ids"),
    ({"mode": "matrix"}, "mode"),
    ({"parameterization": "relu"}, "parameterization"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LogitAdjustment(10, **kwargs)


def test_wrapper_rejects_vocabulary_mismatch(tiny_tokenizer):
    with pytest.raises(ValueError, match="vocab_size"):
        CALMModel(make_tiny_model(tiny_tokenizer), LogitAdjustment(5))
