"""Keep only the accepted path of a draft tree in a transformers KV cache.

Where it sits: the decoder appends the whole tree (root + n nodes, tree-index order, see
``tree.py``) to a ``DynamicCache`` in one verification forward; ``verify.py`` picks the accepted
tree indices; ``compact_cache`` then leaves ``prefix + kept entries`` so the next forward continues
from the accepted path as if it had been decoded token by token.

Shapes: each cache layer holds ``keys`` / ``values`` ``[B, kv_heads, T, head_dim]``; T goes from
``prefix_len + n + 1`` to ``prefix_len + len(keep)``. Sliding-window targets decode on a cache of plain
layers (``new_cache``): the window lives in the mask, so compaction never loses a position it needs.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer, DynamicSlidingWindowLayer

# Layers whose keys/values are plain per-position tensors. Subclasses are not assumed to be:
# indexed (DSA), quantized and linear-attention layers keep extra state a gather would desync.
_COMPACTABLE = (DynamicLayer, DynamicSlidingWindowLayer)


def sliding_window(config) -> int | None:
    """The window of a model with sliding-window layers (`layer_types` holding "sliding_attention"), else None."""
    types = getattr(config, "layer_types", None) or []
    return getattr(config, "sliding_window", None) if "sliding_attention" in types else None


def new_cache(config) -> DynamicCache:
    """A cache for a loop that compacts and crops: plain per-position layers for every layer. A sliding-window
    layer drops the positions that leave its window, so a rejected tree would push out positions it can never
    give back; with full layers the window is applied by the attention mask instead (`heads/runtime/tree.py tree_mask`)."""
    return DynamicCache() if sliding_window(config) else DynamicCache(config=config)


def cache_length(cache: Cache) -> int:
    """Number of positions the cache holds."""
    return cache.get_seq_length()


def crop_cache(cache: Cache, length: int) -> None:
    """Keep the first ``length`` positions."""
    current = cache_length(cache)
    if not 0 <= length <= current:
        raise ValueError(f"cannot crop a cache of {current} positions to {length}")
    if length < current:
        # transformers 5 takes a negative count of positions to drop (a positive value is refused).
        cache.crop(length - current)


def _check_compactable(layer: object, index: int, total: int) -> None:
    if type(layer) not in _COMPACTABLE:
        raise TypeError(
            f"compact_cache: cache layer {index} is a {type(layer).__name__}; only DynamicLayer and "
            "unwrapped DynamicSlidingWindowLayer can drop rejected tree entries"
        )
    if layer.keys.shape[-2] != total:
        raise RuntimeError(
            f"compact_cache: cache layer {index} holds {layer.keys.shape[-2]} positions instead of {total} "
            "(a sliding window that has already wrapped); its dropped positions cannot be restored"
        )


def compact_cache(cache: Cache, prefix_len: int, keep: list[int]) -> None:
    """Drop the rejected tree entries: the cache ends as prefix + the ``keep`` entries, in order.

    ``keep`` are ascending tree indices (0 = root) among the ``n + 1`` entries appended after
    ``prefix_len`` positions. In place on the cache's layers.
    """
    total = cache_length(cache)
    appended = total - prefix_len
    if appended < 1:
        raise ValueError(f"cache holds {total} positions, no tree entries after prefix_len={prefix_len}")
    if any(b <= a for a, b in zip(keep, keep[1:])) or (keep and not 0 <= keep[0] <= keep[-1] < appended):
        raise ValueError(f"keep must be strictly ascending tree indices in 0..{appended - 1}, got {keep}")
    new_len = prefix_len + len(keep)
    if keep == list(range(len(keep))):
        crop_cache(cache, new_len)
        return
    source = torch.tensor(keep, dtype=torch.long) + prefix_len  # [m] positions to keep after the prefix
    on_device: dict[torch.device, torch.Tensor] = {}
    for i, layer in enumerate(cache.layers):
        if not getattr(layer, "is_initialized", False):
            continue  # layers that share another layer's KV hold nothing of their own
        _check_compactable(layer, i, total)
        device = layer.keys.device
        if device not in on_device:
            on_device[device] = source.to(device)
        index = on_device[device]
        # Advanced indexing copies first, so writing the kept entries over the tree is alias-safe.
        layer.keys[:, :, prefix_len:new_len] = layer.keys[:, :, index]  # [B, H, m, D]
        layer.values[:, :, prefix_len:new_len] = layer.values[:, :, index]  # [B, H, m, D]
        layer.keys = layer.keys[:, :, :new_len]  # [B, H, prefix_len+m, D]
        layer.values = layer.values[:, :, :new_len]  # [B, H, prefix_len+m, D]
        if isinstance(layer, DynamicSlidingWindowLayer):
            layer.cumulative_length = new_len


def repack_cache(cache: Cache, valid: torch.Tensor) -> torch.Tensor:
    """Gather every row's valid slots to the right end of a cache of max-valid-count slots; returns the new
    `valid [B, L']`. Order within a row is kept, so the cache reads as if it had been left-padded."""
    length = int(valid.sum(1).max())
    # stable sort of 0/1 flags puts a row's holes first and its valid slots after them, in order
    index = torch.sort(valid.to(torch.int8), dim=1, stable=True).indices[:, valid.shape[1] - length:]  # [B, L']
    for layer in cache.layers:
        if getattr(layer, "is_initialized", False):
            B, H, _, D = layer.keys.shape
            gather = index[:, None, :, None].expand(B, H, length, D)  # [B, H, L', D]
            layer.keys, layer.values = layer.keys.gather(2, gather), layer.values.gather(2, gather)
    return valid.gather(1, index)  # [B, L']


def check_cache_layers(cache: Cache) -> None:
    """Holes need plain per-slot layers: a sliding window would count holes as tokens."""
    for i, layer in enumerate(cache.layers):
        if getattr(layer, "is_initialized", False) and type(layer) is not DynamicLayer:
            raise TypeError(f"batched decoding: cache layer {i} is a {type(layer).__name__}; only full-attention "
                            "DynamicLayer caches can hold masked holes (sliding-window targets: use batch size 1 "
                            "with eval/decode/decoder.py)")
