"""The library's shape, read from its source: no import cycle (imports inside functions count), no module over
600 lines, no function over 80, no citation of a document outside the repository, and no module-level side
effect on os.environ when the package or a subpackage is imported."""

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hf_calibration"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def _modules() -> dict[str, Path]:
    """Dotted name → file of every module of the package (a package by its ``__init__.py``)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imported(name: str, path: Path) -> set[str]:
    """Modules of the package that module ``name`` imports anywhere in its body (functions included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets.add(base)
            targets.update(f"{base}.{alias.name}" for alias in node.names)
    # a package importing its own submodules (its re-exports) is how a package is built, not a cycle
    return {t for t in targets if t in MODULES and t != name and not t.startswith(name + ".")}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), iteratively."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle_through_a_function_level_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle():
    graph = {name: _imported(name, path) for name, path in MODULES.items()}
    cycles = _cycles(graph)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_no_module_over_600_lines():
    long = {str(p.relative_to(ROOT)): n for p in MODULES.values()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_no_function_over_80_lines():
    long = {}
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"] = lines
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_no_citation_of_a_document_outside_the_repository():
    cited = [f"{p.relative_to(ROOT)}:{i}" for p in MODULES.values()
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if "SPEC §" in line]
    assert not cited, f"'SPEC §' (a document outside the repository) cited at: {cited}"


# the package and each subpackage, imported one after the other in a fresh interpreter
PACKAGES = sorted(name for name, path in MODULES.items() if path.name == "__init__.py")

# Third-party libraries set variables of their own when imported (torch: TORCHINDUCTOR_CACHE_DIR; an OpenMP runtime:
# KMP_*); they are imported first, so what is left is what our modules do.
THIRD_PARTY = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "evaluate", "sklearn", "scipy.stats",
               "matplotlib", "huggingface_hub", "safetensors")

_PROBE = """
import importlib, json, os, sys
for lib in json.loads(sys.argv[1]):
    try:
        importlib.import_module(lib)
    except ImportError:
        pass
changed = {}
for name in sys.argv[2:]:
    before = dict(os.environ)
    importlib.import_module(name)
    after = dict(os.environ)
    diff = {k: after.get(k) for k in set(before) | set(after) if before.get(k) != after.get(k)}
    if diff:
        changed[name] = diff
print(json.dumps(changed))
"""


def test_importing_the_package_leaves_os_environ_unchanged():
    assert "hf_calibration" in PACKAGES and "hf_calibration.calm" in PACKAGES
    env = {"PATH": "", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(THIRD_PARTY), *PACKAGES], capture_output=True, text=True, timeout=600,
                          env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    changed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert changed == {}, f"importing changed os.environ: {changed}"


def test_the_environment_probe_sees_a_module_that_sets_a_variable(tmp_path):
    (tmp_path / "sets_env.py").write_text("import os\nos.environ['HFCAL_LAYOUT_PROBE'] = '1'\n")
    proc = subprocess.run([sys.executable, "-c", _PROBE, "[]", "sets_env"], capture_output=True, text=True, timeout=60,
                          env={"PATH": "", "PYTHONPATH": str(tmp_path)})
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"sets_env": {"HFCAL_LAYOUT_PROBE": "1"}}


# --------------------------------------------------------------------------- library and lab apart (issue 48)
# A help string or docstring says what a thing does, its default and units, and cites the docs; the measured
# numbers, the seeds and the dates of the runs behind a default live in docs/*_results.md. The detector flags a
# metric name followed by a number (a measurement), a calendar date, "since <year>", an "N-th session" and a
# percentage other than an interval's 95 % level; a formatted example ("ECE = 0.123") and chance ("≈ 0.5") pass.
_LAB = re.compile(r"\b(?:AUROC|ECE|Brier|accuracy|NLL)\b(?! = )(?! ≈ 0\.5)[^.;=≈]{0,12}?[−+-]?\d+\.\d+"
                  r"|\b20\d\d-\d\d-\d\d\b|\bsince 20\d\d|\b\w+(?:st|nd|rd|th) session\b"
                  r"|(?<![\d.])(?!95 ?%)(?!95 percent)(?!97\.5 ?%)\d+(?:\.\d+)? ?(?:%|percent\b)")


def _help_and_docstrings(path: Path):
    """(line, text) of every docstring and every ``help`` string (a dict key or a keyword) in ``path``."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            text = ast.get_docstring(node, clean=False)
            if text:
                yield getattr(node, "lineno", 1), text
        pairs = []
        if isinstance(node, ast.Dict):
            pairs = [(k, v) for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant) and k.value == "help"]
        elif isinstance(node, ast.keyword) and node.arg == "help":
            pairs = [(node, node.value)]
        for _, value in pairs:
            try:
                yield value.lineno, str(ast.literal_eval(value))
            except ValueError:  # an f-string or a name: built at run time, not a measurement written down
                pass


def _lab_numbers(path: Path) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{line}: {m.group(0)!r}" for line, text in _help_and_docstrings(path)
            for m in _LAB.finditer(text)]


def test_the_lab_detector_finds_a_measured_number_and_a_date(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text('"""Ranks at AUROC 0.891 [0.80, 0.94]."""\nf = dict(help="Default since 2026; run of 2026-12-03; ECE cut 70 %.")\n'
                       'g = dict(help="95 % bootstrap interval; title \'ECE = 0.123\'; AUROC ≈ 0.5 is chance.")\n',
                       encoding="utf-8")
    found = [hit.split(": ", 1)[1] for hit in _lab_numbers_at(planted)]
    assert found == ["'AUROC 0.891'", "'since 2026'", "'2026-12-03'", "'70 %'"]


def _lab_numbers_at(path: Path) -> list[str]:
    return [f"{path}:{line}: {m.group(0)!r}" for line, text in _help_and_docstrings(path) for m in _LAB.finditer(text)]


def test_no_measured_number_or_date_in_the_package_help_or_docstrings():
    found = [hit for path in MODULES.values() for hit in _lab_numbers(path)]
    assert not found, "move these to docs/*_results.md and cite the section:\n" + "\n".join(found)


def _private_imports(path: Path, name: str) -> list[str]:
    """``from hf_calibration.<other>... import _x`` or ``from hf_calibration.<other>._mod import ...`` in ``path``, where
    <other> is another subpackage (or top-level module) than the one ``name`` belongs to."""
    own = ".".join(name.split(".")[:2])
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hf_calibration.")):
            continue
        parts = node.module.split(".")
        if ".".join(parts[:2]) == own:
            continue
        names = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
        if any(p.startswith("_") for p in parts[2:]):
            names.append(node.module)
        found += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names]
    return found


def test_no_package_module_imports_a_private_name_of_another_subpackage():
    found = [hit for name, path in MODULES.items() for hit in _private_imports(path, name)]
    assert not found, "\n".join(found)


def test_the_private_import_finder_finds_one(tmp_path):
    fake = tmp_path / "hf_calibration" / "posthoc" / "base.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("from hf_calibration.metrics._validation import to_numpy\nfrom hf_calibration.metrics.bootstrap "
                    "import _resolve\nfrom hf_calibration.posthoc.logits import _lbfgs\n", encoding="utf-8")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        found = _private_imports(fake, "hf_calibration.posthoc.base")
    finally:
        ROOT = saved
    assert [f.split(": ", 1)[1] for f in found] == ["hf_calibration.metrics._validation", "_resolve"]
