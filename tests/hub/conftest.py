"""A fake Hub on 127.0.0.1 for the Hub tests, with huggingface_hub pointed at it and isolated from the machine."""

import secrets
from dataclasses import dataclass
from pathlib import Path

import pytest
from huggingface_hub import constants

from hf_calibration.runtime import offline as _offline
from tests.hub.fake_hub import FakeHub


@dataclass
class HubSession:
    hub: FakeHub
    token: str
    user: str
    hf_home: Path
    storage: Path


@pytest.fixture()
def fake_hub(tmp_path, monkeypatch):
    """Start ``FakeHub``; point HF_ENDPOINT (and the constants huggingface_hub read at import) at it.

    HF_HOME is a fresh temporary folder (no token file, empty caches), HF_TOKEN is unset, Xet is off
    (the fake speaks the plain LFS protocol) and offline mode is off for this test only.
    """
    storage, hf_home = tmp_path / "server", tmp_path / "hf_home"
    hf_home.mkdir()
    token, user = f"hf_test_{secrets.token_hex(12)}", "calib-user"
    hub = FakeHub(storage, tokens={token: user}).start()
    try:
        for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE", "HF_HUB_CACHE", "HF_TOKEN_PATH"):
            monkeypatch.delenv(var, raising=False)
        env = {"HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_XET": "1", "HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "0",
               "HF_HOME": str(hf_home), "HF_HUB_DISABLE_TELEMETRY": "1"}
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        # huggingface_hub copies these from the environment once, at import time.
        patched = {
            "ENDPOINT": hub.url,
            "HUGGINGFACE_CO_URL_TEMPLATE": hub.url + "/{repo_id}/resolve/{revision}/{filename}",
            "HF_HUB_OFFLINE": False,
            "HF_HUB_DISABLE_XET": True,
            "HF_HUB_DISABLE_TELEMETRY": True,
            "HF_HOME": str(hf_home),
            "HF_HUB_CACHE": str(hf_home / "hub"),
            "HUGGINGFACE_HUB_CACHE": str(hf_home / "hub"),
            "HF_ASSETS_CACHE": str(hf_home / "assets"),
            "HF_XET_CACHE": str(hf_home / "xet"),
            "HF_TOKEN_PATH": str(hf_home / "token"),
            "HF_STORED_TOKENS_PATH": str(hf_home / "stored_tokens"),
        }
        for name, value in patched.items():
            monkeypatch.setattr(constants, name, value)
        _offline.forget_reachability()
        yield HubSession(hub=hub, token=token, user=user, hf_home=hf_home, storage=storage)
    finally:
        hub.stop()
        _offline.forget_reachability()

