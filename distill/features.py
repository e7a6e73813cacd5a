"""On-disk feature shards: what `draftsmith extract` writes and offline training streams.

A feature folder holds `index.json` and safetensors shards. Each shard packs S sequences end to
end (N tokens in all): `input_ids [N]`, `loss_mask [N]`, `offsets [S+1]`, `row_ids [S]` (row of
the training set), one `hidden.<key> [N, H]` per stored target feature (a layer index or
"final") -- with `extract.dtype: float8_e4m3` an e4m3 tensor and its `hidden_scale.<key> [N]` (float32, one
scale per token row, `quantize_rows`; readers get bfloat16 back) -- and optionally `topk_values [N, k]` /
`topk_indices [N, k]` (the target's top-k logits). `index.json` records the schema version, target id, feature
keys, dtype, k, every shard's sha256 and its sequence count, and what extracting each shard cost (seconds, the
processes extracting beside it, their torch threads; also in the shard's own metadata, so a resumed extraction
still sums every shard: `extraction_cost`); readers refuse a folder whose schema or target does not match.

`FeatureStore` reads a folder lazily: a shard is memory-mapped (`safe_open`) when a sequence of it is
first asked for, its checksum verified on that first open (a corrupt shard is named and refused, or
skipped with `on_corrupt="skip"`), and only the last few shards stay open, so RAM is bounded by a few
shards whatever the dataset's size. `read_index(..., verify=True)` (`draftsmith extract --verify`)
checks every shard up front.
"""

from __future__ import annotations

import hashlib
import json
from array import array
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from draftsmith.distill.cache import sha256_of, write_failure

SCHEMA_VERSION = 2  # 2: per-shard sequence counts (streaming reads)
E4M3_MAX = 448.0  # the largest finite float8_e4m3fn


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, H] -> (e4m3 [N, H], float32 scale [N]): each row scaled so its largest magnitude is e4m3's largest
    finite value (the per-row "dynamic" scale of FP8 activations); an all-zero row gets scale 1."""
    x = x.float()
    amax = x.abs().amax(dim=-1)  # [N]
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    q = (x / scale[:, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale


def dequantize_rows(q: torch.Tensor, scale: torch.Tensor, dtype=torch.bfloat16) -> torch.Tensor:
    return (q.float() * scale.float()[:, None]).to(dtype)


class FeatureError(ValueError):
    """A feature folder that cannot be used as it is; the message names the file and the fix."""


@dataclass
class FeatureIndex:
    target: str
    feature_keys: list[str]
    dtype: str
    top_k_logits: int
    shards: dict[str, str] = field(default_factory=dict)  # file name -> sha256
    shard_sequences: dict[str, int] = field(default_factory=dict)  # file name -> sequences it holds
    num_sequences: int = 0
    num_tokens: int = 0
    # sha256 of the extracted rows' token ids and loss masks in order (`rows_fingerprint`): training refuses
    # features of other data even where the count matches; "" in folders extracted before it was recorded (the
    # count alone)
    data_fingerprint: str = ""
    # file name -> {seconds: what its process spent on it (the target's forward and packing, not the write),
    # processes: how many extracted side by side, threads: that process's torch threads}; absent for shards
    # written before it was recorded
    shard_cost: dict[str, dict] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION


def rows_fingerprint(rows) -> str:
    """sha256 over each row's input_ids and loss_mask (lists or tensors), in order: which data a feature
    folder holds."""
    h = hashlib.sha256()
    for row in rows:
        for key in ("input_ids", "loss_mask"):
            values = row[key].tolist() if hasattr(row[key], "tolist") else list(row[key])
            h.update(array("q", values).tobytes())
            h.update(b"|")
        h.update(b"\n")
    return h.hexdigest()


def pack_shard(items: list[dict], path: Path, cost: dict | None = None) -> None:
    """items: per sequence {row_id, input_ids [T], loss_mask [T], hidden {key: [T, H]}, topk_values?,
    topk_indices?}; `cost` ({seconds, processes, threads}: what making them took) goes into the shard's
    metadata (`shard_cost`)."""
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
        if "hidden_scale" in items[0]:  # float8 rows and their scales
            scales = [it["hidden_scale"][key] for it in items]
            tensors[f"hidden_scale.{key}"] = torch.cat(scales).float().contiguous()
    if "topk_values" in items[0]:
        tensors["topk_values"] = torch.cat([it["topk_values"] for it in items]).contiguous()  # [N, k]
        tensors["topk_indices"] = torch.cat([it["topk_indices"] for it in items]).to(torch.int32).contiguous()
    tmp = path.with_suffix(".tmp")
    try:
        metadata = {"schema_version": str(SCHEMA_VERSION)}
        if cost is not None:
            metadata["cost"] = json.dumps(cost)
        save_file(tensors, str(tmp), metadata=metadata)
    except Exception as exc:  # safetensors reports I/O failures as its own error type
        tmp.unlink(missing_ok=True)
        raise write_failure(path, exc, "the finished shards are kept and skipped") from exc
    tmp.rename(path)  # a shard is either complete or absent


def shard_cost(path: Path) -> dict | None:
    """The extraction cost a shard's metadata records (`pack_shard`), None where it records none."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as handle:
        cost = (handle.metadata() or {}).get("cost")
    return json.loads(cost) if cost is not None else None


def extraction_cost(folder: Path) -> dict | None:
    """What extracting a feature folder took, from its shards (every process and every resumed sitting that
    wrote one): {wall_seconds: each shard's seconds over the processes extracting side by side, core_seconds:
    each shard's seconds x its process's threads}; None where a shard's cost was not recorded or there is no
    index."""
    path = Path(folder) / "index.json"
    if not path.is_file():
        return None
    index = json.loads(path.read_text())
    costs = index.get("shard_cost") or {}
    if not index.get("shards") or any(name not in costs for name in index["shards"]):
        return None
    shards = [costs[name] for name in index["shards"]]
    return {"wall_seconds": round(sum(c["seconds"] / c["processes"] for c in shards), 3),
            "core_seconds": round(sum(c["seconds"] * c["threads"] for c in shards), 3)}


def unpack_shard(path: Path) -> list[dict]:
    """The inverse of `pack_shard`: a list of per-sequence dicts with `hidden` {key: [T, H]} (all in RAM)."""
    t = load_file(str(path))
    small = {"offsets": t["offsets"].tolist(), "row_ids": t["row_ids"].tolist(), "keys": list(t)}
    return [_item(lambda name, a, b: t[name][a:b], small, s) for s in range(len(small["row_ids"]))]


def _item(read, small: dict, s: int) -> dict:
    """Sequence `s` of a shard: `read(name, a, b)` slices a tensor; `small` holds offsets and row ids."""
    off = small["offsets"]
    a, b = int(off[s]), int(off[s + 1])
    hidden = {}
    for k in small["keys"]:
        if k.startswith("hidden."):
            key = k[len("hidden."):]
            scaled = f"hidden_scale.{key}" in small["keys"]
            hidden[key] = dequantize_rows(read(k, a, b),
                                          read(f"hidden_scale.{key}", a, b)) if scaled else read(k, a, b)
    item = {"row_id": int(small["row_ids"][s]), "input_ids": read("input_ids", a, b).long(),
            "loss_mask": read("loss_mask", a, b).long(), "hidden": hidden}
    if "topk_values" in small["keys"]:
        item["topk_values"], item["topk_indices"] = read("topk_values", a, b), read("topk_indices", a,
                                                                                    b).long()
    return item


class FeatureStore:
    """Sequences of a feature folder by global position, read lazily shard by shard (see the module doc)."""

    def __init__(self, folder: Path, target: str | None = None, feature_keys: list[str] | None = None,
                 keep_open: int = 3, on_corrupt: str = "error"):
        self.folder, self.keep_open, self.on_corrupt = Path(folder), keep_open, on_corrupt
        self.index = read_index(folder, target=target, feature_keys=feature_keys, verify=False)
        self.names, self.skipped, self.verified = sorted(self.index.shards), [], set()
        if on_corrupt == "skip":  # the dataset's size must be known: check every shard now, drop the bad ones
            for name in list(self.names):
                try:
                    verify_shard(self.folder, self.index, name)
                    self.verified.add(name)
                except FeatureError as exc:
                    self.names.remove(name)
                    self.skipped.append(str(exc))
        elif on_corrupt != "error":
            raise ValueError(f"extract.on_corrupt '{on_corrupt}' unknown; valid: error, skip")
        self.counts = [self.index.shard_sequences[n] for n in self.names]
        # first global position of each shard
        self.starts = [sum(self.counts[:i]) for i in range(len(self.counts))]
        self.open: dict[str, tuple] = {}  # shard -> (handle, small tensors), the most recently used last

    def __len__(self) -> int:
        return sum(self.counts)

    def locate(self, i: int) -> tuple[int, int]:
        """(shard number, sequence within it) of global position `i`."""
        import bisect

        k = bisect.bisect_right(self.starts, i) - 1
        return k, i - self.starts[k]

    def shard_ranges(self) -> list[range]:
        return [range(start, start + n) for start, n in zip(self.starts, self.counts)]

    def lengths(self) -> list[int]:
        """Every sequence's length in tokens, by global position, from the shards' offsets alone (read
        without verifying or keeping a shard open; a shard that cannot be read is checked, so a missing or
        corrupt one is named as on its first open)."""
        from safetensors import safe_open

        out = []
        for name in self.names:
            try:
                with safe_open(str(self.folder / name), "pt") as handle:
                    out.extend(handle.get_tensor("offsets").diff().tolist())
            except Exception:  # safetensors' own error types, or the file is gone
                verify_shard(self.folder, self.index, name)  # raises the FeatureError naming it and the fix
                raise
        return out

    def _handle(self, name: str):
        from safetensors import safe_open

        if name in self.open:
            self.open[name] = self.open.pop(name)  # most recently used
            return self.open[name]
        if name not in self.verified:  # checked on a rank's first open of the shard
            verify_shard(self.folder, self.index, name)
            self.verified.add(name)
        handle = safe_open(str(self.folder / name), "pt")
        small = {"offsets": handle.get_tensor("offsets").tolist(),
                 "row_ids": handle.get_tensor("row_ids").tolist(), "keys": list(handle.keys())}
        self.open[name] = (handle, small)
        while len(self.open) > self.keep_open:
            self.open.pop(next(iter(self.open)))
        return self.open[name]

    def __getitem__(self, i: int) -> dict:
        k, s = self.locate(i)
        handle, small = self._handle(self.names[k])
        return _item(lambda name, a, b: handle.get_slice(name)[a:b], small, s)


def write_index(folder: Path, index: FeatureIndex) -> None:
    tmp = folder / "index.json.tmp"
    tmp.write_text(json.dumps(asdict(index), indent=2))
    tmp.rename(folder / "index.json")


def read_index(folder: Path, target: str | None = None, feature_keys: list[str] | None = None,
               verify: bool = True) -> FeatureIndex:
    """Load and check a feature folder; every problem names the file and what to do."""
    path = Path(folder) / "index.json"
    if not path.is_file():
        raise FeatureError(f"{path} missing: run `draftsmith extract -c <config>` first (or set "
                           "extract.enabled: false)")
    raw = json.loads(path.read_text())
    if raw.get("schema_version") != SCHEMA_VERSION:
        raise FeatureError(f"{path}: schema version {raw.get('schema_version')} but this draftsmith reads "
                           f"{SCHEMA_VERSION}; re-run `draftsmith extract` into a fresh folder")
    unknown = sorted(set(raw) - {f.name for f in fields(FeatureIndex)})
    if unknown:
        raise FeatureError(f"{path}: index fields {unknown} that this draftsmith does not write (another "
                           "version wrote it); re-run `draftsmith extract` into a fresh folder")
    index = FeatureIndex(**raw)
    if target is not None and index.target != target:
        raise FeatureError(f"{path}: features were extracted from target '{index.target}', the config names "
                           f"'{target}'; re-extract or fix model.target")
    missing = [k for k in (feature_keys or []) if k not in index.feature_keys]
    if missing:
        raise FeatureError(f"{path}: the drafter needs target features {missing}, the shards hold "
                           f"{index.feature_keys}; set extract.layers and re-extract")
    if verify:
        for name in index.shards:
            verify_shard(Path(folder), index, name)
    return index


def verify_shard(folder: Path, index: FeatureIndex, name: str) -> None:
    shard = Path(folder) / name
    if not shard.is_file():
        raise FeatureError(f"shard {shard} listed in index.json is missing; re-run `draftsmith extract`")
    if sha256_of(shard) != index.shards[name]:
        raise FeatureError(f"shard {shard} fails its sha256 checksum (corrupt or edited); delete it and "
                           "re-run `draftsmith extract`, which rewrites only missing shards (or set "
                           "extract.on_corrupt: skip to train without it)")
