"""The README and the pages under docs/: every relative link resolves, the README stays a front door.

A link resolves when the file it names exists and its `#anchor`, if any, is the slug GitHub makes of one of that
file's headings (lowercase; punctuation but `-` and `_` dropped; each space a `-`; a repeated heading gets `-1`,
`-2`, ...). Links inside fenced code blocks are not links, and `#` lines there are not headings.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
FIRST_SCREEN_LINES = 40
MAX_README_LINES = 200

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b(?!T)")


def prose_lines(text: str) -> list[str]:
    """The lines of a Markdown text outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading's text."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor of a Markdown file's headings, repeated headings numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(path.read_text()):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def relative_links(path: Path) -> list[str]:
    """The targets of a page's links that point into the repository (not a URL, not mail)."""
    targets = []
    for line in prose_lines(path.read_text()):
        for target in LINK.findall(line):
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):
                targets.append(target)
    return targets


def broken_links(path: Path, root: Path = REPO) -> list[str]:
    """Each relative link of a page that names no file or no heading, with what is wrong (paths from root)."""
    broken = []
    for target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(root)}: {target}"
        if not resolved.exists():
            broken.append(f"{where}: no file {file_part}")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{where}: no heading #{anchor} in {resolved.relative_to(root)}")
    return broken


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("What a user does", "what-a-user-does"),
        ("What `kubectl apply` rejects", "what-kubectl-apply-rejects"),
        ("/dev/shm (Ray's object store)", "devshm-rays-object-store"),
        (
            "The full loop (real KubeRay, Ray pods as local processes)",
            "the-full-loop-real-kuberay-ray-pods-as-local-processes",
        ),
        ("`make test` and the test counts", "make-test-and-the-test-counts"),
        ("A driver that hangs: the stall watchdog", "a-driver-that-hangs-the-stall-watchdog"),
        ("snake_case and kebab-case stay", "snake_case-and-kebab-case-stay"),
    ],
)
def test_a_headings_anchor_follows_githubs_slug_rules(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


def test_a_repeated_heading_gets_a_numbered_anchor_and_a_heading_in_a_code_block_none(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n## Tested\n```bash\n# not a heading\n```\n## Tested\n")
    assert anchors(page) == {"title", "tested", "tested-1"}


def test_a_link_to_a_missing_file_or_a_missing_heading_is_reported_naming_it(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n## Known section\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#known-section) [gone](missing.md) [moved](other.md#old-section) [url](https://example.com/x#y)\n"
        "```\n[in code](nowhere.md)\n```\n"
    )
    broken = [problem.split(": ", 1)[1] for problem in broken_links(page, root=tmp_path)]
    assert broken == ["missing.md: no file missing.md", "other.md#old-section: no heading #old-section in other.md"]


def test_every_relative_link_in_the_readme_and_docs_resolves_to_a_file_and_a_heading() -> None:
    broken = [problem for page in PAGES for problem in broken_links(page)]
    assert not broken, "\n".join(broken)


def test_the_readme_and_docs_have_links_to_check() -> None:
    assert len(PAGES) >= 8, [page.name for page in PAGES]
    assert all(relative_links(page) for page in PAGES if page.name != "safety.md")


def test_the_readme_stays_short() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines: move the detail to docs/"


def test_the_readmes_first_screen_shows_make_demo_and_make_test() -> None:
    first_screen = "\n".join(README.read_text().splitlines()[:FIRST_SCREEN_LINES])
    assert "make demo" in first_screen
    assert "make test" in first_screen


def test_the_readme_links_every_page_under_docs() -> None:
    linked = {(README.parent / target.partition("#")[0]).resolve() for target in relative_links(README)}
    assert not [page.name for page in PAGES[1:] if page.resolve() not in linked]


def test_dated_figures_live_only_on_the_measurements_page() -> None:
    dated = [
        f"{page.relative_to(REPO)}:{number}: {line.strip()}"
        for page in PAGES
        if page.name != "measurements.md"
        for number, line in enumerate(page.read_text().splitlines(), 1)
        if DATE.search(line)
    ]
    assert not dated, "\n".join(dated)
