"""Every directive fence in the book's markdown is parsed as the directive it was written as.

Two mistakes render silently, with no warning even under ``-W``: a backtick in the title of a
```` ```{admonition} ```` fence (a backtick fence's info string may not contain one, so the
"fence" is a paragraph and the next fence pairs with the wrong line), and a fenced code block
nested in a directive fence of the same length (its opening line closes nothing, its closing
line closes the directive, and the rest of the dropdown spills out). Both were found in the
exercises by the translators reading the built pages.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from markdown_it import MarkdownIt

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((REPO / "book").glob("*.ipynb")) + sorted((REPO / "exercises").rglob("*.ipynb"))
DIRECTIVE_LINE = re.compile(r"^(`{3,})\{(\w[\w-]*)\}")


def directive_fences(markdown: str) -> list[str]:
    """The directive names of the backtick fences CommonMark parses in ``markdown``, in order."""
    parser = MarkdownIt("commonmark")
    return [
        t.info.split("}")[0].lstrip("{") for t in parser.parse(markdown) if t.type == "fence" and t.info.startswith("{")
    ]


def written_directives(markdown: str) -> list[str]:
    """The directive names the author opened at the top level (a nested one is the parser's business)."""
    names, depth_fence = [], None
    for line in markdown.splitlines():
        match = DIRECTIVE_LINE.match(line)
        if depth_fence is None and match:
            names.append(match.group(2))
            depth_fence = match.group(1)
        elif depth_fence is not None and line.strip() == depth_fence:
            depth_fence = None
    return names


def nested_same_length_fence(markdown: str) -> str | None:
    """The first line inside a directive fence that opens a code fence of the directive's own length."""
    fence = None
    for line in markdown.splitlines():
        match = DIRECTIVE_LINE.match(line)
        if fence is None and match:
            fence = match.group(1)
        elif fence is not None:
            if line.strip() == fence:
                fence = None
            elif re.match(rf"^{fence}(?!`)\S", line):
                return line
    return None


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_directive_fence_parses(path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "markdown":
            continue
        where = f"{path.relative_to(REPO)} cell {index}"
        assert directive_fences(cell.source) == written_directives(cell.source), (
            f"{where}: a directive fence is not parsed as written (a backtick in its title?)"
        )
        nested = nested_same_length_fence(cell.source)
        assert nested is None, (
            f"{where}: {nested!r} nests a fence as long as its directive's: use one more backtick outside"
        )


def test_the_check_catches_both_mistakes() -> None:
    backtick_title = "```{admonition} Hint: why `x`\n:class: dropdown\ntext\n```\n"
    assert directive_fences(backtick_title) != written_directives(backtick_title)
    nested = "```{admonition} Hint\n:class: dropdown\n```python\nx = 1\n```\nmore\n```\n"
    assert nested_same_length_fence(nested) == "```python"
    fixed = "````{admonition} Hint\n:class: dropdown\n```python\nx = 1\n```\nmore\n````\n"
    assert nested_same_length_fence(fixed) is None
    assert directive_fences(fixed) == written_directives(fixed) == ["admonition"]
