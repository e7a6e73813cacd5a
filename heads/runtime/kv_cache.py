"""The target's cache through speculative decoding: keep the accepted path, roll the rest back.

Where it sits: the decoder appends the whole tree (root + n nodes, tree-index order, see ``tree.py``) to a
``DynamicCache`` in one verification forward; ``verify.py`` picks the accepted tree indices; ``compact_cache``
then leaves ``prefix + kept entries`` so the next forward continues from the accepted path as if it had been
decoded token by token.

Which caches: the layer kinds are the ones transformers builds for the config (`layer_kinds`, read with
transformers' own `get_layer_types_and_kwargs`, so a window declared by `sliding_window` alone, as Mistral
does, is seen as well as one listed in `layer_types`).

- attention layers hold ``keys`` / ``values`` ``[B, kv_heads, T, head_dim]`` (MLA: its latent and rotary
  parts, with different last dims); T goes from ``prefix_len + n + 1`` to ``prefix_len + len(keep)``.
  Sliding-window layers are built as plain layers (``new_cache``): a sliding layer drops what leaves its
  window, so a rejected draft would push out positions it can never give back; the window lives in the mask
  instead.
- recurrent layers (gated delta net, Mamba-2, short convolutions: transformers' ``LinearAttentionLayer``) hold
  a conv window and a state that cannot be cut back. ``record`` switches on transformers' past recording
  before a verification forward (the state after every verified token is kept), and ``crop_cache`` then
  restores the state after the last kept token; only a prefix of the appended tokens can be kept, so a tree is
  verified on such a target one root-to-leaf path per batch row (eval/decode/decoder.py) and the accepted row
  is kept (``keep_row``).
- layers that hold nothing of their own (shared KV, MoE / MLP blocks: ``DummyLayer``) are skipped.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import (
    Cache,
    DummyLayer,
    DynamicLayer,
    DynamicSlidingWindowLayer,
    LinearAttentionAndFullAttentionLayer,
    LinearAttentionAndSlidingWindowAttentionLayer,
    LinearAttentionCacheLayerMixin,
    get_layer_types_and_kwargs,
)

SLIDING = ("sliding_attention", "hybrid_sliding")  # transformers' layer types with a window
RECURRENT = ("linear_attention", "conv", "hybrid", "hybrid_sliding")  # with a conv / recurrent state


def text_config(config):
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def layer_kinds(config) -> list[str]:
    """The cache layer type of every decoder layer, as transformers builds the cache for `config`."""
    return list(get_layer_types_and_kwargs(text_config(config))[0])


def sliding_window(config) -> int | None:
    """The window of a model with sliding-window layers, however declared (`layer_types`, or `sliding_window`
    alone, Mistral-style), else None."""
    kinds, kwargs = get_layer_types_and_kwargs(text_config(config))
    windows = [kw.get("sliding_window") for kind, kw in zip(kinds, kwargs) if kind in SLIDING]
    return min(windows) if windows else None


def masks_by_layer_type(config) -> bool:
    """The model reads one attention mask per layer type (a dict keyed by `config.layer_types`), not one
    tensor."""
    return getattr(text_config(config), "layer_types", None) is not None


def recurrent(config) -> bool:
    """The model has layers with a recurrent state (linear attention, state-space or convolution layers)."""
    return any(kind in RECURRENT for kind in layer_kinds(config))


def new_cache(config) -> DynamicCache:
    """The cache transformers builds for `config`, with every sliding-window layer built as a plain one (the
    module doc says why; the window is applied by the attention mask, heads/runtime/tree.py `tree_mask`)."""
    cache = DynamicCache(config=text_config(config))
    for i, layer in enumerate(cache.layers):
        if type(layer) is DynamicSlidingWindowLayer:
            cache.layers[i] = DynamicLayer()
        elif type(layer) is LinearAttentionAndSlidingWindowAttentionLayer:
            cache.layers[i] = LinearAttentionAndFullAttentionLayer(number_of_states=layer.number_of_states)
    return cache


def record(cache: Cache, tokens: int, short: bool = False) -> None:
    """Before a forward of `tokens` positions some of which may be rolled back: recurrent layers keep the
    state after each of them (transformers' past recording; a no-op on caches without recurrent layers).
    `short`: the forward runs inside `short_scan.recorded` with its short scans, which hand the cache every
    token's state themselves, so the model is asked for no per-token recording (`crop_cache` checks they all
    came)."""
    if any(isinstance(layer, LinearAttentionCacheLayerMixin) for layer in cache.layers):
        cache.activate_past_recording(recurrent_states_to_keep=0 if short else max(1, tokens))
        cache.draftsmith_short_record = tokens if short else None


def cache_length(cache: Cache) -> int:
    """Number of positions the cache holds (an int: a recurrent layer's count is a tensor updated in
    place)."""
    return int(cache.get_seq_length())


def recording(cache: Cache) -> bool:
    return any(getattr(layer, "record_past", False) for layer in cache.layers)


def _check_short_record(cache: Cache) -> None:
    """After a `record(..., short=True)` forward of T tokens: every recurrent layer holds T states to roll
    back to (a layer whose scan the short scans did not serve holds one: a crop would restore a wrong
    state)."""
    tokens = getattr(cache, "draftsmith_short_record", None)
    if tokens is None:
        return
    for i, layer in enumerate(cache.layers):
        if not isinstance(layer, LinearAttentionCacheLayerMixin):
            continue
        for state, ready in layer.is_recurrent_states_initialized.items():
            held = len(layer.recurrent_states_history[state]) if ready else tokens
            if held != tokens:
                raise RuntimeError(
                    f"cache layer {i} holds {held} recurrent states after a verification of {tokens} tokens: "
                    "its scan was not served by heads/runtime/short_scan.py, and it cannot be rolled back; "
                    "DRAFTSMITH_SHORT_SCANS=0 verifies through transformers' own past recording instead")
    cache.draftsmith_short_record = None


def crop_cache(cache: Cache, length: int) -> None:
    """Keep the first ``length`` positions (a recording cache is cropped even to its own length: that ends the
    recording of the last forward and trims the recurrent layers' conv windows)."""
    current = cache_length(cache)
    if not 0 <= length <= current:
        raise ValueError(f"cannot crop a cache of {current} positions to {length}")
    _check_short_record(cache)
    if length < current or recording(cache):
        # transformers 5 takes a negative count of positions to drop (a positive value is refused).
        cache.crop(length - current)


def keep_row(cache: Cache, row: int, length: int) -> None:
    """A cache of one verification's branch rows (decoder: a tree on a recurrent target) -> the one row that
    holds the accepted path, cut to ``length`` positions. Cropped first: the recorded states are kept per
    forward, and selecting rows does not select them."""
    crop_cache(cache, length)
    cache.reorder_cache(torch.tensor([row]))


def expand(cache: Cache, rows: int) -> None:
    """One sequence's cache repeated over `rows` batch rows (each row then continues on its own)."""
    if rows > 1:
        cache.reorder_cache(torch.zeros(rows, dtype=torch.long))


def _check_compactable(layer: object, index: int, total: int) -> None:
    if type(layer) not in (DynamicLayer, DynamicSlidingWindowLayer):  # subclasses keep state a gather desyncs
        raise TypeError(
            f"compact_cache: cache layer {index} is a {type(layer).__name__}; only plain attention layers "
            "(DynamicLayer, heads/runtime/kv_cache.py new_cache) can drop rejected tree entries"
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
        if isinstance(layer, DummyLayer) or not getattr(layer, "is_initialized", False):
            continue  # layers that share another layer's KV (or hold none) have nothing of their own
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
        if isinstance(layer, DynamicSlidingWindowLayer):  # a window not yet passed (new_cache builds none)
            layer.cumulative_length = new_len


def repack_cache(cache: Cache, valid: torch.Tensor) -> torch.Tensor:
    """Gather every row's valid slots to the right end of a cache of max-valid-count slots; returns the new
    `valid [B, L']`. Order within a row is kept, so the cache reads as if it had been left-padded."""
    length = int(valid.sum(1).max())
    # stable sort of 0/1 flags puts a row's holes first and its valid slots after them, in order
    # [B, L']
    index = torch.sort(valid.to(torch.int8), dim=1, stable=True).indices[:, valid.shape[1] - length:]
    for layer in cache.layers:
        if isinstance(layer, DummyLayer) or not getattr(layer, "is_initialized", False):
            continue

        def gathered(x):  # keys and values apart: MLA caches a latent and a rotary part of other widths
            B, H, _, D = x.shape
            return x.gather(2, index[:, None, :, None].expand(B, H, length, D))  # [B, H, L', D]

        layer.keys, layer.values = gathered(layer.keys), gathered(layer.values)
    return valid.gather(1, index)  # [B, L']


def check_cache_layers(cache: Cache) -> None:
    """Holes need plain per-slot layers: a sliding window would count holes as tokens."""
    for i, layer in enumerate(cache.layers):
        if isinstance(layer, DummyLayer) or not getattr(layer, "is_initialized", False):
            continue
        if type(layer) is not DynamicLayer:
            raise TypeError(f"batched decoding: cache layer {i} is a {type(layer).__name__}; only "
                            "full-attention DynamicLayer caches can hold masked holes (sliding-window and "
                            "recurrent targets: use batch size 1 with eval/decode/decoder.py)")
