"""A block drafter's teacher at its mask slots: the target's law over the draft vocabulary and each slot's
analytical acceptance (DFlash's acceptance-weighted loss, DSpark's confidence target).

Shapes: `sel [B, A]` the blocks whose slot is counted (N of them), `teacher_at [N]` the position whose target
logits are the slot's teacher; laws `[N, Vd]` over the draft vocabulary.
"""

from __future__ import annotations

import torch


class SlotTeacher:
    """Mixed into DFlashDrafter (it supplies `reduced`, `vocab_size`, `draft_vocab_size`,
    `draft_to_target`)."""

    def target_to_draft(self, ids: torch.Tensor) -> torch.Tensor:
        """Draft index of target ids, -1 outside the draft vocabulary."""
        if not self.reduced:
            return ids
        index = torch.full((self.vocab_size,), -1, dtype=torch.long, device=ids.device)
        index[self.draft_to_target(torch.arange(self.draft_vocab_size, device=ids.device))] = \
            torch.arange(self.draft_vocab_size, device=ids.device)
        return index[ids]

    def teacher_probs(self, batch: dict, sel: torch.Tensor, teacher_at: torch.Tensor) -> torch.Tensor | None:
        """The target's law `[N, Vd]` at the selected slots over the draft vocabulary (mass outside it
        dropped: it cannot be accepted), from dense or top-k logits; None without a teacher."""
        rows = sel.nonzero()[:, 0]
        cols = self.draft_to_target(torch.arange(self.draft_vocab_size, device=sel.device))
        if batch.get("target_logits") is not None:
            return batch["target_logits"][rows, teacher_at].float().softmax(-1)[:, cols]
        if batch.get("target_topk_values") is not None:
            values = batch["target_topk_values"][rows, teacher_at].float()
            indices = batch["target_topk_indices"][rows, teacher_at].long()
            full = values.new_zeros(values.shape[0], self.vocab_size).scatter_(1, indices, values.softmax(-1))
            return full[:, cols]
        return None

    @torch.no_grad()
    def slot_acceptance(self, logits: torch.Tensor, labels: torch.Tensor, batch: dict, sel: torch.Tensor,
                        teacher_at: torch.Tensor) -> torch.Tensor:
        """Each selected slot's chance `[N]` that its draft is accepted, sum_v min(q(v), p(v)) (speculative
        sampling's acceptance, 1 - TV), no gradient; without a teacher p is the label's point mass, so it is
        q(label) (0 for a label outside the draft vocabulary)."""
        q = logits.float().softmax(-1)
        p = self.teacher_probs(batch, sel, teacher_at)
        if p is None:
            index = self.target_to_draft(labels)
            return torch.where(index >= 0, q.gather(1, index.clamp(min=0)[:, None])[:, 0], 0.0)
        return torch.minimum(q, p).sum(-1).clamp(0.0, 1.0)
