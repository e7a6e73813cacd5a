"""Feature extraction: the target's hidden states (and top-k logits) for every training sequence.

Between data and training. `target_features` is the one place the target is run for training
signal: offline (this stage, `draftsmith extract`, writing shards through `features.py`) and
online (`train/sources.py`, inside the training step) both call it, so both paths see the same
numbers. Extraction is split across processes by accelerate (shard k goes to rank k mod world),
prints bytes per token and the projected size first (and refuses when the disk cannot hold it),
skips shards already on disk (a killed run resumes) and ends with rank 0 writing `index.json`.

Shapes: batch ids [B, T] -> hidden {key: [B, T, H]}, logits [B, T, V] or top-k [B, T, k].
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from draftsmith.distill.cache import sha256_of
from draftsmith.distill.features import (
    FeatureIndex,
    pack_shard,
    quantize_rows,
    rows_fingerprint,
    shard_cost,
    write_index,
)

STORAGE_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
                  "float8_e4m3": torch.float8_e4m3fn}
# float8_e4m3: hidden states as e4m3 with one float32 scale per token row (features.quantize_rows), about half
# the disk of bfloat16; the top-k logits stay bfloat16 (they are a small share and decide the loss's targets)
LOGIT_DTYPES = {"float8_e4m3": torch.bfloat16}


@dataclass
class ExtractConfig:
    """`extract:` section — offline features; `enabled: false` trains online (target in the step)."""

    enabled: bool = False
    layers: list[int] = field(default_factory=list)  # extra target layers to store beyond the drafter's own
    top_k_logits: int = 64  # target logits kept per position (sparse distillation); 0 = none (hard labels)
    # storage dtype of hidden states and logits; float8_e4m3: e4m3 hidden states with a
    dtype: str = "bfloat16"
    # per-row scale, logits in bfloat16 (docs/results/fp8-features.md measures its disk and tau)
    shard_size: int = 256  # sequences per shard
    batch_size: int = 8  # sequences per target forward
    out: str = ""  # empty: <run dir>/features
    on_corrupt: str = "error"  # a shard failing its checksum when training reads it: error (named) or skip it

    def __post_init__(self):
        if self.dtype not in STORAGE_DTYPES:
            raise ValueError(f"extract.dtype '{self.dtype}' unknown; use one of {', '.join(STORAGE_DTYPES)}")
        if self.on_corrupt not in ("error", "skip"):
            raise ValueError(f"extract.on_corrupt '{self.on_corrupt}' unknown; use error or skip")


def feature_key(key) -> str:
    return str(key)


@torch.no_grad()
def target_features(target, batch: dict, keys, top_k: int | None) -> dict:
    """Run the target on a padded batch -> {"features": {key: [B,T,H]}, and "target_logits" [B,T,V]
    (top_k None) or "target_topk_values"/"target_topk_indices" [B,T,k] (top_k > 0)}."""
    out = target.forward(batch["input_ids"], attention_mask=batch["attention_mask"], layers=list(keys))
    result = {"features": {feature_key(k): v for k, v in out.hidden.items()}}
    if top_k is None:
        result["target_logits"] = out.logits  # [B, T, V]
    elif top_k > 0:
        values, indices = out.logits.topk(top_k, dim=-1)  # [B, T, k]
        result["target_topk_values"], result["target_topk_indices"] = values, indices
    return result


def bytes_per_token(target, keys: list, cfg: ExtractConfig) -> int:
    """What one token costs on disk: its stored features and top-k logits, plus ids and mask."""
    config = target.config.get_text_config() if hasattr(target.config, "get_text_config") else target.config
    width = STORAGE_DTYPES[cfg.dtype].itemsize
    scale = 4 if cfg.dtype in LOGIT_DTYPES else 0  # a float32 scale per row of each quantized feature
    logit_width = LOGIT_DTYPES.get(cfg.dtype, STORAGE_DTYPES[cfg.dtype]).itemsize
    return len(keys) * (config.hidden_size * width + scale) + cfg.top_k_logits * (logit_width + 4) + 4 + 1


def check_space(target, dataset, folder: Path, keys: list, cfg: ExtractConfig, report: bool = True) -> int:
    """Print bytes per token and the projected size of the whole split; refuse when the disk cannot hold
    it."""
    import shutil

    tokens = sum(len(dataset[i]["input_ids"]) for i in range(len(dataset)))
    per_token = bytes_per_token(target, keys, cfg)
    need, free = tokens * per_token, shutil.disk_usage(folder).free
    if report:
        print(f"[extract] {folder.name}: {len(dataset)} sequences, {tokens} tokens x {per_token} B/token "
              f"({len(keys)} features, top-{cfg.top_k_logits} logits, {cfg.dtype}) = {need / 2**30:.2f} GiB; "
              f"{free / 2**30:.1f} GiB free", flush=True)
    if need > free:
        raise OSError(f"extract: {folder} needs {need / 2**30:.2f} GiB for {tokens} tokens but "
                      f"{free / 2**30:.2f} GiB are free: free space, pick extract.out on a larger disk, "
                      "store fewer features (extract.layers), fewer top-k logits or a smaller extract.dtype, "
                      "or train online")
    return need


def run_extract(target, dataset, folder: Path, keys: list, cfg: ExtractConfig, accelerator,
                progress: bool = True) -> FeatureIndex:
    """Write shards for `dataset` (rows of input_ids/loss_mask) into `folder`; return the index."""
    from tqdm.auto import tqdm

    from draftsmith.distill.collate import collate

    folder.mkdir(parents=True, exist_ok=True)
    store = STORAGE_DTYPES[cfg.dtype]
    logit_store = LOGIT_DTYPES.get(cfg.dtype, store)
    quantized = cfg.dtype in LOGIT_DTYPES
    n_shards = (len(dataset) + cfg.shard_size - 1) // cfg.shard_size
    check_space(target, dataset, folder, keys, cfg, accelerator.is_main_process)
    mine = [k for k in range(n_shards) if k % accelerator.num_processes == accelerator.process_index]
    todo = [k for k in mine if not (folder / f"shard-{k:05d}.safetensors").is_file()]
    bar = tqdm(total=len(todo), desc="extract", unit="shard",
               disable=not (progress and accelerator.is_main_process))
    for k in todo:
        start = time.perf_counter()
        rows = [dict(dataset[i], index=i) for i in range(k * cfg.shard_size,
                                                         min((k + 1) * cfg.shard_size, len(dataset)))]
        items = []
        for b in range(0, len(rows), cfg.batch_size):
            chunk = rows[b: b + cfg.batch_size]
            batch = {key: v.to(target.device) for key, v in collate(chunk).items()}
            feats = target_features(target, batch, keys, cfg.top_k_logits)
            for i, row in enumerate(chunk):
                n = len(row["input_ids"])
                item = {"row_id": row["index"], "input_ids": row["input_ids"], "loss_mask": row["loss_mask"]}
                if quantized:
                    rows_q = {key: quantize_rows(v[i, :n].cpu()) for key, v in feats["features"].items()}
                    item["hidden"] = {key: q for key, (q, _) in rows_q.items()}
                    item["hidden_scale"] = {key: sc for key, (_, sc) in rows_q.items()}
                else:
                    item["hidden"] = {key: v[i, :n].to(store).cpu() for key, v in feats["features"].items()}
                if cfg.top_k_logits > 0:
                    item["topk_values"] = feats["target_topk_values"][i, :n].to(logit_store).cpu()
                    item["topk_indices"] = feats["target_topk_indices"][i, :n].cpu()
                items.append(item)
        cost = {"seconds": round(time.perf_counter() - start, 3), "processes": accelerator.num_processes,
                "threads": torch.get_num_threads()}
        pack_shard(items, folder / f"shard-{k:05d}.safetensors", cost)
        bar.update(1)
    bar.close()
    accelerator.wait_for_everyone()
    index = FeatureIndex(target=target.name, feature_keys=[feature_key(k) for k in keys], dtype=cfg.dtype,
                         top_k_logits=cfg.top_k_logits, num_sequences=len(dataset),
                         num_tokens=sum(len(dataset[i]["input_ids"]) for i in range(len(dataset))),
                         data_fingerprint=rows_fingerprint(dataset[i] for i in range(len(dataset))))
    if accelerator.is_main_process:
        index.shards = {f"shard-{k:05d}.safetensors": sha256_of(folder / f"shard-{k:05d}.safetensors")
                        for k in range(n_shards)}
        index.shard_sequences = {f"shard-{k:05d}.safetensors": min(cfg.shard_size,
                                                                   len(dataset) - k * cfg.shard_size)
                                 for k in range(n_shards)}
        costs = {name: shard_cost(folder / name) for name in index.shards}
        index.shard_cost = {name: c for name, c in costs.items() if c is not None}
        write_index(folder, index)
    accelerator.wait_for_everyone()
    return index
