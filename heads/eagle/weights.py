"""EAGLE's training-time-test steps weighted by exact acceptance (`drafter.eagle3.step_weights: acceptance`,
heads/eagle/model.py `compute_loss`): each step at each position weighs its share of its chain's expected
accepted length (heads/losses.py `chain_weights`, the weights DFlash's slots take).
"""

from __future__ import annotations

import torch

from draftsmith.heads.losses import chain_weights, to_draft_index


def step_masks(counted: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """The positions `[B, n]` each unrolled step counts: `counted`, less t < j (no real feature left)."""
    masks = []
    for j in range(steps):
        mask = counted.clone()
        mask[:, :j] = False
        masks.append(mask)
    return masks


@torch.no_grad()
def acceptance_weights(drafter, logits: list[torch.Tensor], masks: list[torch.Tensor], labels: torch.Tensor,
                       teacher) -> list[torch.Tensor]:
    """`drafter`'s unrolled steps' position weights `[B, n]` from exact acceptance, no gradient
    (heads/losses.py `chain_weights`, DFlash's slot weights along the training-time test): the chain the
    drafter starts at position a drafts at step j from position a + j; that draft's chance of acceptance is
    sum_v min(q, p) with p the teacher's law renormalised on the draft vocabulary (dense, or its top-k),
    q(label) without a teacher; a position a step does not count (t < j, or not counted) has chance 0, so
    the chain's later steps weigh 0 too. Step j at t gets W[a = t - j, j]. `logits[j]` `[N, Vd]` are step
    j's draft logits at `masks[j]` (`step_masks`), the ones its loss reads: computed once."""
    B, n = labels.shape
    k = len(logits)
    accept = labels.new_zeros(B, n, k, dtype=torch.float32)  # [B, anchor a, step j]
    for j, (step_logits, mask) in enumerate(zip(logits, masks)):
        if not mask.any():
            continue
        q = step_logits.detach().float().softmax(-1)  # [N, Vd]
        p = teacher_probs(teacher, mask, drafter.draft_vocab_size)
        if p is None:  # the label's point mass (0 for a label outside the draft vocabulary)
            lab = labels[mask]
            inside = drafter.t2d[lab] if drafter.reduced else torch.ones_like(lab, dtype=torch.bool)
            index = to_draft_index(drafter.t2d)[lab] if drafter.reduced else lab
            chance = torch.where(inside, q.gather(1, index.clamp(min=0)[:, None])[:, 0], 0.0)
        else:
            chance = torch.minimum(q, p).sum(-1).clamp(0.0, 1.0)
        at = torch.zeros(B, n, device=labels.device).masked_scatter(mask, chance)  # [B, n] by position t
        accept[:, :n - j, j] = at[:, j:]
    W = chain_weights(accept)  # [B, n, k]
    weights = []
    for j in range(k):
        w = torch.zeros(B, n, device=labels.device)
        w[:, j:] = W[:, :n - j, j]
        weights.append(w)
    return weights


def teacher_probs(teacher, mask: torch.Tensor, draft_vocab_size: int) -> torch.Tensor | None:
    """The teacher's law `[N, Vd]` at the masked positions (renormalised on the draft vocabulary; a
    position whose top-k holds no draft token gets all zeros), None without a teacher."""
    if teacher is None:
        return None
    if teacher[0] == "dense":
        return teacher[1][mask].float().softmax(-1)
    values, indices = teacher[1][mask].float(), teacher[2][mask].long()
    probs = values.softmax(-1).nan_to_num(0.0)  # an all -inf row -> zeros
    return values.new_zeros(values.shape[0], draft_vocab_size).scatter_add_(1, indices, probs)
