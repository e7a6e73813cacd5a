"""scripts/bench/speculators_peer/speculators_peer.py convert: the EAGLE-3 arm's data shifts the loss mask one
position earlier (speculators' shift_batch), the DFlash arm's keeps draftsmith's (`--mask plain`) and, with
`--hs-from`, reuses the EAGLE-3 conversion's hidden states and vocabulary through symlinks."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import load_script

from draftsmith.distill.cache import sha256_of
from draftsmith.distill.features import FeatureIndex, pack_shard, write_index

V, H = 259, 8


def features(folder: Path, masks: list[list[int]]) -> Path:
    """A train split as `draftsmith extract` lays it out: the three fused layers and the raw last layer."""
    (folder / "train").mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    keys = ["1", "2", "3", "5"]
    items = [{"row_id": i, "input_ids": torch.randint(0, V, (len(m),), generator=g),
              "loss_mask": torch.tensor(m), "hidden": {k: torch.randn(len(m), H, generator=g) for k in keys}}
             for i, m in enumerate(masks)]
    pack_shard(items, folder / "train" / "shard-00000.safetensors")
    index = FeatureIndex(target="tiny", feature_keys=keys, dtype="float32", top_k_logits=0)
    index.shards["shard-00000.safetensors"] = sha256_of(folder / "train" / "shard-00000.safetensors")
    index.shard_sequences["shard-00000.safetensors"] = len(items)
    index.num_sequences = len(items)
    write_index(folder / "train", index)
    return folder


def test_the_dflash_data_keeps_the_mask_and_links_the_eagle3_hidden_states(tmp_path):
    from datasets import load_from_disk

    peer = load_script("speculators_peer/speculators_peer")
    masks = [[0, 0, 1, 1, 1, 0], [0, 1, 1, 0, 1]]
    feats = features(tmp_path / "features", masks)
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text(json.dumps({"vocab_size": V}))
    peer.convert(feats, tmp_path / "target", tmp_path / "eagle3", 16)
    peer.convert(feats, tmp_path / "target", tmp_path / "dflash", 16, "plain", tmp_path / "eagle3")
    shifted = load_from_disk(str(tmp_path / "eagle3" / "data")).with_format(None)["loss_mask"]
    plain = load_from_disk(str(tmp_path / "dflash" / "data")).with_format(None)["loss_mask"]
    assert plain == masks and shifted == [m[1:] + [0] for m in masks]
    for name in ("hs", "d2t.npy", "t2d.npy"):  # no second copy
        link = tmp_path / "dflash" / name
        assert link.is_symlink() and link.resolve() == (tmp_path / "eagle3" / name).resolve()
    assert np.load(tmp_path / "dflash" / "d2t.npy").shape == (16,)
    info = json.loads((tmp_path / "dflash" / "peer.json").read_text())
    assert info["mask"] == "plain" and info["sequences"] == 2 and info["hidden_order"] == ["1", "2", "3", "5"]
    other = features(tmp_path / "other", masks)  # the hidden states are read by row: other features refused
    with pytest.raises(SystemExit, match="hidden states are other rows"):
        peer.convert(other, tmp_path / "target", tmp_path / "dflash2", 16, "plain", tmp_path / "eagle3")
