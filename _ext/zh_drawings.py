"""The Chinese edition's drawings, players and plots speak Chinese: their labels translated after the build.

Both editions are built from the same stored notebook outputs, drawn in English (the notebooks run
once, and nbval checks them against those outputs). Every word those pictures show comes from one
catalog, :mod:`minikv.viz.labels`, whose templates can be read back; so once the zh edition is
written, this extension passes each page and each SVG file of ``_images/`` through
:func:`minikv.viz.labels.translate_html`: SVG text of the radix trees, slot strips, engine
pictures and matplotlib plots (stored with their text as text), and a player's captions, details,
buttons and script, and the titles and captions the notebooks' code passes to them (through
:func:`minikv.viz.labels.label`, so they are catalog templates too). Token words and code stay
as they are.

The exercise checker's reports stored on the exercise pages (``<div class="minikv-check">``) are
English too; their sentences are messages of :mod:`minikv.language`'s catalog, so
:func:`translate_reports` reads each one back into Chinese with
:func:`minikv.language.translate_message` (a sentence built from parts it cannot read back stays
English, and so does a sentence whose translation would keep three English words in a row).

A notebook's table may link to a page of the book by its English title (the introduction's map of
the chapters): :func:`translate_page_links` gives such a link the title of the zh page it leads to,
read from the two built editions (the English one is the zh folder's parent).

The English edition is not touched. Registered in ``_config.yml`` (``local_extensions``).
"""

from __future__ import annotations

import html
import re
from functools import cache
from pathlib import Path
from typing import Any

from sphinx.application import Sphinx
from sphinx.config import Config


def is_chinese(config: Config) -> bool:
    return str(config.language or "en").lower().startswith("zh")


def translated_files(outdir: Path) -> list[Path]:
    """The files that can hold a drawing: every page, and the SVG images the notebooks' outputs became."""
    return sorted([*outdir.rglob("*.html"), *(outdir / "_images").glob("*.svg")])


def translate_outputs(outdir: Path) -> int:
    """Translate the labels of every drawing under ``outdir``; the number of files changed."""
    from minikv.viz.labels import translate_html

    changed = 0
    for path in translated_files(outdir):
        before = path.read_text(encoding="utf-8")
        after = translate_reports(translate_html(before, "zh"))
        if path.suffix == ".html":
            after = translate_page_links(after, path, outdir)
        if after != before:
            path.write_text(after, encoding="utf-8")
            changed += 1
    return changed


REPORT = re.compile(r'<div class="minikv-check".*?</div>', re.DOTALL)
"""A check's report as ``CheckResult._repr_html_`` writes it (no ``div`` inside)."""
TEXT = re.compile(r">([^<>]+)<")
MARK = re.compile(r"^(\s*[✓✗] )(?!\S+: )")
"""The mark before a case of the report's list (a verdict's mark is part of its message)."""
ENGLISH_LEFT = re.compile(r"(?<![\w`])[A-Za-z]+(?: [A-Za-z]+){2,}(?![\w`])")
"""Three English words in a row: a field the catalog could not read back was left in English."""


def translate_reports(page: str) -> str:
    """Every checker report in ``page`` with each sentence the catalog can read back in Chinese."""
    return REPORT.sub(lambda report: TEXT.sub(_translated_text, report.group(0)), page)


def _translated_text(node: re.Match[str]) -> str:
    from minikv.language import translate_message

    text = html.unescape(node.group(1))
    core = text.strip()
    if not core:
        return node.group(0)
    mark = MARK.match(core)
    prefix, message = (mark.group(1), core[mark.end() :]) if mark else ("", core)
    found = translate_message(message, "zh")
    if found is None or ENGLISH_LEFT.search(found):  # half a translation reads worse than none
        return node.group(0)
    lead, trail = text[: len(text) - len(text.lstrip())], text[len(text.rstrip()) :]
    return ">" + html.escape(lead + prefix + found + trail, quote=False) + "<"


PAGE_LINK = re.compile(r'(<a\b[^>]*\bhref=")(?![a-z]+:|#)([^"#]+\.html)((?:#[^"]*)?"[^>]*>)([^<]+)(</a>)')
"""A link to a page of the site: its target (relative to the linking page) and its text."""
H1 = re.compile(r"<h1>(.*?)(?:<a class=\"headerlink\"|</h1>)", re.DOTALL)


@cache
def page_title(path: Path) -> str | None:
    """The ``<h1>`` of a built page, as text; None if there is no such page."""
    try:
        found = H1.search(path.read_text(encoding="utf-8"))
    except OSError:
        return None
    return html.unescape(re.sub(r"<[^>]+>", "", found.group(1))).strip() if found else None


def translate_page_links(page: str, path: Path, outdir: Path) -> str:
    """``page`` (at ``path`` in the zh edition ``outdir``) with each link whose text is the English title
    of the page it leads to showing that page's Chinese title instead."""
    root = outdir.resolve()

    def retitle(link: re.Match[str]) -> str:
        target = (path.parent / link.group(2)).resolve()
        if not target.is_relative_to(root):
            return link.group(0)
        english, chinese = page_title(root.parent / target.relative_to(root)), page_title(target)
        if english is None or chinese is None or html.unescape(link.group(4)).strip() != english:
            return link.group(0)
        return link.group(1) + link.group(2) + link.group(3) + html.escape(chinese, quote=False) + link.group(5)

    return PAGE_LINK.sub(retitle, page)


def on_build_finished(app: Sphinx, exception: Exception | None) -> None:
    if exception is None and app.builder.format == "html" and is_chinese(app.config):
        translate_outputs(Path(app.outdir))


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("build-finished", on_build_finished)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
