"""EAGLE's settings and the layer it is built from: `drafter.eagle` (`EagleConfig`, EAGLE-1's loss weights),
the dynamic trees `draftsmith plan` tries for EAGLE-1 and EAGLE-3 (`eagle_serving_candidates`), and
`drafter_config`: the one-layer Llama config sized to the target (its widths, heads, head size, norm epsilon
and RoPE) that heads/eagle/model.py, heads/eagle/eagle3.py and heads/dflash/model.py build their layers from.

In the flow: the recipe's `drafter:` section -> `EagleConfig` (heads/kind.py's row for `eagle`); the target's
config (`text_config` of a loaded target) -> `drafter_config` -> a `LlamaConfig` (sdpa, fp32 weights) whose
`hidden_size` is the q/k/v input width (H, or 2H for EAGLE-3's [embed, hidden]).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from draftsmith.heads.settings import KindSettings


def eagle_serving_candidates() -> list[dict]:
    """EAGLE-2 dynamic trees `draftsmith plan` tries (top-k, depth, nodes): from a 1-token chain to the
    16-node GPU tree, one with a confidence stop, two with a prompt-lookup branch (EAGLE-1 and EAGLE-3)."""
    shapes = [(1, 1, 1), (1, 2, 2), (1, 3, 3), (1, 4, 4), (2, 3, 4), (2, 4, 6), (3, 4, 8), (4, 5, 12),
              (4, 6, 16)]
    out = [{"tree_topk": k, "num_speculative_tokens": d, "tree_nodes": n} for k, d, n in shapes]
    return out + [{"tree_topk": 2, "num_speculative_tokens": 4, "tree_nodes": 6,
                   "confidence_threshold": 0.05},
                  {"tree_topk": 1, "num_speculative_tokens": 3, "tree_nodes": 3, "lookup_branch": 4},
                  {"tree_topk": 2, "num_speculative_tokens": 4, "tree_nodes": 6, "lookup_branch": 4}]


@dataclass
class EagleConfig(KindSettings):
    """`drafter.eagle` (EAGLE-1): loss = feature_weight x smooth-L1 on the feature + logit_weight x
    divergence."""

    fc_bias: bool = False  # vLLM/SGLang build fc without bias; true = EAGLE-1 repo's original
    feature_weight: float = 1.0  # smooth-L1 on predicted features (EAGLE-1's v-loss)
    logit_weight: float = 0.1  # weight of the KL/CE on the drafter's logits (EAGLE-1's p-loss)

    def serving_candidates(self, folder_config: dict) -> list[dict]:
        return eagle_serving_candidates()

    def feature_layers(self, target_config) -> list:
        return ["final"]


def drafter_config(target_config, attention_width: int | None = None):
    """The one-layer Llama config an EAGLE drafter's layer is built from, sized to the target (sdpa, fp32).

    Both serving engines build an EAGLE drafter's layer as a Llama layer whatever the target family (vLLM
    llama_eagle.py / llama_eagle3.py, SGLang llama_eagle.py / llama_eagle3.py: heads/engines.py), so it is
    trained as one: the target's widths, heads, head size, norm epsilon and RoPE, no attention bias, SiLU.
    `attention_width` widens the q/k/v input (EAGLE-3's [embed, hidden] = 2H) at the same head size."""
    from transformers import LlamaConfig

    tc = target_config
    # a heterogeneous config (Gemma-4: head sizes per layer) answers per-layer fields per layer: the last's
    layer = (getattr(tc, "per_layer_config", None) or [tc])[-1]
    heads = layer.num_attention_heads
    head_dim = getattr(layer, "head_dim", None) or tc.hidden_size // heads
    rope = dict(getattr(tc, "rope_parameters", None) or {"rope_type": "default",
                                                         "rope_theta": getattr(tc, "rope_theta", 1e4)})
    if "full_attention" in rope:  # per-layer-type RoPE (Gemma 3): the global layers'
        rope = dict(rope["full_attention"])
    cfg = LlamaConfig(vocab_size=tc.vocab_size, hidden_size=attention_width or tc.hidden_size,
                      intermediate_size=layer.intermediate_size, num_hidden_layers=1,
                      num_attention_heads=heads,
                      num_key_value_heads=getattr(layer, "num_key_value_heads", None) or heads,
                      head_dim=head_dim, hidden_act="silu",
                      max_position_embeddings=getattr(tc, "max_position_embeddings", 4096),
                      initializer_range=getattr(tc, "initializer_range", 0.02),
                      rms_norm_eps=getattr(layer, "rms_norm_eps", None) or 1e-6, rope_parameters=rope,
                      attention_bias=False, mlp_bias=False, tie_word_embeddings=False,
                      pad_token_id=getattr(tc, "pad_token_id", None))
    # trainable weights in fp32 whatever the target's dtype (autocast does the rest)
    cfg.dtype = torch.float32
    cfg._attn_implementation = "sdpa"  # boolean masks (TTT, trees) go straight to torch SDPA
    return cfg


def text_config(target_model: nn.Module):
    config = target_model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config
