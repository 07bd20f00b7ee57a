"""A link on every page of the book to the same page in its other edition.

The book is built twice from the same sources (``scripts/i18n.py``): English into ``_build/html/``
and Chinese (``language = "zh_CN"``, the catalogs of ``locale/``) into ``_build/html/zh/``. This
extension puts a "中文" link on each English page and an "English" link on each Chinese page, in the
article's header next to the theme's buttons. The links are relative (``../zh/book/01_why_manage.html``
and back), so they work on GitHub Pages under any base path and from ``file://``. The link stays in the
header's row of buttons (``static/language-switch.css``) and keeps the reader's place: it carries the
id of the section being read, which is the same in both editions (Sphinx names a section after its
English title), so the other edition opens there (``static/language-switch.js``).

Registered in ``_config.yml`` (``sphinx: local_extensions: {language_switch: _ext}``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sphinx.application import Sphinx
from sphinx.config import Config

TEMPLATES = Path(__file__).resolve().parent / "templates"
STATIC = Path(__file__).resolve().parent / "static"
TEMPLATE = "language-switch.html"
ZH_FOLDER = "zh"  # the Chinese edition's folder inside the English one


def is_chinese(config: Config) -> bool:
    return str(config.language or "en").lower().startswith("zh")


def add_template(app: Sphinx, config: Config) -> None:
    """Put the switch at the end of the article header (sphinx-book-theme's ``article_header_end``)."""
    config.templates_path = [*config.templates_path, str(TEMPLATES)]
    config.html_static_path = [*config.html_static_path, str(STATIC)]
    options = dict(config.html_theme_options or {})
    items = options.get("article_header_end", "article-header-buttons.html")
    if isinstance(items, str):
        items = [item.strip() for item in items.split(",") if item.strip()]
    if TEMPLATE not in items:
        items = [*items, TEMPLATE]
    options["article_header_end"] = items
    config.html_theme_options = options


def switch_for(pagename: str, chinese: bool) -> dict[str, str]:
    """The other edition's address of ``pagename``, relative to this page."""
    up = "../" * pagename.count("/")
    if chinese:
        href = f"{up}../{pagename}.html"
        return {"href": href, "label": "English", "lang": "en", "title": "Read this page in English"}
    href = f"{up}{ZH_FOLDER}/{pagename}.html"
    return {"href": href, "label": "中文", "lang": "zh-CN", "title": "阅读本页的中文版"}


def add_link(app: Sphinx, pagename: str, templatename: str, context: dict[str, Any], doctree: object) -> None:
    context["language_switch"] = switch_for(pagename, is_chinese(app.config))


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("config-inited", add_template)
    app.add_css_file("language-switch.css")
    app.add_js_file("language-switch.js")
    app.connect("html-page-context", add_link)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
