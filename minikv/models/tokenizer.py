"""A byte-level BPE tokenizer and chat template, built from what a GGUF file carries.

A GGUF file holds the tokenizer next to the weights: the vocabulary
(``tokenizer.ggml.tokens``), the merge rules (``tokenizer.ggml.merges``), which
tokens are special (``token_type`` 3, "control"), the name of the
pre-tokenizer (``tokenizer.ggml.pre``) and the chat template as a Jinja string.
:class:`Tokenizer` turns those into a Hugging Face ``tokenizers`` BPE model, so
nothing is downloaded, and renders the chat template with Jinja as Hugging Face
does, so the prompt a server builds is the prompt the model was trained on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..errors import ArgumentError, ArgumentTypeError

CONTROL = 3
"""``tokenizer.ggml.token_type`` of a control token (``<|im_start|>``, ``<|endoftext|>``, ...)."""

PRE_TOKENIZERS = {"smollm": "digits", "gpt2": "plain", "default": "plain"}
"""Which ``tokenizer.ggml.pre`` values this tokenizer reproduces: SmolLM splits every digit apart first."""


class Tokenizer:
    """``encode``, ``decode`` and ``apply_chat_template`` for a GPT-2-style byte-level BPE vocabulary.

    ``special`` token ids (control tokens) are matched whole in the text, never
    split by BPE, and dropped by ``decode(..., skip_special_tokens=True)``.
    """

    def __init__(
        self,
        tokens: Sequence[str],
        merges: Sequence[str],
        special: Iterable[int] = (),
        pre: str = "gpt2",
        chat_template: str | None = None,
        bos_token_id: int | None = None,
        eos_token_id: int | None = None,
    ) -> None:
        try:
            from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
            from tokenizers import Tokenizer as HFTokenizer
        except ImportError:
            raise ImportError(
                "minikv's real-model tokenizer needs the 'tokenizers' package: pip install \"minikv[models]\""
            ) from None
        if pre not in PRE_TOKENIZERS:
            raise ArgumentError(f"pre: unknown pre-tokenizer {pre!r}; known: {sorted(PRE_TOKENIZERS)}")
        self.tokens = list(tokens)
        self.special_ids = frozenset(int(i) for i in special)
        if any(not 0 <= i < len(self.tokens) for i in self.special_ids):
            raise ArgumentError(f"special: ids must be in [0, {len(self.tokens)})")
        self.chat_template = chat_template
        self.bos_token_id, self.eos_token_id = bos_token_id, eos_token_id
        vocab = {token: i for i, token in enumerate(self.tokens)}
        pairs = [(left, right) for left, right in (merge.split(" ", 1) for merge in merges)]
        bpe = HFTokenizer(models.BPE(vocab, pairs, fuse_unk=False, byte_fallback=False))
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        if PRE_TOKENIZERS[pre] == "digits":
            # llama.cpp's "smollm": every digit is a piece of its own, then GPT-2's split.
            digits = pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated")
            bpe.pre_tokenizer = pre_tokenizers.Sequence([digits, byte_level])
        else:
            bpe.pre_tokenizer = byte_level
        bpe.decoder = decoders.ByteLevel()
        bpe.add_special_tokens([AddedToken(self.tokens[i], special=True, normalized=False)
                                for i in sorted(self.special_ids)])  # fmt: skip
        self._bpe = bpe

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special tokens written in the text (``<|im_start|>``) become their ids."""
        if not isinstance(text, str):
            raise ArgumentTypeError(f"text must be a str, got {type(text).__name__}")
        return list(self._bpe.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """The text of ``ids`` (bytes that do not form whole UTF-8 characters show as U+FFFD)."""
        ids = [int(i) for i in ids]
        if any(not 0 <= i < self.vocab_size for i in ids):
            raise ArgumentError(f"ids: token ids must be in [0, {self.vocab_size})")
        return str(self._bpe.decode(ids, skip_special_tokens=skip_special_tokens))

    def token_text(self, token_id: int) -> str:
        """One token as readable text (the drawings' labels): its bytes decoded, nothing skipped."""
        return self.decode([token_id])

    def render_chat(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = False) -> str:
        """The chat template applied to ``messages`` (``[{"role": ..., "content": ...}, ...]``), as text."""
        if self.chat_template is None:
            raise ArgumentError("this tokenizer has no chat template")
        if not isinstance(messages, Sequence) or not all(
            isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages
        ):
            raise ArgumentTypeError("messages must be a list of {'role': str, 'content': str} dicts")
        text = _jinja_template(self.chat_template).render(
            messages=list(messages),
            add_generation_prompt=add_generation_prompt,
            bos_token=self._text_of(self.bos_token_id),
            eos_token=self._text_of(self.eos_token_id),
        )
        return str(text)

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = False
    ) -> list[int]:
        """Token ids of the chat template applied to ``messages`` (what a chat server prefills)."""
        return self.encode(self.render_chat(messages, add_generation_prompt))

    def _text_of(self, token_id: int | None) -> str:
        return "" if token_id is None else self.tokens[token_id]

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, special={len(self.special_ids)})"


def _jinja_template(source: str) -> Any:
    """Compile a chat template as Hugging Face does: a sandbox, blocks trimmed."""
    try:
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise ImportError("chat templates need the 'jinja2' package: pip install \"minikv[models]\"") from None

    def raise_exception(message: str) -> None:
        raise ArgumentError(f"chat template: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(source)
