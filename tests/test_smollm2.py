"""SmolLM2-135M-Instruct through minikv, against Hugging Face ``transformers`` loading the same GGUF file.

Four claims, each against the independent implementation:

(a) the tokenizer built from the GGUF gives ``transformers``' ids, for plain text
    and for chat-templated conversations;
(b) minikv's Llama gives ``transformers``' logits: measured here at most 5.5e-5
    apart (logits reach about 40) in float32 on a CPU, asserted within ``LOGIT_ATOL``;
(c) greedy outputs served by minikv's engine (shared system prompt served from
    the radix cache, page sizes 1 and 16, preemption in a tight pool) equal
    ``transformers``' ``generate(do_sample=False)`` token for token;
(d) and equal minikv's own ``recompute``.

The test command installs the weights (``scripts/setup.sh``); elsewhere these
tests skip with the install command, except in CI, where a missing file fails.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from helpers import smollm2_or_skip

from minikv.engine import EngineRequest, make_engine, recompute
from minikv.models import LlamaModel, Tokenizer, load_smollm2, smollm2_path

LOGIT_ATOL = 5e-4
"""Measured 5.5e-5 (SmolLM2 in float32, a 37-token chat prompt); ten times that is the bar."""

IM_END = 2
"""``<|im_end|>``: the end of an assistant's turn, the stop token of every request here."""

SYSTEM = "You are a patient teacher. You explain how computers work in short, plain sentences."
QUESTIONS = ["What is a cache?", "Why do servers batch requests?", "What is a page of memory?", "Name a sort."]


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    # Two test workers share two cores: more threads each only make them wait on each other.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def smollm2() -> tuple[LlamaModel, Tokenizer]:
    smollm2_or_skip()
    return load_smollm2(max_positions=512)


@pytest.fixture(scope="module")
def reference():  # type: ignore[no-untyped-def]
    """``transformers``' own model and tokenizer, loaded from the same file (float32)."""
    smollm2_or_skip()
    transformers = pytest.importorskip("transformers")
    path = smollm2_path()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    return model.eval(), tokenizer


def chat(question: str, system: str | None = SYSTEM) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": system}] if system is not None else []
    return [*messages, {"role": "user", "content": question}]


TEXTS = [
    "The KV cache stores keys and values.",
    "In 2024, 1,234,567 requests took 89.5 ms each!",
    "  leading spaces,\ttabs\n\nand blank lines  ",
    "Ünïcödé, 中文的键值缓存, emoji 🙂🚀 and a Ω.",
    "def evict(self, size: int) -> list[int]:\n    return self._heap[:size]  # LRU",
    "<|im_start|>user\nspecial tokens inside text<|im_end|>",
]


def test_tokenizer_gives_transformers_ids(smollm2, reference) -> None:  # type: ignore[no-untyped-def]
    _, ours = smollm2
    _, theirs = reference
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == theirs.encode(text, add_special_tokens=False), text
        assert ours.decode(ids) == text


def test_chat_template_gives_transformers_ids(smollm2, reference) -> None:  # type: ignore[no-untyped-def]
    _, ours = smollm2
    _, theirs = reference
    conversations = [
        chat(QUESTIONS[0]),
        chat(QUESTIONS[1], system=None),  # the template adds SmolLM's own system prompt
        [*chat(QUESTIONS[2]), {"role": "assistant", "content": "A block."}, {"role": "user", "content": "Why?"}],
    ]  # fmt: skip
    for messages in conversations:
        for generation_prompt in (True, False):
            expected = theirs.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=True)
            expected = expected["input_ids"] if isinstance(expected, dict) or hasattr(expected, "keys") else expected
            assert ours.apply_chat_template(messages, add_generation_prompt=generation_prompt) == list(expected)


def test_logits_equal_transformers(smollm2, reference) -> None:  # type: ignore[no-untyped-def]
    model, tokenizer = smollm2
    hf_model, _ = reference
    ids = tokenizer.apply_chat_template(chat("What does a KV cache store, and why does it help?"), True)
    with torch.no_grad():
        expected = hf_model(torch.tensor([ids])).logits[0]
    ours = model.forward(ids)
    assert (ours - expected).abs().max().item() <= LOGIT_ATOL
    assert torch.equal(ours.argmax(-1), expected.argmax(-1))


def hf_greedy(hf_model, prompt: list[int], max_new_tokens: int) -> list[int]:  # type: ignore[no-untyped-def]
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                                eos_token_id=IM_END, pad_token_id=IM_END)  # fmt: skip
    return out[0, len(prompt) :].tolist()


@pytest.fixture(scope="module")
def prompts_and_expected(smollm2, reference):  # type: ignore[no-untyped-def]
    """The chat prompts (a shared system prompt, four questions) and transformers' greedy answers."""
    _, tokenizer = smollm2
    hf_model, _ = reference
    prompts = [tokenizer.apply_chat_template(chat(q), add_generation_prompt=True) for q in QUESTIONS]
    return prompts, [hf_greedy(hf_model, p, 10) for p in prompts]


@pytest.mark.parametrize(
    ("page_size", "num_slots", "preempts"),
    [(1, 400, False), (16, 400, False), (1, 72, True)],
    ids=["page-1", "page-16", "tight-pool"],
)
def test_engine_generates_what_transformers_generates(  # type: ignore[no-untyped-def]
    smollm2, prompts_and_expected, page_size, num_slots, preempts
):
    model, _ = smollm2
    prompts, expected = prompts_and_expected
    engine = make_engine(model, num_pages=num_slots // page_size, page_size=page_size, max_running=4)
    first = engine.submit(EngineRequest(prompts[0], 10, stop_tokens=[IM_END]))
    engine.step()  # its prefill: from here on the system prompt is in the tree
    requests = [first] + [engine.submit(EngineRequest(p, 10, stop_tokens=[IM_END])) for p in prompts[1:]]
    while engine.has_work():
        engine.step()
        engine.check()
    assert [r.output for r in requests] == expected
    # Every later request found the shared system prompt in the cache (whole pages of it).
    shared = next(i for i, (a, b) in enumerate(zip(prompts[0], prompts[1], strict=False)) if a != b)
    assert shared > 20
    assert all(r.cached_tokens >= shared - shared % page_size for r in requests[1:])
    assert (engine.stats.preemptions > 0) == preempts


def test_recompute_generates_what_transformers_generates(smollm2, prompts_and_expected) -> None:  # type: ignore[no-untyped-def]
    model, _ = smollm2
    prompts, expected = prompts_and_expected
    assert recompute(model, prompts[0], 10, stop_tokens=[IM_END]) == expected[0]
