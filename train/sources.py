"""Where a training batch's target signal comes from: shards on disk (offline) or the live target.

Both sources hand the loop the same batch dict: `input_ids`, `loss_mask`, `attention_mask` [B, T],
`features` {key: [B, T, H]} and either `target_logits` [B, T, V] (online, dense) or
`target_topk_values` / `target_topk_indices` [B, T, k] (offline shards, or online with top-k).
`build_sources` (called by train/setup.py `prepare`) picks one from the config (`extract.enabled`), checks
shards against the data they must match, and hands back the datasets and the collate function with it, so the
loop and the drafters never know which ran; the on-policy source (`train/onpolicy.py`) wraps the online one.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import Dataset, Sampler

from draftsmith.distill.collate import collate
from draftsmith.distill.extract import target_features
from draftsmith.distill.features import FeatureStore, rows_fingerprint
from draftsmith.train.runtime import TrainingError, rank0_print


class RowDataset(Dataset):
    """Tokenised rows (from `build_datasets`) with their row index, for online training."""

    def __init__(self, rows):
        self.rows, self._lengths = rows, None

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        return dict(self.rows[i], index=i)

    def lengths(self) -> list[int]:
        """Every row's length in tokens (read once a dataset, as `ShardDataset.lengths`)."""
        if self._lengths is None:
            self._lengths = [len(row["input_ids"]) for row in self.rows]
        return self._lengths


class ShardDataset(Dataset):
    """The sequences of a feature folder, streamed shard by shard (distill/features.py FeatureStore): RAM
    holds a few memory-mapped shards whatever the dataset's size."""

    def __init__(self, folder: Path, target: str, keys: list[str], on_corrupt: str = "error"):
        self.store = FeatureStore(folder, target=target, feature_keys=keys, on_corrupt=on_corrupt)
        self.index, self.keys, self._lengths = self.store.index, keys, None

    def lengths(self) -> list[int]:
        """Every sequence's length (read from the shards once a dataset: `FeatureStore.lengths`)."""
        if self._lengths is None:
            self._lengths = self.store.lengths()
        return self._lengths

    def __len__(self) -> int:
        return len(self.store)

    def __getitem__(self, i: int) -> dict:
        return self.store[i]


def group_by_length(order: list[int], lengths, batch: int, generator: torch.Generator,
                    span: int = 64) -> list[int]:
    """`order` regrouped so that each run of `batch` indices (a micro-batch as the loader cuts it) holds
    sequences of about one length: every stretch of `span` batches of the order is sorted longest first, cut
    into batches, and its full batches shuffled (a short last one stays last, so the loader's cuts stay on
    the runs). A batch's sequences still come from one random stretch of the epoch: what HF Trainer's
    LengthGroupedSampler does with its megabatches, plus the shuffle of the batches within one."""
    out = []
    for start in range(0, len(order), batch * span):
        chunk = sorted(order[start: start + batch * span], key=lambda i: -int(lengths[i]))  # ties: order
        full = len(chunk) // batch
        for k in torch.randperm(full, generator=generator).tolist():
            out.extend(chunk[k * batch: (k + 1) * batch])
        out.extend(chunk[full * batch:])
    return out


class ShardBlockSampler(Sampler):
    """An epoch's order over a feature folder that depends only on (seed, epoch), not on the world size:
    the shards in a shuffled order, each shard's sequences shuffled within it — random enough, and every
    rank reads the same one or two shards at a time (accelerate deals each global batch out across ranks).
    `group` > 0 (train.group_by_length: the micro-batch size) regroups that order by length
    (`group_by_length`; a stretch of 64 batches then spans ceil(64 x group / shard size) + 1 shards at most:
    2 at the shipped batch of 4 and shard size of 256 — keep it within the store's `keep_open`)."""

    def __init__(self, dataset: ShardDataset, seed: int, epoch: int, group: int = 0):
        self.ranges, self.seed, self.epoch, self.group = dataset.store.shard_ranges(), seed, epoch, group
        self.lengths = dataset.lengths() if group else None

    def __len__(self) -> int:
        return sum(len(r) for r in self.ranges)

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        order = [self.ranges[k].start + int(i) for k in torch.randperm(len(self.ranges), generator=g).tolist()
                 for i in torch.randperm(len(self.ranges[k]), generator=g)]
        yield from group_by_length(order, self.lengths, self.group, g) if self.group else order


class LengthGroupedSampler(Sampler):
    """A random order over rows of these lengths, a function of (seed, epoch), regrouped by
    `group_by_length` into micro-batches of `batch` (online training with train.group_by_length)."""

    def __init__(self, lengths: list[int], batch: int, seed: int, epoch: int):
        self.lengths, self.batch, self.seed, self.epoch = lengths, batch, seed, epoch

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        yield from group_by_length(torch.randperm(len(self.lengths), generator=g).tolist(), self.lengths,
                                   self.batch, g)


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


def build_sources(cfg, run_dir: Path, target, drafter, train_rows, val_rows, spec):
    """(train set, validation set or None, source, collate) from offline shards or for the live target."""
    from draftsmith.train.onpolicy import build_onpolicy_source

    keys = [str(k) for k in drafter.feature_layers]
    if cfg.extract.enabled:
        features = Path(cfg.extract.out) if cfg.extract.out else run_dir / "features"
        on_corrupt = cfg.extract.on_corrupt
        val_set = (ShardDataset(features / "validation", target.name, keys, on_corrupt) if len(val_rows)
                   else None)
        train_set = ShardDataset(features / "train", target.name, keys, on_corrupt)
        for name, split, rows in (("train", train_set, train_rows), ("validation", val_set, val_rows)):
            if split is not None and split.index.num_sequences != len(rows):
                raise TrainingError(f"{features / name} holds features of {split.index.num_sequences} "
                                    f"sequences and the data gives {len(rows)}: the data changed since they "
                                    "were extracted (e.g. data.validation, data.limit); move "
                                    f"{features / name} aside and extract again (draftsmith extract, or the "
                                    "pipeline's extract stage)")
            fingerprint = split.index.data_fingerprint if split is not None else None
            if fingerprint and fingerprint != rows_fingerprint(rows):
                raise TrainingError(f"{features / name} holds features of other sequences than the data "
                                    f"gives (the same count, {len(rows)}, but other tokens: data.train, "
                                    "data.validation, data.max_length, the chat template or the tokenizer "
                                    f"changed since they were extracted); move {features / name} aside and "
                                    "extract again (draftsmith extract, or the pipeline's extract stage)")
        for split in (train_set, val_set):
            for problem in (split.store.skipped if split is not None else []):
                rank0_print(f"[train] skipped (extract.on_corrupt: skip): {problem}")
        return train_set, val_set, OfflineSource(), collate_shard_items
    online = OnlineSource(target, list(drafter.feature_layers), cfg.train.online_top_k or None)
    source = build_onpolicy_source(cfg.train, online, drafter, target, spec)
    return RowDataset(train_rows), RowDataset(val_rows) if len(val_rows) else None, source, collate
