"""Result folders: nothing lost, nothing mixed.

A job stages its files in a fresh temporary folder beside the result folder and moves them into place only when
it has finished (``AtomicOutputDir``). Each result folder records which job wrote which files in a small hidden
manifest (``MANIFEST``), so that a later run can tell its own earlier files from anybody else's:

- files of an earlier run of the **same** job that this run does not write again (a domain no longer in the
  stream, a scoring no longer asked for in the same folder) are removed, so no stale diagram is shown as current;
- a folder holding **another** job's results, or a file this run would replace that no run of this package
  wrote, is refused with a ``ParameterError`` naming the output option, unless ``overwrite`` (then the other
  job's files are removed and the user's file replaced);
- everything else in the folder (other scorings' subfolders, the user's own files) stays untouched.

``check_result_folder`` makes the same refusal up front, before a model loads, so no work is lost to it.

``partial_path`` names where a job keeps what it has scored while it runs (a hidden file beside the result
folder, like the staging folder, so a run that stops leaves the result folder as it was); the job removes it
once its results are in place.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from hf_calibration.errors import ParameterError

MANIFEST = ".hf-calibration.json"


def read_manifest(folder: Path) -> dict | None:
    """``{"job": name, "files": [relative paths]}`` of the run that wrote ``folder``, or None (none, or unreadable)."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ok = isinstance(manifest, dict) and isinstance(manifest.get("files"), list)
    return manifest if ok else None


def _conflict(folder: Path, job: str, names, overwrite: bool, parameter: str, shown: str) -> None:
    """ParameterError naming ``parameter`` when ``folder`` holds another job's results or one of ``names`` (relative
    paths this run writes) exists without a manifest of this package."""
    if overwrite or not folder.is_dir():
        return
    manifest = read_manifest(folder)
    if manifest is not None and manifest.get("job") != job:
        listed = ", ".join(manifest["files"][:3]) + (", …" if len(manifest["files"]) > 3 else "")
        raise ParameterError(parameter, shown, f"{shown!r} holds the results of {manifest.get('job')} ({listed}); "
                             f"choose another folder, or pass {{overwrite}} to replace them", related=("overwrite",))
    if manifest is None:
        existing = [n for n in names if (folder / n).exists()]
        if existing:
            raise ParameterError(parameter, shown, f"{str(folder / existing[0])!r} exists and was not written by "
                                 f"{job}; choose another folder, or pass {{overwrite}} to replace it",
                                 related=("overwrite",))


def check_result_folder(path, job: str, names=(), *, overwrite: bool = False, parameter: str = "output_dir") -> None:
    """Before any work: the refusal ``AtomicOutputDir`` would make when moving ``names`` into ``path`` (module
    docstring). ParameterError naming ``parameter``."""
    _conflict(Path(path), job, names, overwrite, parameter, str(path))


def partial_path(path, job: str) -> Path:
    """``<parent>/.<name>.<job>.partial.jsonl``: the scores a ``job`` writing into ``path`` keeps while it runs."""
    path = Path(path)
    return path.parent / f".{path.name}.{job}.partial.jsonl"


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() or p.is_symlink())


def _result_folders(tmp: Path, depth: int) -> list[Path]:
    folders = [tmp]
    for _ in range(depth):
        folders = [c for f in folders for c in sorted(f.iterdir()) if c.is_dir()]
    return folders


def _remove(target: Path) -> None:
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    elif target.exists() or target.is_symlink():
        target.unlink()


def _prune_empty(folder: Path, stop: Path) -> None:
    """Remove ``folder`` and its parents up to ``stop`` while they are empty (left by removed stale files)."""
    while folder != stop and folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
        folder = folder.parent


class AtomicOutputDir:
    """Stage files in a temporary folder and move them into ``path`` only when all were written.

    job : the writing job's name, recorded in each result folder's manifest. depth : where the result folders
        are: 0, ``path`` itself; 2, ``path/<task>/<scoring>/`` (lm-eval-import). overwrite : replace another job's
        results and files no run of this package wrote (otherwise a ParameterError naming ``parameter``).

    An error while writing leaves ``path`` as it was: nothing half-written. Stale files of the same job's earlier
    run are removed; files of other runs, scorings or the user stay (module docstring).
    """

    def __init__(self, path: Path, job: str = "hf-calibration", *, depth: int = 0, overwrite: bool = False,
                 parameter: str = "output_dir"):
        self.path, self.job, self.depth, self.overwrite, self.parameter = Path(path), job, depth, overwrite, parameter

    def __enter__(self) -> Path:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = tempfile.TemporaryDirectory(dir=self.path.parent, prefix=f".{self.path.name}-")
        return Path(self._tmp.name)

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is None:
                tmp = Path(self._tmp.name)
                results = [(r, self.path / r.relative_to(tmp)) for r in _result_folders(tmp, self.depth)]
                if self.depth:  # the folder above the results must not be another job's result folder
                    _conflict(self.path, self.job, [], self.overwrite, self.parameter, str(self.path))
                for staged, dest in results:  # every refusal before anything moves
                    _conflict(dest, self.job, _files(staged), self.overwrite, self.parameter, str(self.path))
                for staged, dest in results:
                    self._commit(staged, dest)
        finally:
            self._tmp.cleanup()
        return False

    def _commit(self, staged: Path, dest: Path) -> None:
        new = [f for f in _files(staged) if f != MANIFEST]
        dest.mkdir(parents=True, exist_ok=True)
        _remove_stale(dest, new)
        for name in new:
            target = dest / name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)  # a file replacing a folder (or a rerun's adapter folder) of the same name
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staged / name, target)
        write_manifest(dest, self.job, new)


def _remove_stale(dest: Path, new) -> None:
    """Remove the files the earlier run's manifest in ``dest`` lists that this run (``new``) does not write again."""
    for name in (read_manifest(dest) or {}).get("files", []):
        if name not in new and ".." not in Path(name).parts:
            _remove(dest / name)
            _prune_empty((dest / name).parent, dest)


def mark_written(folder: Path, job: str, before: dict) -> None:
    """For a job whose files a library writes in place (calm: the trainer's ``save_model``), after they are
    written: the files new or changed since ``before`` (``snapshot``) are ``job``'s; the earlier run's files it
    did not write again are removed (as ``AtomicOutputDir`` does) and the manifest written."""
    new = written_since(folder, before)
    _remove_stale(Path(folder), new)
    write_manifest(folder, job, new)


def write_manifest(folder: Path, job: str, files) -> None:
    """Record that ``job`` wrote ``files`` (paths relative to ``folder``) in ``folder``'s ``MANIFEST``: the marker
    a later run reads (module docstring). ``AtomicOutputDir`` writes it; a job whose files a library writes in
    place calls ``mark_written``."""
    text = json.dumps({"job": job, "files": sorted(files)}, indent=1) + "\n"
    (Path(folder) / MANIFEST).write_text(text, encoding="utf-8")


def snapshot(folder: Path) -> dict:
    """``{relative path: (size, mtime_ns)}`` of the files under ``folder`` ({} when it does not exist): compared
    with a later one, what a run wrote in place (``written_since``)."""
    folder = Path(folder)
    if not folder.is_dir():
        return {}
    return {name: ((folder / name).stat().st_size, (folder / name).stat().st_mtime_ns) for name in _files(folder)
            if name != MANIFEST and (folder / name).is_file()}


def written_since(folder: Path, before: dict) -> list[str]:
    """The files under ``folder`` that are new or changed since ``before`` (``snapshot``)."""
    return sorted(name for name, stamp in snapshot(folder).items() if before.get(name) != stamp)
