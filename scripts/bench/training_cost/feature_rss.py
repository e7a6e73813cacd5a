"""Peak memory of an offline epoch over streamed feature shards, for two dataset sizes (the figure behind the
streaming feature store; no model involved: random features of a realistic width).

    python scripts/bench/training_cost/feature_rss.py OUT [--shards 12 48] [--per-shard 32] [--tokens 128]
        [--hidden 576]

For each size: writes the shards (distill/features.py pack_shard + index.json), then in a fresh process runs
one epoch through ShardDataset + ShardBlockSampler + the training collate, recording the peak RSS above the
process's baseline. Prints and writes OUT/feature-rss.json. A loader that held every shard would grow by
the dataset's size; the streaming one grows by a few shards.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

from draftsmith.distill.cache import sha256_of
from draftsmith.distill.features import FeatureIndex, pack_shard, write_index

EPOCH = """
import json, resource, sys
from torch.utils.data import DataLoader
from draftsmith.train.sources import ShardBlockSampler, ShardDataset, collate_shard_items
data = ShardDataset(sys.argv[1], "synthetic", ["final"])
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
tokens = 0
sampler = ShardBlockSampler(data, 0, 0)
for batch in DataLoader(data, batch_size=8, sampler=sampler, collate_fn=collate_shard_items):
    tokens += int(batch["loss_mask"].sum())
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"base_kib": base, "peak_kib": peak, "tokens": tokens}))
"""


def write_features(folder: Path, shards: int, per_shard: int, tokens: int, hidden: int,
                   seed: int = 0) -> Path:
    """A feature folder of random sequences (one feature, top-4 logits), as `draftsmith extract` lays it
    out."""
    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    index = FeatureIndex(target="synthetic", feature_keys=["final"], dtype="float32", top_k_logits=4)
    for k in range(shards):
        items = []
        for s in range(per_shard):
            n = tokens - (s % 3)
            items.append({"row_id": k * per_shard + s, "input_ids": torch.randint(0, 259, (n,), generator=g),
                          "loss_mask": torch.ones(n, dtype=torch.long),
                          "hidden": {"final": torch.randn(n, hidden, generator=g)},
                          "topk_values": torch.randn(n, 4, generator=g),
                          "topk_indices": torch.randint(0, 259, (n, 4))})
        name = f"shard-{k:05d}.safetensors"
        pack_shard(items, folder / name)
        index.shards[name], index.shard_sequences[name] = sha256_of(folder / name), per_shard
    index.num_sequences = shards * per_shard
    write_index(folder, index)
    return folder


def measure(folder: Path) -> dict:
    run = subprocess.run([sys.executable, "-c", EPOCH, str(folder)], capture_output=True, text=True,
                         check=True)
    stats = json.loads(run.stdout.strip().splitlines()[-1])
    shard_mib = (folder / "shard-00000.safetensors").stat().st_size / 2**20
    total_mib = sum(p.stat().st_size for p in folder.glob("*.safetensors")) / 2**20
    return {"shards": len(list(folder.glob("*.safetensors"))), "shard_mib": round(shard_mib, 2),
            "dataset_mib": round(total_mib, 1),
            "peak_rss_growth_mib": round((stats["peak_kib"] - stats["base_kib"]) / 1024, 1),
            "tokens": stats["tokens"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--shards", type=int, nargs="+", default=[12, 48])
    parser.add_argument("--per-shard", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=576)
    args = parser.parse_args()
    rows = [measure(write_features(args.out / f"shards-{n}", n, args.per_shard, args.tokens, args.hidden))
            for n in args.shards]
    (args.out / "feature-rss.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
