"""``TextFigure``: a matplotlib figure that a notebook shows as SVG with its text kept as text.

Text kept as text (``svg.fonttype: none``) is drawn by the reader's browser, with the reader's
fonts: Chinese labels (:func:`~minikv.viz.labels.set_language`) show wherever the system has a
Chinese font, Colab included, with no font file to install; and the zh edition of the book can
translate a plot's labels after the build, as it does a tree's. The SVG is deterministic (no date,
fixed ids), so nbval can compare it. PNG is still rendered for viewers that want it; a missing
Chinese glyph there warns no one (the SVG is what the book and notebooks show).
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import matplotlib
from matplotlib.figure import Figure

SVG_SETTINGS: dict[str, Any] = {"svg.fonttype": "none", "svg.hashsalt": "minikv"}
"""The rcParams a figure is saved as SVG with: text as text, ids that do not change between runs."""


@contextmanager
def _no_glyph_warnings() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from", category=UserWarning)
        yield


class TextFigure(Figure):
    """A :class:`~matplotlib.figure.Figure` whose notebook display is SVG with text as text (see the module)."""

    def _repr_svg_(self) -> str:
        buffer = io.StringIO()
        with matplotlib.rc_context(SVG_SETTINGS), _no_glyph_warnings():  # type: ignore[arg-type]
            self.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None, "Creator": None})
        return buffer.getvalue()

    def draw(self, renderer: Any) -> None:
        with _no_glyph_warnings():
            super().draw(renderer)

    def tight_layout(self, *args: Any, **kwargs: Any) -> None:
        with _no_glyph_warnings():
            super().tight_layout(*args, **kwargs)
