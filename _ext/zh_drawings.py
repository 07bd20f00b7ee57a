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

The English edition is not touched. Registered in ``_config.yml`` (``local_extensions``).
"""

from __future__ import annotations

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
        after = translate_html(before, "zh")
        if after != before:
            path.write_text(after, encoding="utf-8")
            changed += 1
    return changed


def on_build_finished(app: Sphinx, exception: Exception | None) -> None:
    if exception is None and app.builder.format == "html" and is_chinese(app.config):
        translate_outputs(Path(app.outdir))


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("build-finished", on_build_finished)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
