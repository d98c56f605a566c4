"""The documentation says what the code does, and is laid out for the reader who arrives.

* The command has a short task page (docs/cli.md, and its Chinese twin) and a
  reference (docs/cli-reference.md) that names every command, option and variable the
  installed ``ascend-patch`` has -- read from its ``--help``, as a user sees them.
* A link to ``page.md#anchor`` lands on a heading of that page: the split moved
  sections, and a link that resolves to the file but not the section still misleads.
* The plugins' own pages name every group the plugin declares, and no page says a
  first-party plugin declares nothing (docs/plugin-authors.md did, long after the
  transformers plugin had groups).
* The README tells Ascend users how this differs from torch_npu's ``transfer_to_npu``
  and still gives exactly two commands to copy: the demo and the test suite.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest


REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
PAGES = sorted(
    [
        *REPO.glob("*.md"),
        *REPO.glob("docs/*.md"),
        *REPO.glob("plugins/*/README.md"),
        *REPO.glob("kits/*/README.md"),
        *REPO.glob("examples/**/*.md"),
    ]
)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _name(page: Path) -> str:
    return str(page.relative_to(REPO))


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the headings of ``page`` (code blocks hold no headings)."""
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    found: set[str] = set()
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", "")).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_anchor_link_lands_on_a_heading(page: Path) -> None:
    """[text](page.md#anchor) and [text](#anchor) name a heading that exists."""
    broken = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target) or "#" not in target:
            continue
        path, anchor = target.split("#", 1)
        dest = (page.parent / path).resolve() if path else page
        if dest.suffix == ".md" and dest.is_file() and anchor not in _anchors(dest):
            broken.append(target)
    assert broken == []


# ------------------------------------------------------------------------ the command


def _help(*command: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "ascend_patch_core._cli", *command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def _options(help_text: str) -> set[str]:
    """The option strings of an argparse help's option lines (not of its examples)."""
    options: set[str] = set()
    for line in help_text.splitlines():
        match = re.match(r"^  (-\S.*?)(?:\s{2,}|$)", line)
        if match:
            options.update(re.findall(r"(?<![\w-])--?[a-zA-Z][\w-]*", match[1]))
    return options - {"-h", "--help"}


def _commands() -> list[str]:
    """The commands the top-level --help lists under COMMAND."""
    listed = re.findall(r"^    ([a-z][\w-]*)(?:\s{2,}|$)", _help(), flags=re.M)
    assert listed, "the top-level --help lists no commands"
    return listed


def test_the_reference_names_every_command_and_option() -> None:
    """What ``ascend-patch <command> --help`` offers, docs/cli-reference.md explains."""
    reference = (DOCS / "cli-reference.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## `ascend-patch (\w+)", reference, flags=re.M)
    missing = [f"a section for {c}" for c in _commands() if c not in headings]
    for command in ["", *_commands()]:
        missing += [
            f"{command or 'ascend-patch'} {option}"
            for option in sorted(_options(_help(*([command] if command else []))))
            if not re.search(rf"`{re.escape(option)}(?![\w-])", reference)
        ]
    assert missing == []


def test_the_reference_names_every_variable_the_core_reads() -> None:
    """Every ASCEND_PATCH_* name in the core's sources is in the reference."""
    reference = (DOCS / "cli-reference.md").read_text(encoding="utf-8")
    names = {
        name
        for path in (REPO / "ascend_patch_core").rglob("*.py")
        for name in re.findall(
            r"\bASCEND_PATCH_[A-Z][A-Z_]*[A-Z]\b", path.read_text(encoding="utf-8")
        )
    }
    assert names, "the core reads no ASCEND_PATCH_* variable?"
    assert sorted(n for n in names if f"`{n}" not in reference) == []


def _command_words(block: str) -> list[str]:
    """A block of commands without its comments (those are translated)."""
    return re.sub(r"#.*", "", block).split()


@pytest.mark.parametrize("page", ["cli.md", "cli.zh-CN.md"])
def test_the_task_page_is_short_and_each_task_points_into_the_reference(page: str) -> None:
    """A task: a heading, a command, a sentence or two, and a link to the reference."""
    text = (DOCS / page).read_text(encoding="utf-8")
    tasks = re.split(r"^## ", text, flags=re.M)[1:]
    assert 6 <= len(tasks) <= 12
    for task in tasks:
        title = task.splitlines()[0]
        assert "```bash\nascend-patch " in task or "```bash\nASCEND_PATCH" in task, title
        assert "](cli-reference.md" in task, title
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    if page == "cli.md":
        assert len(prose.split()) <= 1200
    else:  # the Chinese page is the same tasks, in the same order
        english = re.findall(
            r"^```bash\n(.*?)```", (DOCS / "cli.md").read_text(), flags=re.S | re.M
        )
        chinese = re.findall(r"^```bash\n(.*?)```", text, flags=re.S | re.M)
        assert [_command_words(b) for b in chinese] == [_command_words(b) for b in english]


# ------------------------------------------------------------------------ the plugins


PLUGINS = {
    "torch_npu_ops": ("ascend_patch_torch", "torch-plugin.md"),
    "mmcv_npu": ("ascend_patch_mmcv", "mmcv-plugin.md"),
    "transformers_npu": ("ascend_patch_transformers", "transformers-plugin.md"),
}


def _groups(folder: str, package: str) -> list[str]:
    """The Patch classes a plugin's group modules define, read with ast (nothing imported)."""
    names = []
    for module in sorted((REPO / "plugins" / folder / package).glob("groups*.py")):
        for node in ast.parse(module.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef) and any(
                isinstance(base, ast.Name) and base.id == "Patch" for base in node.bases
            ):
                names.append(node.name)
    return names


@pytest.mark.parametrize("folder", sorted(PLUGINS))
def test_a_plugins_pages_name_every_group_it_declares(folder: str) -> None:
    """The README (the index's description) and the docs page list what is there."""
    package, page = PLUGINS[folder]
    groups = _groups(folder, package)
    assert len(groups) >= 5
    for text in [
        (REPO / "plugins" / folder / "README.md").read_text(encoding="utf-8"),
        (DOCS / page).read_text(encoding="utf-8"),
    ]:
        assert [g for g in groups if f"`{g}`" not in text] == []


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_no_page_says_a_first_party_plugin_declares_nothing(page: Path) -> None:
    """Each of the three plugins declares groups (above), and the torch plugin's
    NumpyCompat applies without an NPU: no page may say otherwise."""
    text = " ".join(page.read_text(encoding="utf-8").split())
    stale = [
        sentence
        for sentence in re.split(r"(?<=[.!?])\s+|\|", text)
        if re.search(
            r"declares nothing|registers no patch|no patches yet|are to come|"
            r"still being written|plugin (?:patches|changes) nothing",
            sentence,
        )
    ]
    about_a_plugin = "plugins" in page.parts or page.stem.endswith(
        ("-plugin", "package-description")
    )
    assert [
        sentence
        for sentence in stale
        if (about_a_plugin or re.search(r"transformers|mmcv|torch", sentence, re.I))
        and "a loaded plugin declares nothing" not in sentence
    ] == []


# ------------------------------------------------------------------------ the README


@pytest.mark.parametrize("readme", ["README.md", "README.zh-CN.md"])
def test_the_readme_says_how_it_differs_from_transfer_to_npu(readme: str) -> None:
    """What Ascend users know is named, with the differences and the item-by-item table."""
    text = (REPO / readme).read_text(encoding="utf-8")
    assert "from torch_npu.contrib import transfer_to_npu" in text
    assert "docs/torch-plugin.md#coverage-of-torch_npus-transfer_to_npu" in text
    section = text[text.index("transfer_to_npu") :]
    for difference in ["revert()", "--report", "--disable", "apply()", "--emulate-npu"]:
        assert difference in section, difference


@pytest.mark.parametrize("readme", ["README.md", "README.zh-CN.md"])
def test_the_readme_gives_exactly_two_commands_to_copy(readme: str) -> None:
    """The demo and the test suite; every other command lives in docs/."""
    text = (REPO / readme).read_text(encoding="utf-8")
    blocks = re.findall(r"^```(?:bash|sh|shell|console)\n(.*?)```", text, flags=re.S | re.M)
    assert [b.strip() for b in blocks] == ["python3 dev.py demo", "python3 dev.py test"]
