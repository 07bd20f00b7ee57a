"""Every fixed word the pictures show, in English and Chinese: one catalog for drawings, players and plots.

A drawing never holds an English literal of its own: it asks :func:`text` for a
label by key, with named fields for what changes (numbers, token words), and
gets it in the language chosen by :func:`set_language` (English by default).
So a Chinese notebook calls ``minikv.viz.set_language("zh")`` once and draws in
Chinese; the English pictures stay byte for byte what they were.
A notebook's own titles and captions live here too (keys ``ch5.``, ``ex5.``...): its code
passes ``title=label("ch5.arrives", n=3)``, never an English literal, so they follow the
language as well.

The Chinese edition of the book is built from the *stored* English outputs of
the notebooks. :func:`translate` reads an English label back -- the catalog's
templates, turned into patterns -- and writes it in Chinese, fields carried
over (translated themselves where they are labels). ``_ext/zh_drawings.py``
applies it to the text of every SVG and player of the zh pages, which is why
every template here must be readable back: tests check that translating what
the English drawings show gives what the Chinese drawings show.

Terms follow the course's term list (``KEY_TERMS`` in ``scripts/i18n.py``):
驱逐 (evict), 锁定 (lock), 槽位 (slot), 节点 (node), 分裂 (split), 页池 (page
pool); "token" stays "token", as in the notes. Identifiers (``ref_count``,
``k_cache(0)``, ``store_kv``) are code and stay as they are.

Fonts: SVG text is drawn by the reader's browser, which finds a Chinese font
among the system's (Windows, macOS, Android, ChromeOS and most Linux desktops
have one); :data:`CJK_FONT_FAMILY` lists the usual ones first. Nothing is
fetched from a CDN. Matplotlib figures display as SVG with their text kept as
text for the same reason (see :mod:`minikv.viz.figure`); on Colab the
reader's own browser draws them, so a Colab runtime needs no Chinese font.
"""

from __future__ import annotations

import html
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType

from ..errors import ArgumentError
from ..language import LANGUAGES, get_language, language, set_language, translate_message
from ..language import checked_language as _checked

__all__ = [
    "CATALOG",
    "CJK_FONT_FAMILY",
    "LANGUAGES",
    "Label",
    "get_language",
    "join",
    "label",
    "language",
    "player_fragments",
    "set_language",
    "text",
    "translate",
    "translate_html",
]

CJK_FONT_FAMILY = (
    "'Noto Sans CJK SC','Source Han Sans SC','PingFang SC','Hiragino Sans GB','Microsoft YaHei',"
    "'WenQuanYi Micro Hei',sans-serif"
)
"""A CSS font stack of the Chinese fonts systems ship; the zh build sets it on translated SVG text."""


@dataclass(frozen=True)
class Label:
    """One fixed string in both languages; ``en_other`` is the English form when the ``count`` field is not 1."""

    en: str
    zh: str
    en_other: str | None = None


# Field names say what a field holds, so that :func:`translate` knows how to read it back:
# numbers are digits; ``words``, ``error``, ``value``, ``label`` and ``sign`` are carried over
# as they are (token words, an exception, user text); every other field is a label itself.
_NUMBER_FIELDS = frozenset(
    {"n", "count", "total", "cached", "protected", "evictable", "free", "ref", "t", "page_size", "slot", "page",
     "row", "layer", "rank", "first", "last", "start", "stop", "size_bytes", "heads", "local", "tp_size",
     "num_heads", "waiting", "running", "finished", "steps", "prefill", "decode", "rows", "max_running", "layers",
     "pages", "slots_per_page", "dims", "query_heads", "kv_heads", "batch", "step", "notes_step", "uid",
     "chunk", "prompt_len", "new_len"}
)  # fmt: skip
_LITERAL_FIELDS = frozenset(
    {"words", "error", "value", "sign", "slots_text", "name", "size", "kind", "shape", "strides", "uids"}
)
_OPTIONAL_FIELDS = frozenset({"track", "label", "queue", "in_flight"})
"""Fields translated when they are a label and kept as they are when not (``k_cache(1)`` is code)."""
_LIST_FIELDS = {"parts": ("; ", "；"), "items": (", ", "、")}
"""List fields: their items are translated one by one and joined with each language's separator."""

CATALOG: Mapping[str, Label] = MappingProxyType(
    {
        # -- radix tree drawings (tree.py): the legend, the node boxes, the slot strip ------------
        "state.root": Label("root (always kept)", "根节点（始终保留）"),
        "state.protected": Label("protected: locked (ref > 0)", "受保护：已锁定（引用 > 0）"),
        "state.evictable": Label("evictable leaf (ref 0)", "可驱逐的叶子节点（引用 0）"),
        "state.interior": Label("interior node, unlocked", "内部节点，未锁定"),
        "state.evicted": Label("just evicted (ghost)", "刚被驱逐（残影）"),
        "state.inserted": Label("just inserted", "刚插入"),
        "state.split": Label("the two halves of a split", "分裂出的两半"),
        "state.walked": Label("path a match just walked", "匹配刚走过的路径"),
        "node.root": Label("root", "根"),
        "node.evicted": Label("evicted: slots freed", "已驱逐：槽位已释放"),
        "node.status": Label("ref {ref} · t {t}", "引用 {ref} · 时间 {t}"),
        "node.tooltip": Label(
            "[{words}] slots {slots_text}; ref_count {ref}, t {t}; {state}",
            "[{words}] 槽位 {slots_text}；ref_count {ref}，t {t}；{state}",
        ),
        "word.protected": Label("protected", "受保护"),
        "word.evictable": Label("evictable", "可驱逐"),
        "word.interior": Label("interior", "内部节点"),
        "word.evicted": Label("evicted", "已驱逐"),
        "legend.footer": Label(
            "ref = locks held, t = last use. Cached {total} slots = {protected} protected + {evictable} evictable.",
            "引用 = 持有的锁数，时间 = 最近一次使用。缓存 {total} 个槽位 = {protected} 受保护 + {evictable} 可驱逐。",
        ),
        "legend.footer_paged": Label(
            "ref = locks held, t = last use. Cached {total} slots = {protected} protected + {evictable} evictable."
            " Boxed columns are pages of {page_size} slots.",
            "引用 = 持有的锁数，时间 = 最近一次使用。缓存 {total} 个槽位 = {protected} 受保护 + {evictable} 可驱逐。"
            "带框的列是 {page_size} 个槽位的页。",
        ),
        "strip.slots": Label("slots", "槽位"),
        "strip.entry": Label("{meaning}: {count}", "{meaning}：{count}"),
        # The meanings of minikv.snapshot.SLOT_STATES (a test checks the English is the same).
        "slot.free": Label("free in the pool", "在页池中空闲"),
        "slot.evictable": Label("in the tree, evictable (ref 0)", "在树中，可驱逐（引用 0）"),
        "slot.locked": Label("in the tree, locked (ref > 0)", "在树中，已锁定（引用 > 0）"),
        "slot.evicted": Label("evicted, on its way to the pool", "已驱逐，正在回到页池"),
        "slot.request": Label("owned by a running request", "属于一个运行中的请求"),
        "slot.conflict": Label(
            "free AND in the tree, or in two nodes (a bug)", "既空闲又在树中，或在两个节点中（程序错误）"
        ),
        # -- counted nouns --------------------------------------------------------------------------
        "count.node": Label("{count} node", "{count} 个节点", "{count} nodes"),
        "count.slot": Label("{count} slot", "{count} 个槽位", "{count} slots"),
        "count.token": Label("{count} token", "{count} 个 token", "{count} tokens"),
        # -- recorder captions (recorder.py) ----------------------------------------------------------
        "rec.start": Label("start: {nodes} holds {slots}", "开始：{nodes}共占 {slots}", "start: {nodes} hold {slots}"),
        "rec.start_empty": Label("start: the tree is empty", "开始：树是空的"),
        "rec.caption": Label("{head}: {parts}", "{head}：{parts}"),
        "rec.labelled": Label("{label} · {caption}", "{label} · {caption}"),
        "rec.refused": Label("{head}: refused ({error})", "{head}：被拒绝（{error}）"),
        "rec.match": Label("match [{words}]", "匹配 [{words}]"),
        "rec.hit": Label("{cached} of {total} tokens cached", "{total} 个 token 中已缓存 {cached} 个"),
        "rec.miss": Label("nothing cached (0 of {total} tokens)", "没有缓存（{total} 个 token 中 0 个）"),
        "rec.split": Label("split [{words}] after {tokens}", "在 {tokens} 之后分裂 [{words}]"),
        "rec.insert": Label("insert [{words}]", "插入 [{words}]"),
        "rec.added": Label("added [{words}] ({slots})", "新增 [{words}]（{slots}）"),
        "rec.nothing_new": Label("nothing new to add", "没有新内容可加"),
        "rec.already": Label("{tokens} already cached (the return value)", "{tokens} 已在缓存中（返回值）"),
        "rec.partial": Label("last {tokens} not inserted (a partial page)", "最后 {tokens} 未插入（不满一页）"),
        "rec.lock": Label("lock [{words}]", "锁定 [{words}]"),
        "rec.unlock": Label("unlock [{words}]", "解锁 [{words}]"),
        "rec.lock_not_radix": Label("lock (not a radix handle)", "锁定（不是基数树的句柄）"),
        "rec.unlock_not_radix": Label("unlock (not a radix handle)", "解锁（不是基数树的句柄）"),
        "rec.lock_empty": Label("lock (empty match)", "锁定（空匹配）"),
        "rec.unlock_empty": Label("unlock (empty match)", "解锁（空匹配）"),
        "rec.root_only": Label("the root is always protected; nothing to do", "根节点始终受保护；无事可做"),
        "rec.ref_change": Label("ref_count {sign} on {nodes}", "{nodes}的 ref_count {sign}"),
        "rec.evictable_again": Label("{slots} evictable again", "{slots}重新可驱逐"),
        "rec.still_protected": Label("still protected by another lock", "仍被另一个锁保护"),
        "rec.newly_protected": Label("{slots} newly protected", "{slots}新受保护"),
        "rec.already_protected": Label("already protected by another lock", "已被另一个锁保护"),
        "rec.evict": Label("evict {value}", "驱逐 {value}"),
        "rec.nothing_to_do": Label("nothing to do", "无事可做"),
        "rec.removed_item": Label("[{words}] ({slots})", "[{words}]（{slots}）"),
        "rec.removed": Label("removed {items}", "移除 {items}"),
        "rec.freed": Label("freed {slots}: whole nodes go", "释放 {slots}：按整个节点驱逐"),
        "rec.reset_head": Label("reset", "重置"),
        "rec.reset": Label("reset: removed {nodes} ({slots})", "重置：移除 {nodes}（{slots}）"),
        "rec.sizes": Label(
            "cached {total} slots: {protected} protected, {evictable} evictable",
            "缓存 {total} 个槽位：{protected} 受保护，{evictable} 可驱逐",
        ),
        "rec.sizes_free": Label("{sizes} · {free} free in the pool", "{sizes} · 页池中空闲 {free} 个"),
        # -- the frame player (player.py) -------------------------------------------------------------
        "player.prev": Label("prev", "上一帧"),
        "player.next": Label("next", "下一帧"),
        "player.play": Label("play", "播放"),
        "player.pause": Label("pause", "暂停"),
        "player.prev_title": Label("previous frame (left arrow)", "上一帧（左方向键）"),
        "player.next_title": Label("next frame (right arrow)", "下一帧（右方向键）"),
        "player.play_title": Label("play / pause", "播放 / 暂停"),
        "player.frame": Label("frame", "帧"),
        "player.page_title": Label("minikv frames", "minikv 帧"),
        # -- the engine drawing (engine.py) -----------------------------------------------------------
        "engine.head": Label("Engine (the scheduler)", "Engine（调度器）"),
        "engine.queues": Label(
            "waiting {waiting}  |  running {running}  |  finished {finished}",
            "等待 {waiting}  |  运行 {running}  |  完成 {finished}",
        ),
        "engine.steps": Label(
            "after {steps} steps: {prefill} prefill, {decode} decode",
            "{steps} 步之后：{prefill} 次预填充，{decode} 次解码",
        ),
        "engine.cache_head": Label("cache manager ({name})", "缓存管理器（{name}）"),
        "engine.tree_holds": Label("tree holds {total} slots", "树中有 {total} 个槽位"),
        "engine.tree_split": Label(
            "{protected} locked, {evictable} evictable", "{protected} 已锁定，{evictable} 可驱逐"
        ),
        "engine.pool_free": Label("{free} of {total} slots free", "{total} 个槽位中空闲 {free} 个"),
        "engine.pages_of": Label("pages of {count} slot", "每页 {count} 个槽位", "pages of {count} slots"),
        "engine.rows": Label("{rows} of {max_running} rows in use", "{max_running} 行中在用 {rows} 行"),
        "engine.row_each": Label("one row of slots per running request", "每个运行中的请求一行槽位"),
        "engine.storage_head": Label("{name} (K/V storage)", "{name}（K/V 存储）"),
        "engine.storage_shape": Label(
            "{layers} layers x {pages} pages x {slots_per_page} slots",
            "{layers} 层 x {pages} 页 x {slots_per_page} 个槽位",
        ),
        "engine.storage_heads": Label("{heads} KV heads x {dims} dims, {kind}", "{heads} 个 KV 头 x {dims} 维，{kind}"),
        "engine.model_head": Label("{name} (the model)", "{name}（模型）"),
        "engine.model_shape": Label(
            "{layers} layers, {query_heads} query / {kv_heads} KV heads",
            "{layers} 层，{query_heads} 个查询头 / {kv_heads} 个 KV 头",
        ),
        "engine.model_reads": Label(
            "prefill, decode: attention reads K/V by slot", "预填充、解码：注意力按槽位读取 K/V"
        ),
        "engine.evict_edge": Label("evict (when short)", "evict（不够时）"),
        "engine.row_edge": Label("a row per request", "每个请求一行"),
        "engine.batches_edge": Label("prefill / decode batches", "预填充 / 解码批次"),
        "engine.slots_edge": Label("the batch's slots", "批次的槽位"),
        "engine.store_edge": Label("store_kv, then read by slot", "store_kv，再按槽位读取"),
        # -- plots (plots.py) ---------------------------------------------------------------------------
        "plot.admit": Label("admit", "接纳"),
        "plot.forward": Label("forward pass", "前向计算"),
        "plot.finish": Label("finish", "完成"),
        "plot.lifecycle_x": Label("order in which the steps ran", "步骤执行的顺序"),
        "plot.lifecycle_title": Label(
            "The request lifecycle (box numbers are the notes' seven steps)",
            "请求的生命周期（框中编号是笔记的七个步骤）",
        ),
        "plot.request": Label("request {n}", "请求 {n}"),
        "plot.band_protected": Label("protected (locked)", "受保护（已锁定）"),
        "plot.band_evictable": Label("evictable", "可驱逐"),
        "plot.band_requests": Label("held by running requests", "运行中的请求持有"),
        "plot.band_free": Label("free in the pool", "在页池中空闲"),
        "op.start": Label("start", "开始"),
        "op.match": Label("match", "匹配"),
        "op.insert": Label("insert", "插入"),
        "op.lock": Label("lock", "锁定"),
        "op.unlock": Label("unlock", "解锁"),
        "op.evict": Label("evict", "驱逐"),
        "op.reset": Label("reset", "重置"),
        "op.note": Label("note", "注释"),
        "plot.frame_op": Label("frame (operation)", "帧（操作）"),
        "plot.frame": Label("frame", "帧"),
        "plot.slots": Label("slots", "槽位"),
        "plot.sizes_title": Label("Where the slots are after each operation", "每次操作之后槽位在哪里"),
        "plot.this_request": Label("this request", "本请求"),
        "plot.all_requests": Label("all requests so far", "到目前为止的全部请求"),
        "plot.cached_share": Label("prompt tokens cached", "已缓存的提示词 token"),
        "plot.hit_rate_title": Label("Prefix-cache hit rate per request", "每个请求的前缀缓存命中率"),
        "plot.hit_rate": Label("hit rate", "命中率"),
        "plot.no_eviction": Label("no eviction", "不驱逐"),
        "plot.series_no_eviction": Label("{name}: no eviction", "{name}：不驱逐"),
        "plot.no_cache_line": Label("naive: the whole prompt", "极简管理器：整个提示词"),
        "plot.radix_line": Label("radix: the uncached part", "基数树：未缓存的部分"),
        "plot.request_axis": Label("request", "请求"),
        "plot.recomputed": Label("tokens recomputed", "重新计算的 token"),
        "plot.pool_size": Label("pool size (slots)", "页池大小（槽位）"),
        "plot.pool_size_log": Label("pool size (slots, log scale)", "页池大小（槽位，对数坐标）"),
        "plot.sweep_title": Label("Hit rate against pool size (LRU eviction)", "命中率与页池大小（LRU 驱逐）"),
        # -- scheduler pictures (scheduler.py) --------------------------------------------------------
        "sched.states_title": Label("Each request's status after every step", "每一步之后各个请求的状态"),
        "sched.engine_step": Label("engine step", "引擎步"),
        "sched.waiting": Label("waiting", "等待中"),
        "sched.running": Label("running", "运行中"),
        "sched.finished": Label("finished", "已完成"),
        "sched.table_title": Label(
            "the slot table: token position -> slot (a bold line every {page_size} positions)",
            "槽位表：token 位置 -> 槽位（每 {page_size} 个位置一条粗线）",
        ),
        "sched.pages_axis": Label(
            "page of the K/V cache (one column; a cell is a row, labelled with its slot)",
            "K/V 缓存的页（一页一列；一格是一行，标着它的槽位）",
        ),
        "sched.shared": Label("read by several", "被多个请求读取"),
        "sched.not_read": Label("not read", "未被读取"),
        # -- storage pictures (storage.py) -----------------------------------------------------------------
        "storage.buffer": Label(
            "{value}: kv_buffer {shape}, strides {strides}", "{value}：kv_buffer {shape}，步长 {strides}"
        ),
        "storage.layer": Label("layer {layer}", "第 {layer} 层"),
        "storage.layouts_title": Label(
            "The one K/V allocation in memory order (x = element offset)",
            "唯一的一块 K/V 分配，按内存顺序（x = 元素偏移）",
        ),
        "storage.layouts_key": Label("colour = layer, shade and number = page", "颜色 = 层，深浅和数字 = 页"),
        "storage.slot": Label("slot {slot}", "槽位 {slot}"),
        "storage.page": Label("page {page}", "第 {page} 页"),
        "storage.row": Label("row {row}", "第 {row} 行"),
        "storage.slots_title": Label(
            "{value}, page_size {page_size}: slot s is row s % {page_size} of page s // {page_size}",
            "{value}，page_size {page_size}：槽位 s 是第 s // {page_size} 页的第 s % {page_size} 行",
        ),
        "storage.slots_note": Label(
            "(@ = element offset where the page's K starts in that layer)", "（@ = 该页的 K 在那一层开始处的元素偏移）"
        ),
        "storage.rank": Label("rank {rank}: heads {first}..{last}, {size}", "rank {rank}：头 {first}..{last}，{size}"),
        "storage.global_head": Label("global KV head", "全局 KV 头"),
        "storage.heads_title": Label(
            "{num_heads} KV heads over tp_size {tp_size}: each rank stores {local}",
            "{num_heads} 个 KV 头分到 tp_size {tp_size}：每个 rank 存 {local} 个",
        ),
        "storage.heads_note": Label(
            "(numbers in the rank rows are the rank's local head indices)", "（rank 行中的数字是该 rank 的本地头编号）"
        ),
        "storage.runs": Label("{track}: {count} run", "{track}：{count} 段", "{track}: {count} runs"),
        "storage.page_track": Label("page {page}, K, all layers", "第 {page} 页，K，所有层"),
        # -- a request's life over time (timeline.py) ------------------------------------------------------
        "timeline.row": Label("request {uid}: {prompt_len} + {new_len}", "请求 {uid}：{prompt_len} + {new_len}"),
        "timeline.chunk": Label("prefill chunk of {chunk} tokens", "{chunk} 个 token 的预填充块"),
        "timeline.kind.waiting": Label("waiting", "等待中"),
        "timeline.kind.decode": Label("decode", "解码"),
        "timeline.kind.stalled": Label("stalled", "停顿"),
        "timeline.kind.preempted": Label("preempted", "被抢占"),
        "timeline.one_step": Label("step {step}", "第 {step} 步"),
        "timeline.steps": Label("steps {first}-{last}", "第 {first}-{last} 步"),
        "timeline.tip": Label("request {uid}: {what}, {span}", "请求 {uid}：{what}，{span}"),
        "timeline.finished_tip": Label("request {uid}: finished in step {step}", "请求 {uid}：在第 {step} 步完成"),
        "timeline.axis": Label("step", "步"),
        "timeline.legend.waiting": Label("waiting", "等待中"),
        "timeline.legend.prefill": Label("prefill chunk (tokens)", "预填充块（token 数）"),
        "timeline.legend.decode": Label("decode", "解码"),
        "timeline.legend.stalled": Label("running, not in the batch", "运行中，不在本批次"),
        "timeline.legend.preempted": Label("preempted (requeued)", "被抢占（重新排队）"),
        "timeline.finished": Label("finished", "已完成"),
        "timeline.preemption": Label("preemption", "抢占"),
        # -- the overlap loop over time (overlap.py) ------------------------------------------------------
        "overlap.title_on": Label(
            "overlap=True: the CPU plans batch N+1 while the device runs batch N",
            "overlap=True：设备运行批次 N 时，CPU 规划批次 N+1",
        ),
        "overlap.title_off": Label(
            "overlap=False: each batch runs before the next one is planned",
            "overlap=False：每个批次运行完，才规划下一个批次",
        ),
        "overlap.cpu": Label("CPU: schedule", "CPU：调度"),
        "overlap.device": Label("device: run", "设备：运行"),
        "overlap.memory": Label("memory: release", "内存：释放"),
        "overlap.batch": Label("batch {batch}", "批次 {batch}"),
        "overlap.step": Label("step", "步"),
        "overlap.kind.prefill": Label("prefill", "预填充"),
        "overlap.kind.decode": Label("decode", "解码"),
        "overlap.kind.mixed": Label("prefill + decode", "预填充 + 解码"),
        "overlap.launch": Label("launch", "启动"),
        "overlap.collect": Label("collect results", "取回结果"),
        "overlap.release": Label("release (request number)", "释放（请求编号）"),
        "overlap.hazard": Label("released while in flight", "仍在途时就被释放"),
        "overlap.preempt": Label("preemption", "抢占"),
        "overlap.planned_tip": Label(
            "batch {batch} ({work}) planned in step {step}: requests {uids}",
            "第 {step} 步规划批次 {batch}（{work}）：请求 {uids}",
        ),
        "overlap.run_tip": Label(
            "batch {batch} ({work}) in flight from step {first} to step {last}: requests {uids}",
            "批次 {batch}（{work}）从第 {first} 步到第 {last} 步在途：请求 {uids}",
        ),
        "overlap.collect_tip": Label(
            "results of batch {batch} collected in step {step}", "第 {step} 步取回批次 {batch} 的结果"
        ),
        "overlap.release_tip": Label("request {uid} released in step {step}", "第 {step} 步释放请求 {uid}"),
        "overlap.hazard_tip": Label(
            "request {uid} released in step {step} while batch {batch}, which reads its row, is in flight",
            "第 {step} 步释放请求 {uid}，而读取它那一行的批次 {batch} 仍在途",
        ),
        "overlap.preempt_tip": Label("request {uid} preempted in step {step}", "第 {step} 步抢占请求 {uid}"),
        # the rows a decode kernel read (draw_rows_read, exercise 7)
        "storage.page_axis": Label("page", "页"),
        "storage.row_axis": Label("row", "行"),
        "storage.request_rows": Label(
            "request {n} ({total} tokens): {verdict}", "请求 {n}（{total} 个 token）：{verdict}"
        ),
        "storage.rows_right": Label("its own rows", "恰好是它自己的行"),
        "storage.rows_wrong": Label("{count} rows wrong", "{count} 行有误"),
        "storage.read_own": Label("read, its own", "读取了，属于它"),
        "storage.read_other": Label("read, not its own", "读取了，不属于它"),
        "storage.own_unread": Label("its own, not read", "属于它，未读取"),
        # -- titles and captions the chapters' code passes to drawings (label("ch5.arrives", n=3)) --------
        "intro.chapter": Label("chapter", "章节"),
        "intro.notes": Label("notes", "笔记"),
        "intro.modules": Label("minikv module: names", "minikv 模块：名字"),
        "intro.peer_files": Label("mini-sglang files", "mini-sglang 文件"),
        "intro.exercises": Label("exercises", "练习"),
        "intro.challenges": Label("challenges {first}–{last}", "挑战 {first}–{last}"),
        "intro.beyond_notes": Label("beyond the notes", "笔记之外"),
        "intro.motivation_only": Label("(motivation only)", "（仅为动机）"),
        "ch1.model": Label("model", "模型"),
        "ch1.attention": Label("attention", "注意力"),
        "ch1.config_numbers": Label("config numbers", "配置数字"),
        "ch1.bytes_per_token": Label("bytes/token", "字节/token"),
        "ch1.kv_numbers": Label(
            "{layers} layers, {kv_heads} KV heads × {dims}", "{layers} 层，{kv_heads} 个 KV 头 × {dims}"
        ),
        "ch1.mla_numbers": Label(
            "{layers} layers, latent {rank} + rope {dims}", "{layers} 层，潜向量 {rank} + rope {dims}"
        ),
        "ch1.tokens_that_fit": Label("tokens that fit", "放得下的 token 数"),
        "ch1.weights": Label("weights", "权重"),
        "ch1.memory": Label("memory", "内存"),
        "ch1.tokens_left": Label("tokens left", "剩余 token 数"),
        "ch1.requests_4k": Label("4k-token requests", "4k-token 请求数"),
        "ch1.manager": Label("manager", "管理器"),
        "ch1.request": Label("request", "请求"),
        "ch1.tokens": Label("tokens", "token 数"),
        "ch1.cached_reused": Label("cached (reused)", "已缓存（复用）"),
        "ch1.computed": Label("computed", "需计算"),
        "ch1.engine_running": Label("an engine, three requests running", "一个引擎，三个请求在运行"),
        "ch1.after_b_admitted": Label(
            "after B's admission: A's prefix slots {slots_text} are B's or free",
            "接纳 B 之后：A 的前缀槽位 {slots_text} 已归 B 或空闲",
        ),
        "ch2.step": Label("step {step}", "第 {step} 步"),
        "ch2.step_of_notes": Label("step {step} (notes' {notes_step})", "第 {step} 步（笔记的第 {notes_step} 步）"),
        "ch2.allocate": Label("allocate: slots {slots_text} for [{words}]", "分配：槽位 {slots_text} 给 [{words}]"),
        "ch2.store": Label(
            "store_kv: K and V of [{words}], storage only", "store_kv：写入 [{words}] 的 K 和 V，只动存储层"
        ),
        "ch2.free_duplicates": Label(
            "free indices[{start}:{stop}] = {slots_text}", "释放 indices[{start}:{stop}] = {slots_text}"
        ),
        "ch2.seven_steps": Label("the seven steps of one request", "一个请求的七个步骤"),
        "ch2.after_notes_step": Label("after the notes' step {step}", "笔记第 {step} 步之后"),
        "ch4.while_running": Label(
            "while it runs: 5 slots are the request's; the manager holds none",
            "运行期间：5 个槽位归请求所有；管理器一个也不持有",
        ),
        "ch4.after_finish": Label(
            "after finish: already_cached = {cached}, so the caller freed every slot",
            "finish 之后：already_cached = {cached}，所以调用者释放了每一个槽位",
        ),
        # the workloads chapter 4 compares (plot_recomputed draws a workload's name through translate)
        "ch4.shared_system_prompt": Label("shared system prompt", "共享系统提示词"),
        "ch4.multi_turn_chat": Label("multi-turn chat", "多轮对话"),
        "ch4.few_shot": Label("few-shot", "少样本"),
        "ch4.second_runs": Label("{name}: the second request runs", "{name}：第二个请求在运行"),
        "ch5.first_two_arrive": Label("requests 1 and 2 arrive", "请求 1 和 2 到达"),
        "ch5.arrives": Label("request {n} arrives", "请求 {n} 到达"),
        "ch5.finishes": Label("request {n} finishes", "请求 {n} 完成"),
        "ch5.notes_step": Label("the notes' step {step}", "笔记的第 {step} 步"),
        "ch5.memory_short": Label("memory is short", "内存不够了"),
        "ch5.pool_takes_back": Label("the pool takes the evicted slots back", "页池收回被驱逐的槽位"),
        "ch6.prompt_free_in_tree": Label(
            "after the notes' step 5: the system prompt's slots are free and in the tree",
            "笔记第 5 步之后：系统提示词的槽位既空闲又在树中",
        ),
        "ch6.after_step": Label("after step {steps} ({kind})", "第 {steps} 步之后（{kind}）"),
        "ch6.two_turns": Label("the engine after two turns", "两轮对话之后的引擎"),
        "ch6.preempted": Label("step {steps}: request {uid} preempted", "第 {steps} 步：请求 {uid} 被抢占"),
        "ch6.in_flight": Label(
            "step {steps}: in flight {in_flight}; first request {state}",
            "第 {steps} 步：在途 {in_flight}；第一个请求{state}",
        ),
        "ch6.nothing": Label("nothing", "无"),
        "ch6.released": Label("released", "已释放"),  # and "running": sched.running
        "ch7.tree": Label("SmolLM2's radix tree after four requests", "四个请求之后 SmolLM2 的基数树"),
        "ch8.waiting": Label("waiting, in {name} order: {queue}", "等待队列，按 {name} 顺序：{queue}"),
        "ch8.empty": Label("(empty)", "（空）"),
        "ch8.before_step": Label(
            "before step {steps}: it runs {kind} {words}", "第 {steps} 步之前：它运行 {kind} {words}"
        ),
        "ch8.queue_player": Label(
            "lpm: the waiting queue and the tree before each step", "lpm：每一步之前的等待队列和树"
        ),
        "ch8.two_prompts": Label(
            "Six requests, two system prompts, a 20-slot pool", "六个请求、两个系统提示词、一个 20 槽位的页池"
        ),
        "ch8.which_first": Label("Which request first: one burst", "先运行哪个请求：一次突发"),
        "ch8.cold_request": Label("A cold request in a stream of cached ones", "一连串已缓存请求中的一个冷请求"),
        "ch8.room": Label("How much room to reserve: one burst", "预留多少空间：一次突发"),
        "ch8.no_budget": Label("no budget: the document in one step", "没有预算：整篇文档一步算完"),
        "ch8.budget": Label("a budget of {n} prompt tokens a step", "每步 {n} 个提示词 token 的预算"),
        # the measures chapter 8 compares (plot_measures draws a measure's name through translate)
        "ch8.prompt_tokens_computed": Label("prompt tokens computed", "计算的提示词 token"),
        "ch8.preemptions": Label("preemptions", "抢占次数"),
        "ch8.steps": Label("steps", "步数"),
        "ch8.worst_wait": Label("worst wait", "最长等待"),
        "ch8.mean_wait": Label("mean wait", "平均等待"),
        "ch8.mean_decode_batch": Label("mean decode batch", "平均解码批大小"),
        "ch8.recomputed": Label("recomputed", "重新计算"),
        "ch8.last_decode": Label("What the last decode step read, page by page", "最后一个解码步逐页读了什么"),
        "ex5.four_requests": Label("MyPagedRadixCache, four requests", "MyPagedRadixCache，四个请求"),
    }
)
"""Key -> :class:`Label`. Keys are grouped by the module that draws them."""


def text(key: str, /, *, lang: str | None = None, **fields: object) -> str:
    """The label ``key`` in ``lang`` (default: :func:`get_language`), its fields filled in.

    The English form with ``en_other`` is chosen by the ``count`` field (or ``n``): singular for 1.
    """
    return _filled(key, lang, fields)


def _filled(key: str, lang: str | None, fields: Mapping[str, object]) -> str:
    if key not in CATALOG:
        raise ArgumentError(f"key: no label {key!r} in the catalog")
    lang = get_language() if lang is None else _checked(lang)
    label = CATALOG[key]
    template = label.zh if lang == "zh" else label.en
    count = fields.get("count", fields.get("n"))
    if lang == "en" and label.en_other is not None and count != 1:
        template = label.en_other
    return template.format(**fields) if fields else template


def label(key: str, /, **fields: object) -> str:
    """The label ``key`` in the language of the moment: the titles and captions a notebook gives a drawing.

    ``draw_pool(pool, title=label("ch4.after_finish", cached=5))`` draws the title in English, or in
    Chinese after ``set_language("zh")`` (the zh Colab copies); and since the key's English form is
    a catalog template, the zh edition translates the title in the stored English outputs too.
    Keys of this kind start with their chapter (``ch5.``) or exercise (``ex5.``).
    """
    return _filled(key, None, fields)


def join(items: Sequence[str], field: str = "parts", *, lang: str | None = None) -> str:
    """``items`` joined with the separator of list field ``field`` (``parts``: "; ", ``items``: ", ") in ``lang``."""
    en, zh = _LIST_FIELDS[field]
    lang = get_language() if lang is None else _checked(lang)
    return (zh if lang == "zh" else en).join(items)


# -- reading English back ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Pattern:
    key: str
    regex: re.Pattern[str]
    fields: tuple[str, ...]
    literal: int  # characters of fixed text: longer ones are tried first (more specific)


@lru_cache(maxsize=1)
def _patterns() -> tuple[dict[str, str], tuple[_Pattern, ...]]:
    """Fixed English strings -> Chinese, and every English template with fields as a full-match pattern."""
    fixed: dict[str, str] = {}
    patterns = []
    for key, label in CATALOG.items():
        for english in dict.fromkeys((label.en, label.en_other or label.en)):
            parts = list(string.Formatter().parse(english))
            names = tuple(dict.fromkeys(name for _, name, _, _ in parts if name))
            if not names:
                fixed.setdefault(english, key)
                continue
            seen: set[str] = set()
            regex = ""
            for fixed_text, name, _, _ in parts:
                regex += re.escape(fixed_text)
                if name:
                    regex += f"(?P={name})" if name in seen else _field_regex(name)
                    seen.add(name)
            length = sum(len(fixed_text) for fixed_text, _, _, _ in parts)
            patterns.append(_Pattern(key, re.compile(regex, re.DOTALL), names, length))
    patterns.sort(key=lambda p: -p.literal)
    return fixed, tuple(patterns)


def _field_regex(name: str) -> str:
    if name in _NUMBER_FIELDS:
        return rf"(?P<{name}>-?[\d,.]+)"
    if name == "words":
        return rf"(?P<{name}>[^\]]*)"
    if name == "value":  # a repr, in a head that a ": " may follow
        return rf"(?P<{name}>[^:;]+)"
    return rf"(?P<{name}>.+?)"


def translate(english: str, lang: str = "zh") -> str:
    """``english``, a label as an English drawing shows it, in ``lang``; unchanged if no label reads so.

    Whole strings only: ``"evictable leaf (ref 0)"`` translates, a sentence that merely contains it
    does not. Fields keep their values; fields that are labels themselves are translated too.
    """
    _checked(lang)
    if lang == "en":
        return english
    found = _translate(english)
    return english if found is None else found


def _translate(english: str) -> str | None:
    fixed, patterns = _patterns()
    if english in fixed:
        return CATALOG[fixed[english]].zh
    for pattern in patterns:
        match = pattern.regex.fullmatch(english)
        if match is None:
            continue
        values = {}
        for name in pattern.fields:
            value = match.group(name)
            if name == "error":  # an exception quoted as "Type: message": minikv's message in its catalog
                values[name] = _translated_error(value)
            elif name in _NUMBER_FIELDS or name in _LITERAL_FIELDS:
                values[name] = value
            elif name in _LIST_FIELDS:
                items = _split_list(value, name)
                translated = [_translate(item) for item in items]
                if any(t is None for t in translated):
                    break
                values[name] = _LIST_FIELDS[name][1].join(t for t in translated if t is not None)
            else:
                inner = _translate(value)
                if inner is None and name not in _OPTIONAL_FIELDS:
                    break
                values[name] = value if inner is None else inner
        else:
            return CATALOG[pattern.key].zh.format(**values)
    return None


def _translated_error(error: str) -> str:
    """``"EvictionError: size: asked to ..."`` with its message in Chinese, where minikv's catalog has it."""
    kind, separator, message = error.partition(": ")
    found = translate_message(message, "zh") if separator else None
    return error if found is None else f"{kind}: {found}"


def _split_list(value: str, name: str) -> list[str]:
    if name == "items":  # "[a b] (2 slots), [c] (1 slot)": split between items, never inside token words
        return re.split(r"(?<=\)), (?=\[)", value)
    whole = _translate(value)  # a part may hold the separator itself ("...; nothing to do")
    if whole is not None:
        return [value]
    return value.split(_LIST_FIELDS[name][0])


# -- the zh edition's pages ----------------------------------------------------------------------

# Where a built page holds a drawing's words: each pattern's groups are (before, words, after).
_SVG_TEXT = re.compile(r"(<text\b[^>]*>)([^<]*)(</text>)")
_IN_MARKUP = (
    re.compile(r"(<title>)([^<]*)(</title>)"),  # an SVG node's tooltip
    re.compile(r'(<figcaption class="mkp-caption">(?:\d+\. )?)([^<]*)(</figcaption>)'),  # after the frame number
    re.compile(r'(<div class="mkp-details">)([^<]*)(</div>)'),
    re.compile(r'(<div class="mkp-title">)([^<]*)(</div>)'),  # a player's title (a notebook's label)
)
_IN_ATTRIBUTES = (re.compile(r'(xlink:title=")([^"]*)(")'),)  # graphviz's tooltips
_TABLE = re.compile(r"<table\b.*?</table>", re.DOTALL)  # a notebook's table (minikv.course.demo.html_table)
_TABLE_TEXT = re.compile(r"(<(?!code\b)[^<>]*>)([^<>]*[A-Za-z][^<>]*)()(?=<)")  # a cell's words, not its code


def player_fragments(lang: str) -> list[str]:
    """The fixed pieces of a player's HTML and script that hold words, in ``lang`` (see player.py)."""

    def t(key: str) -> str:
        return html.escape(text(key, lang=lang))

    return [
        f'title="{t("player.prev_title")}">&#9664; {t("player.prev")}</button>',
        f'title="{t("player.play_title")}">&#9654; {t("player.play")}</button>',
        f'title="{t("player.next_title")}">{t("player.next")} &#9654;</button>',
        f'aria-label="{t("player.frame")}"',
        f'play.innerHTML = "&#9654; {t("player.play")}";',
        f'play.innerHTML = "&#10074;&#10074; {t("player.pause")}";',
    ]


def translate_html(page: str, lang: str = "zh") -> str:
    """A built page (or an SVG file) with every label of its drawings, players and plots in ``lang``.

    SVG ``<text>`` elements and tooltips, a player's title, captions, details, buttons and script
    are read through :func:`translate`, and so are the titles and captions a notebook passes
    through :func:`label` and the words of its tables' cells (code in ``<code>`` left out); text
    that is not a label (token words, code) stays byte for byte. SVG
    text that changed gets :data:`CJK_FONT_FAMILY` after its own fonts.
    """
    _checked(lang)
    if lang == "en":
        return page

    def relabel(match: re.Match[str], attribute: bool = False, font: bool = False) -> str:
        before, body, after = match.groups()
        plain = html.unescape(body).replace("\xa0", " ")  # graphviz writes a double space as "&#160; "
        translated = translate(plain, lang)
        if translated == plain:
            return match.group(0)
        return (_with_cjk_font(before) if font else before) + html.escape(translated, quote=attribute) + after

    page = _SVG_TEXT.sub(lambda m: relabel(m, font=True), page)
    for pattern in _IN_MARKUP:
        page = pattern.sub(relabel, page)
    for pattern in _IN_ATTRIBUTES:
        page = pattern.sub(lambda m: relabel(m, attribute=True), page)
    page = _TABLE.sub(lambda table: _TABLE_TEXT.sub(relabel, table.group(0)), page)
    for english, chinese in zip(player_fragments("en"), player_fragments(lang), strict=True):
        page = page.replace(english, chinese)
    return page


def _with_cjk_font(tag: str) -> str:
    """An SVG ``<text>`` start tag whose font list ends with the Chinese fonts.

    graphviz writes ``font-family="Helvetica,sans-Serif"``, matplotlib (text kept as text)
    ``style="font-size: 8px; font-family: 'DejaVu Sans', ..."``; a tag with neither gets the attribute.
    """
    if "font-family=" in tag:
        return re.sub(r'font-family="([^"]*)"', lambda m: f'font-family="{m.group(1)},{CJK_FONT_FAMILY}"', tag, count=1)
    if "font-family:" in tag:
        return re.sub(r"(font-family:[^;\"]*)", lambda m: f"{m.group(1)}, {CJK_FONT_FAMILY}", tag, count=1)
    return tag.replace("<text", f'<text font-family="{CJK_FONT_FAMILY}"', 1)
