"""Small helpers for the book's demonstrations, so that no chapter has to define them again.

None of this is part of what the course teaches; it only keeps the chapters'
cells about the cache:

* :func:`say` and :func:`show_error` print long messages wrapped to the page;
* :func:`token_kv` is a stand-in for the model: the key of a token is its id,
  so :func:`tokens_in_slots` can read back which token a slot holds;
* :func:`new_server` builds the three pieces a server holds (a cache manager,
  a page pool and the KV storage), optionally with some prompts already served;
* :func:`html_table` draws a table that renders alike in Jupyter, Colab and the book;
* :func:`print_captions` and :func:`print_tree` print a recording and a tree as text;
* :func:`show_source` shows a function or class of the package as highlighted code, read from
  the package itself, so what a chapter shows can never drift from what runs;
* :func:`glue` stores a value for the book's ``{glue:}`` roles, as ``myst_nb.glue`` does, without
  myst-nb (which Colab does not have).

::

    from minikv.course.demo import new_server, token_kv, tokens_in_slots
    manager, pool, kv_cache = new_server(12, cached=[[1, 2, 3]])
    handle, slots = manager.match_prefix([1, 2, 3, 4])
    tokens_in_slots(kv_cache, slots)    # [1, 2, 3]: the KV of those tokens is in those slots
"""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import torch

from ..base import BaseCacheManager, KVCacheLayout
from ..errors import ArgumentError, ArgumentTypeError
from ..lifecycle import serve
from ..mha_pool import MHAKVCache
from ..naive_manager import NaiveCacheManager
from ..page_pool import PagePool
from ..radix_manager import RadixCacheManager
from ..snapshot import TreeSnapshot, VocabLike, outline

__all__ = [
    "GLUE_PREFIX",
    "WIDTH",
    "Server",
    "SourceListing",
    "glue",
    "html_table",
    "new_server",
    "print_captions",
    "print_tree",
    "say",
    "show_error",
    "show_source",
    "token_kv",
    "tokens_in_slots",
]

WIDTH = 76
"""Characters per printed line: what fits the book's page without a scroll bar."""

KVFunction = Callable[[int, torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]


# -- printing ---------------------------------------------------------------------------


def say(text: str, indent: str = "", *, width: int = WIDTH) -> None:
    """Print a long message wrapped to the page; lines after the first are indented 4 more."""
    print(textwrap.fill(str(text), width=width, initial_indent=indent, subsequent_indent=indent + "    "))


def show_error(error: BaseException, prefix: str = "", *, width: int = WIDTH) -> None:
    """Print an error's type and message (``OutOfSlotsError: ...``), wrapped to the page."""
    if not isinstance(error, BaseException):
        raise ArgumentTypeError(f"error must be an exception, got {type(error).__name__}")
    say(f"{prefix}{type(error).__name__}: {error}", width=width)


GLUE_PREFIX = "application/papermill.record/"
"""What :func:`glue` puts before each MIME type of a hidden value (myst-nb's ``GLUE_PREFIX``)."""


def glue(name: str, value: Any, display: bool = False) -> None:
    """Store ``value`` under ``name`` for the book's ``{glue:}`` roles; hidden, also print ``name = value``.

    The display output is exactly ``myst_nb.glue``'s (a bundle with ``scrapbook`` metadata
    holding ``name`` and ``mime_prefix``), from which the book build fills the roles; but it
    needs only IPython, since myst-nb is a build tool that Colab does not have. A hidden value
    (``display=False``) carries :data:`GLUE_PREFIX` on its MIME types, so no front end shows
    it; the printed line is for the reader on Colab, who sees a ``{glue:}`` role raw.
    """
    from IPython.core.formatters import format_display_data
    from IPython.display import display as _display

    formats: Any = format_display_data  # (IPython's functions have no type hints)
    show: Any = _display

    if not isinstance(name, str) or not name:
        raise ArgumentError(f"name must be a non-empty str, got {name!r}")
    bundle, metadata = formats(value)
    prefix = "" if display else GLUE_PREFIX
    metadata["scrapbook"] = {"name": name, "mime_prefix": prefix}
    show({prefix + mime: data for mime, data in bundle.items()}, raw=True, metadata=metadata)
    if not display:
        print(f"{name} = {bundle.get('text/plain', repr(value))}")


def print_captions(frames: Iterable[Any], *, width: int = WIDTH) -> None:
    """Print each recorded frame (of a :class:`~minikv.viz.recorder.TreeRecorder`) as ``number | caption``."""
    for frame in frames:
        print(textwrap.fill(f"{frame.index} | {frame.caption}", width, subsequent_indent="    "))


def print_tree(manager: Any, vocab: VocabLike = None, *, values: bool = True, times: bool = True) -> None:
    """Print a radix tree as indented text, one node per line (:func:`minikv.snapshot.outline`)."""
    print(outline(TreeSnapshot.of(manager), vocab, values=values, times=times))


def html_table(header: Sequence[Any], rows: Iterable[Sequence[Any]], align: str = "", *, nowrap: bool = True) -> Any:
    """An HTML table (an ``IPython.display.HTML``): it renders alike in Jupyter, Colab and the book.

    ``align`` has one letter per column, ``l`` (the default) or ``r``. Cells are
    put in as they are, so they may hold HTML (links, ``<code>``); escape plain
    text that may contain ``<`` or ``&`` yourself (``html.escape``).
    """
    from IPython.display import HTML as _HTML

    make_html: Any = _HTML  # (IPython's HTML has no type hints)

    if any(a not in "lr" for a in align):
        raise ArgumentError(f"align: one letter per column, 'l' or 'r', got {align!r}")
    wrap = " white-space:nowrap;" if nowrap else ""

    def row(cells: Sequence[Any], tag: str) -> str:
        out = []
        for i, value in enumerate(cells):
            side = "right" if i < len(align) and align[i] == "r" else "left"
            out.append(f'<{tag} style="text-align:{side}; vertical-align:top; padding:2px 8px;{wrap}">{value}</{tag}>')
        return "<tr>" + "".join(out) + "</tr>"

    body = "".join(row(cells, "td") for cells in rows)
    return make_html(f"<table>{row(header, 'th')}{body}</table>")


class SourceListing:
    """The source of one function or class: highlighted Python in Jupyter, Colab and the book.

    It renders as a Markdown code block, which Jupyter, Colab and the book all
    highlight; printed (or compared by nbval) it is the plain source text.
    """

    def __init__(self, name: str, text: str) -> None:
        self.name = name
        self.text = text

    def _repr_markdown_(self) -> str:
        fence = "````" if "```" in self.text else "```"
        return f"{fence}python\n{self.text}\n{fence}"

    def __repr__(self) -> str:
        return self.text


def show_source(obj: Any) -> SourceListing:
    """The source of ``obj`` (a function, method, class or property of minikv), dedented.

    A property shows its getter. Only minikv's own code is shown: the book
    teaches the package, and a listing of anything else would be a copy.
    """
    target: Any = obj.fget if isinstance(obj, property) else obj
    target = getattr(target, "fn", target)  # a Triton kernel: the Python function it compiles
    module = getattr(target, "__module__", None) or ""
    if not (module == "minikv" or module.startswith("minikv.")):
        raise ArgumentError(f"obj: show_source shows minikv's own code, got {obj!r} from {module or 'nowhere'!r}")
    try:
        text = inspect.getsource(target)
    except (OSError, TypeError) as error:
        raise ArgumentError(f"obj: no source for {obj!r} ({error})") from error
    return SourceListing(getattr(target, "__qualname__", repr(target)), textwrap.dedent(text).rstrip("\n"))


# -- a stand-in model and a server ---------------------------------------------------------------


def token_kv(num_kv_heads: int = 1, head_dim: int = 4, *, device: torch.device | str = "cpu") -> KVFunction:
    """A ``kv_fn`` for :func:`minikv.lifecycle.store`: the key of a token is its id, the value minus that.

    Every head and every element of a token's K row holds the token id, in every
    layer, so what sits in a slot can be read back with :func:`tokens_in_slots`.
    """
    if isinstance(num_kv_heads, bool) or not isinstance(num_kv_heads, int) or num_kv_heads < 1:
        raise ArgumentError(f"num_kv_heads must be a positive int, got {num_kv_heads!r}")
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 1:
        raise ArgumentError(f"head_dim must be a positive int, got {head_dim!r}")

    def kv_fn(layer: int, input_ids: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.as_tensor(input_ids)[start:].to(device=device, dtype=torch.float32)
        keys = ids[:, None, None].repeat(1, num_kv_heads, head_dim)  # (tokens, heads, head_dim)
        return keys, -keys

    return kv_fn


def tokens_in_slots(kv_cache: MHAKVCache, slots: Any, layer: int = 0) -> list[int]:
    """The token ids whose K (written by :func:`token_kv`) these slots hold in ``layer``."""
    k = kv_cache.k_cache(layer)
    flat = k.reshape(-1, *k.shape[2:])  # (slots, heads, head_dim), whatever the page size
    index = torch.as_tensor(slots, device=flat.device).long().reshape(-1)
    return [int(t) for t in flat[index, 0, 0].round().long().tolist()]


class Server(NamedTuple):
    """What a server holds: who owns which slot (manager), which slots are free (pool), the KV itself."""

    manager: BaseCacheManager
    pool: PagePool
    kv_cache: MHAKVCache


def new_server(
    num_slots: int,
    *,
    manager: str = "radix",
    cached: Iterable[Sequence[int]] = (),
    num_layers: int = 1,
    num_kv_heads: int = 1,
    head_dim: int = 4,
    page_size: int = 1,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> Server:
    """A server with ``num_slots`` slots: ``(manager, pool, kv_cache)``, unpackable.

    ``manager`` is ``"radix"`` (a :class:`~minikv.RadixCacheManager`) or
    ``"naive"``. Each prompt in ``cached`` is served first (admit, store with
    :func:`token_kv`, finish), as if earlier requests had left it in the cache.
    """
    if isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots < 1:
        raise ArgumentError(f"num_slots must be a positive int, got {num_slots!r}")
    if num_slots % page_size:
        raise ArgumentError(f"num_slots: {num_slots} is not a whole number of pages of {page_size}")
    if manager == "radix":
        cache_manager: BaseCacheManager = RadixCacheManager(device, page_size=page_size)
    elif manager == "naive":
        if page_size != 1:
            raise ArgumentError(f"page_size: the naive manager has pages of 1 slot, got {page_size}")
        cache_manager = NaiveCacheManager(device)
    else:
        raise ArgumentError(f"manager must be 'radix' or 'naive', got {manager!r}")
    num_pages = num_slots // page_size
    pool = PagePool(num_pages, page_size=page_size, device=device)
    kv_cache = MHAKVCache(
        num_kv_heads, num_layers, head_dim, num_pages, dtype, KVCacheLayout.LayerFirst, device, page_size=page_size
    )
    kv_fn = token_kv(num_kv_heads, head_dim, device=device)
    for prompt in cached:
        serve(cache_manager, pool, prompt, kv_cache, kv_fn)
    return Server(cache_manager, pool, kv_cache)
