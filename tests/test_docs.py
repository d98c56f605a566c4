"""The documentation stands on its own: it cites only what a reader of the repository can open.

* No page points outside the repository (``../shared/...``, the notes of the people who
  built it) or speaks of "the seed" without saying what it is: the reference patcher
  is named, as the DrivingSDK patcher (``mx_driving.patcher``).
* Every relative link of every page resolves to a file of the repository.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest


REPO = Path(__file__).resolve().parent.parent
PAGES = sorted(
    [
        *REPO.glob("*.md"),
        *REPO.glob("docs/*.md"),
        *REPO.glob("plugins/*/README.md"),
        *REPO.glob("kits/*/README.md"),
        *REPO.glob("examples/**/*.md"),
    ]
)
OUTSIDE = re.compile(r"\.\./shared\b|shared/reference|\bthe seed\b|\bseed's\b", re.IGNORECASE)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _name(page: Path) -> str:
    return str(page.relative_to(REPO))


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_no_page_cites_what_a_reader_cannot_open(page: Path) -> None:
    """No ../shared citation and no unexplained "the seed"."""
    found = [
        f"{_name(page)}:{number}: {line.strip()}"
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert found == []


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_relative_link_resolves(page: Path) -> None:
    """[text](path) and [text](path#anchor) name a file or folder of the repository."""
    broken = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:|#", target):
            continue
        resolved = (page.parent / target.split("#")[0]).resolve()
        if not resolved.exists() or REPO not in resolved.parents:
            broken.append(target)
    assert broken == []


def test_no_source_says_the_seed() -> None:
    """Docstrings and comments (help(), tracebacks) name the DrivingSDK patcher too."""
    sources = [
        path
        for folder in ("ascend_patch_core", "kits", "plugins", "examples", "tests")
        for path in (REPO / folder).rglob("*.py")
        if path != Path(__file__).resolve()
    ]
    found = [
        f"{_name(path)}:{number}"
        for path in sources
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"\bthe seed\b|\bseed's\b", line, re.IGNORECASE)
    ]
    assert found == []
