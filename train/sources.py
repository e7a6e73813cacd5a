"""Where a training batch's target signal comes from: shards on disk (offline) or the live target.

Both sources hand the loop the same batch dict: `input_ids`, `loss_mask`, `attention_mask` [B, T],
`features` {key: [B, T, H]} and either `target_logits` [B, T, V] (online, dense) or
`target_topk_values` / `target_topk_indices` [B, T, k] (offline shards, or online with top-k).
`loop.prepare` picks one from the config (`extract.enabled`), so the loop and the drafters never know
which ran; the on-policy source (`train/onpolicy.py`) wraps the online one.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import Dataset, Sampler

from draftsmith.distill.collate import collate
from draftsmith.distill.extract import target_features
from draftsmith.distill.features import FeatureStore


class RowDataset(Dataset):
    """Tokenised rows (from `build_datasets`) with their row index, for online training."""

    def __init__(self, rows):
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        return dict(self.rows[i], index=i)


class ShardDataset(Dataset):
    """The sequences of a feature folder, streamed shard by shard (distill/features.py FeatureStore): RAM holds
    a few memory-mapped shards whatever the dataset's size."""

    def __init__(self, folder: Path, target: str, keys: list[str], on_corrupt: str = "error"):
        self.store = FeatureStore(folder, target=target, feature_keys=keys, on_corrupt=on_corrupt)
        self.index, self.keys = self.store.index, keys

    def __len__(self) -> int:
        return len(self.store)

    def __getitem__(self, i: int) -> dict:
        return self.store[i]


class ShardBlockSampler(Sampler):
    """An epoch's order over a feature folder that depends only on (seed, epoch), not on the world size:
    the shards in a shuffled order, each shard's sequences shuffled within it — random enough, and every
    rank reads the same one or two shards at a time (accelerate deals each global batch out across ranks)."""

    def __init__(self, dataset: ShardDataset, seed: int, epoch: int):
        self.ranges, self.seed, self.epoch = dataset.store.shard_ranges(), seed, epoch

    def __len__(self) -> int:
        return sum(len(r) for r in self.ranges)

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        for k in torch.randperm(len(self.ranges), generator=g).tolist():
            block = self.ranges[k]
            yield from (block.start + int(i) for i in torch.randperm(len(block), generator=g))


def collate_shard_items(items: list[dict]) -> dict:
    """Pad shard items (features included) into one batch; padding positions carry mask 0."""
    batch = collate([{"input_ids": it["input_ids"], "loss_mask": it["loss_mask"]} for it in items])
    B, T = batch["input_ids"].shape
    batch["features"] = {}
    for key in items[0]["hidden"]:
        H = items[0]["hidden"][key].shape[-1]
        feat = torch.zeros(B, T, H, dtype=items[0]["hidden"][key].dtype)  # [B, T, H]
        for i, it in enumerate(items):
            feat[i, : len(it["input_ids"])] = it["hidden"][key]
        batch["features"][key] = feat
    if "topk_values" in items[0]:
        k = items[0]["topk_values"].shape[-1]
        vals = torch.full((B, T, k), float("-inf"))  # [B, T, k]
        idx = torch.zeros((B, T, k), dtype=torch.long)
        for i, it in enumerate(items):
            n = len(it["input_ids"])
            vals[i, :n], idx[i, :n] = it["topk_values"].float(), it["topk_indices"]
        batch["target_topk_values"], batch["target_topk_indices"] = vals, idx
    return batch


class OnlineSource:
    """The target runs inside the step (no disk): adds features and dense or top-k logits."""

    def __init__(self, target, keys: list, top_k: int | None = None):
        self.target, self.keys, self.top_k = target, keys, top_k

    def __call__(self, batch: dict) -> dict:
        return dict(batch, **target_features(self.target, batch, self.keys, self.top_k))


class OfflineSource:
    """Shards already hold the features: nothing to add; only moves features to the batch device."""

    def __call__(self, batch: dict) -> dict:
        return batch


def to_device(batch: dict, device: torch.device, dtype: torch.dtype | None = None) -> dict:
    out = {}
    for key, value in batch.items():
        if isinstance(value, dict):
            out[key] = to_device(value, device, dtype)
        elif isinstance(value, torch.Tensor):
            value = value.to(device)
            out[key] = value.to(dtype) if dtype is not None and value.is_floating_point() else value
        else:
            out[key] = value
    return out
