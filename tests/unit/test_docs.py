"""README.md is a short way in; docs/*.md hold the rest. Both stay readable in a terminal: short
README, lines of at most 100 columns (the generated knob lists too), headings that never
skip a level, relative links that lead to a file (and a heading) that exists."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [README, *DOCS]
MAX_README_LINES = 220
MAX_COLUMNS = 100

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"(`+).*?\1")


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def prose(path: Path):
    """(line number, line) outside fenced code blocks."""
    fence = None
    for number, line in enumerate(path.read_text().splitlines(), 1):
        marker = re.match(r"\s*(```+|~~~+)", line)
        if marker:
            if fence is None:
                fence = marker.group(1)
            elif marker.group(1).startswith(fence):
                fence = None
            continue
        if fence is None:
            yield number, line


def headings(path: Path) -> list[tuple[int, int, str]]:
    out = []
    for number, line in prose(path):
        m = re.match(r"(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if m:
            out.append((number, len(m.group(1)), m.group(2)))
    return out


def slug(title: str) -> str:
    """GitHub's anchor for a heading."""
    text = title.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def test_there_are_docs_pages():
    names = {p.name for p in DOCS}
    assert {
        "recipes.md",
        "knobs.md",
        "day2.md",
        "rollouts.md",
        "security.md",
        "testbed.md",
        "benchmarks.md",
        "evidence.md",
    } <= names


def test_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines: move detail to docs/"


def test_readme_opens_with_the_two_commands_and_ci_runs_the_second():
    lines = README.read_text().splitlines()
    assert lines[:3] == ["# servefleet", "", "```bash"]
    demo, tests = (line.split("#", 1)[0].strip() for line in lines[3:5])
    assert demo == "./bin/setup && .venv/bin/servefleet demo"
    assert tests == "./bin/setup && .venv/bin/pytest"
    assert lines[5] == "```"
    ci = [
        line.strip()
        for line in (REPO / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert ci[-1] == tests, ".ci/run must run exactly README's test command"


@pytest.mark.parametrize("path", PAGES, ids=rel)
def test_lines_fit_100_columns(path):
    long = [
        f"{rel(path)}:{number}: {len(line)} columns"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if len(line) > MAX_COLUMNS
    ]
    assert not long, "\n".join(long)


@pytest.mark.parametrize("path", PAGES, ids=rel)
def test_headings_never_skip_a_level(path):
    found = headings(path)
    assert found and found[0][1] == 1, f"{rel(path)}: the first heading is not a '# title'"
    for (_, before, _), (number, level, title) in zip(found, found[1:], strict=False):
        assert level <= before + 1, (
            f"{rel(path)}:{number}: '{title}' jumps from {'#' * before} to {'#' * level}"
        )


@pytest.mark.parametrize("path", PAGES, ids=rel)
def test_relative_links_lead_somewhere(path):
    broken = []
    for number, line in prose(path):
        for target in LINK.findall(CODE_SPAN.sub("", line)):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists():
                broken.append(f"{rel(path)}:{number}: {target}: no such file")
            elif (
                anchor
                and dest.suffix == ".md"
                and anchor not in {slug(t) for _, _, t in headings(dest)}
            ):
                broken.append(f"{rel(path)}:{number}: {target}: no such heading")
    assert not broken, "\n".join(broken)


def test_every_docs_page_is_linked_from_the_readme():
    linked = {
        (README.parent / t.partition("#")[0]).resolve()
        for _, line in prose(README)
        for t in LINK.findall(line)
    }
    assert not [rel(p) for p in DOCS if p.resolve() not in linked]


def test_the_test_time_table_keeps_its_marker_under_its_rows():
    lines = (REPO / "docs" / "evidence.md").read_text().splitlines()
    at = lines.index("<!-- test-time-rows -->")
    assert lines[at - 1].startswith("| "), "new test-time rows go right above the marker"
    assert "<!-- test-time-rows -->" not in README.read_text()
