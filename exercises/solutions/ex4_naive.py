# %% [markdown]
# # Exercises 4: no cache, then a block cache
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/minikv-course/minikv/blob/main/exercises/ex4_naive.ipynb)
#
# Chapter 4's `NaiveCacheManager` caches nothing, yet it must speak the manager
# interface well enough that the seven steps of chapter 2 neither leak nor crash. You
# write it first. Then you build the design one step up from it, the one nano-vllm uses:
# a *block table* that reuses whole blocks of earlier prompts, found by a chain of hashes
# instead of a tree. Chapter 5's radix tree goes one step further and shares any
# prefix.
#
# Each task has a cell with `# YOUR CODE HERE`; its last line, `check(...)`, runs the
# cases and shows what passed and the smallest failing case. Hints are in dropdowns.

# %%
import torch

from minikv import BaseCacheManager, NaiveCacheHandle, SizeInfo
from minikv.errors import ArgumentError, EvictionError, OutOfSlotsError
from minikv.exercises import check
from minikv.exercises.blocks import BlockPool, compute_hash

print("GPU:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none, everything runs on the CPU")

# %% [markdown]
# ## Task 4.1 · `naive.manager` (easy)
#
# Write the class `NaiveManager(BaseCacheManager)`, built as `NaiveManager(device)`:
#
# * `no_slots()`, a small helper the other methods call, returns a new empty `int32`
#   tensor on the manager's device.
# * `match_prefix(input_ids)` finds nothing: a `NaiveCacheHandle(0)` and an empty `int32`
#   tensor on the manager's device.
# * `lock_handle(handle, unlock=False)` has nothing to protect and does nothing.
# * `insert_prefix(input_ids, indices)` keeps nothing, and returns `len(indices)`. That
#   is the famous "lie", and it is what makes the caller free every slot it allocated.
#   Raise `ValueError` if the lengths differ (`ArgumentError` is one).
# * `evict(size)`: `evict(0)` returns an empty `int32` tensor. Any other size raises,
#   since there is nothing to evict.
# * `reset()` returns an empty `int32` tensor, `size_info` is `SizeInfo(0, 0)` (a
#   property) and `check_integrity()` has nothing to check.
# * Every tensor a method returns is the caller's own: a caller may resize it and write
#   into it, and no later result may change because of that.
#
# The checker then runs requests through minikv's `serve` with your manager and a small
# page pool: if a single slot leaks, the pool runs dry.
#
# ```{admonition} Hint 1: why len(indices)
# :class: dropdown
# At step 5 the caller frees `indices[cached_len:already_cached]`. Here `cached_len` is
# always 0, so `already_cached = len(indices)` frees everything the request allocated,
# which is right when nothing is kept. Return 0 and nothing is ever freed.
# ```
#
# ```{admonition} Hint 2: a new empty tensor each time
# :class: dropdown
# Write one small helper that returns `torch.empty(0, dtype=torch.int32, device=self.device)`
# and call it from every method that returns no slots: the right dtype and device in one
# place, and a new tensor for each caller. One tensor made in `__init__` and returned from
# every method would be shared: a caller that resizes it changes what `reset()` returns next.
# ```


# %%
class NaiveManager(BaseCacheManager):
    def __init__(self, device: str = "cpu") -> None:
        ### BEGIN SOLUTION
        self.device = torch.device(device)
        self.page_size = 1
        ### END SOLUTION

    def no_slots(self) -> torch.Tensor:
        ### BEGIN SOLUTION
        return torch.empty(0, dtype=torch.int32, device=self.device)
        ### END SOLUTION

    def match_prefix(self, input_ids):
        ### BEGIN SOLUTION
        return NaiveCacheHandle(0), self.no_slots()
        ### END SOLUTION

    def lock_handle(self, handle, unlock=False) -> None:
        ### BEGIN SOLUTION
        return None
        ### END SOLUTION

    def insert_prefix(self, input_ids, indices, *, handle=None) -> int:
        ### BEGIN SOLUTION
        if len(input_ids) != len(indices):
            raise ArgumentError(f"input_ids has {len(input_ids)} tokens but indices has {len(indices)} slots")
        return len(indices)
        ### END SOLUTION

    def evict(self, size: int) -> torch.Tensor:
        ### BEGIN SOLUTION
        if size == 0:
            return self.no_slots()
        raise EvictionError(f"size: this manager holds nothing, so it cannot evict {size} slots")
        ### END SOLUTION

    def reset(self) -> torch.Tensor:
        ### BEGIN SOLUTION
        return self.no_slots()
        ### END SOLUTION

    @property
    def size_info(self) -> SizeInfo:
        ### BEGIN SOLUTION
        return SizeInfo(0, 0)
        ### END SOLUTION

    def check_integrity(self) -> None:
        ### BEGIN SOLUTION
        return None
        ### END SOLUTION


check("naive.manager", NaiveManager)

# %% [markdown]
# ## A block cache, nano-vllm style
#
# nano-vllm (`nanovllm/engine/block_manager.py`) caches *blocks* of `block_size` tokens
# rather than arbitrary prefixes. A full block gets a hash that also covers every block
# before it: block `i`'s hash is `compute_hash(tokens of block i, hash of block i - 1)`.
# So an equal hash means an equal *prefix*, not just an equal block, and a new prompt's
# cached part is found block by block, as far as the hashes are known. There is no tree
# and no lock on a path; each block counts its users.
#
# The scaffold is given (`minikv.exercises.blocks`). It is the storage of minikv's own
# `BlockManager` (`minikv.block_manager`), under the same names but without its methods;
# the checks run that manager beside your functions and compare the two after every step.
#
# * `Block(block_id, ref_count=0, hash=-1, token_ids=())`: `hash` is -1 while the block
#   is not full; `token_ids` are kept to rule out hash collisions.
# * `BlockPool(num_blocks, block_size)`: `pool.blocks` (a list of `Block`),
#   `pool.hash_to_block` (hash → block id, for full blocks) and `pool.free_block_ids`,
#   a `deque` of free block ids, the next one to reuse on the left.
# * `compute_hash(token_ids, prefix_hash=-1) -> int`.
#
# A freed block keeps its hash and tokens: it can still be hit until someone takes its
# memory. That is how nano-vllm evicts, lazily, when a free block is reused.

# %% [markdown]
# ## Task 4.2 · `blocks.block_hashes` (easy)
#
# Write `block_hashes(token_ids, block_size) -> list[int]`: the chained hash of every
# *full* block, in order. `token_ids` is a list of ints; leave it as it is. The first block's prefix hash is -1. A partial last block gets
# no hash: its tokens may still grow.
#
# ```{admonition} Hint
# :class: dropdown
# Walk `range(0, len(token_ids) - block_size + 1, block_size)` and keep the previous hash
# in a variable that starts at -1.
# ```


# %%
def block_hashes(token_ids: list[int], block_size: int) -> list[int]:
    ### BEGIN SOLUTION
    hashes = []
    prefix_hash = -1
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        prefix_hash = compute_hash(token_ids[start : start + block_size], prefix_hash)
        hashes.append(prefix_hash)
    return hashes
    ### END SOLUTION


check("blocks.block_hashes", block_hashes)

# %% [markdown]
# ## Task 4.3 · `blocks.deallocate` (easy)
#
# Write `deallocate(pool, block_table) -> None`: a request finished, so each of its
# blocks loses one user, and a block nobody uses goes to the *right* end of the free
# list. Keep the block's hash and tokens, and leave the list `block_table` as it is.
#
# Walk the table in reverse, the way nano-vllm does. The blocks freed first are then
# reused first, and those are the request's last blocks, the ones least likely to be
# shared. The shared first blocks stay cached longest.
#
# ```{admonition} Hint
# :class: dropdown
# `for block_id in reversed(block_table)`: decrement `ref_count`, and at 0
# `pool.free_block_ids.append(block_id)`.
# ```


# %%
def deallocate(pool: BlockPool, block_table: list[int]) -> None:
    ### BEGIN SOLUTION
    for block_id in reversed(block_table):
        block = pool.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count == 0:
            pool.free_block_ids.append(block_id)
    ### END SOLUTION


check("blocks.deallocate", deallocate)

# %% [markdown]
# ## Task 4.4 · `blocks.allocate` (hard)
#
# Write `allocate(pool, token_ids) -> (block_table, num_cached_tokens)`: one block per
# `block_size` tokens (the last one possibly partial), reusing cached blocks where the
# prefix allows. `token_ids` is a list of ints (any ids, large ones too); leave it as it is.
#
# 1. **Find the cached prefix.** For full blocks `i = 0, 1, ...`: the block is cached if
#    `pool.hash_to_block` has its chained hash *and* that block's `token_ids` equal block
#    `i`'s tokens (a collision guard). Stop at the first block that is not. **Never reuse
#    the last block**, even if it is cached: at least one token must be computed, or
#    attention would run on zero new tokens (nano-vllm issue #144). So only the first
#    `num_blocks - 1` blocks can be hits.
# 2. **Check there is room, before changing anything.** Cached blocks that are in use
#    cost nothing. Cached blocks that are free must be taken off the free list, so they
#    cost a free block each, as does every other block. Not enough free blocks: raise
#    `OutOfSlotsError` with the pool untouched.
# 3. **Build the table.** A hit gets `ref_count += 1`, and if it was free, it comes off
#    the free list (`pool.free_block_ids.remove(block_id)`). Every other block is
#    `pool.free_block_ids.popleft()`. If that block's old hash still points at it in
#    `hash_to_block`, delete that entry (its memory is about to hold other tokens), then
#    reset it: `ref_count = 1`, `hash = -1`, `token_ids = ()`. If it is a full block,
#    give it its hash and tokens and record it in `hash_to_block`.
#
# `num_cached_tokens` is the number of hit blocks × `block_size`.
#
# ```{admonition} Hint 1: the order of work
# :class: dropdown
# Compute the hashes (task 4.2) and the list of hits first, without touching the pool.
# Then count the cost and raise if needed. Only then change the pool, block by block.
# ```
#
# ```{admonition} Hint 2: the cost
# :class: dropdown
# `needed = num_blocks - (number of hits whose ref_count > 0)`. Compare it with
# `len(pool.free_block_ids)`.
# ```
#
# ```{admonition} Hint 3: stale hashes
# :class: dropdown
# Only delete `hash_to_block[block.hash]` if it maps to *this* block: a newer block with
# the same tokens may have taken the entry over, and that entry must stay.
# ```


# %%
def allocate(pool: BlockPool, token_ids: list[int]) -> tuple[list[int], int]:
    ### BEGIN SOLUTION
    size = pool.block_size
    num_blocks = -(-len(token_ids) // size)
    hashes = block_hashes(token_ids, size)
    hits = []
    for i in range(min(len(hashes), num_blocks - 1)):
        block_id = pool.hash_to_block.get(hashes[i])
        if block_id is None or pool.blocks[block_id].token_ids != tuple(token_ids[i * size : (i + 1) * size]):
            break
        hits.append(block_id)
    needed = num_blocks - sum(1 for block_id in hits if pool.blocks[block_id].ref_count > 0)
    if needed > len(pool.free_block_ids):
        raise OutOfSlotsError(f"token_ids: {needed} free blocks needed, {len(pool.free_block_ids)} free")
    table = []
    for i in range(num_blocks):
        if i < len(hits):
            block = pool.blocks[hits[i]]
            if block.ref_count == 0:
                pool.free_block_ids.remove(block.block_id)
            block.ref_count += 1
        else:
            block = pool.blocks[pool.free_block_ids.popleft()]
            if block.hash != -1 and pool.hash_to_block.get(block.hash) == block.block_id:
                del pool.hash_to_block[block.hash]
            block.ref_count, block.hash, block.token_ids = 1, -1, ()
            if i < len(hashes):
                block.hash, block.token_ids = hashes[i], tuple(token_ids[i * size : (i + 1) * size])
                pool.hash_to_block[block.hash] = block.block_id
        table.append(block.block_id)
    return table, len(hits) * size
    ### END SOLUTION


check("blocks.allocate", allocate)

# %% [markdown]
# ## Try it: what a block cache shares, and what it cannot
#
# Two prompts share their first 6 tokens. With blocks of 4, only the first block is
# shared: the second block differs in its last two tokens, and a block is shared whole
# or not at all. A radix tree would share all 6.

# %%
import traceback

pool = BlockPool(num_blocks=8, block_size=4)
try:
    first = allocate(pool, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    second = allocate(pool, [1, 2, 3, 4, 5, 6, 0, 0, 0])
    print("first request: ", first)
    print("second request:", second)
    print(pool.describe())
except NotImplementedError as error:
    stub = traceback.extract_tb(error.__traceback__)[-1].name  # the function that is still a stub
    task = {"block_hashes": "task 4.2", "allocate": "task 4.4"}.get(stub, "its task")
    print(f"write {stub} ({task}) first: it still raises NotImplementedError")

# %% [markdown]
# ## The real block manager
#
# `minikv.block_manager.BlockManager` is what the checks compared you with. It keeps the
# same three structures, and adds what a server needs around them: a `Sequence` per
# request holding its tokens, its block table and `num_cached_tokens`;
# `can_allocate` for a scheduler to ask first; `append` for decoding, which takes a new
# block when a token opens one and hashes a block the moment it fills; and
# `check_integrity`, which recounts every reference from the block tables.
#
# The same two prompts as above, then three decoded tokens that fill the first
# request's last block, then the first request finishing:

# %%
from minikv.block_manager import BlockManager, Sequence

manager = BlockManager(num_blocks=8, block_size=4)
first = Sequence([1, 2, 3, 4, 5, 6, 7, 8, 9])
second = Sequence([1, 2, 3, 4, 5, 6, 0, 0, 0])
for name, seq in (("first", first), ("second", second)):
    manager.allocate(seq)
    print(f"{name}: block table {seq.block_table}, cached tokens {seq.num_cached_tokens}")

for token in (10, 11, 12):
    manager.append(first, token)
last_block = manager.blocks[first.block_table[-1]]
print(f"first after decoding: {len(first)} tokens, block table {first.block_table}")
print(f"its last block is full and hashed now: tokens {list(last_block.token_ids)}, hashed: {last_block.hash != -1}")

manager.deallocate(first)
print("free list after first finishes:", list(manager.free_block_ids), "(block 0 stays: second uses it)")
manager.check_integrity()
print(manager)

# %% [markdown]
# ## Your block manager in an engine
#
# `minikv.block_engine.BlockEngine` is nano-vllm's serving loop: admit what
# `can_allocate` allows and prefill it from `num_cached_tokens` on, otherwise decode
# every running request, preempting the newest when no block is free. The slot of
# token `t` is `block_table[t // block_size] * block_size + t % block_size`, and the
# model reads and writes K/V there. `LearnerBlockManager` gives the engine your
# `allocate` and `deallocate`, and adds what you did not write: `can_allocate` (your
# `allocate` tried on a copy of the pool) and `append` for decoding.
#
# Three requests share an 8-token system prompt. All three are admitted in the same
# step, so the second and the third hit the two blocks the first has just allocated
# (it is prefilled first, so they are written before they are read). The third prompt
# is 12 tokens, three full blocks, yet only 8 are cached: the last block is always
# computed. Your manager must give the same tokens as minikv's and as `recompute`,
# which caches nothing.

# %%
from minikv.block_engine import make_block_engine
from minikv.engine import recompute
from minikv.exercises.block_engine_adapter import LearnerBlockManager
from minikv.tiny_model import TinyDecoder

model = TinyDecoder(vocab_size=32, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=8, max_positions=64)
system_prompt = [20, 21, 22, 23, 24, 25, 26, 27]
prompts = [[*system_prompt, 1, 2], [*system_prompt, 3], [*system_prompt, 4, 5, 6, 7]]
try:
    yours = LearnerBlockManager(16, 4, allocate=allocate, deallocate=deallocate)
    engine = make_block_engine(model, num_blocks=16, block_size=4, block_manager=yours)
    outputs = engine.generate(prompts, max_new_tokens=6)
    for request in sorted(engine.finished, key=lambda r: r.uid):
        print(f"request {request.uid}: {len(request.prompt)} prompt tokens, {request.cached_tokens} cached")
    assert outputs == make_block_engine(model, 16, 4).generate(prompts, 6), "not the tokens of minikv's manager"
    assert outputs == [recompute(model, p, 6) for p in prompts], "not the tokens of recompute"
    print("the same tokens as minikv's BlockManager and as recompute:", outputs)
except NotImplementedError as error:
    stub = traceback.extract_tb(error.__traceback__)[-1].name
    task = {"block_hashes": "task 4.2", "allocate": "task 4.4", "deallocate": "task 4.3"}.get(stub, "its task")
    print(f"write {stub} ({task}) first: it still raises NotImplementedError")
