"""On-disk feature shards: what `draftsmith extract` writes and offline training reads.

A feature folder holds `index.json` and safetensors shards. Each shard packs S sequences end to
end (N tokens in all): `input_ids [N]`, `loss_mask [N]`, `offsets [S+1]`, `row_ids [S]` (row of
the training set), one `hidden.<key> [N, H]` per stored target feature (a layer index or
"final"), and optionally `topk_values [N, k]` / `topk_indices [N, k]` (the target's top-k logits).
`index.json` records the schema version, target id, feature keys, dtype, k and every shard's
sha256; readers refuse a folder whose schema, target or checksums do not match, naming the shard.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

SCHEMA_VERSION = 1


class FeatureError(ValueError):
    """A feature folder that cannot be used as it is; the message names the file and the fix."""


@dataclass
class FeatureIndex:
    target: str
    feature_keys: list[str]
    dtype: str
    top_k_logits: int
    shards: dict[str, str] = field(default_factory=dict)  # file name -> sha256
    num_sequences: int = 0
    num_tokens: int = 0
    schema_version: int = SCHEMA_VERSION


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def pack_shard(items: list[dict], path: Path) -> None:
    """items: per sequence {row_id, input_ids [T], loss_mask [T], hidden {key: [T, H]}, topk_values?, topk_indices?}."""
    lengths = [len(it["input_ids"]) for it in items]
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    tensors = {
        "input_ids": torch.cat([torch.as_tensor(it["input_ids"]) for it in items]).to(torch.int32),  # [N]
        "loss_mask": torch.cat([torch.as_tensor(it["loss_mask"]) for it in items]).to(torch.int8),  # [N]
        "offsets": offsets.to(torch.int64),  # [S+1]
        "row_ids": torch.tensor([it["row_id"] for it in items], dtype=torch.int64),  # [S]
    }
    for key in items[0]["hidden"]:
        tensors[f"hidden.{key}"] = torch.cat([it["hidden"][key] for it in items]).contiguous()  # [N, H]
    if "topk_values" in items[0]:
        tensors["topk_values"] = torch.cat([it["topk_values"] for it in items]).contiguous()  # [N, k]
        tensors["topk_indices"] = torch.cat([it["topk_indices"] for it in items]).to(torch.int32).contiguous()
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata={"schema_version": str(SCHEMA_VERSION)})
    tmp.rename(path)  # a shard is either complete or absent


def unpack_shard(path: Path) -> list[dict]:
    """The inverse of `pack_shard`: a list of per-sequence dicts with `hidden` {key: [T, H]}."""
    t = load_file(str(path))
    off = t["offsets"].tolist()
    hidden_keys = [k[len("hidden."):] for k in t if k.startswith("hidden.")]
    out = []
    for s, row in enumerate(t["row_ids"].tolist()):
        a, b = off[s], off[s + 1]
        item = {"row_id": row, "input_ids": t["input_ids"][a:b].long(), "loss_mask": t["loss_mask"][a:b].long(),
                "hidden": {k: t[f"hidden.{k}"][a:b] for k in hidden_keys}}
        if "topk_values" in t:
            item["topk_values"], item["topk_indices"] = t["topk_values"][a:b], t["topk_indices"][a:b].long()
        out.append(item)
    return out


def write_index(folder: Path, index: FeatureIndex) -> None:
    tmp = folder / "index.json.tmp"
    tmp.write_text(json.dumps(asdict(index), indent=2))
    tmp.rename(folder / "index.json")


def read_index(folder: Path, target: str | None = None, feature_keys: list[str] | None = None,
               verify: bool = True) -> FeatureIndex:
    """Load and check a feature folder; every problem names the file and what to do."""
    path = Path(folder) / "index.json"
    if not path.is_file():
        raise FeatureError(f"{path} missing: run `draftsmith extract -c <config>` first (or set extract.enabled: false)")
    raw = json.loads(path.read_text())
    if raw.get("schema_version") != SCHEMA_VERSION:
        raise FeatureError(f"{path}: schema version {raw.get('schema_version')} but this draftsmith reads "
                           f"{SCHEMA_VERSION}; re-run `draftsmith extract` into a fresh folder")
    index = FeatureIndex(**raw)
    if target is not None and index.target != target:
        raise FeatureError(f"{path}: features were extracted from target '{index.target}', the config names "
                           f"'{target}'; re-extract or fix model.target")
    missing = [k for k in (feature_keys or []) if k not in index.feature_keys]
    if missing:
        raise FeatureError(f"{path}: the drafter needs target features {missing}, the shards hold "
                           f"{index.feature_keys}; set extract.layers and re-extract")
    if verify:
        for name, digest in index.shards.items():
            shard = Path(folder) / name
            if not shard.is_file():
                raise FeatureError(f"shard {shard} listed in index.json is missing; re-run `draftsmith extract`")
            if sha256_of(shard) != digest:
                raise FeatureError(f"shard {shard} fails its sha256 checksum (corrupt or edited); delete it and "
                                   "re-run `draftsmith extract`, which rewrites only missing shards")
    return index
