"""Docstring examples of the library, the evaluate modules and their cards run as doctests."""

import doctest
import importlib
import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FLAGS = doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS

LIBRARY_MODULES = [
    "hf_calibration.metrics",
    "hf_calibration.metrics.binning",
    "hf_calibration.metrics.bootstrap",
    "hf_calibration.metrics.consistency",
    "hf_calibration.metrics.ece",
    "hf_calibration.metrics.scores",
    "hf_calibration.metrics.semantic",
    "hf_calibration.metrics.smooth",
    "hf_calibration.metrics.streaming",
    "hf_calibration.reporting.plotting",
]
EVALUATE_MODULES = sorted(p.parent.name for p in REPO.glob("metrics/*/*.py") if p.stem == p.parent.name)


def _run(tests):
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    for test in tests:
        runner.run(test)
    return runner.summarize(verbose=False)


@pytest.mark.parametrize("name", LIBRARY_MODULES)
def test_library_docstrings(name):
    module = importlib.import_module(name)
    tests = doctest.DocTestFinder().find(module, module.__name__)
    result = _run(tests)
    assert result.failed == 0
    if name != "hf_calibration.metrics":
        assert result.attempted > 0, f"{name} has no examples"


@pytest.fixture
def at_repo_root(monkeypatch):
    pytest.importorskip("evaluate")
    monkeypatch.chdir(REPO)  # the examples load "metrics/<name>" relative to a clone's root


@pytest.mark.parametrize("name", EVALUATE_MODULES)
def test_evaluate_module_docstrings(name, at_repo_root):
    spec = importlib.util.spec_from_file_location(f"_doctest_{name}", REPO / "metrics" / name / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = _run(doctest.DocTestFinder().find(module, module.__name__))
    assert result.failed == 0 and result.attempted >= 4


@pytest.mark.parametrize("name", EVALUATE_MODULES)
def test_metric_card_examples(name, at_repo_root):
    card = (REPO / "metrics" / name / "README.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", card, flags=re.S) if b.lstrip().startswith(">>>")]
    assert blocks, f"{name}/README.md has no example"
    parser = doctest.DocTestParser()
    tests = [parser.get_doctest(block, {}, f"{name}/README.md[{i}]", None, 0) for i, block in enumerate(blocks)]
    assert _run(tests).failed == 0
