"""A visible cue on every table wider than the text column: it scrolls sideways.

The theme (pydata-sphinx-theme) already wraps each table in a ``.pst-scrollable-table-container``
that scrolls; but with overlay scrollbars nothing shows that columns are hidden, and a reader took
the guarantees table for three columns. ``static/wide-tables.js`` marks the containers that overflow
(again on resize) and ``static/wide-tables.css`` gives them a scrollbar that stays visible and a
one-line hint above the table, in the page's language.

Registered in ``_config.yml`` (``sphinx: local_extensions: {wide_tables: _ext}``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sphinx.application import Sphinx
from sphinx.config import Config

STATIC = Path(__file__).resolve().parent / "static"


def add_static_path(app: Sphinx, config: Config) -> None:
    if str(STATIC) not in map(str, config.html_static_path):
        config.html_static_path = [*config.html_static_path, str(STATIC)]


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("config-inited", add_static_path)
    app.add_css_file("wide-tables.css")
    app.add_js_file("wide-tables.js")
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
