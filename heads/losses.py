"""Token-level distillation losses shared by every trainable drafter kind.

In the flow: a drafter's `compute_loss` (Medusa heads, EAGLE drafters, draft LMs) compares its
logits at counted positions with the target's distribution there, dense `[N, V]` (online) or sparse
top-k `[N, k]` + indices (offline shards). Every function returns one value per position `[N]`;
the caller masks and averages.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def distill_kl(head_logits: torch.Tensor, target_logits: torch.Tensor,
               target_indices: torch.Tensor | None = None, temperature: float = 1.0) -> torch.Tensor:
    """Per-position forward KL(target ‖ drafter) at `temperature`, scaled by temperature² (Hinton).

    head_logits `[N, V]`; target_logits `[N, V]` (dense) or `[N, k]` with `target_indices [N, k]`
    (sparse top-k: the tokens not kept count as -inf, i.e. the target is the softmax over the k kept).
    Returns `[N]`.
    """
    log_q = F.log_softmax(head_logits.float() / temperature, dim=-1)  # [N, V]
    if target_indices is not None:
        log_q = log_q.gather(-1, target_indices.long())  # [N, k]
    p = F.softmax(target_logits.float() / temperature, dim=-1)  # [N, V] or [N, k]
    # xlogy: a target probability of exactly 0 (logit -inf) contributes 0, not nan
    return (torch.xlogy(p, p) - p * log_q).sum(-1) * temperature**2  # [N]
