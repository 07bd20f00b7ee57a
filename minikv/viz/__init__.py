"""Pictures of the cache: radix trees (graphviz), a frame player (HTML), and plots (matplotlib).

Draw the tree now::

    from minikv.viz import Vocab, draw_tree
    vocab = Vocab()
    manager.insert_prefix(vocab.encode("Hello world"), [0, 1])
    draw_tree(manager, vocab)

Record every operation and step through them::

    from minikv.viz import TreeRecorder
    rec = TreeRecorder(manager, vocab)
    rec.insert_prefix(vocab.encode("Hello there"), [2, 3])
    rec.frames[-1].caption      # 'insert [Hello there]: split [Hello world] after 1 token; ...'
    rec.player()                # slider, prev / next, play

Modules: :mod:`~minikv.viz.tree` (snapshots, changes, drawings),
:mod:`~minikv.viz.recorder` (the recording proxy), :mod:`~minikv.viz.player`
(the HTML player), :mod:`~minikv.viz.plots` (lifecycle, sizes, hit rate), and,
where present, :mod:`~minikv.viz.storage` (storage-layer pictures).
"""

from .player import FramePlayer, PlayerFrame
from .plots import plot_hit_rate, plot_lifecycle, plot_sizes
from .recorder import Frame, TreeRecorder
from .tree import (
    GraphvizMissingError,
    NodeView,
    TreeChanges,
    TreeDrawing,
    TreeSnapshot,
    Vocab,
    diff_snapshots,
    draw_snapshot,
    draw_tree,
    node_id,
    render_svg,
)

__all__ = [
    "Frame",
    "FramePlayer",
    "GraphvizMissingError",
    "NodeView",
    "PlayerFrame",
    "TreeChanges",
    "TreeDrawing",
    "TreeRecorder",
    "TreeSnapshot",
    "Vocab",
    "diff_snapshots",
    "draw_snapshot",
    "draw_tree",
    "node_id",
    "plot_hit_rate",
    "plot_lifecycle",
    "plot_sizes",
    "render_svg",
]  # fmt: skip

# The storage pictures are written separately; re-export them only when that module exists.
try:
    from . import storage
except ModuleNotFoundError as error:
    if error.name != f"{__name__}.storage":
        raise
else:
    from .storage import *  # noqa: F403  (its __all__ lists its public names)

    __all__ += list(getattr(storage, "__all__", ()))
