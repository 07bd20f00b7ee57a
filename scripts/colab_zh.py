"""The Chinese Colab copies' two translations: markdown from the book's catalogs, code comments from one more.

``scripts/colab_copy.py`` writes ``colab/zh/<page>.ipynb`` with these; this module only translates.

Markdown. The zh edition of the book is Sphinx's gettext: each page's catalog
(``locale/zh_CN/LC_MESSAGES/<page>.po``) holds one message per paragraph, heading, list item's
paragraph, table cell and admonition title, its msgid the block's raw MyST with line breaks as spaces.
:func:`translate_markdown` finds those blocks in a markdown cell with the parser Sphinx reads the
notebook with (myst-parser's markdown-it, the book's extensions on), looks each one up, and writes the
translation in its place, keeping the list markers, indentation, table pipes and directive fences
around it. The result is MyST in Chinese; ``colab_copy.Converter`` turns it into markdown Colab
renders, as it does the English. A block the catalog does not translate (new English not yet carried
into the catalogs, or a fuzzy entry) is reported, and ``colab_copy.py`` stops on it: a zh copy never
shows a stale or English paragraph silently.

Code comments. ``locale/zh_CN/code_comments.po`` (outside ``LC_MESSAGES``: Sphinx does not read it)
holds one message per comment of the notebooks' code cells: a run of whole-line comments at one
indentation is one message (its lines joined), a comment after code is one message. ``colab_copy.py
--extract-comments`` writes it from the notebooks, keeping every translation; :func:`translate_code`
puts the Chinese in place, wrapped to the English block's width. Only comments change: the tests
compare the copies' code token by token with the English. Pragmas (``# noqa``, ``# type:``,
``# fmt:``) and comments without a word stay as they are.
"""

from __future__ import annotations

import io
import re
import tokenize
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LANGUAGE = "zh"
CATALOGS = REPO / "locale" / "zh_CN" / "LC_MESSAGES"
COMMENTS = REPO / "locale" / "zh_CN" / "code_comments.po"
MYST_EXTENSIONS = {"colon_fence", "dollarmath", "amsmath", "deflist", "substitution"}  # _config.yml's
DIRECTIVE_FENCE = re.compile(r"^\{(?P<name>[\w-]+)\}[ \t]*(?P<arg>.*)$")
OPTION = re.compile(r"^:(?P<key>[\w-]+):")
PRAGMA = re.compile(r"^#\s*(noqa\b|type:|fmt:|pragma\b|pyright:|mypy:|ruff:)")
WORD = re.compile(r"[A-Za-z]{2,}")
MAGIC = re.compile(r"^\s*[%!]")


class Untranslated(Exception):
    """Blocks of a notebook that its catalog does not translate (the message lists them)."""


# -- markdown -----------------------------------------------------------------------------------


def load_catalog(path: Path) -> dict[str, str]:
    """``{msgid: msgstr}`` of a catalog's translated, non-fuzzy messages."""
    from babel.messages.pofile import read_po

    with path.open("rb") as handle:
        catalog = read_po(handle)
    found = {}
    for message in catalog:
        if not message.id or message.fuzzy:
            continue
        msgid = message.id if isinstance(message.id, str) else message.id[0]
        msgstr = message.string if isinstance(message.string, str) else (message.string or [""])[0]
        if msgstr:
            found[msgid] = msgstr
    return found


def page_catalog(path: str, root: Path = REPO) -> dict[str, str]:
    """The catalog of the notebook ``path`` (``book/05_radix.ipynb`` reads ``book/05_radix.po``)."""
    catalog = root / CATALOGS.relative_to(REPO) / Path(path).with_suffix(".po")
    return load_catalog(catalog) if catalog.is_file() else {}


_PARSER = None


def _parser():  # type: ignore[no-untyped-def]
    global _PARSER
    if _PARSER is None:
        from myst_parser.config.main import MdParserConfig
        from myst_parser.mdit_to_docutils.base import DocutilsRenderer
        from myst_parser.parsers.mdit import create_md_parser

        _PARSER = create_md_parser(MdParserConfig(enable_extensions=MYST_EXTENSIONS), DocutilsRenderer)
    return _PARSER


def msgid_of(content: str) -> str:
    """What Sphinx extracts from a block whose raw MyST is ``content`` (``extract_messages``)."""
    return content.replace("\n", " ").strip()


@dataclass
class Tally:
    """How many blocks were translated, and which were not."""

    translated: int = 0
    missing: list[str] | None = None

    def __post_init__(self) -> None:
        self.missing = [] if self.missing is None else self.missing


def translate_markdown(text: str, lookup: Callable[[str], str | None], tally: Tally) -> str:
    """``text`` (one markdown cell's MyST) with every block replaced by its translation."""
    lines = text.split("\n")
    edits: list[tuple[int, int, list[str]]] = []  # (first line, end line, new lines)
    row: list[int] | None = None
    row_cells: list[str] = []

    def translated(msgid: str) -> str:
        found = lookup(msgid)
        if found is None:
            tally.missing.append(msgid)  # type: ignore[union-attr]
            return msgid
        tally.translated += 1
        return found

    def flush_row() -> None:
        nonlocal row_cells
        if row is not None and row_cells:
            line, start = lines[row[0]], 0
            for content in row_cells:
                at = line.index(content, start)
                new = re.sub(r"(?<!\\)\|", r"\\|", translated(msgid_of(content)))
                line = line[:at] + new + line[at + len(content) :]
                start = at + len(new)
            edits.append((row[0], row[0] + 1, [line]))
        row_cells = []

    tokens = _parser().parse(text)
    for i, token in enumerate(tokens):
        if token.type == "tr_open":
            flush_row()
            row = token.map
        elif token.type == "inline" and tokens[i - 1].type in ("th_open", "td_open"):
            if token.content.strip():
                row_cells.append(token.content)
        elif token.type == "inline" and tokens[i - 1].map is not None:
            start, end = tokens[i - 1].map
            content = token.content.split("\n")
            first = lines[start]
            at = first.find(content[0])
            if at < 0:
                raise ValueError(f"cannot place the block {content[0]!r} in {first!r}")
            prefix = first[:at]
            more = prefix if set(prefix) <= set(" >") and ">" in prefix else " " * len(prefix)
            new = translated(msgid_of(token.content)).split("\n")
            edits.append((start, end, [prefix + new[0], *[more + line for line in new[1:]]]))
        elif token.type == "fence" and (directive := DIRECTIVE_FENCE.match(token.info.strip())):
            start, end = token.map
            edits.append((start, end, _directive(lines[start:end], directive, translated, lookup, tally)))
    flush_row()
    for start, end, new in sorted(edits, reverse=True):
        lines[start:end] = new
    return "\n".join(lines)


def _directive(
    lines: list[str],
    directive: re.Match[str],
    translated: Callable[[str], str],
    lookup: Callable[[str], str | None],
    tally: Tally,
) -> list[str]:
    """A directive's fence: its title and body translated, its options and fences kept."""
    opening, closing = lines[0], lines[-1]
    if directive["arg"].strip():
        arg = directive["arg"].strip()
        opening = opening[: opening.rindex(arg)] + translated(msgid_of(arg))
    body = lines[1:-1]
    options = 0
    while options < len(body) and OPTION.match(body[options]):
        options += 1
    inner = translate_markdown("\n".join(body[options:]), lookup, tally)
    return [opening, *body[:options], *inner.split("\n"), closing]


# -- code comments ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Comment:
    """One message of a code cell: whole-line comments at one column (rows), or a comment after code."""

    rows: tuple[int, ...]  # 0-based lines of the cell
    column: int
    text: str  # the English, lines joined with spaces
    inline: bool


def _masked(code: str) -> str:
    """IPython's ``%magic`` and ``!shell`` lines blanked, so that Python's tokenizer reads the rest."""
    return "\n".join("" if MAGIC.match(line) else line for line in code.split("\n"))


def code_tokens(code: str) -> list[tuple[int, str]]:
    """The code's tokens without comments and blank-line breaks, magic lines as they are written."""
    kept = [(-1, line) for line in code.split("\n") if MAGIC.match(line)]
    for token in tokenize.generate_tokens(io.StringIO(_masked(code)).readline):
        if token.type not in (tokenize.COMMENT, tokenize.NL):
            kept.append((token.type, token.string))
    return kept


def comments(code: str) -> list[Comment]:
    """The comment messages of one code cell, in order."""
    found: list[Comment] = []
    lines = code.split("\n")
    for token in tokenize.generate_tokens(io.StringIO(_masked(code)).readline):
        if token.type != tokenize.COMMENT or PRAGMA.match(token.string) or not WORD.search(token.string):
            continue
        row, column = token.start[0] - 1, token.start[1]
        text = token.string[1:].strip()
        inline = bool(lines[row][:column].strip())
        last = found[-1] if found else None
        if not inline and last and not last.inline and last.column == column and last.rows[-1] == row - 1:
            found[-1] = Comment((*last.rows, row), column, f"{last.text} {text}", False)
        else:
            found.append(Comment((row,), column, text, inline))
    return found


def width(text: str) -> int:
    """Columns ``text`` takes in a monospace font (a Chinese character takes two)."""
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


NO_LINE_START = set("，。、；：！？）》」』”’,.;:!?)")


def wrap(text: str, columns: int) -> list[str]:
    """``text`` in lines of at most ``columns`` (Chinese breaks between characters, English between words)."""
    lines: list[str] = []
    for paragraph in text.split("\n"):
        units = re.findall(r"`[^`]*`|[\x21-\x7e]+| |.", paragraph)
        line = ""
        for unit in units:
            if line and unit != " " and unit[0] not in NO_LINE_START and width(line + unit) > columns:
                lines.append(line.rstrip())
                line = ""
            if unit == " " and not line:
                continue
            line += unit
        lines.append(line.rstrip())
    return lines


def translate_code(code: str, lookup: Callable[[str], str | None], missing: list[str]) -> str:
    """``code`` with each comment message replaced by its translation (the code itself unchanged)."""
    lines = code.split("\n")
    for comment in reversed(comments(code)):
        chinese = lookup(comment.text)
        if chinese is None:
            missing.append(comment.text)
            continue
        first = lines[comment.rows[0]]
        if comment.inline:
            lines[comment.rows[0]] = first[: comment.column] + "# " + chinese.replace("\n", " ")
            continue
        indent = first[: comment.column]
        columns = max(max(width(lines[row].rstrip()) for row in comment.rows), 60) - len(indent) - 2
        new = [f"{indent}# {line}".rstrip() for line in wrap(chinese, columns)]
        lines[comment.rows[0] : comment.rows[-1] + 1] = new
    return "\n".join(lines)


def notebook_comments(notebook: dict) -> Iterator[str]:
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
            for comment in comments(source):
                yield comment.text


def comment_catalog_problems(pages: dict[str, dict], path: Path = COMMENTS) -> list[str]:
    """The catalog's messages against the notebooks' comments: those no comment has any more."""
    from babel.messages.pofile import read_po

    if not path.is_file():
        return [f"{path.name} is missing (run: scripts/colab_copy.py --extract-comments)"]
    with path.open("rb") as handle:
        kept = {m.id for m in read_po(handle) if m.id}
    wanted = {text for notebook in pages.values() for text in notebook_comments(notebook)}
    return [f"{path.name}: no notebook has the comment {text[:80]!r} any more" for text in sorted(kept - wanted)]


def write_comment_catalog(pages: dict[str, dict], path: Path = COMMENTS) -> tuple[int, int]:
    """Write the catalog of every comment of ``pages`` (``{path: notebook}``), keeping the translations.

    Returns (messages, translated). A comment no notebook has any more leaves the catalog.
    """
    from babel.messages.catalog import Catalog
    from babel.messages.pofile import read_po, write_po

    old, created = {}, None
    if path.is_file():
        with path.open("rb") as handle:
            previous_catalog = read_po(handle)
        old = {m.id: m for m in previous_catalog if m.id}
        created = previous_catalog.creation_date  # no change in the file when no comment changed
    catalog = Catalog(
        locale="zh_CN",
        project="minikv",
        charset="utf-8",
        creation_date=created,
        header_comment=(
            "# The code comments of minikv's notebooks, in Chinese, for the Colab copies in colab/zh/.\n"
            "# Written by `scripts/colab_copy.py --extract-comments` (translations are kept); read by\n"
            "# scripts/colab_zh.py. A msgstr may hold \\n where its comment should break a line."
        ),
    )
    for page, notebook in pages.items():
        for text in notebook_comments(notebook):
            if text in catalog:
                entry = catalog[text]
                if (page, None) not in entry.locations:
                    entry.locations.append((page, None))
                continue
            previous = old.get(text)
            catalog.add(
                text,
                previous.string if previous else "",
                locations=[(page, None)],
                flags=previous.flags if previous else (),
            )
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as handle:
        write_po(handle, catalog, width=0, omit_header=False, include_lineno=False, sort_output=False)
    messages = [m for m in catalog if m.id]
    return len(messages), sum(bool(m.string) and not m.fuzzy for m in messages)
