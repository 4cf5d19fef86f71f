"""Save, load and share calibrated artifacts: a model's folder plus the calibration's own files, the Hub.

A calibrated model (``CALMModel``, ``SECLModel``) is a wrapper of ours around a ``peft.PeftModel`` (or, for
CALM without LoRA, a full model). Its folder is what ``save_artifact`` writes: the model's own
``save_pretrained`` output (for a PeftModel PEFT's adapter layout, ``adapter_model.safetensors`` +
``adapter_config.json``, loadable by ``peft.PeftModel.from_pretrained``) with the calibration's extra files
beside it; ``load_artifact`` and ``load_artifact_weights`` read it back through PEFT.

The Hub helpers are generic: CALM, SECL and the ``evaluate`` metric Spaces build their folders with
their own ``save_pretrained`` and call ``write_model_card`` + ``push_folder_to_hub`` to share them and
``download_folder`` to get them back. Inputs are checked before any network call, so a missing token
or a malformed repo id fails at once with a ValueError naming the argument. Tokens are passed to
huggingface_hub and never logged or written anywhere by this module.

Every endpoint comes from huggingface_hub (``HF_ENDPOINT``), so the same code runs against the Hub or
a mirror; offline (HF_HUB_OFFLINE=1 or an unreachable endpoint) ``download_folder`` uses the local
cache only instead of spending ~47 s on retries .
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from huggingface_hub import HfApi, ModelCard, ModelCardData, get_token, snapshot_download
from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError
from huggingface_hub.utils import validate_repo_id

from hf_calibration import __version__
from hf_calibration.runtime.offline import hub_available
from hf_calibration.errors import check_choice

logger = logging.getLogger(__name__)

LIBRARY_NAME = "hf-calibration"
FORMAT_VERSION_KEY = "format_version"
REPO_TYPES = ("model", "dataset", "space")
METRICS_DIR = Path(__file__).resolve().parent.parent / "metrics"  # the source tree's evaluate modules
# A metric Space's app when its folder has none: our Gradio page (evaluate's widget needs gradio < 4).
_SPACE_APP = """import evaluate

from hf_calibration.integrations.spaces import launch_metric_space

launch_metric_space(evaluate.load("{name}"))
"""


ADAPTER_CONFIG_NAME = "adapter_config.json"  # PEFT's file names (peft.utils.constants)
ADAPTER_WEIGHTS_NAME = "adapter_model.safetensors"


@contextlib.contextmanager
def peft_checkpointing_warning_silenced():
    """Silence one FutureWarning by its exact message: PEFT 0.21's ``PeftModel`` reads
    ``is_gradient_checkpointing``, which transformers 5.24 deprecates. A mismatch between the two
    libraries that the caller cannot act on; every other warning still shows."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        yield


def _is_peft_model(model) -> bool:
    from peft import PeftModel

    return isinstance(model, PeftModel)


def base_model_name(model) -> str | None:
    """Hub id (or path) of the model a calibrated ``model`` adapts: a ``PeftModel``'s
    ``base_model_name_or_path``, else the model config's ``_name_or_path``; None when neither is set."""
    if _is_peft_model(model):
        name = model.peft_config[model.active_adapter].base_model_name_or_path
    else:
        name = getattr(model.config, "_name_or_path", None)
    return name or None


def save_artifact(model, save_directory: str | os.PathLike, write_extras: Callable[[Path], None], *,
                  state_dict: dict | None = None, **kwargs) -> Path:
    """Write a calibrated model's folder: ``model.save_pretrained`` then ``write_extras(folder)``.

    model : a ``peft.PeftModel`` (PEFT writes its own adapter layout: ``adapter_model.safetensors`` and
        ``adapter_config.json``) or a ``PreTrainedModel`` (a full model folder).
    write_extras : writes the calibration's own files (e.g. the logit adjustment, SECL's state) into the folder.
    state_dict : the model's weights to save instead of the live ones (e.g. the full tensors DeepSpeed ZeRO-3
        gathered), keyed as ``model.state_dict()``. ``kwargs`` go to ``model.save_pretrained``.

    Returns the folder. For a PeftModel ``save_embedding_layers`` defaults to False: calibration never resizes
    the embeddings, and PEFT's "auto" looks the base model's config up on the Hub to find that out.
    """
    folder = Path(save_directory)
    if _is_peft_model(model):
        kwargs.setdefault("save_embedding_layers", False)
    model.save_pretrained(folder, state_dict=state_dict, **kwargs)
    write_extras(folder)
    return folder


def load_artifact(pretrained: str | os.PathLike, read_extras: Callable[[Path], Any], *,
                  required_files: Sequence[str] = (), base_model=None, is_trainable: bool = False,
                  adapter_name: str = "default", revision: str | None = None, token: str | None = None,
                  **model_kwargs) -> tuple[Any, Any]:
    """Read what ``save_artifact`` wrote, from a local folder or a Hub repo id: ``(model, read_extras(folder))``.

    ``read_extras(folder)`` runs first, so an invalid extra file (a newer ``format_version``, a bad shape)
    fails before any model is loaded or changed. A folder with ``adapter_config.json`` is loaded with
    ``peft.PeftModel.from_pretrained`` on top of ``base_model`` (a loaded model, adapted in place) or, when
    None, of its ``base_model_name_or_path`` (resolved like ``hf_calibration.modeling.load_model``, so the
    packaged offline copies work; ``model_kwargs`` go to its ``from_pretrained``); any other folder as a full
    model through ``AutoModelForCausalLM``. ``is_trainable`` and ``adapter_name`` go to PEFT.

    Raises FileNotFoundError naming the first missing ``required_files`` entry; what ``read_extras`` and
    ``download_folder`` raise.
    """
    from transformers import AutoModelForCausalLM

    folder = download_folder(pretrained, revision=revision, token=token, required_files=required_files)
    extras = read_extras(folder)
    if (folder / ADAPTER_CONFIG_NAME).is_file():
        from peft import PeftConfig, PeftModel

        if base_model is None:
            from hf_calibration.modeling import resolve_model_path

            name = PeftConfig.from_pretrained(str(folder)).base_model_name_or_path
            base_model = AutoModelForCausalLM.from_pretrained(resolve_model_path(name), **model_kwargs)
        with peft_checkpointing_warning_silenced():
            model = PeftModel.from_pretrained(base_model, str(folder), adapter_name=adapter_name,
                                              is_trainable=is_trainable)
    else:
        model = AutoModelForCausalLM.from_pretrained(str(folder), **model_kwargs)
    return model, extras


def load_artifact_weights(model, folder: str | os.PathLike) -> None:
    """Load the model weights of a folder ``save_artifact`` wrote into ``model``, built with the same layout.

    A ``PeftModel`` reads its adapter with PEFT's own ``load_adapter`` into the active adapter; a full model
    loads ``model.safetensors`` (non-strict: only the saved weights). The model's train/eval mode is kept.
    """
    folder = Path(folder)
    if _is_peft_model(model):
        # is_trainable=True only keeps the mode (False calls eval()); the existing adapter's requires_grad is kept
        model.load_adapter(str(folder), adapter_name=model.active_adapter, is_trainable=True)
    else:
        from safetensors.torch import load_file

        model.load_state_dict(load_file(str(folder / "model.safetensors")), strict=False)


def check_repo_id(repo_id: str, *, argument: str = "repo_id") -> str:
    """Check a Hub repo id ("name" or "namespace/name") locally; ValueError naming ``argument`` otherwise.

    The rules are the Hub's (``huggingface_hub.utils.validate_repo_id``): letters, digits, "-", "_"
    and "." only, no "--" or "..", at most 96 characters, no ".git" suffix.
    """
    if not isinstance(repo_id, str) or not repo_id:
        raise ValueError(f"{argument}: expected a repo id like 'user/name', got {repo_id!r}")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        raise ValueError(f"{argument}: invalid Hub repo id {repo_id!r}: {err}") from None
    return repo_id


def _resolve_token(token: str | None) -> str:
    if token is not None and (not isinstance(token, str) or not token.strip()):
        # The value itself is a secret: name only its type.
        raise ValueError(f"token: expected a non-empty string, got a {type(token).__name__}")
    token = token or get_token()
    if not token:
        raise ValueError(
            "token: no Hugging Face token available; pass token=..., set HF_TOKEN, or run `hf auth login`"
        )
    return token


def push_folder_to_hub(
    folder: str | os.PathLike,
    repo_id: str,
    *,
    token: str | None = None,
    private: bool = False,
    commit_message: str = "Upload calibrated artifact with hf-calibration",
    repo_type: str = "model",
    space_sdk: str | None = None,
    allow_patterns: Sequence[str] | None = None,
) -> str:
    """Create ``repo_id`` if needed and upload every file of ``folder`` to it in one commit.

    Parameters
    ----------
    folder : path
        Local folder to upload (e.g. what ``CALMModel.save_pretrained`` wrote, plus its README.md).
    repo_id : str
        "namespace/name" (or "name" for the token's own namespace).
    token : str, optional
        Hub token with write access; default: huggingface_hub's lookup (HF_TOKEN, then the token file).
    private : bool
        Create the repo as private (ignored when it already exists).
    repo_type : {"model", "dataset", "space"}
    space_sdk : str, optional
        Required by the Hub when creating a Space ("gradio", "docker", "static").
    allow_patterns : sequence of str, optional
        Glob patterns of the files to upload (default: all, except ``.git`` and caches).

    Returns the URL of the commit. Raises ValueError (before any request) for a missing folder, an
    invalid repo id or repo type, or no available token; huggingface_hub's HfHubHTTPError for a
    refusal by the server.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"folder: {str(folder)!r} is not a directory")
    check_repo_id(repo_id)
    check_choice(repo_type, "repo_type", REPO_TYPES)
    token = _resolve_token(token)
    api = HfApi(token=token, library_name=LIBRARY_NAME, library_version=__version__)
    url = api.create_repo(repo_id, private=private, repo_type=repo_type, exist_ok=True, space_sdk=space_sdk)
    commit = api.upload_folder(
        repo_id=url.repo_id, folder_path=folder, repo_type=repo_type, commit_message=commit_message,
        allow_patterns=list(allow_patterns) if allow_patterns is not None else None,
        ignore_patterns=["*__pycache__*", "*.pyc"],
    )
    logger.info("pushed %s to %s (%s)", folder, url.repo_id, commit.commit_url)
    return commit.commit_url


def push_artifact_to_hub(
    artifact,
    repo_id: str,
    *,
    base_model: str,
    method: str,
    paper_url: str,
    config: Mapping,
    metrics: Mapping[str, float] | None = None,
    token: str | None = None,
    private: bool = False,
    commit_message: str | None = None,
    **card_kwargs,
) -> str:
    """``artifact.save_pretrained`` into a temporary folder, ``write_model_card`` there, ``push_folder_to_hub``.

    The body of a ``push_to_hub`` method: ``artifact`` is anything with ``save_pretrained(folder)``
    (a ``CALMModel``, a ``SECLModel``, a PEFT model). ``card_kwargs`` go to ``write_model_card`` (tags,
    datasets, description, usage, …). The repo id and token are checked before anything is saved;
    returns the commit URL. ``base_model`` must be a Hub id; every ``adapter_config.json`` in the pushed
    folder names it as ``base_model_name_or_path`` (PEFT writes whatever path the model was loaded from).
    """
    check_repo_id(repo_id)
    token = _resolve_token(token)
    if not callable(getattr(artifact, "save_pretrained", None)):
        raise TypeError(f"artifact: expected an object with save_pretrained(folder), got {type(artifact).__name__}")
    check_repo_id(base_model, argument="base_model")  # a Hub id: a local path would load nowhere else
    with tempfile.TemporaryDirectory() as staging:
        artifact.save_pretrained(staging)
        _name_base_model(Path(staging), base_model)
        write_model_card(staging, base_model=base_model, method=method, paper_url=paper_url, config=config,
                         metrics=metrics, **card_kwargs)
        return push_folder_to_hub(staging, repo_id, token=token, private=private,
                                  commit_message=commit_message or f"Upload {method} artifact with hf-calibration")


def _name_base_model(folder: Path, base_model: str) -> None:
    """Make every ``adapter_config.json`` under ``folder`` name ``base_model`` (a Hub id).

    PEFT records ``base_model_name_or_path`` from the model it wrapped; for a model loaded from a local
    folder that is a path of this machine, which nobody who downloads the artifact can load.
    """
    for path in folder.rglob("adapter_config.json"):
        cfg = json.loads(path.read_text(encoding="utf-8"))
        if cfg.get("base_model_name_or_path") != base_model:
            logger.info("%s: base_model_name_or_path %r -> %r", path.name, cfg.get("base_model_name_or_path"),
                        base_model)
            cfg["base_model_name_or_path"] = base_model
            path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def download_folder(
    repo_id_or_path: str | os.PathLike,
    *,
    revision: str | None = None,
    allow_patterns: Sequence[str] | None = None,
    repo_type: str = "model",
    token: str | None = None,
    required_files: Sequence[str] = (),
) -> Path:
    """Local folder holding ``repo_id_or_path``: a local folder as is, a Hub repo through ``snapshot_download``.

    Parameters
    ----------
    repo_id_or_path : str or path
        An existing local folder, or a Hub repo id ("namespace/name").
    revision : str, optional
        Branch, tag or commit id on the Hub (default "main"); ignored for a local folder.
    allow_patterns : sequence of str, optional
        Download only the matching files.
    required_files : sequence of str
        Files the caller needs (e.g. ``["logit_adjustment.safetensors"]``); FileNotFoundError names the
        first missing one and where it was looked for.

    Offline (HF_HUB_OFFLINE=1 or an unreachable endpoint) only the local cache is used. Raises
    ValueError for something that is neither a folder nor a valid repo id, FileNotFoundError when
    offline without a cached copy or when a required file is missing; huggingface_hub's errors
    (RepositoryNotFoundError, RevisionNotFoundError) otherwise.
    """
    path = Path(repo_id_or_path).expanduser()
    if path.is_dir():
        folder = path
    else:
        repo_id = str(repo_id_or_path)
        try:
            validate_repo_id(repo_id)
        except HFValidationError:
            raise ValueError(
                f"repo_id_or_path: {repo_id!r} is neither an existing folder nor a valid Hub repo id"
            ) from None
        kwargs = dict(repo_id=repo_id, revision=revision, repo_type=repo_type, token=token,
                      allow_patterns=list(allow_patterns) if allow_patterns is not None else None)
        if hub_available():
            folder = Path(snapshot_download(**kwargs))
        else:
            try:
                folder = Path(snapshot_download(**kwargs, local_files_only=True))
            except LocalEntryNotFoundError:
                raise FileNotFoundError(
                    f"{repo_id!r} is not in the local Hugging Face cache and the Hub is not reachable "
                    "(HF_HUB_OFFLINE=1 or no network); download it once online or pass a local folder"
                ) from None
    for name in required_files:
        if not (folder / name).is_file():
            raise FileNotFoundError(f"{repo_id_or_path}: no {name} (looked in {folder})")
    return folder


def write_model_card(
    folder: str | os.PathLike,
    *,
    base_model: str,
    method: str,
    paper_url: str,
    config: Mapping,
    metrics: Mapping[str, float] | None = None,
    library_name: str = LIBRARY_NAME,
    license: str = "apache-2.0",
    tags: Sequence[str] = (),
    datasets: Sequence[str] | None = None,
    description: str | None = None,
    usage: str | None = None,
) -> Path:
    """Write ``folder/README.md``: YAML front matter for the Hub plus a short card in Markdown.

    The front matter (``huggingface_hub.ModelCardData``) carries ``library_name``, ``base_model``,
    ``license``, ``tags`` (``library_name``, "calibration", the method in lower case, then ``tags``)
    and ``datasets``; the text names the method with a link to ``paper_url``, the measured ``metrics``
    as a table (name → value, floats shown with 4 decimals) and ``config`` as JSON. ``usage`` is a
    Python snippet shown under "Usage".

    Returns the path of README.md. Raises ValueError naming the argument for a missing folder, an
    empty ``base_model`` / ``method``, a ``base_model`` that is not a Hub id (a local path loads nowhere
    else), a ``paper_url`` that is not http(s), a ``config`` that is not a
    JSON-serialisable mapping, or a non-finite / non-numeric metric.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"folder: {str(folder)!r} is not a directory")
    for name, value in (("base_model", base_model), ("method", method), ("library_name", library_name)):
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{name}: expected a non-empty string, got {value!r}")
    check_repo_id(base_model, argument="base_model")
    if not isinstance(paper_url, str) or not re.match(r"https?://\S+$", paper_url):
        raise ValueError(f"paper_url: expected an http(s) URL, got {paper_url!r}")
    if not isinstance(config, Mapping):
        raise ValueError(f"config: expected a dict, got {type(config).__name__}")
    try:
        config_json = json.dumps(dict(config), indent=2, sort_keys=True)
    except (TypeError, ValueError) as err:
        raise ValueError(f"config: not JSON-serialisable ({err})") from None
    rows = []
    for name, value in (metrics or {}).items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"metrics: value of {name!r} must be a finite number, got {value!r}")
        rows.append(f"| {name} | {value:.4f} |" if isinstance(value, float) else f"| {name} | {value} |")

    all_tags = list(dict.fromkeys([library_name, "calibration", method.lower(), *tags]))
    data = ModelCardData(library_name=library_name, base_model=base_model, license=license, tags=all_tags,
                         datasets=list(datasets) if datasets else None)
    parts = [
        f"# {method} calibration of {base_model}",
        description or (
            f"A calibrated artifact for [`{base_model}`](https://huggingface.co/{base_model}) made with "
            f"`{library_name}` using **{method}** ([paper]({paper_url}))."
        ),
    ]
    if rows:
        parts.append("## Measured metrics\n\n| metric | value |\n|---|---|\n" + "\n".join(rows))
    if usage:
        parts.append(f"## Usage\n\n```python\n{usage.strip()}\n```")
    parts.append(f"## Configuration\n\n```json\n{config_json}\n```")
    content = f"---\n{data.to_yaml()}\n---\n\n" + "\n\n".join(parts) + "\n"
    path = folder / "README.md"
    ModelCard(content).save(path)
    return path


def check_artifact_config(cfg: Mapping, *, kind: str, max_format_version: int, source: str | None = None) -> int:
    """The ``format_version`` of a saved artifact config, checked against what this library reads.

    ``cfg`` is the loaded JSON config of an artifact of ``kind`` (e.g. "CALM logit adjustment");
    a config without the key is version 1 (written before versions were recorded). ``source`` (a
    file or repo) is named in errors. Raises ValueError when the version is not a positive integer or
    is newer than ``max_format_version``, saying which version of hf-calibration is installed.
    """
    where = f" in {source}" if source else ""
    if not isinstance(cfg, Mapping):
        raise ValueError(f"cfg: the {kind} config{where} must be a JSON object, got {type(cfg).__name__}")
    version = cfg.get(FORMAT_VERSION_KEY, 1)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"{FORMAT_VERSION_KEY}: the {kind} config{where} has {version!r}; expected an integer ≥ 1")
    if version > max_format_version:
        raise ValueError(
            f"{FORMAT_VERSION_KEY}: the {kind} config{where} has format_version {version}, but hf-calibration "
            f"{__version__} reads at most {max_format_version}; it was written by a newer release, upgrade "
            "with `pip install -U hf-calibration`"
        )
    return version


def _requirement_names(text: str) -> set[str]:
    """Normalised (PEP 503) project names required by a requirements.txt, including ``#egg=`` URLs."""
    names = set()
    for line in text.splitlines():
        line = line.split(" #")[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        egg = re.search(r"[#&]egg=([\w.-]+)", line)
        match = egg or re.match(r"([A-Za-z0-9][\w.-]*)", line.split("@")[0].strip())
        if match:
            names.add(re.sub(r"[-_.]+", "-", match.group(1)).lower())
    return names


def publish_metric_space(
    metric_name: str,
    space_id: str,
    *,
    token: str | None = None,
    metrics_dir: str | os.PathLike | None = None,
    private: bool = False,
) -> str:
    """Publish the evaluate module ``metrics/<metric_name>/`` as a Gradio Space named ``space_id``.

    ``evaluate.load("<namespace>/<metric_name>")`` loads ``<metric_name>.py`` from the Space, so the
    Space's name must equal the folder's name. The folder must hold ``<metric_name>.py``, README.md
    (evaluate's card; its YAML header must declare ``sdk: gradio``) and requirements.txt listing
    hf-calibration (the module imports it). When the folder has no ``app.py``, the standard evaluate
    widget app is added to the upload (the folder itself is not modified).

    ``metrics_dir`` defaults to the ``metrics/`` folder of the source checkout. Returns the commit
    URL. Raises ValueError (before any request) naming what is wrong, then as ``push_folder_to_hub``.
    """
    root = Path(metrics_dir) if metrics_dir is not None else METRICS_DIR
    if not isinstance(metric_name, str) or not re.fullmatch(r"[A-Za-z0-9][\w-]*", metric_name):
        raise ValueError(f"metric_name: expected a folder name like 'expected_calibration_error', got {metric_name!r}")
    folder = root / metric_name
    if not folder.is_dir():
        raise ValueError(f"metric_name: no metric folder {str(folder)!r}")
    check_repo_id(space_id, argument="space_id")
    if space_id.split("/")[-1] != metric_name:
        raise ValueError(
            f"space_id: the Space must be named after the metric folder ({metric_name!r}) so that "
            f"evaluate.load finds {metric_name}.py, got {space_id!r}"
        )
    missing = [n for n in (f"{metric_name}.py", "README.md", "requirements.txt") if not (folder / n).is_file()]
    if missing:
        raise ValueError(f"metric_name: {str(folder)!r} lacks {', '.join(missing)}")
    if LIBRARY_NAME not in _requirement_names((folder / "requirements.txt").read_text(encoding="utf-8")):
        raise ValueError(f"requirements.txt: {str(folder / 'requirements.txt')!r} does not list {LIBRARY_NAME}")
    readme = (folder / "README.md").read_text(encoding="utf-8")
    header = re.match(r"^---\s*\n(.*?)\n---\s*\n", readme, flags=re.S)
    meta = yaml.safe_load(header.group(1)) if header else None
    if not isinstance(meta, dict) or meta.get("sdk") != "gradio":
        raise ValueError(f"README.md: the YAML header of {str(folder / 'README.md')!r} must declare `sdk: gradio`")

    with tempfile.TemporaryDirectory() as staging:
        stage = Path(staging) / metric_name
        shutil.copytree(folder, stage, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        app = stage / meta.get("app_file", "app.py")
        if not app.exists():
            app.write_text(_SPACE_APP.format(name=space_id), encoding="utf-8")
        return push_folder_to_hub(
            stage, space_id, token=token, private=private, repo_type="space", space_sdk="gradio",
            commit_message=f"Publish the {metric_name} evaluate module (hf-calibration {__version__})",
        )
