"""hf_calibration.integrations.hub against the fake Hub on 127.0.0.1: push, download back, compare exactly; bad input."""

import hashlib
import json
import logging

import pytest
import torch
from huggingface_hub import ModelCard
from huggingface_hub.errors import RepositoryNotFoundError
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict
from safetensors.torch import load_file, save_file

from hf_calibration.integrations.hub import (
    METRICS_DIR,
    check_artifact_config,
    download_folder,
    publish_metric_space,
    push_folder_to_hub,
    write_model_card,
)
from tests.hub.fake_hub import files_containing
from tests.tiny import make_tiny_model

PAPER = "https://arxiv.org/abs/2410.00000"


def _lora_folder(model, tmp_path):
    """A saved LoRA adapter with non-zero B (PEFT initialises B = 0), an extra safetensors file and a JSON config."""
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    torch.manual_seed(1)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.normal_(0.0, 0.5)
    folder = tmp_path / "artifact"
    peft_model.save_pretrained(folder)
    extra = {"rho": torch.randn(7), "shift": torch.randn(7)}
    save_file(extra, str(folder / "logit_adjustment.safetensors"))
    (folder / "logit_adjustment_config.json").write_text(json.dumps({"format_version": 1, "vocab_size": 7}))
    return peft_model.eval(), folder, extra


def _files(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("lfs", [True, False], ids=["lfs", "regular"])
def test_push_then_download_gives_the_same_files_and_outputs(fake_hub, tiny_model, tiny_tokenizer, tmp_path,
                                                             caplog, capfd, lfs):
    caplog.set_level(logging.DEBUG)
    fake_hub.hub.lfs = lfs
    peft_model, folder, extra = _lora_folder(tiny_model, tmp_path)
    write_model_card(folder, base_model="HuggingFaceTB/SmolLM2-135M-Instruct", method="CALM", paper_url=PAPER,
                     config={"r": 4, "lr": 1e-3}, metrics={"ece": 0.0512, "accuracy": 0.61})
    local = _files(folder)
    repo_id = f"{fake_hub.user}/tiny-calm"

    commit_url = push_folder_to_hub(folder, repo_id, token=fake_hub.token)

    # What arrived on the server: the same names and bytes; weights went through LFS when offered.
    assert commit_url.startswith(f"{fake_hub.hub.url}/{repo_id}/commit/")
    stored = fake_hub.hub.stored_files(repo_id)
    assert set(stored) == {"README.md", "adapter_config.json", "adapter_model.safetensors",
                           "logit_adjustment.safetensors", "logit_adjustment_config.json"}
    assert stored == local
    lfs_paths = set(fake_hub.hub.repos[("model", repo_id)].lfs)
    assert lfs_paths == ({"adapter_model.safetensors", "logit_adjustment.safetensors"} if lfs else set())
    if lfs:  # the stored object is named by the sha256 of the pushed file
        sha = hashlib.sha256(local["adapter_model.safetensors"]).hexdigest()
        assert (fake_hub.storage / "lfs" / sha).read_bytes() == local["adapter_model.safetensors"]

    # Download into the (temporary) HF cache and compare with what was pushed.
    downloaded = download_folder(repo_id)
    assert downloaded.is_relative_to(fake_hub.hf_home)
    assert _files(downloaded) == local
    expected_adapter = get_peft_model_state_dict(peft_model)
    got_adapter = load_file(str(downloaded / "adapter_model.safetensors"))
    assert set(got_adapter) == set(expected_adapter)
    assert all(torch.equal(got_adapter[k], expected_adapter[k]) for k in expected_adapter)
    got_extra = load_file(str(downloaded / "logit_adjustment.safetensors"))
    assert got_extra.keys() == extra.keys() and all(torch.equal(got_extra[k], extra[k]) for k in extra)

    # The reloaded adapter on a fresh copy of the same base model gives the same logits, exactly.
    reloaded = PeftModel.from_pretrained(make_tiny_model(tiny_tokenizer), str(downloaded)).eval()
    ids = torch.tensor([[5, 9, 13, 2, 7, 11]])
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, peft_model(ids).logits)
        assert not torch.equal(reloaded(ids).logits, make_tiny_model(tiny_tokenizer)(ids).logits)

    # The token went out as a bearer header on every write call (the LFS PUT goes to a presigned URL,
    # the public download used none), and nowhere to disk or logs.
    writes = [r for r in fake_hub.hub.requests if r.method == "POST"]
    assert {r.path.split("?")[0].rsplit("/", 1)[-1] for r in writes} >= {"create", "validate-yaml", "main"}
    assert all(r.headers.get("authorization") == f"Bearer {fake_hub.token}" for r in writes)
    assert all("authorization" not in r.headers for r in fake_hub.hub.requests if r.method in ("GET", "HEAD"))
    assert files_containing(fake_hub.storage, fake_hub.token) == []
    assert files_containing(fake_hub.hf_home, fake_hub.token) == []
    assert fake_hub.token not in caplog.text
    out, err = capfd.readouterr()
    assert fake_hub.token not in out + err


def test_model_card_front_matter_and_text(tmp_path):
    path = write_model_card(tmp_path, base_model="Qwen/Qwen2.5-0.5B", method="SECL", paper_url=PAPER,
                            config={"gate": "page-hinkley", "delta": 0.005}, metrics={"conf-ECE": 0.1234567, "n": 40},
                            tags=["lora"], usage="print('hi')")
    card = ModelCard.load(path)
    assert card.data.library_name == "hf-calibration"
    assert card.data.base_model == "Qwen/Qwen2.5-0.5B"
    assert card.data.license == "apache-2.0"
    assert card.data.tags == ["hf-calibration", "calibration", "secl", "lora"]
    assert PAPER in card.text and "| conf-ECE | 0.1235 |" in card.text and "| n | 40 |" in card.text
    assert json.loads(card.text.split("```json\n")[1].split("```")[0]) == {"delta": 0.005, "gate": "page-hinkley"}


@pytest.mark.parametrize("kwargs, match", [
    ({"paper_url": "arxiv 2410"}, "paper_url"),
    ({"metrics": {"ece": float("nan")}}, "metrics: value of 'ece'"),
    ({"config": {"f": object()}}, "config: not JSON"),
    ({"base_model": ""}, "base_model"),
])
def test_model_card_bad_input(tmp_path, kwargs, match):
    args = dict(base_model="m/x", method="CALM", paper_url=PAPER, config={}, metrics=None) | kwargs
    with pytest.raises(ValueError, match=match):
        write_model_card(tmp_path, **args)


def test_download_folder_returns_a_local_folder_as_is(tmp_path):
    assert download_folder(tmp_path) == tmp_path
    with pytest.raises(FileNotFoundError, match="logit_adjustment.safetensors"):
        download_folder(tmp_path, required_files=["logit_adjustment.safetensors"])


def test_push_without_token_fails_before_any_request(fake_hub, tmp_path):
    (tmp_path / "a.json").write_text("{}")
    with pytest.raises(ValueError, match="token: no Hugging Face token"):
        push_folder_to_hub(tmp_path, f"{fake_hub.user}/x")
    assert fake_hub.hub.requests == []


@pytest.mark.parametrize("repo_id", ["user/bad name", "user/a--b", "a/b/c", "user/caf\u00e9", "user/x.git", "-user/x"])
def test_invalid_repo_id_fails_before_any_request(fake_hub, tmp_path, repo_id):
    (tmp_path / "a.json").write_text("{}")
    with pytest.raises(ValueError, match="repo_id: invalid Hub repo id"):
        push_folder_to_hub(tmp_path, repo_id, token=fake_hub.token)
    with pytest.raises(ValueError, match="repo_id_or_path: .* neither an existing folder nor a valid Hub repo id"):
        download_folder(repo_id)
    assert fake_hub.hub.requests == []


def test_download_errors_name_what_is_missing(fake_hub, tmp_path):
    (tmp_path / "adapter_config.json").write_text("{}")
    repo_id = f"{fake_hub.user}/no-adjustment"
    push_folder_to_hub(tmp_path, repo_id, token=fake_hub.token)
    with pytest.raises(FileNotFoundError, match=f"{repo_id}: no logit_adjustment.safetensors"):
        download_folder(repo_id, required_files=["adapter_config.json", "logit_adjustment.safetensors"])
    with pytest.raises(RepositoryNotFoundError):
        download_folder(f"{fake_hub.user}/does-not-exist")


def test_private_repo_needs_the_token_to_download(fake_hub, tmp_path):
    (tmp_path / "a.json").write_text('{"a": 1}')
    repo_id = f"{fake_hub.user}/private-artifact"
    push_folder_to_hub(tmp_path, repo_id, token=fake_hub.token, private=True)
    assert fake_hub.hub.repos[("model", repo_id)].private
    with pytest.raises(RepositoryNotFoundError):
        download_folder(repo_id)
    assert (download_folder(repo_id, token=fake_hub.token) / "a.json").read_text() == '{"a": 1}'


def test_check_artifact_config_versions():
    assert check_artifact_config({"format_version": 2}, kind="CALM", max_format_version=2) == 2
    assert check_artifact_config({}, kind="CALM", max_format_version=2) == 1  # written before versions existed
    with pytest.raises(ValueError, match=r"format_version: the CALM config in x/y has format_version 3, "
                                         r"but hf-calibration .* reads at most 2"):
        check_artifact_config({"format_version": 3}, kind="CALM", max_format_version=2, source="x/y")
    with pytest.raises(ValueError, match="expected an integer ≥ 1"):
        check_artifact_config({"format_version": "2"}, kind="CALM", max_format_version=2)


def _metric_folder(tmp_path, name="expected_calibration_error"):
    """The real metrics/<name>/ when it exists, else a minimal evaluate-style folder in tmp."""
    if (METRICS_DIR / name / "requirements.txt").is_file():
        return METRICS_DIR
    folder = tmp_path / "metrics" / name
    folder.mkdir(parents=True)
    (folder / f"{name}.py").write_text("import evaluate\n")
    header = f"title: {name}\nsdk: gradio\napp_file: app.py\ntags:\n- evaluate"
    (folder / "README.md").write_text(f"---\n{header}\n---\n\n# ECE\n")
    (folder / "requirements.txt").write_text("evaluate>=0.4.5\nhf-calibration>=0.1\n")
    return tmp_path / "metrics"


def test_publish_metric_space(fake_hub, tmp_path):
    name = "expected_calibration_error"
    metrics_dir = _metric_folder(tmp_path, name)
    space_id = f"{fake_hub.user}/{name}"
    publish_metric_space(name, space_id, token=fake_hub.token, metrics_dir=metrics_dir)

    repo = fake_hub.hub.repos[("space", space_id)]
    assert repo.sdk == "gradio"
    stored = fake_hub.hub.stored_files(space_id, repo_type="space")
    local = _files(metrics_dir / name)
    assert {f"{name}.py", "README.md", "requirements.txt", "app.py"} <= set(stored)
    assert all(stored[p] == local[p] for p in local if "__pycache__" not in p)
    assert any(r.path.startswith(f"/api/spaces/{space_id}/commit/") for r in fake_hub.hub.requests)
    if "app.py" not in local:
        assert f'evaluate.load("{space_id}")' in stored["app.py"].decode()


def test_publish_metric_space_bad_input(fake_hub, tmp_path):
    name = "expected_calibration_error"
    metrics_dir = _metric_folder(tmp_path / "copy", name)
    if metrics_dir == METRICS_DIR:  # work on a copy: the checks below edit requirements.txt
        import shutil

        shutil.copytree(METRICS_DIR / name, tmp_path / "m" / name)
        metrics_dir = tmp_path / "m"
    with pytest.raises(ValueError, match="space_id: the Space must be named after the metric folder"):
        publish_metric_space(name, f"{fake_hub.user}/ece", token=fake_hub.token, metrics_dir=metrics_dir)
    (metrics_dir / name / "requirements.txt").write_text("evaluate\nhf_calibration_extra\n")
    with pytest.raises(ValueError, match="does not list hf-calibration"):
        publish_metric_space(name, f"{fake_hub.user}/{name}", token=fake_hub.token, metrics_dir=metrics_dir)
    with pytest.raises(ValueError, match="metric_name: no metric folder"):
        publish_metric_space("nope", f"{fake_hub.user}/nope", token=fake_hub.token, metrics_dir=metrics_dir)
    assert fake_hub.hub.requests == []


def test_download_folder_offline_uses_the_cache_only(fake_hub, tmp_path, monkeypatch):
    from huggingface_hub import constants

    (tmp_path / "a.json").write_text('{"a": 1}')
    repo_id = f"{fake_hub.user}/cached"
    push_folder_to_hub(tmp_path, repo_id, token=fake_hub.token)
    online = download_folder(repo_id)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    sent = len(fake_hub.hub.requests)
    assert download_folder(repo_id) == online
    with pytest.raises(FileNotFoundError, match="not in the local Hugging Face cache"):
        download_folder(f"{fake_hub.user}/never-downloaded")
    assert len(fake_hub.hub.requests) == sent


def test_bare_repo_name_goes_to_the_token_owners_namespace(fake_hub, tmp_path):
    (tmp_path / "a.json").write_text("{}")
    url = push_folder_to_hub(tmp_path, "bare-name", token=fake_hub.token)
    assert f"/{fake_hub.user}/bare-name/commit/" in url
    assert set(fake_hub.hub.stored_files(f"{fake_hub.user}/bare-name")) == {"a.json"}
