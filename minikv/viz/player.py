"""``FramePlayer``: step through a sequence of SVG pictures, in one self-contained piece of HTML.

The same output has to work in three places -- a Jupyter notebook, Colab's
output iframe and the published static Jupyter Book -- and keep nbval's stored
outputs stable. Hence:

* every frame is inline SVG (no files, no CDN, no ipywidgets, which would need
  saved widget state and a CDN in the static book);
* ids come from a hash of the content, never from a random uuid, so the same
  frames give the same HTML bytes;
* the script finds its players by a data attribute and marks each one
  ``data-ready`` once wired, so showing the same output twice on a page works
  (each copy is wired exactly once);
* without JavaScript (an untrusted notebook, a sanitising viewer) the controls
  stay hidden and every frame shows, in order, with its caption.
"""

from __future__ import annotations

import hashlib
import html
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ArgumentError, ArgumentTypeError
from .labels import get_language, player_fragments, text
from .tree import render_svg


@dataclass(frozen=True)
class PlayerFrame:
    """One picture of the player: SVG text, a caption, and a line of details (e.g. slot counts).

    The player shows the caption as ``"<number>. <caption>"``; ``number``
    defaults to the frame's position counted from 1 (as the player's counter
    counts). A :class:`~minikv.viz.TreeRecorder` passes its own frame numbers
    (0 is the starting state), the numbers its captions are referred to by.
    """

    svg: str
    caption: str
    details: str = ""
    number: int | None = None


class FramePlayer:
    """A frame player; display it in a notebook, or take its HTML from ``html``.

    ``frames`` are ``PlayerFrame`` objects, or ``(picture, caption[, details])``
    tuples where the picture is SVG text, a graphviz graph or anything with an
    ``svg()`` method (a :class:`~minikv.viz.tree.TreeDrawing`). ``open_at`` is
    the position of the frame shown first (pick one that shows something).
    """

    def __init__(
        self, frames: Sequence[Any], *, title: str | None = None, interval_ms: int = 1200, open_at: int = 0
    ) -> None:
        if isinstance(frames, (str, bytes)) or not isinstance(frames, Sequence):
            raise ArgumentTypeError(f"frames must be a sequence of frames, got {type(frames).__name__}")
        if not frames:
            raise ArgumentError("frames must not be empty")
        if isinstance(interval_ms, bool) or not isinstance(interval_ms, int) or interval_ms < 50:
            raise ArgumentError(f"interval_ms must be an int >= 50, got {interval_ms!r}")
        if title is not None and not isinstance(title, str):
            raise ArgumentTypeError(f"title must be a str, got {type(title).__name__}")
        if isinstance(open_at, bool) or not isinstance(open_at, int) or not 0 <= open_at < len(frames):
            raise ArgumentError(f"open_at must be a frame position in [0, {len(frames)}), got {open_at!r}")
        self.frames: tuple[PlayerFrame, ...] = tuple(_as_frame(f, i) for i, f in enumerate(frames))
        self.title = title
        self.interval_ms = interval_ms
        self.open_at = open_at
        self.language = get_language()
        """The language of the controls (:func:`~minikv.viz.labels.set_language` when the player was made)."""
        digest = hashlib.sha1()
        parts = (x for i, f in enumerate(self.frames) for x in (f.svg, self.caption(i), f.details))
        for part in (title or "", str(interval_ms), str(open_at), *parts):
            digest.update(part.encode("utf-8"))
            digest.update(b"\0")
        if self.language != "en":  # English ids stay what they were
            digest.update(self.language.encode())
        self.player_id = "minikv-player-" + digest.hexdigest()[:12]
        self.html = self._build()

    def caption(self, position: int) -> str:
        """The caption of the frame at ``position`` as the player shows it: numbered."""
        frame = self.frames[position]
        number = position + 1 if frame.number is None else frame.number
        return f"{number}. {frame.caption}"

    def __len__(self) -> int:
        return len(self.frames)

    def _repr_html_(self) -> str:
        return self.html

    def __repr__(self) -> str:
        return f"<FramePlayer: {len(self.frames)} frames>"

    def save(self, path: str | Path) -> Path:
        """Write a standalone HTML page holding the player (open it in any browser)."""
        path = Path(path)
        title = html.escape(self.title or text("player.page_title", lang=self.language))
        lang = "zh-CN" if self.language == "zh" else "en"
        page = (
            f'<!DOCTYPE html>\n<html lang="{lang}"><head><meta charset="utf-8"><title>{title}</title></head>\n'
            f"<body>\n{self.html}\n</body></html>\n"
        )
        path.write_text(page, encoding="utf-8")
        return path

    # -- building the HTML ----------------------------------------------------------

    def _build(self) -> str:
        pid = self.player_id
        n = len(self.frames)
        figures = "\n".join(self._figure(i, f) for i, f in enumerate(self.frames))
        title = f'<div class="mkp-title">{html.escape(self.title)}</div>' if self.title else ""
        prev, play, next_, frame, *_ = player_fragments(self.language)
        return (
            f'<div class="minikv-player" id="{pid}" data-minikv-player="{pid}" data-frames="{n}" tabindex="0">\n'
            f"<style>{_CSS}</style>\n{title}"
            f'<div class="mkp-controls" style="display:none">'
            f'<button type="button" class="mkp-prev" {prev}'
            f'<button type="button" class="mkp-play" {play}'
            f'<button type="button" class="mkp-next" {next_}'
            f'<input type="range" class="mkp-slider" min="0" max="{n - 1}" value="{self.open_at}" step="1" '
            f'{frame}><span class="mkp-counter">{self.open_at + 1} / {n}</span></div>\n'
            f'<div class="mkp-frames">\n{figures}\n</div>\n'
            f"<script>{_script(pid, self.interval_ms, self.open_at, self.language)}</script>\n"
            f"</div>"
        )

    def _figure(self, index: int, frame: PlayerFrame) -> str:
        details = f'<div class="mkp-details">{html.escape(frame.details)}</div>' if frame.details else ""
        svg = _inline_svg(frame.svg, f"{self.player_id}-f{index}-")
        return (
            f'<figure class="mkp-frame" data-index="{index}">'
            f'<figcaption class="mkp-caption">{html.escape(self.caption(index))}</figcaption>{details}'
            f'<div class="mkp-picture">{svg}</div></figure>'
        )


def _as_frame(item: Any, index: int) -> PlayerFrame:
    if isinstance(item, PlayerFrame):
        return item
    if not isinstance(item, tuple) or not 2 <= len(item) <= 3:
        raise ArgumentTypeError(
            f"frames[{index}] must be a PlayerFrame or a (picture, caption[, details]) tuple, got {type(item).__name__}"
        )
    picture, caption, *rest = item
    if not isinstance(caption, str) or not all(isinstance(x, str) for x in rest):
        raise ArgumentTypeError(f"frames[{index}]: caption and details must be str")
    return PlayerFrame(_svg_of(picture, index), caption, rest[0] if rest else "")


def _svg_of(picture: Any, index: int) -> str:
    if isinstance(picture, str):
        svg = picture
    elif callable(getattr(picture, "svg", None)):
        svg = picture.svg()
    elif hasattr(picture, "source") and hasattr(picture, "pipe"):  # any graphviz graph
        svg = render_svg(picture.source)
    else:
        kind = type(picture).__name__
        raise ArgumentTypeError(f"frames[{index}]: picture must be SVG text or a graphviz graph, got {kind}")
    if "<svg" not in svg:
        raise ArgumentError(f"frames[{index}]: picture is not SVG (no <svg> element)")
    return svg


_ID_ATTR = re.compile(r'\bid="([^"]*)"')
_URL_REF = re.compile(r"url\(#([^)]*)\)")
_HREF_REF = re.compile(r'(xlink:href|href)="#([^"]*)"')


def _inline_svg(svg: str, prefix: str) -> str:
    """SVG fit to sit inside HTML: no XML prologue or doctype, ids made unique per frame, scaled to fit."""
    svg = svg[svg.index("<svg") :].strip()
    svg = _ID_ATTR.sub(lambda m: f'id="{prefix}{m.group(1)}"', svg)
    svg = _URL_REF.sub(lambda m: f"url(#{prefix}{m.group(1)})", svg)
    svg = _HREF_REF.sub(lambda m: f'{m.group(1)}="#{prefix}{m.group(2)}"', svg)
    return svg.replace("<svg", '<svg style="max-width:100%;height:auto"', 1)


_CSS = (
    # Its own colours, light on every page: a book theme's muted figcaption colour or a dark
    # mode must not make the captions hard to read (the SVG pictures are drawn for white).
    ".minikv-player{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;font-size:14px;margin:0.5em 0;"
    "outline:none;background:#ffffff;color:#101828;padding:0.4em 0.6em;border-radius:4px}"
    ".minikv-player .mkp-title{font-weight:600;margin-bottom:0.3em}"
    ".minikv-player .mkp-controls{align-items:center;gap:0.4em;flex-wrap:wrap;margin-bottom:0.4em}"
    ".minikv-player .mkp-controls button{font:inherit;padding:0.15em 0.7em;border:1px solid #98a2b3;"
    "border-radius:4px;background:#f9fafb;color:#101828;cursor:pointer}"
    ".minikv-player .mkp-controls button:disabled{opacity:0.4;cursor:default}"
    ".minikv-player .mkp-slider{flex:1 1 12em;min-width:8em}"
    ".minikv-player .mkp-counter{font-variant-numeric:tabular-nums;min-width:4.5em;text-align:right}"
    ".minikv-player .mkp-frame{margin:0 0 1em 0}"
    ".minikv-player .mkp-caption{font-weight:600;margin-bottom:0.15em;text-align:left;color:#101828}"
    ".minikv-player .mkp-details{color:#475467;font-size:0.9em;margin-bottom:0.3em}"
    ".minikv-player .mkp-picture{background:#ffffff;overflow-x:auto}"
)

_SCRIPT = """
(function () {
  var players = document.querySelectorAll('[data-minikv-player="__PID__"]');
  Array.prototype.forEach.call(players, function (root) {
    if (root.dataset.ready) { return; }
    root.dataset.ready = "1";
    var frames = root.querySelectorAll(".mkp-frame");
    var controls = root.querySelector(".mkp-controls");
    var slider = root.querySelector(".mkp-slider");
    var counter = root.querySelector(".mkp-counter");
    var prev = root.querySelector(".mkp-prev");
    var next = root.querySelector(".mkp-next");
    var play = root.querySelector(".mkp-play");
    var current = 0;
    var timer = null;
    function show(i) {
      current = Math.max(0, Math.min(frames.length - 1, i));
      for (var k = 0; k < frames.length; k++) {
        frames[k].style.display = (k === current) ? "block" : "none";
      }
      slider.value = String(current);
      counter.textContent = (current + 1) + " / " + frames.length;
      prev.disabled = current === 0;
      next.disabled = current === frames.length - 1;
    }
    function stop() {
      if (timer !== null) { clearInterval(timer); timer = null; }
      __STOP__
    }
    function start() {
      if (current === frames.length - 1) { show(0); }
      __START__
      timer = setInterval(function () {
        if (current >= frames.length - 1) { stop(); } else { show(current + 1); }
      }, __INTERVAL__);
    }
    slider.addEventListener("input", function () { stop(); show(parseInt(slider.value, 10)); });
    prev.addEventListener("click", function () { stop(); show(current - 1); });
    next.addEventListener("click", function () { stop(); show(current + 1); });
    play.addEventListener("click", function () { if (timer === null) { start(); } else { stop(); } });
    root.addEventListener("keydown", function (event) {
      if (event.target === slider) { return; }
      if (event.key === "ArrowLeft") { stop(); show(current - 1); event.preventDefault(); }
      if (event.key === "ArrowRight") { stop(); show(current + 1); event.preventDefault(); }
    });
    controls.style.display = "flex";
    show(__OPEN__);
  });
})();
"""


def _script(pid: str, interval_ms: int, open_at: int, language: str = "en") -> str:
    *_, stopped, started = player_fragments(language)
    return (
        _SCRIPT.replace("__PID__", pid)
        .replace("__INTERVAL__", str(interval_ms))
        .replace("__OPEN__", str(open_at))
        .replace("__STOP__", stopped)
        .replace("__START__", started)
    )
