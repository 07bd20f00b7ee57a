"""Pictures of the cache: radix trees (graphviz), a frame player (HTML), and plots (matplotlib).

Draw the tree now::

    from minikv.viz import Vocab, draw_tree   # Vocab is minikv.course.vocab.Vocab
    vocab = Vocab()
    manager.insert_prefix(vocab.encode("Hello world"), [0, 1])
    draw_tree(manager, vocab)

Record every operation and step through them::

    from minikv.viz import TreeRecorder
    rec = TreeRecorder(manager, vocab)
    rec.insert_prefix(vocab.encode("Hello there"), [2, 3])
    rec.frames[-1].caption      # 'insert [Hello there]: split [Hello world] after 1 token; ...'
    rec.player()                # slider, prev / next, play

Show who owns each slot of the pool (free, cached, locked, a running request)::

    draw_tree(manager, vocab, pool=pool)        # a numbered strip of slots above the tree
    TreeRecorder(manager, vocab, pool=pool)     # the strip in every frame

Draw a serving run, one row per request (waiting, prefill chunks, decode, preempted, finished)::

    timeline = record_timeline(engine)          # on a fresh engine, before the first submit
    engine.generate(prompts, 8)
    timeline                                    # shown as SVG in a notebook; timeline.svg() is the text

Draw the overlap loop: what the CPU plans while the device runs, and when memory is released::

    recording = record_overlap(engine)          # engine = make_engine(..., overlap=True), fresh
    engine.generate(prompts, 3)
    draw_overlap(recording)                     # lanes "CPU: schedule", "device: run", "memory: release"

Draw in Chinese (the labels, legends, captions and buttons; token words stay as they are)::

    from minikv.viz import set_language
    set_language("zh")          # "en" (the default) goes back; the words live in minikv.viz.labels
    draw_pool(pool, title=label("ch2.seven_steps"))   # a chapter's own title, from the same catalog

Modules: :mod:`~minikv.viz.tree` (drawings), :mod:`~minikv.viz.recorder`
(the recording proxy), :mod:`~minikv.viz.player` (the HTML player),
:mod:`~minikv.viz.timeline` (a serving run, one row per request),
:mod:`~minikv.viz.overlap` (the overlap loop over time),
:mod:`~minikv.viz.plots` (lifecycle, sizes, hit rate),
:mod:`~minikv.viz.scheduler` (requests over steps, measures side by side, the slot
table a kernel walks), :mod:`~minikv.viz.storage` (storage-layer pictures) and
:mod:`~minikv.viz.labels` (every word they draw, in English and Chinese). The snapshot they all
draw from is :mod:`minikv.snapshot`; ``Vocab`` lives in :mod:`minikv.course.vocab`.
"""

from ..course.vocab import Vocab  # re-exported: the book's examples import it from here
from ..snapshot import NodeView, SlotOwnership, TreeChanges, TreeSnapshot, diff_snapshots, outline
from . import storage
from .engine import EngineDrawing, draw_engine
from .labels import get_language, label, set_language
from .overlap import OverlapDrawing, OverlapRecording, OverlapStep, draw_overlap, record_overlap
from .player import FramePlayer, PlayerFrame
from .plots import plot_hit_rate, plot_hit_rate_sweep, plot_lifecycle, plot_recomputed, plot_sizes
from .recorder import Frame, TreeRecorder
from .scheduler import draw_slot_table, plot_measures, plot_request_states
from .storage import *  # noqa: F403  (its __all__ lists its public names)
from .timeline import Timeline, TimelineEvent, TimelineSegment, record_timeline
from .tree import GraphvizMissingError, TreeDrawing, draw_pool, draw_snapshot, draw_tree, node_id, render_svg

__all__ = [
    "EngineDrawing",
    "Frame",
    "FramePlayer",
    "GraphvizMissingError",
    "NodeView",
    "OverlapDrawing",
    "OverlapRecording",
    "OverlapStep",
    "PlayerFrame",
    "SlotOwnership",
    "Timeline",
    "TimelineEvent",
    "TimelineSegment",
    "TreeChanges",
    "TreeDrawing",
    "TreeRecorder",
    "TreeSnapshot",
    "Vocab",
    "diff_snapshots",
    "get_language",
    "label",
    "draw_engine",
    "draw_overlap",
    "draw_pool",
    "draw_slot_table",
    "draw_snapshot",
    "draw_tree",
    "node_id",
    "outline",
    "plot_hit_rate",
    "plot_hit_rate_sweep",
    "plot_lifecycle",
    "plot_measures",
    "plot_request_states",
    "plot_recomputed",
    "plot_sizes",
    "record_overlap",
    "record_timeline",
    "render_svg",
    "set_language",
    *storage.__all__,
]
