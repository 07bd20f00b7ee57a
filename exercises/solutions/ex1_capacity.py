# %% [markdown]
# # Exercises 1: what the KV cache costs
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/minikv-course/minikv/blob/main/exercises/ex1_capacity.ipynb)
#
# Chapter 1 claimed that a KV cache needs *managing* because it is big: every token of
# every running request keeps a K row and a V row in every layer, and the GPU memory
# left after the model's weights runs out fast. Here you compute those numbers
# yourself, then count what sharing prefixes saves.
#
# **How these exercises work.** Each task describes one function. Write it in the cell
# below the task, where it says `# YOUR CODE HERE`, and run the cell: its last line,
# `check("<exercise id>", your_function)`, runs real cases against minikv's own
# implementation and shows what passed and, if something failed, the *smallest*
# failing case with what was expected and what your function gave. Hints hide in
# dropdowns; open one only when you are stuck. Tasks go from easy to hard.
#
# Besides its hand-made cases, each check draws random inputs from everything the task
# allows (any dtype, any token ids, any order), always the same ones, and shrinks a
# failing one to the smallest it can find, printed with its seed. It also checks that
# your function leaves its arguments as it found them, unless the task says otherwise.
# The reference solutions are in the book's Solutions part: look there after an honest try.

# %%
import torch

from minikv.exercises import check

print("GPU:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none, everything runs on the CPU")

# %% [markdown]
# ## Task 1.1 · `capacity.kv_bytes_per_token` (easy)
#
# Write `kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype) -> int`: the bytes
# one token's KV cache takes, across all layers, for multi-head attention (MHA) and
# grouped-query attention (GQA).
#
# In every layer, attention keeps for each token one K vector and one V vector per KV
# head, each of `head_dim` elements of type `dtype`. GQA changes only how many KV heads
# there are: Llama-3-8B has 32 query heads but only 8 KV heads.
#
# ```{admonition} Hint 1: what to multiply
# :class: dropdown
# Count the elements first: layers × KV heads × `head_dim`, for K, and the same again
# for V. Then multiply by the size of one element.
# ```
#
# ```{admonition} Hint 2: the size of a dtype
# :class: dropdown
# `torch.empty((), dtype=dtype).element_size()` is 4 for `torch.float32` and 2 for
# `torch.float16` and `torch.bfloat16`.
# ```


# %%
def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    ### BEGIN SOLUTION
    element_size = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * num_kv_heads * head_dim * element_size  # 2: one K and one V
    ### END SOLUTION


check("capacity.kv_bytes_per_token", kv_bytes_per_token)

# %% [markdown]
# ## Task 1.2 · `capacity.mla_bytes_per_token` (easy)
#
# DeepSeek-V3 uses *multi-head latent attention* (MLA): instead of K and V per head, each
# layer caches one compressed latent vector of `kv_lora_rank` elements per token, plus a
# small key part of `qk_rope_head_dim` elements that carries the rotary position
# encoding. At decode, SGLang and vLLM attend over the latent itself, folding the
# up-projections to K and V into the query and the output (chapter 1); only prefill may
# expand it into full K and V, as temporaries.
#
# Write `mla_bytes_per_token(num_layers, kv_lora_rank, qk_rope_head_dim, dtype) -> int`.
#
# ```{admonition} Hint
# :class: dropdown
# There is no separate V and no head count here: per layer it is
# `kv_lora_rank + qk_rope_head_dim` elements. Compare the result with task 1.1 for
# Llama-3-8B: MLA stores a 61-layer model's token in about half the bytes.
# ```


# %%
def mla_bytes_per_token(num_layers: int, kv_lora_rank: int, qk_rope_head_dim: int, dtype: torch.dtype) -> int:
    ### BEGIN SOLUTION
    element_size = torch.empty((), dtype=dtype).element_size()
    return num_layers * (kv_lora_rank + qk_rope_head_dim) * element_size
    ### END SOLUTION


check("capacity.mla_bytes_per_token", mla_bytes_per_token)

# %% [markdown]
# ## Task 1.3 · `capacity.tokens_that_fit` (easy)
#
# Write `tokens_that_fit(memory_bytes, bytes_per_token) -> int`: how many whole tokens'
# KV fit in `memory_bytes`. A token whose KV fits only partly does not count: the cache
# cannot keep half a token.
#
# Then look at the numbers: with 20 GiB left for the cache, how many tokens does
# Llama-3-8B hold in bfloat16? How many requests of 4,000 tokens is that?
#
# ```{admonition} Hint
# :class: dropdown
# Round down, with integer division. `round()` and `math.ceil()` both promise memory that
# is not there.
# ```


# %%
def tokens_that_fit(memory_bytes: int, bytes_per_token: int) -> int:
    ### BEGIN SOLUTION
    return memory_bytes // bytes_per_token
    ### END SOLUTION


check("capacity.tokens_that_fit", tokens_that_fit)

# %% [markdown]
# ## Task 1.4 · `capacity.cached_tokens_with_sharing` (medium)
#
# Many requests start with the same tokens: a system prompt, a few-shot preamble, the
# earlier turns of a chat. The K and V of a token depend only on that token and the
# tokens before it, so two prompts that start the same way can share those rows. A perfect prefix cache
# stores one KV row per *distinct prefix*.
#
# Write `cached_tokens_with_sharing(prompts) -> int`: given a list of prompts (each a
# list of token ids), how many KV rows a perfect prefix cache holds for all of them.
# For `[[1, 2, 3], [1, 2, 4]]` the answer is 4: rows for `1`, `1 2`, `1 2 3` and
# `1 2 4`. Without sharing it would be 6.
#
# The checker's answer comes from inserting your prompts into minikv's radix tree
# (chapter 5) and counting what it holds.
#
# ```{admonition} Hint 1: what to count
# :class: dropdown
# The row of the token at position `i` of a prompt is shared exactly with the prompts
# that have the same first `i + 1` tokens. So count the distinct tuples `prompt[:i + 1]`.
# ```
#
# ```{admonition} Hint 2: a trap
# :class: dropdown
# Comparing each prompt only with the one before it undercounts sharing when the list is
# not sorted. Sorted prompts work: the total length minus the common prefix of each
# neighbouring pair is the answer. A set of prefixes works in any order.
# ```


# %%
def cached_tokens_with_sharing(prompts: list[list[int]]) -> int:
    ### BEGIN SOLUTION
    prefixes = {tuple(prompt[: i + 1]) for prompt in prompts for i in range(len(prompt))}
    return len(prefixes)
    ### END SOLUTION


check("capacity.cached_tokens_with_sharing", cached_tokens_with_sharing)

# %% [markdown]
# ## What you have shown
#
# One token of Llama-2-7B costs 512 KiB of KV cache in bfloat16, so a 4,000-token prompt
# costs about 2 GB; grouped-query attention cuts Llama-3-8B to a quarter of that. With
# 20 GiB left for the cache, Llama-3-8B holds 163,840 tokens: forty requests of 4,000
# tokens, and that is all the server can run at once. Sharing prefixes stretches that memory, but
# only if something decides what to keep, what to share and what to free. Chapter 2
# splits that job in two: storage that owns the bytes, and a manager that decides.
