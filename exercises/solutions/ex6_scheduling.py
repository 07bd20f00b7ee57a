# %% [markdown]
# # Exercises 6: which request goes first
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/minikv-course/minikv/blob/main/exercises/ex6_scheduling.ipynb)
#
# The engine of [chapter 8](../book/08_scheduler.ipynb) keeps a waiting queue. At the start
# of every step it asks its *scheduling policy* to order that queue, then admits requests from
# the front until one does not fit. First come, first served (FCFS) keeps arrival order. SGLang's
# defining idea next to its radix cache is to admit by what is cached instead: the request with
# the *longest cached prefix* first (its `lpm` policy), so that a prefix still in the tree is used
# before an older request's allocation evicts it.
#
# Here you write that policy, and minikv's engine runs it: your function becomes the engine's
# policy through `make_engine(policy=...)`. Then you fix the starvation it causes.
#
# **How these exercises work.** Each task describes one function. Write it where it says
# `# YOUR CODE HERE` and run the cell: `check("<exercise id>", your_function)` runs real cases
# against minikv's own policies (`minikv/scheduling.py`) and shows the *smallest* failing case.
# The last cases of each check run your function inside the engine on the course's workloads: every
# output must equal a recompute from scratch, and the prompt tokens computed must be the ones
# minikv's policy computes. Hints hide in dropdowns.

# %%
import torch

from minikv import RadixCacheManager
from minikv.engine import EngineRequest, make_engine, recompute
from minikv.exercises import check
from minikv.scheduling import SchedulingPolicy
from minikv.tiny_model import TinyDecoder

print("GPU:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none, everything runs on the CPU")

# %% [markdown]
# ## Task 6.1 · `scheduling.cached_prefix_len` (easy)
#
# To order the queue, a policy needs each waiting request's cached prefix: how many leading
# tokens admission would take from the tree right now. Two details decide the number:
#
# * admission matches `ids[:-1]`, never the last token: the model must run on at least one
#   token to produce the logits of the next, so a prompt cached whole still computes its last token;
# * with `page_size > 1` only whole pages match.
#
# And asking must change nothing. `cache.match_prefix` would stamp the matched path with the
# current time (so the least recently used order changes just because someone *looked*) and
# split a node where the match ends inside it. A policy that asked every waiting request at
# every step that way would reorder eviction. A `RadixCacheManager` has the read-only half of
# its walk: `cache.find(ids)` returns `(node, matched_length, cut)` and changes nothing; the
# matched length already counts whole pages only.
#
# Write `cached_prefix_len(cache, ids) -> int`, where `cache` is a `RadixCacheManager` and `ids`
# a 1-D `int64` NumPy array of token ids (a request's prompt, then the tokens it generated).
#
# ```{admonition} Hint
# :class: dropdown
# `cache.find(ids[:-1])[1]`. Everything else the match needs (pages, partial nodes) `find`
# already does.
# ```


# %%
def cached_prefix_len(cache: RadixCacheManager, ids) -> int:
    ### BEGIN SOLUTION
    _, matched, _ = cache.find(ids[:-1])  # the last token is always computed
    return matched
    ### END SOLUTION


check("scheduling.cached_prefix_len", cached_prefix_len)

# %% [markdown]
# ## Task 6.2 · `scheduling.lpm_order` (medium)
#
# Write `lpm_order(waiting, cache) -> list`: the waiting requests, longest cached prefix first.
#
# * `waiting` is a list of `EngineRequest`s in queue order (the front first). A request's
#   `token_ids` are its prompt and the tokens it generated so far: a request that was
#   preempted comes back with both, and everything it computed may still be in the tree.
# * Requests with equal matches keep their order in `waiting`: the queue's own order, which is
#   arrival order except that a preempted request goes back to the front. Do not sort by
#   `request.uid` (the arrival number): that would put a preempted request behind newer ones.
# * Return a new list holding the same request objects, each once. Leave `waiting` and the
#   tree as they are.
#
# The checker compares your order with minikv's `LongestPrefixMatch` on queues built for the
# edge cases (an empty queue, ties, requests that match nothing, prompts cached whole, pages),
# then plugs your function into the engine on drawn workloads.
#
# ```{admonition} Hint 1
# :class: dropdown
# Python's `sorted` is *stable*: items with equal keys keep their order. So the whole rule is one
# key: the cached prefix, largest first.
# ```
#
# ```{admonition} Hint 2
# :class: dropdown
# `sorted(waiting, key=lambda r: -cached_prefix_len(cache, r.token_ids))`. (`reverse=True` keeps
# equal items in order too; reversing a sorted list afterwards does not.)
# ```


# %%
def lpm_order(waiting: list[EngineRequest], cache: RadixCacheManager) -> list[EngineRequest]:
    ### BEGIN SOLUTION
    return sorted(waiting, key=lambda request: -cached_prefix_len(cache, request.token_ids))
    ### END SOLUTION


check("scheduling.lpm_order", lpm_order)

# %% [markdown]
# ## Your policy in the engine
#
# A policy is a small object with one method, `order(waiting, cache)`: subclass
# `SchedulingPolicy` and call your function. The engine below serves two system prompts
# whose requests arrive alternately, one request at a time, in a pool that holds only a little
# more than one request. Under FCFS each prompt evicts the other's prefix before it is used
# again; longest-prefix-first serves the requests of the prefix still in the tree first.


# %%
class MyLongestPrefixMatch(SchedulingPolicy):
    name = "mine"

    def order(self, waiting, cache):
        return lpm_order(waiting, cache)


model = TinyDecoder(max_positions=64)
system_a, system_b = list(range(1, 13)), list(range(13, 25))
prompts = [(system_a if i % 2 == 0 else system_b) + [25 + i] for i in range(8)]
try:
    for policy in ("fcfs", MyLongestPrefixMatch()):
        engine = make_engine(model, num_pages=20, max_running=1, policy=policy)
        outputs = engine.generate(prompts, max_new_tokens=3)
        assert outputs == [recompute(model, prompt, 3) for prompt in prompts]
        print(
            f"{engine.policy.name:>5}: {engine.stats.prefill_tokens} prompt tokens computed of "
            f"{engine.stats.prompt_tokens}, in {engine.stats.steps} steps; outputs equal recompute"
        )
except NotImplementedError:
    print("✗ lpm_order (or cached_prefix_len) is still the stub: write it, then run this cell again.")

# %% [markdown]
# ## Task 6.3 · `scheduling.aging_order` (medium)
#
# Longest-prefix-first has a price. A request that matches nothing waits as long as requests
# that match keep arriving: it can wait forever (SGLang's issue 31954 reports it). The fix here is
# *aging*: every step a request has waited counts as cached tokens, so its priority is
#
#     cached_prefix_len + tokens_per_step * request.waited_steps
#
# and a request that has waited `L / tokens_per_step` steps longer than a newcomer outranks it
# whatever their matches (`L`: the longest prompt). Its wait is bounded.
#
# Write `aging_order(waiting, cache, tokens_per_step) -> list`: the waiting requests, highest
# priority first; equal priorities keep their order in `waiting`. `request.waited_steps` is kept by
# the engine (steps spent in the queue, after a preemption too). The same rules as task 6.2 hold, and the
# engine cases compare with minikv's `Aging` policy: one of them is a workload where
# longest-prefix-first starves a request.
#
# ```{admonition} Hint
# :class: dropdown
# The same `sorted` as in task 6.2, with the priority above as the key, negated.
# ```


# %%
def aging_order(waiting: list[EngineRequest], cache: RadixCacheManager, tokens_per_step: float) -> list[EngineRequest]:
    ### BEGIN SOLUTION
    def priority(request: EngineRequest) -> float:
        return cached_prefix_len(cache, request.token_ids) + tokens_per_step * request.waited_steps

    return sorted(waiting, key=lambda request: -priority(request))
    ### END SOLUTION


check("scheduling.aging_order", aging_order)

# %% [markdown]
# ## What you have built
#
# A scheduling policy only *orders*; the engine still admits from the front and never skips a
# request that does not fit. That is why the whole policy is a sort key, and why the
# details are the match itself: `ids[:-1]`, whole pages, a walk that reads without stamping, and
# a stable order for ties. Compare yours with `minikv/scheduling.py`, which also has SGLang's
# `dfs-weight` (requests that share a path admitted together). SGLang's `lpm` falls back to
# FCFS when more than 128 requests wait, because matching every waiting request at every step
# costs time too.
