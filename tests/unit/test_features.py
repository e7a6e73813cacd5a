"""The streaming feature store (distill/features.py FeatureStore, train/sources.py ShardDataset and
ShardBlockSampler): it returns exactly what the in-RAM reader returns, reads lazily with bounded memory
(peak RSS of an epoch over 12 shards stays within a few shards), verifies a shard's checksum on its first
open and names a corrupt one (or skips it when told), and its order depends only on (seed, epoch)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import load_script

from draftsmith.distill.features import (
    FeatureError,
    read_index,
    rows_fingerprint,
    unpack_shard,
)
from draftsmith.train.sources import ShardBlockSampler, ShardDataset, collate_shard_items, group_by_length


def write_features(folder: Path, shards: int, per_shard: int, tokens: int, hidden: int) -> Path:
    """scripts/bench/training_cost/feature_rss.py's synthetic feature folder (`draftsmith extract`'s layout,
    random features)."""
    return load_script("feature_rss").write_features(folder, shards, per_shard, tokens, hidden)


def test_streamed_items_equal_the_in_ram_reader(tmp_path):
    folder = write_features(tmp_path / "f", shards=4, per_shard=5, tokens=7, hidden=8)
    data = ShardDataset(folder, "synthetic", ["final"])
    in_ram = [it for name in sorted(data.index.shards) for it in unpack_shard(folder / name)]
    assert len(data) == len(in_ram) == 20
    for i, ref in enumerate(in_ram):
        got = data[i]
        assert got["row_id"] == ref["row_id"] and torch.equal(got["input_ids"], ref["input_ids"])
        assert torch.equal(got["hidden"]["final"], ref["hidden"]["final"])
        assert (torch.equal(got["topk_indices"], ref["topk_indices"])
                and torch.equal(got["topk_values"], ref["topk_values"]))
    assert len(data.store.open) <= data.store.keep_open  # only the last few shards stay open
    # the same sampler over both readers gives the same batches (so the same loss on the same seed)
    order = list(ShardBlockSampler(data, seed=3, epoch=1))
    a = collate_shard_items([data[i] for i in order[:6]])
    b = collate_shard_items([in_ram[i] for i in order[:6]])
    assert all(torch.equal(a[k], b[k]) for k in ("input_ids", "target_topk_values")) and torch.equal(
        a["features"]["final"], b["features"]["final"])


def test_the_order_depends_only_on_seed_and_epoch_and_keeps_shards_together(tmp_path):
    data = ShardDataset(write_features(tmp_path / "f", shards=5, per_shard=4, tokens=3, hidden=4),
                        "synthetic", ["final"])
    order = list(ShardBlockSampler(data, seed=0, epoch=0))
    assert sorted(order) == list(range(20)) and order == list(ShardBlockSampler(data, seed=0, epoch=0))
    assert order != list(ShardBlockSampler(data, seed=0, epoch=1))
    blocks = [data.store.locate(i)[0] for i in order]
    assert all(len(set(blocks[j:j + 4])) == 1 for j in range(0, 20, 4))  # one shard at a time


def test_grouping_by_length_cuts_batches_of_one_length_from_random_stretches():
    """train.group_by_length: the order is a permutation; each micro-batch the loader cuts holds sequences of
    about one length (padding falls from ~37 % to ~4 % with 16-batch stretches); a batch still comes from one
    stretch of the random order; a short last batch of a stretch stays last so the cuts stay aligned."""
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(16, 384, (1030,), generator=g).tolist()
    order = torch.randperm(1030, generator=g).tolist()
    grouped = group_by_length(order, lengths, 4, torch.Generator().manual_seed(1), span=16)
    assert sorted(grouped) == list(range(1030))
    assert grouped == group_by_length(order, lengths, 4, torch.Generator().manual_seed(1), span=16)

    def padding(o):
        batches = [o[b: b + 4] for b in range(0, len(o), 4)]
        return 1 - sum(lengths[i] for i in o) / sum(len(b) * max(lengths[i] for i in b) for b in batches)

    assert padding(order) > 0.3 and padding(grouped) < 0.05  # stretches of 64 sequences: ~4 %
    for start in range(0, 1030, 64):  # each stretch of 16 batches holds the same sequences as before
        assert sorted(grouped[start: start + 64]) == sorted(order[start: start + 64])
    assert grouped[1028:] == sorted(order[1024:], key=lambda i: -lengths[i])[4:]  # the short batch, last


def test_the_grouped_order_over_shards_reads_lengths_from_their_offsets(tmp_path):
    data = ShardDataset(write_features(tmp_path / "f", shards=5, per_shard=4, tokens=3, hidden=4),
                        "synthetic", ["final"])
    lengths = data.lengths()
    grouped = list(ShardBlockSampler(data, seed=0, epoch=0, group=4))
    assert not data.store.open and not data.store.verified  # no shard opened for reading nor verified
    assert lengths == [len(data[i]["input_ids"]) for i in range(20)]
    assert sorted(grouped) == list(range(20)) and grouped == list(ShardBlockSampler(data, 0, 0, group=4))


def test_grouping_by_length_names_a_corrupt_or_missing_shard(tmp_path):
    folder = write_features(tmp_path / "f", shards=3, per_shard=4, tokens=3, hidden=4)
    data = ShardDataset(folder, "synthetic", ["final"])
    shards = sorted(data.index.shards)
    (folder / shards[1]).write_bytes(b"\x00" * 4)
    with pytest.raises(FeatureError, match=shards[1] + ".*checksum"):
        ShardBlockSampler(data, seed=0, epoch=0, group=4)
    (folder / shards[1]).unlink()
    with pytest.raises(FeatureError, match=shards[1] + ".*missing"):
        ShardBlockSampler(ShardDataset(folder, "synthetic", ["final"]), seed=0, epoch=0, group=4)


def test_a_corrupt_shard_is_named_on_first_open_or_skipped(tmp_path):
    folder = write_features(tmp_path / "f", shards=3, per_shard=2, tokens=4, hidden=4)
    bad = folder / "shard-00001.safetensors"
    bad.write_bytes(bad.read_bytes()[:-8] + b"corrupt!")
    data = ShardDataset(folder, "synthetic", ["final"])  # nothing read yet: nothing checked yet
    assert data[0]["row_id"] == 0
    with pytest.raises(FeatureError,
                       match="shard-00001.safetensors fails its sha256 checksum.*on_corrupt: skip"):
        data[2]
    skipping = ShardDataset(folder, "synthetic", ["final"], on_corrupt="skip")
    assert len(skipping) == 4 and [skipping[i]["row_id"] for i in range(4)] == [0, 1, 4, 5]
    assert "shard-00001" in skipping.store.skipped[0]


def test_an_epoch_streams_in_bounded_memory(tmp_path):
    """12 shards of ~4 MiB: the epoch's peak RSS grows by a few shards at most, not by the dataset (48
    MiB)."""
    row = load_script("feature_rss").measure(write_features(tmp_path / "f", shards=12, per_shard=32,
                                                            tokens=128, hidden=256))
    assert row["dataset_mib"] >= 10 * row["shard_mib"] and row["tokens"] > 0
    assert row["peak_rss_growth_mib"] < 4 * row["shard_mib"] + 16, row


def test_float8_rows_keep_three_mantissa_bits_and_their_scale():
    from draftsmith.distill.features import dequantize_rows, quantize_rows

    x = torch.randn(64, 96) * torch.logspace(-3, 3, 64)[:, None]  # rows six decades apart
    x[5] = 0.0  # an all-zero row: scale 1, zeros back
    x[7, 3] = 1e4  # one massive activation in a row
    q, scale = quantize_rows(x)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (64,) and scale[5] == 1.0
    back = dequantize_rows(q, scale, torch.float32)
    assert torch.equal(back[5], x[5]) and back[7, 3] == x[7, 3]  # a row's largest value is exact
    # e4m3: 3 mantissa bits (relative error <= 2^-4) down to its smallest normal, 2^-6 of the row's scale
    normal = x.abs() >= scale[:, None] * 2 ** -6
    assert ((back - x).abs() <= x.abs() * 2 ** -4 + 1e-12)[normal].all()
    # subnormal spacing 2^-9: half of it
    assert ((back - x).abs() <= scale[:, None] * 2 ** -10)[~normal].all()
    # the largest maps to 448, no overflow
    assert torch.allclose(back.abs().amax(-1), x.abs().amax(-1), rtol=1e-6)


def test_rows_fingerprint_names_the_tokens_not_their_container():
    rows = [{"input_ids": [5, 6, 7], "loss_mask": [0, 1, 1]}, {"input_ids": [8, 9], "loss_mask": [1, 1]}]
    as_tensors = [{k: torch.tensor(v) for k, v in r.items()} for r in rows]
    assert rows_fingerprint(rows) == rows_fingerprint(as_tensors)
    assert rows_fingerprint(rows) != rows_fingerprint(rows[::-1])  # order: row ids index the shards
    assert rows_fingerprint(rows) != rows_fingerprint([rows[0], {"input_ids": [8, 9], "loss_mask": [0, 1]}])
    # where one row's tokens end is part of it: [5,6,7][8,9] is not [5,6][7,8,9]
    moved = [{"input_ids": [5, 6], "loss_mask": [0, 1]}, {"input_ids": [7, 8, 9], "loss_mask": [1, 1, 1]}]
    assert rows_fingerprint(rows) != rows_fingerprint(moved)


def test_an_index_with_fields_this_version_does_not_write_is_one_clear_error(tmp_path):
    """An index.json another draftsmith wrote (a field renamed, say) names its unknown fields and the fix; the
    same index without them reads (the twin)."""
    import json

    folder = write_features(tmp_path / "f", shards=1, per_shard=2, tokens=4, hidden=4)
    path = folder / "index.json"
    raw = json.loads(path.read_text())
    path.write_text(json.dumps({**raw, "shard_seconds": {}}))
    with pytest.raises(FeatureError, match=r"index fields \['shard_seconds'\].*re-run `draftsmith extract`"):
        read_index(folder)
    path.write_text(json.dumps(raw))
    assert read_index(folder).shards
