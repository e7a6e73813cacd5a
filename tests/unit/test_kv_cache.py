"""Tree verification forward + KV compaction on tiny random HF models (heads/runtime/tree.py,
heads/runtime/kv_cache.py).

One forward of root + tree nodes over a cached prompt must give, at every tree index, the logits of
a plain forward of that node's root path; after ``compact_cache`` keeps an accepted path, the next
token's logits must match a cache-free forward of prompt + path + token.
"""

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
from transformers.cache_utils import Cache, DynamicLayer, DynamicSlidingWindowLayer

from draftsmith.heads.runtime import kv_cache
from draftsmith.heads.runtime.kv_cache import cache_length, compact_cache, crop_cache
from draftsmith.heads.runtime.tree import (
    build_tree_buffers,
    paths_to_parents,
    position_ids,
    verification_mask,
)

PROMPT_LEN = 10
VOCAB = 128
TREE = [[0], [1], [0, 0], [0, 1], [1, 0]]  # tree indices: 1=[0] 2=[1] 3=[0,0] 4=[0,1] 5=[1,0]
SIZES = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=VOCAB,
)
FAMILIES = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}


@pytest.fixture(params=[(f, a) for f in FAMILIES for a in ("eager", "sdpa")], ids=lambda p: f"{p[0]}-{p[1]}")
def model(request):
    family, attn = request.param
    config_cls, model_cls = FAMILIES[family]
    torch.manual_seed(0)
    return model_cls._from_config(config_cls(**SIZES), attn_implementation=attn, dtype=torch.float32).eval()


def _last_logits(model, ids: list[int]) -> torch.Tensor:
    return model(torch.tensor([ids])).logits[0, -1]  # [V]


@torch.no_grad()
def _verify_tree(model):
    """Prefill a prompt, run one tree-verification forward; returns everything the checks need."""
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, VOCAB, (PROMPT_LEN,), generator=g).tolist()
    root, *tokens = torch.randint(0, VOCAB, (6,), generator=g).tolist()
    buffers = build_tree_buffers(paths_to_parents(TREE)[0])
    cache = DynamicCache(config=model.config)
    model(torch.tensor([prompt]), cache=cache, use_cache=True)
    assert cache_length(cache) == PROMPT_LEN
    logits = model(
        torch.tensor([[root] + tokens]),
        attention_mask=verification_mask(buffers.visible, PROMPT_LEN, model.dtype),
        position_ids=position_ids(buffers.depth, PROMPT_LEN),
        cache=cache,
        use_cache=True,
    ).logits[0]  # [n+1, V]
    assert cache_length(cache) == PROMPT_LEN + buffers.n + 1
    return prompt, [root] + tokens, buffers, cache, logits


def _root_path(buffers, j: int) -> list[int]:
    path = [j]
    while path[-1] > 0:
        path.append(buffers.parents[path[-1] - 1] + 1)
    return path[::-1]


@torch.no_grad()
def test_tree_forward_matches_sequential_paths(model):
    prompt, tree_tokens, buffers, _, logits = _verify_tree(model)
    for j in range(buffers.n + 1):
        reference = _last_logits(model, prompt + [tree_tokens[k] for k in _root_path(buffers, j)])
        torch.testing.assert_close(logits[j], reference, atol=1e-5, rtol=0)


@pytest.mark.parametrize("keep", [[0, 2, 5], [0, 1, 4], [0, 2], [0, 1, 3], [0, 1], [0]])
@torch.no_grad()
def test_compacted_cache_continues_the_accepted_path(model, keep):
    prompt, tree_tokens, _, cache, _ = _verify_tree(model)
    compact_cache(cache, PROMPT_LEN, keep)
    assert cache_length(cache) == PROMPT_LEN + len(keep)
    assert all(layer.keys.shape[-2] == PROMPT_LEN + len(keep) for layer in cache.layers)
    nxt = 17
    logits = model(torch.tensor([[nxt]]), cache=cache, use_cache=True).logits[0, -1]  # [V]
    reference = _last_logits(model, prompt + [tree_tokens[k] for k in keep] + [nxt])
    torch.testing.assert_close(logits, reference, atol=1e-5, rtol=0)


def test_contiguous_keep_is_a_plain_crop(monkeypatch):
    cache = DynamicCache()
    keys = torch.randn(1, 2, 8, 4)  # [B, H, T, D]
    cache.update(keys, keys.clone(), 0)
    crops = []
    monkeypatch.setattr(kv_cache, "crop_cache", lambda c, n: (crops.append(n), crop_cache(c, n)))
    compact_cache(cache, prefix_len=3, keep=[0, 1, 2])
    assert crops == [6] and cache_length(cache) == 6
    torch.testing.assert_close(cache.layers[0].keys, keys[:, :, :6])


def test_gather_keeps_prefix_then_entries_in_order():
    cache = DynamicCache()
    keys = torch.arange(9.0).reshape(1, 1, 9, 1)  # [B, H, T, D] value = position
    cache.update(keys, -keys, 0)
    compact_cache(cache, prefix_len=3, keep=[0, 2, 5])
    assert cache.layers[0].keys.flatten().tolist() == [0, 1, 2, 3, 5, 8]
    assert cache.layers[0].values.flatten().tolist() == [0, -1, -2, -3, -5, -8]


def test_crop_cache():
    cache = DynamicCache()
    cache.update(torch.randn(1, 2, 8, 4), torch.randn(1, 2, 8, 4), 0)
    crop_cache(cache, 8)
    assert cache_length(cache) == 8
    crop_cache(cache, 5)
    assert cache_length(cache) == 5
    with pytest.raises(ValueError):
        crop_cache(cache, 6)


@pytest.mark.parametrize("keep", [[2, 1], [0, 0], [0, 9], [-1, 2]])
def test_bad_keep_raises(keep):
    cache = DynamicCache()
    cache.update(torch.randn(1, 2, 8, 4), torch.randn(1, 2, 8, 4), 0)
    with pytest.raises(ValueError):
        compact_cache(cache, prefix_len=3, keep=keep)


def test_wrapped_sliding_window_is_refused():
    cache = Cache(layers=[DynamicSlidingWindowLayer(sliding_window=4)])
    cache.update(torch.randn(1, 2, 8, 4), torch.randn(1, 2, 8, 4), 0)
    with pytest.raises(RuntimeError, match="sliding window"):
        compact_cache(cache, prefix_len=3, keep=[0, 2])


def test_unwrapped_sliding_window_is_compacted():
    cache = Cache(layers=[DynamicSlidingWindowLayer(sliding_window=64)])
    keys = torch.arange(9.0).reshape(1, 1, 9, 1)
    cache.update(keys, keys, 0)
    compact_cache(cache, prefix_len=3, keep=[0, 2, 5])
    assert cache_length(cache) == 6
    assert cache.layers[0].keys.flatten().tolist() == [0, 1, 2, 3, 5, 8]


def test_unknown_layer_type_is_refused():
    class IndexedLayer(DynamicLayer):
        pass

    cache = Cache(layers=[IndexedLayer()])
    cache.update(torch.randn(1, 2, 8, 4), torch.randn(1, 2, 8, 4), 0)
    with pytest.raises(TypeError, match="IndexedLayer"):
        compact_cache(cache, prefix_len=3, keep=[0, 2])
