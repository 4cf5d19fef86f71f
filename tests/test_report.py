"""``hf-calibration report``: one self-contained HTML page from result folders, checked in a real browser.

The browser test drives the system Chromium (Debian's ``chromium`` package; Playwright's own browser
downloads are not used) with Playwright. Without a browser or Playwright it is skipped with that reason;
``.ci/run`` installs both and runs it. The screenshot is kept under ``outputs/test-artifacts/``.
"""

import json
import shutil
from pathlib import Path

import pytest

from hf_calibration.cli import main
from hf_calibration.errors import ParameterError
from hf_calibration.reporting.html_report import find_metric_tables, render_report
from hf_calibration.jobs import EvaluateConfig, ReportConfig, run_evaluate, run_report

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "outputs" / "test-artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def folders(tiny_model_dir, tmp_path_factory):
    """A real evaluate run on the tiny model, and a second folder shaped like a diagnose result."""
    root = tmp_path_factory.mktemp("results")
    run_evaluate(EvaluateConfig(model=str(tiny_model_dir), limit=12, n_resamples=20, output_dir=str(root / "evaluate")),
                 progress=False)
    diag = root / "diagnose"
    diag.mkdir()
    entry = lambda v: {"value": v, "low": v - 0.05, "high": v + 0.05}  # noqa: E731
    (diag / "diagnosis.json").write_text(json.dumps({
        "run": {"model": "tiny", "n": 12},
        "signals": {"verbalized": {"conf_ece": entry(0.31), "auroc": entry(0.55)},
                    "norm_p_true": {"conf_ece": entry(0.12), "auroc": entry(0.81)}},
        "references": {"constant_accuracy": {"conf_ece": entry(0.0), "auroc": 0.5}},
    }))
    shutil.copy(root / "evaluate" / "reliability_diagram.png", diag / "reliability_diagrams.png")
    return root / "evaluate", diag


def test_tables_are_found_with_their_rows_and_references():
    data = {"run": {"n": 3}, "signals": {"a": {"ece": {"value": 0.1, "low": 0.0, "high": 0.2}, "auroc": 0.6},
                                         "constant_accuracy": {"ece": 0.0, "auroc": 0.5}}, "other": [1, 2]}
    [(where, table)] = find_metric_tables(data)
    assert where == "signals" and list(table) == ["a", "constant_accuracy"]
    with pytest.raises(ValueError, match="folders: need at least one"):
        render_report([])


def test_run_report_writes_one_self_contained_page(folders, tmp_path):
    result = run_report(ReportConfig(inputs=[str(f) for f in folders], output=str(tmp_path / "r.html")))
    page = (tmp_path / "r.html").read_text()
    assert result.paths["report"] == tmp_path / "r.html"
    assert page.count('<section class="folder">') == 2 and page.count("<img ") == 2
    assert "http://" not in page and "https://" not in page and "<script" not in page  # nothing to fetch
    assert 'class="reference"' in page and '0.120<span class="ci">[0.070, 0.170]</span>' in page  # an interval cell, by hand
    metrics = json.loads((folders[0] / "metrics.json").read_text())
    ece = metrics["signals"]["option_probability"]["conf_ece"]
    assert f"{ece['value']:.3f}<span class=\"ci\">[{ece['low']:.3f}, {ece['high']:.3f}]</span>" in page  # the evaluate run's own number


def test_cli_report_takes_folders_as_positionals(folders, tmp_path, capsys):
    out = tmp_path / "page.html"
    assert main(["report", *map(str, folders), "--output", str(out)]) == 0
    assert out.is_file()
    assert main(["report", str(tmp_path / "missing"), "--output", str(tmp_path / "x.html")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing" in err and not (tmp_path / "x.html").exists()


def test_cli_report_on_folders_without_results_is_one_line_and_writes_nothing(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("no results here")
    out = tmp_path / "r.html"
    assert main(["report", str(empty), "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hf-calibration: error: DIR: found no result") and str(empty) in err[0]
    assert not out.exists()
    # the folders are positional (report DIR [DIR …]): a missing one is named as the usage line names it
    assert main(["report", str(tmp_path / "missing"), "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hf-calibration: error: DIR: ") and "missing" in err[0]


def test_cli_report_names_an_invalid_metrics_json(tmp_path, capsys):
    """A truncated metrics.json is skipped by the page; when nothing else is found the error names it."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "metrics.json").write_text('{"report": {"conf_ece": ')
    assert main(["report", str(folder), "--output", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "found no result" in err[0], err
    assert f"not valid JSON: {str(folder / 'metrics.json')!r}" in err[0]
    assert not (tmp_path / "r.html").exists()


def test_report_rescores_the_per_answer_files_with_the_ece_options(folders, tmp_path):
    """--n-bins 4 --binning quantile --norm l2: evaluate's predictions.jsonl re-scored; conf-ECE and the constant
    reference against expected_calibration_error called on the written answers (hand-made records in a second
    file: a SECL-style row uses its own <signal>_correct)."""
    import numpy as np

    from hf_calibration.reporting.html_report import rescored_table
    from hf_calibration.metrics import expected_calibration_error

    options = dict(n_bins=4, binning="quantile", norm="l2")
    records = [json.loads(line) for line in (folders[0] / "predictions.jsonl").read_text().splitlines()]
    y = np.array([r["correct"] for r in records], dtype=int)
    conf = np.array([r["confidence"] for r in records])
    table = rescored_table(folders[0] / "predictions.jsonl", options, n_resamples=20)
    assert list(table) == ["confidence", "constant_accuracy"]
    # 12 answers, float64 sums in two orders: bound 12 · 2.2e-16
    assert table["confidence"]["conf_ece"]["value"] == pytest.approx(expected_calibration_error(y, conf, **options),
                                                                     abs=1e-14)
    assert table["constant_accuracy"]["conf_ece"]["value"] == pytest.approx(
        expected_calibration_error(y, np.full(len(y), y.mean()), **options), abs=1e-14)
    stream = tmp_path / "records.jsonl"
    stream.write_text("\n".join(json.dumps({"correct": c, "verbalized": v, "secl": s, "secl_correct": sc})
                                 for c, v, s, sc in [(True, 0.9, 0.6, False), (False, 0.8, 0.3, False),
                                                     (True, 0.7, 0.8, True), (False, 0.2, 0.4, True)]))
    table = rescored_table(stream, dict(n_bins=2, binning="uniform", norm="l1"), n_resamples=5)
    # by hand, 2 bins [0, .5), [.5, 1]: verbalized {0.2: wrong} gap .2, {.9 ok, .8 wrong, .7 ok} gap |.8 − 2/3| →
    # (.2 + 3·(.8 − 2/3)) / 4 = 0.15; SECL with secl_correct {.3 no, .4 yes} gap |.35 − .5|, {.6 no, .8 yes} gap .2
    # → (2·.15 + 2·.2) / 4 = 0.175
    assert table["verbalized"]["conf_ece"]["value"] == pytest.approx(0.15, abs=1e-12)
    assert table["SECL"]["conf_ece"]["value"] == pytest.approx(0.175, abs=1e-12)
    assert rescored_table(folders[0] / "metrics.json", options) == {}  # not JSON lines with `correct`
    out = tmp_path / "r.html"
    result = run_report(ReportConfig(inputs=[str(folders[0])], output=str(out), n_bins=4, binning="quantile",
                                     norm="l2", n_resamples=20))
    assert result.run["ece"] == options
    assert "predictions.jsonl · re-scored: conf-ECE with 4 quantile bins, l2" in out.read_text()
    assert ReportConfig(inputs=["x"]).ece_options() is None
    assert ReportConfig(inputs=["x"], binning="quantile").ece_options() == dict(n_bins=15, binning="quantile", norm="l1")
    for bad in (dict(n_bins=0), dict(binning="equal"), dict(norm="l3")):
        with pytest.raises(ParameterError) as err:
            ReportConfig(inputs=["x"], **bad)
        assert err.value.parameter == next(iter(bad))


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine (apt-get install chromium; .ci/run does)")
def test_page_in_a_real_browser(folders, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[test]'; make test does)")
    out = tmp_path / "page.html"
    run_report(ReportConfig(inputs=[str(f) for f in folders], output=str(out)))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            errors = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            requests = []
            page.on("request", lambda r: requests.append(r.url) if not r.url.startswith(("file:", "data:")) else None)
            page.goto(out.as_uri(), wait_until="load")
            assert errors == [] and requests == []
            assert page.locator("table").count() >= 2
            assert page.locator("td.reference").count() >= 2
            # two folders side by side, and nothing wider than the window or its own folder at 1,300 px
            boxes = page.eval_on_selector_all("section.folder", "s => s.map(e => e.getBoundingClientRect().toJSON())")
            assert len(boxes) == 2 and boxes[0]["top"] == boxes[1]["top"] and boxes[0]["right"] <= boxes[1]["left"]
            assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
            assert page.eval_on_selector_all(".scroll", "d => d.every(e => e.scrollWidth <= e.clientWidth)")
            widths = page.eval_on_selector_all("img", "imgs => imgs.map(i => i.complete ? i.naturalWidth : 0)")
            assert len(widths) == 2 and all(w > 0 for w in widths)  # both diagrams decoded
            page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
        finally:
            browser.close()
    assert (ARTIFACTS / "report.png").stat().st_size > 10_000
