"""The gateway between the real ``openai`` client and the session's real vLLM server (tests/conftest.py).

Each confidence the gateway returns is compared with the value the project computes in process for the same
prompt and answer with the same model (``secl.confidence``: ``p_true``, ``verbalized_confidence``,
``mcqa_signals``), within the tolerance tests/serving/conftest.py derives for served against in-process reads:
P(True), the option softmax and P(True)Norm's softmax are ratios of probabilities, each within PROB_ATOL, so
2·PROB_ATOL; the verbalized expectation Σ p_k·k/10 with Σ p_k = 1 moves by at most max_k |Δp_k| ≤ 2·PROB_ATOL
(the renormalised digit probabilities are ratios too)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tests.gateway.conftest import running_gateway
from tests.serving.conftest import MODEL, PROB_ATOL

openai = pytest.importorskip("openai")

TOL = 2 * PROB_ATOL
QUESTION = "What is the capital of France?"
ROW = {"question": "Which planet is known as the Red Planet?", "choices": ["Venus", "Mars", "Jupiter", "Saturn"],
       "answer": 1, "subject": "astronomy"}


@pytest.fixture(scope="module")
def gateway(vllm_server, smollm):
    from hf_calibration.gateway.config import GatewayConfig

    config = GatewayConfig(upstream=vllm_server.url, model=MODEL, signal="p_true", max_in_flight=16)
    with running_gateway(config, tokenizer=smollm[1]) as (url, gw):
        yield url, gw


@pytest.fixture(scope="module")
def client(gateway):
    c = openai.OpenAI(base_url=gateway[0], api_key="none", max_retries=0, timeout=300)
    yield c
    c.close()


def _chat(client, content, *, stream=False, calibration=None, user=None, max_tokens=12):
    extra = {"calibration": calibration} if calibration else None
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}],
                                          max_tokens=max_tokens, temperature=0, stream=stream, extra_body=extra,
                                          **({"user": user} if user else {}))


def _confidence(choice) -> dict:
    return choice.model_extra["confidence"]


def test_plain_answer_carries_p_true_equal_to_the_in_process_read(client, smollm):
    from hf_calibration.secl.confidence import p_true

    reply = _chat(client, QUESTION)
    answer = reply.choices[0].message.content
    conf = _confidence(reply.choices[0])
    assert conf["signal"] == "p_true" and conf["calibrator"]["kind"] == "identity" and conf["stream"] == "default"
    assert reply.choices[0].model_extra["abstain"] is False
    expected = p_true(*smollm, [QUESTION], [answer]).confidence[0]
    assert conf["raw"] == pytest.approx(expected, abs=TOL)
    assert conf["value"] == conf["raw"]


def test_verbalized_equals_the_in_process_read(client, smollm):
    from hf_calibration.secl.confidence import verbalized_confidence

    reply = _chat(client, QUESTION, calibration={"signal": "verbalized"})
    conf = _confidence(reply.choices[0])
    expected = verbalized_confidence(*smollm, [QUESTION], [reply.choices[0].message.content]).confidence[0]
    assert conf["signal"] == "verbalized" and conf["raw"] == pytest.approx(expected, abs=TOL)


def test_multiple_choice_signals_equal_mcqa_signals(client, smollm):
    from hf_calibration.modeling.prompts import LETTERS, first_option_letter, format_mcqa
    from hf_calibration.secl.confidence import mcqa_signals

    signals = mcqa_signals(*smollm, [ROW], progress=False)
    got = {}
    for name in ("option_probability", "p_true", "norm_p_true", "verbalized"):
        reply = _chat(client, format_mcqa(ROW["question"], ROW["choices"]), max_tokens=4,
                      calibration={"signal": name, "options": ROW["choices"], "multiple_choice": True})
        got[name] = _confidence(reply.choices[0])
        letter = first_option_letter(reply.choices[0].message.content)
    j = LETTERS.index(letter)
    assert all(c["option"] == j for c in got.values())
    assert got["option_probability"]["raw"] == pytest.approx(signals.option_probs[0, j], abs=TOL)
    assert got["p_true"]["raw"] == pytest.approx(signals.p_true_options[0, j], abs=TOL)
    assert got["norm_p_true"]["raw"] == pytest.approx(signals.norm_p_true_options[0, j], abs=TOL)
    np.testing.assert_allclose(got["norm_p_true"]["p_true_options"], signals.p_true_options[0], atol=TOL)
    if j == signals.prediction[0]:  # mcqa_signals reads the verbalized confidence of its prediction only
        assert got["verbalized"]["raw"] == pytest.approx(signals.confidence["verbalized"][0], abs=TOL)


def test_streamed_answer_ends_with_the_confidence_of_the_plain_answer(client):
    plain = _chat(client, QUESTION)
    chunks = list(_chat(client, QUESTION, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    last = chunks[-1].choices[0]
    assert last.model_extra["confidence"]["raw"] == pytest.approx(_confidence(plain.choices[0])["raw"], abs=TOL)
    assert not any("confidence" in (c.choices[0].model_extra or {}) for c in chunks[:-1] if c.choices)


def test_completions_endpoint_and_models_pass_through(client):
    models = client.models.list()
    assert MODEL in [m.id for m in models.data]  # beside any LoRA adapters other tests loaded into the server
    done = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0)
    conf = done.choices[0].model_extra["confidence"]
    assert conf["signal"] == "p_true" and 0 <= conf["value"] <= 1


def test_upstream_error_keeps_its_status_and_openai_shape(client):
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    assert err.value.status_code == 404 and "no-such-model" in err.value.body["message"]


@pytest.mark.parametrize("calibration, param", [({"signal": "entropy"}, "calibration.signal"),
                                                ({"signal": "norm_p_true"}, "calibration.options"),
                                                ({"colour": 1}, "calibration.colour")])
def test_bad_request_is_400_naming_the_field(client, calibration, param):
    with pytest.raises(openai.BadRequestError) as err:
        _chat(client, QUESTION, calibration=calibration)
    assert err.value.status_code == 400 and err.value.body["param"] == param
    assert err.value.body["type"] == "invalid_request_error"


def test_two_streams_sent_concurrently_each_equal_their_solo_run(gateway):
    url, gw = gateway
    questions = {"alice": "What is the capital of Italy?", "bob": "What is two plus two?"}

    async def ask(client, key):
        r = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": questions[key]}],
                                                 max_tokens=12, temperature=0,
                                                 extra_headers={"X-Calibration-Stream": key})
        return r.choices[0].message.content, _confidence(r.choices[0])

    async def main():
        async with openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0, timeout=300) as client:
            solo = {k: await ask(client, k) for k in questions}
            together = dict(zip(questions, await asyncio.gather(*(ask(client, k) for k in questions))))
        return solo, together

    solo, together = asyncio.run(main())
    for key in questions:
        assert together[key][0] == solo[key][0]
        assert together[key][1]["stream"] == key
        assert together[key][1]["raw"] == pytest.approx(solo[key][1]["raw"], abs=TOL)
    assert gw.streams.flush()
    assert gw.streams.state("alice")["steps"] >= 2 and gw.streams.state("bob")["steps"] >= 2
