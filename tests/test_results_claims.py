"""The README's results bullets carry the numbers of the docs they cite (issue 51 item 1), so the two cannot drift
apart: every bullet of README.md's "## Results" section links at least one docs/*_results.md (optionally a
section, by its GitHub anchor), and every number it states — each "value [low, high]" interval as a whole, each
decimal with two or more digits after the point, each percentage — occurs in the text it links (the linked
section, or the whole document without an anchor). Signs and spacing are normalised (− and -, "73 %" and "73%")."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NUM = r"[+−-]?\d+\.\d+"
INTERVAL = re.compile(rf"({NUM})\s*\[\s*({NUM})\s*,\s*({NUM})\s*\]")
DECIMAL = re.compile(r"(?<![\d.])[+−-]?\d+\.\d{2,}(?![\d])")
PERCENT = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)\s?%")
LINK = re.compile(r"\]\((docs/[a-z_]+_results\.md)(?:#([^)\s]+))?\)")


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text.replace("−", "-").replace("\u2009", " "))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (letters, digits, spaces, - and _ kept),
    each space a hyphen."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def section(doc: str, anchor: str | None) -> str:
    """The text under the heading whose anchor is ``anchor``, up to the next heading of its level or above; the
    whole document for None. KeyError when no heading has that anchor."""
    if anchor is None:
        return doc
    lines = doc.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"(#+)\s+(.*)", line)
        if m and slug(m.group(2)) == anchor:
            level = len(m.group(1))
            end = next((j for j in range(i + 1, len(lines))
                        if re.match(rf"#{{1,{level}}}\s", lines[j])), len(lines))
            return "\n".join(lines[i:end])
    raise KeyError(anchor)


def results_bullets(readme: str) -> list[str]:
    """The bullets of the "## Results" section, each with its continuation lines joined."""
    m = re.search(r"^## Results\s*$(.*?)(?=^## )", readme, flags=re.S | re.M)
    assert m, "README.md has no '## Results' section followed by another '## ' section"
    bullets = []
    for line in m.group(1).splitlines():
        if line.startswith("- "):
            bullets.append(line[2:])
        elif bullets and line.startswith("  ") and line.strip():
            bullets[-1] += " " + line.strip()
        elif not line.strip() and bullets and not bullets[-1].endswith("\n"):
            bullets[-1] += "\n"  # a blank line ends the bullet
    return [b.strip() for b in bullets]


def mismatches(bullet: str, read_doc) -> list[str]:
    """The numbers of ``bullet`` missing from the text its links cite (``read_doc(path) → str``), and a line for a
    bullet that cites no results document or a missing section."""
    links = LINK.findall(bullet)
    if not links:
        return ["cites no docs/*_results.md"]
    cited, problems = [], []
    for path, anchor in links:
        try:
            cited.append(section(read_doc(path), anchor or None))
        except KeyError:
            problems.append(f"{path}#{anchor}: no such section")
    text = _norm("\n".join(cited))
    prose = LINK.sub("]", bullet)
    for value, low, high in INTERVAL.findall(prose):
        if not re.search(rf"{re.escape(_norm(value))}\s*\[\s*{re.escape(_norm(low))}\s*,\s*{re.escape(_norm(high))}\s*\]",
                         text):
            problems.append(f"interval {value} [{low}, {high}]")
    for value in DECIMAL.findall(INTERVAL.sub("", prose)):
        digits = _norm(value).lstrip("+-")
        if not re.search(rf"(?<![\d.]){re.escape(digits)}(?!\d)", text):
            problems.append(f"number {value}")
    for value in PERCENT.findall(prose):
        if not re.search(rf"(?<![\d.]){re.escape(value)}\s?%", text.replace(" percent", " %")):
            problems.append(f"percentage {value} %")
    return problems


def _doc(path: str) -> str:
    return (ROOT / path).read_text(encoding="utf-8")


def test_readme_results_bullets_match_the_docs_they_cite():
    bullets = results_bullets((ROOT / "README.md").read_text(encoding="utf-8"))
    assert bullets, "the README's results section has no bullets"
    bad = {b[:80]: m for b in bullets if (m := mismatches(b, _doc))}
    assert not bad, f"README results bullets whose numbers are not in the docs they cite: {bad}"


@pytest.mark.parametrize("bullet, missing", [
    ("Held out 0.858 [0.710, 0.950] (n = 50). [docs](docs/x_results.md#a-section)", []),
    ("Held out 0.858 [0.710, 0.951]. [docs](docs/x_results.md#a-section)", ["interval 0.858 [0.710, 0.951]"]),
    ("Held out 0.858 [0.710, 0.950], cut 73 %. [docs](docs/x_results.md#a-section)", ["percentage 73 %"]),
    ("Held out 0.859. [docs](docs/x_results.md#a-section)", ["number 0.859"]),
    ("Elsewhere 0.777. [docs](docs/x_results.md#a-section)", ["number 0.777"]),  # only in another section
    ("Elsewhere 0.777 and −0.024. [docs](docs/x_results.md)", []),
    ("No link 0.858.", ["cites no docs/*_results.md"]),
    ("0.858 [docs](docs/x_results.md#no-section)", ["docs/x_results.md#no-section: no such section", "number 0.858"]),
])
def test_the_check_catches_a_drifted_number(bullet, missing):
    doc = ("# X\n\n## A section (2026-12-06)\n\nheld out: 0.858 [0.710, 0.950], n = 50.\n\n"
           "## Another\n\n0.777, cut 73 %, −0.024\n")
    docs = {"docs/x_results.md": doc}
    assert slug("A section (2026-12-06)") == "a-section-2026-12-06"
    bullet = bullet.replace("#a-section)", "#a-section-2026-12-06)")
    assert mismatches(bullet, docs.__getitem__) == missing
