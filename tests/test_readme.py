"""Every fenced code block of README.md runs, as a newcomer would paste it, at reduced sizes.

- A ```python block runs in a fresh interpreter (``sys.executable``), so it must define every name it uses.
- A ```bash block may hold only the project's own command line (``.venv/bin/hf-calibration …`` or
  ``hf-calibration …``); its commands run one after another in the same folder, each as
  ``sys.executable -m hf_calibration.cli …``, so this test does not depend on where the venv is.
- ``<!-- readme-test: skip (reason) -->`` on the line above a block skips it with that reason (make targets
  that install, ``accelerate launch`` on GPUs, pip installs). ``<!-- readme-test: requires MODULE -->``
  skips it while MODULE cannot be imported and runs it once it can.
- Any other block (another language, another command, no marker) fails: the README has no code that is
  neither run nor explained.

Each block runs in its own temporary folder (what it writes lands there, not in the clone) holding links
``metrics`` and ``examples`` to the repository's folders, because the README runs from the repository root
and reads the ``evaluate`` modules and the example data by those relative paths. The environment:
``HF_HUB_OFFLINE=1`` (packaged model and data), the repository on ``PYTHONPATH``, progress bars off, and
``OMP_NUM_THREADS=1`` (two processes' torch thread pools on 2 shared cores made one CALM step ten times slower).

Sizes: ``SIZES`` rewrites the README's sizes to a few questions and one step, so the whole file runs in a
few minutes on 2 cores with the real packaged SmolLM2 and real questions. The README does not mention
this; ``HF_CALIBRATION_README_SMOKE=0`` runs the blocks exactly as written (hours on a CPU).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
SMOKE = os.environ.get("HF_CALIBRATION_README_SMOKE", "1") != "0"
TIMEOUT_S = 900
CLI = (".venv/bin/hf-calibration", "hf-calibration")

# (pattern, replacement): the README's sizes → smoke sizes. Every rule must match some block
# (test_every_size_rule_is_used), so a rule cannot outlive the text it shortens.
SIZES = [
    (r"\blimit=\d+", "limit=8"),                         # questions loaded (load_mcqa, EvaluateConfig)
    (r"--limit \d+", "--limit 8"),                       # questions scored by the CLI
    (r"\brange\(320\)", "range(8)"),                     # CALM S_T
    (r"\brange\(320, 640\)", "range(8, 16)"),            # CALM S_V
    (r"\bmax_steps=\d+", "max_steps=1"),                 # CALM optimizer steps
]

FENCE = re.compile(r"^```(\S*)\s*$")
MARKER = re.compile(r"^<!--\s*readme-test:\s*(skip|requires)\s+(.+?)\s*-->$")


@dataclass
class Block:
    index: int
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    marker: tuple[str, str] | None


def readme_blocks(text: str) -> list[Block]:
    """The fenced blocks of ``text``, each with the ``readme-test`` marker on the line above it (if any)."""
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        if end is None:
            raise ValueError(f"README.md line {i + 1}: code block never closed")
        above = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = MARKER.match(above)
        blocks.append(Block(len(blocks), i + 1, opening.group(1), "\n".join(lines[i + 1 : end]) + "\n",
                            marker.groups() if marker else None))
        i = end + 1
    return blocks


BLOCKS = readme_blocks(README.read_text(encoding="utf-8"))


def shorten(code: str) -> str:
    for pattern, replacement in SIZES:
        code = re.sub(pattern, replacement, code)
    return code


def cli_commands(code: str) -> list[list[str]]:
    """The commands of a bash block (continuation lines joined, comments dropped), as argv lists."""
    commands = [shlex.split(line, comments=True) for line in code.replace("\\\n", " ").splitlines()]
    return [c for c in commands if c]


def _env() -> dict:
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", TQDM_DISABLE="1",
               HF_HUB_DISABLE_PROGRESS_BARS="1", HF_DATASETS_DISABLE_PROGRESS_BARS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])))
    return env


def _run(block: Block, argv: list[str], cwd: Path, what: str) -> None:
    try:
        done = subprocess.run(argv, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stderr or b"")[-3000:]
        pytest.fail(f"README block {block.index} (line {block.line}, {block.lang}): {what} ran past {TIMEOUT_S} s\n"
                    f"--- stderr (tail) ---\n{tail.decode(errors='replace') if isinstance(tail, bytes) else tail}", pytrace=False)
    if done.returncode != 0:
        pytest.fail(f"README block {block.index} (line {block.line}, {block.lang}): {what} exited with "
                    f"{done.returncode}\n--- stderr (tail) ---\n{done.stderr[-3000:]}", pytrace=False)


@pytest.mark.parametrize("block", BLOCKS, ids=[f"block{b.index}-line{b.line}-{b.lang or 'plain'}" for b in BLOCKS])
def test_readme_block_runs(block, tmp_path):
    if block.marker is not None:
        kind, value = block.marker
        if kind == "skip":
            pytest.skip(f"README line {block.line}: {value.strip('()')}")
        spec = importlib.util.find_spec(value)
        if spec is None or spec.origin is None:  # origin None: a folder without __init__.py, still being written
            pytest.skip(f"README line {block.line}: needs {value}, which does not exist yet; runs once it does")
    for folder in ("metrics", "examples"):
        (tmp_path / folder).symlink_to(REPO / folder, target_is_directory=True)
    code = shorten(block.code) if SMOKE else block.code
    if block.lang == "python":
        script = tmp_path / "readme_block.py"
        script.write_text(code, encoding="utf-8")
        _run(block, [sys.executable, str(script)], tmp_path, "the Python block")
    elif block.lang == "bash":
        commands = cli_commands(code)
        foreign = [" ".join(c) for c in commands if c[0] not in CLI]
        if foreign or not commands:
            pytest.fail(f"README block {block.index} (line {block.line}): {foreign or 'no command'} is not the "
                        f"project's CLI; run it here or mark it <!-- readme-test: skip (reason) -->", pytrace=False)
        for argv in commands:
            _run(block, [sys.executable, "-m", "hf_calibration.cli", *argv[1:]], tmp_path, shlex.join(argv))
    else:
        pytest.fail(f"README block {block.index} (line {block.line}): a {block.lang or 'plain'!r} block cannot "
                    f"run here; make it python or bash, or mark it <!-- readme-test: skip (reason) -->",
                    pytrace=False)


def test_quick_start_comes_first():
    """The first commands a newcomer meets are `make demo` and `make test`."""
    first = BLOCKS[0]
    assert [line.split()[:2] for line in first.code.splitlines() if line.strip()] == [["make", "demo"], ["make", "test"]]


def test_every_size_rule_is_used():
    unused = [p for p, _ in SIZES if not any(re.search(p, b.code) for b in BLOCKS if b.lang in ("python", "bash"))]
    assert not unused, f"SIZES rules that match no README block (drop them): {unused}"


def test_blocks_are_parsed():
    """The parser on a small text written here: markers, languages and line numbers."""
    text = ("x\n<!-- readme-test: skip (installs) -->\n\n```bash\nmake demo\n```\n"
            "```python\nprint(1)\n```\n<!-- readme-test: requires hf_calibration.jobs -->\n```python\nimport a\n```\n")
    blocks = readme_blocks(text)
    assert [(b.line, b.lang, b.marker) for b in blocks] == [
        (4, "bash", ("skip", "(installs)")), (7, "python", None), (11, "python", ("requires", "hf_calibration.jobs"))]
    assert blocks[1].code == "print(1)\n"
    assert cli_commands(".venv/bin/hf-calibration evaluate \\\n    --limit 5  # five\n") == [
        [".venv/bin/hf-calibration", "evaluate", "--limit", "5"]]
    assert shorten("load_mcqa('mmlu', limit=500); x --limit 200") == "load_mcqa('mmlu', limit=8); x --limit 8"
