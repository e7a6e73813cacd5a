"""DFlash's draft decoder layer, as vLLM 0.32.0 builds it (vllm/model_executor/models/qwen3_dflash.py
`DFlashQwen3DecoderLayer`, `DFlashQwen3Attention`): pre-norm attention and a SiLU-gated MLP, per-head q/k
RMSNorm before a neox-style RoPE, no biases; parameter names are vLLM's, so heads/dflash/export.py copies them
key for key.

In the flow: heads/dflash/model.py `DFlashDrafter` stacks `num_layers` of these; each layer's attention
projects the fused target context to keys and values once (`DFlashAttention.kv`: `[B, T, H]` ->
`[B, nkv, T, hd]` each), then the block's queries `x [B, Q, H]` attend to those context keys and their own
(`mask [B, 1, Q, T + Q]` bool, True = see) -> `[B, Q, H]`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def rms_norm(width: int, eps: float) -> nn.Module:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    return LlamaRMSNorm(width, eps=eps)  # weight * x / rms(x), in fp32: vLLM's RMSNorm


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox-style rotation (vLLM get_rope is_neox_style=True) of `x [B, heads, S, hd]` by
    `cos/sin [B, S, hd]`."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]


class DFlashAttention(nn.Module):
    """vLLM's DFlashQwen3Attention: q/k/v/o projections without bias, per-head q_norm / k_norm before RoPE."""

    def __init__(self, c):
        super().__init__()
        H, self.nh = c.hidden_size, c.num_attention_heads
        self.nkv, self.hd = c.num_key_value_heads, c.head_dim
        self.q_proj = nn.Linear(H, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(H, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(H, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, H, bias=False)
        self.q_norm, self.k_norm = rms_norm(self.hd, c.rms_norm_eps), rms_norm(self.hd, c.rms_norm_eps)

    def kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (normed, rotated) and values `[B, nkv, S, hd]` of inputs `x [B, S, H]`."""
        B, S, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(B, S, self.nkv, self.hd)).transpose(1, 2)
        return rope(k, cos, sin), self.v_proj(x).view(B, S, self.nkv, self.hd).transpose(1, 2)

    def forward(self, x, context: tuple[torch.Tensor, torch.Tensor], cos, sin, mask) -> torch.Tensor:
        """Block queries `x [B, Q, H]` over the context's keys/values and their own -> `[B, Q, H]`."""
        B, Q, _ = x.shape
        # [B, nh, Q, hd]
        q = rope(self.q_norm(self.q_proj(x).view(B, Q, self.nh, self.hd)).transpose(1, 2), cos, sin)
        k, v = self.kv(x, cos, sin)
        k, v = torch.cat([context[0], k], dim=2), torch.cat([context[1], v], dim=2)  # [B, nkv, S + Q, hd]
        group = self.nh // self.nkv
        out = F.scaled_dot_product_attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1),
                                             attn_mask=mask)  # [B, nh, Q, hd]
        return self.o_proj(out.transpose(1, 2).reshape(B, Q, self.nh * self.hd))


class DFlashMLP(nn.Module):
    def __init__(self, hidden: int, inner: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DFlashLayer(nn.Module):
    """vLLM's DFlashQwen3DecoderLayer: pre-norm attention and MLP, each added to the residual stream."""

    def __init__(self, c):
        super().__init__()
        self.self_attn = DFlashAttention(c)
        self.mlp = DFlashMLP(c.hidden_size, c.intermediate_size)
        self.input_layernorm = rms_norm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = rms_norm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x, context, cos, sin, mask) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), context, cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))
