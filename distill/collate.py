"""Batching of tokenised conversations: right-padded tensors for the training step.

Between `data.build_datasets` (rows of `input_ids`, `loss_mask`) and the training sources, which
add the target's features. Output: `input_ids`, `loss_mask`, `attention_mask`, each [B, T], and
`index` [B] (row ids, so offline features can be looked up).
"""

from __future__ import annotations

import torch


def collate(rows: list[dict], pad_id: int = 0) -> dict[str, torch.Tensor]:
    width = max(len(r["input_ids"]) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        ids[i, :n] = torch.as_tensor(r["input_ids"])
        mask[i, :n] = torch.as_tensor(r["loss_mask"])
        attn[i, :n] = 1
    batch = {"input_ids": ids, "loss_mask": mask, "attention_mask": attn}
    if "index" in rows[0]:
        batch["index"] = torch.tensor([r["index"] for r in rows])
    return batch
