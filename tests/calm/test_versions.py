"""CALMTrainer refuses transformers / TRL versions outside the tested ranges of hf_calibration.runtime.versions."""

import pytest

from hf_calibration.runtime import versions as _versions
from tests.calm.test_trainer import make_trainer


def fake_versions(monkeypatch, **found):
    real = _versions.installed_version
    monkeypatch.setattr(_versions, "installed_version", lambda name: found.get(name) or real(name))
    monkeypatch.delenv(_versions.SKIP_VERSION_CHECK_ENV, raising=False)


def test_tested_ranges_are_the_constraints():
    from pathlib import Path

    from packaging.version import Version

    pins = dict(line.strip().split("==") for line in (Path(__file__).parents[2] / "constraints.txt").read_text().split()
                if "==" in line)
    for name, (low, high) in _versions.TESTED_VERSIONS.items():
        assert pins[name] == low  # the lower bound is the version CI installs
        major, minor, _ = Version(low).release
        assert Version(high).release == (major, minor + 1)  # the upper bound is the next minor release


@pytest.mark.parametrize("found, ok", [
    ({}, True),  # what is installed: the constraints' versions
    ({"transformers": "5.24.3"}, True),  # a patch release of the tested minor
    ({"transformers": "5.25.0"}, False),
    ({"transformers": "5.25.0.dev0"}, False),  # a pre-release of the next minor is that minor
    ({"transformers": "5.23.1"}, False),
    ({"trl": "1.17.0"}, False),
    ({"trl": "2.0.0"}, False),
])
def test_untested_versions(monkeypatch, found, ok):
    fake_versions(monkeypatch, **found)
    bad = _versions.untested_versions()
    assert (bad == []) == ok
    for name, v in found.items():
        if not ok:
            low, high = _versions.TESTED_VERSIONS[name]
            assert bad == [f"{name} {v} (tested: >={low},<{high})"]


def test_trainer_raises_at_construction_and_can_opt_out(monkeypatch, tmp_path, tiny_tokenizer, mcqa_data):
    fake_versions(monkeypatch, transformers="5.30.0", trl="1.16.0")
    with pytest.raises(RuntimeError) as err:
        make_trainer(tmp_path, tiny_tokenizer, mcqa_data, method="sft")
    message = str(err.value)
    assert "CALMTrainer is not tested with transformers 5.30.0 (tested: >=5.24.0,<5.25)" in message
    assert "trl 1.16.0" not in message  # the tested package is not named as untested
    assert "HF_CALIBRATION_SKIP_VERSION_CHECK=1" in message
    assert "pip install 'transformers>=5.24.0,<5.25' 'trl>=1.16.0,<1.17'" in message
    monkeypatch.setenv("HF_CALIBRATION_SKIP_VERSION_CHECK", "1")
    make_trainer(tmp_path, tiny_tokenizer, mcqa_data, method="sft")
