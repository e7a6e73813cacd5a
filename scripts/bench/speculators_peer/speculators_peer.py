"""A peer at equal budget: vLLM's speculators 0.9.0 EAGLE-3 (or DFlash) trainer on the features draftsmith
extracted.

Subcommands run by `scripts/bench/speculators_peer/speculators_peer.sh` (which also extracts, trains
draftsmith's drafter on the same shards and evaluates both in our decoder):

    convert FEATURES TARGET PEER --draft-vocab N   (draftsmith's venv) draftsmith shards -> speculators'
                         offline data:
        PEER/data        an HF `datasets` folder: input_ids, loss_mask, seq_len (torch format), train rows
                         first
        PEER/hs/hs_{i}.safetensors   token_ids [T], hidden_states [T, 4, H]: the three fused layers in
                         serving order, then the raw output of the last decoder layer (speculators recomputes
                         the teacher from it: its own final norm + lm_head over the draft vocabulary)
        PEER/d2t.npy, PEER/t2d.npy   the draft vocabulary draftsmith's EAGLE-3 builds from the same train
                         split (the N most frequent label tokens, heads/eagle/eagle3.py draft_vocabulary over
                         distill/data.py label_counts; the same d2t/t2d convention), computed here from the
                         shards so the peer can train before ours; `same-vocab` then checks ours's drafter
                         holds exactly these tokens
        PEER/peer.json   sizes, the train ratio and the mean sequence length
        --mask shifted (EAGLE-3, the default) or plain (DFlash: the mask as draftsmith's, see below)
        --hs-from PEER0  writes only PEER/data: hs, d2t.npy and t2d.npy are symlinks to PEER0's (a
                         conversion of the same FEATURES), peer.json PEER0's with the mask (no second copy of
                         the features)
    ratio PEER   (any python) prints PEER/peer.json's train ratio (the trainer's --train-data-ratio)
    same-vocab DRAFTER PEER   (draftsmith's venv) exit 1 unless DRAFTER's d2t equals PEER/d2t.npy
    seq-len PEER BATCH   (the speculators venv) the smallest --total-seq-len whose packed epoch has as many
                         steps as ours's epoch at BATCH sequences a step (ceil(train sequences / BATCH)):
                         equal steps per epoch, so equal tokens per step on average (4 x the mean length
                         leaves its packer ~14 % short: more, smaller steps); prints it and that step count
    anchors PEER BATCH PER_SEQ BLOCK MAX_ANCHORS   (the speculators venv) DFlash's training blocks per
                         step on average over the epoch: speculators' (at most MAX_ANCHORS a packed row of
                         PEER/seq_len's --total-seq-len, its seed-0 packing) and ours's (at most PER_SEQ a
                         sequence, BATCH sequences a step); prints JSON, with the MAX_ANCHORS that equalises
                         the two where they differ by more than 2 %
    finished PEER   (any python) exit 1 unless PEER/ckpt/0 is the end-of-training save (a SIGINT/SIGTERM'd
                         trainer saves to ckpt/interrupted and exits 0)
    train PEER [speculators flags]   (the speculators venv) speculators' own trainer, as a single CPU process

Facts this rests on (speculators 0.9.0, read from its installed package; SP = site-packages/speculators):
- shard key i is the output of decoder layer i (distill/target.py): serving layers 2/15/27 are keys 1/14/26,
  and the raw last layer is key N-1 (extract with `extract.layers: [N-1]`; "final" is normed, speculators
  would norm it twice). Data: SP/train/data.py ArrowDataset (load_from_disk; hs files by global row index;
  token_ids must equal input_ids; hidden_states[:, :-1] fused, [:, -1] the verifier's last hidden state).
- speculators applies the mask of the input token (SP/models/eagle3/data.py shift_batch), draftsmith the mask
  of the predicted token (heads/eagle/model.py): the converter shifts the mask one position earlier so both
  count the same positions.
- on a CPU-only torch the trainer moves to device 0 (SP/train/trainer.py setup_model, the batch loops) and its
  step timer calls torch.accelerator.synchronize(): `train` points get_local_rank at "cpu" and makes the
  synchronize a no-op; the fused losses need Triton (absent) and CPU autocast is off, so the driver passes
  --loss-implementation eager --hidden-states-dtype float32 --draft-attn-impl sdpa.
- what our reader computes (heads/export.py read_speculators): one Llama layer, full attention,
  norm_before_residual false -- the driver passes --num-layers 1 --draft-arch llama --full-attention-indices 0
  --no-norm-before-residual (the reader refuses the other settings by name).
- differences kept (speculators' recipe, not ours): its draft lm_head stays frozen at the target's rows; its
  loss sums the TTT steps (ours averages them by weight); each step is one packed row of --total-seq-len
  tokens.
DFlash (`--speculator-type dflash`, speculators 0.9.0 wheel: SP = speculators/):
- the same offline layout: hidden_states[:, :-1] the fused layers, [:, -1] the raw last layer, from which
  the teacher is recomputed (SP/models/dflash/core.py:436-453); its data has no preprocess
  (SP/train/cli.py:700-705, shift_batch for eagle3 only), so the mask is draftsmith's own (`--mask plain`);
  an anchor a is a position with loss_mask[a] = 1 outside the packed row's last block_size positions
  (SP/models/dflash/utils.py:44-45), slot k targets token a + k and counts iff loss_mask[a + k]
  (core.py:472-484): the same counted targets as ours, whose anchors are a with loss_mask[a + 1]
  (heads/dflash/model.py pick_anchors), one position earlier
- --block-size counts the anchor: 5 with --no-sample-from-anchor drafts 4 (core.py:255-258); at most
  --max-anchors blocks per packed row (utils.py:21-67), ours at most drafter.dflash.anchors per sequence
- the mask slots embed the frozen target embedding of --mask-token-id (core.py:408-415, SP/model.py:63);
  ours trains one
- our reader (heads/dflash/export.py read_dflash) refuses sliding-window layers and a causal block: the driver
  passes --full-attention-indices 0 1 --sliding-window-non-causal (speculators' defaults are both off)
Nothing here unpickles: hidden states are safetensors, the vocabulary maps .npy (np.load without pickle).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path


def convert(features: Path, target: Path, peer: Path, draft_vocab: int, mask: str = "shifted",
            hs_from: Path | None = None) -> None:
    import numpy as np
    import torch
    from datasets import Dataset
    from safetensors.torch import save_file

    from draftsmith.distill.data import label_counts
    from draftsmith.distill.features import FeatureStore
    from draftsmith.heads.eagle.eagle3 import draft_vocabulary

    if hs_from is not None:
        reuse(features, peer, mask, hs_from)
        return
    config = json.loads((target / "config.json").read_text())
    vocab_size = int(config.get("vocab_size") or config["text_config"]["vocab_size"])
    stores = {split: FeatureStore(features / split) for split in ("train", "validation")
              if (features / split / "index.json").is_file()}
    keys = stores["train"].index.feature_keys
    layers = sorted((k for k in keys if k.lstrip("-").isdigit()), key=int)
    if len(layers) != 4:
        raise SystemExit(f"{features}: shards hold features {keys}; the peer needs the EAGLE-3 recipe's "
                         "three fused layers and the raw last decoder layer (extract.layers: [N-1], e.g. 29 "
                         "for a 30-layer target)")
    aux, last = layers[:3], layers[3:]  # the last decoder layer is the deepest key
    order = [*aux, last[0]]
    (peer / "hs").mkdir(parents=True, exist_ok=True)
    rows = {"input_ids": [], "loss_mask": [], "seq_len": []}
    n_train, i = len(stores["train"]), 0
    # label counts of the train split, as draftsmith's train counts
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for store in stores.values():
        for s in range(len(store)):
            item = store[s]
            ids = torch.as_tensor(item["input_ids"]).long()
            if i < n_train:
                counts += label_counts([item], vocab_size)
            hidden = torch.stack([item["hidden"][k] for k in order], dim=1).contiguous()  # [T, 4, H]
            save_file({"token_ids": ids.clone(), "hidden_states": hidden},
                      str(peer / "hs" / f"hs_{i}.safetensors"))
            rows["input_ids"].append(ids.tolist())
            rows["loss_mask"].append(peer_mask(item["loss_mask"], mask))
            rows["seq_len"].append(len(ids))
            i += 1
    data = Dataset.from_dict(rows)
    data.set_format("torch")
    data.save_to_disk(str(peer / "data"))
    ids = torch.tensor(draft_vocabulary(counts, vocab_size, draft_vocab), dtype=torch.long)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[ids] = True
    np.save(peer / "d2t.npy", (ids - torch.arange(len(ids))).numpy())  # target id = draft id + d2t[draft id]
    np.save(peer / "t2d.npy", t2d.numpy())
    mean = sum(rows["seq_len"]) / max(1, i)
    info = {"sequences": i, "train_sequences": n_train, "train_data_ratio": (n_train + 0.5) / i,
            "mean_seq_len": round(mean, 1), "hidden_order": order, "draft_vocab": draft_vocab,
            "features": str(features), "target": str(target), **({"mask": mask} if mask != "shifted" else {})}
    (peer / "peer.json").write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps(info))


def peer_mask(loss_mask, mask: str) -> list[int]:
    """The loss mask speculators reads: shifted one position earlier for EAGLE-3 (its shift_batch applies the
    input token's mask, draftsmith the predicted token's), draftsmith's own for DFlash (no shift there)."""
    import torch

    m = torch.as_tensor(loss_mask).long().tolist()
    return m[1:] + [0] if mask == "shifted" else m


def reuse(features: Path, peer: Path, mask: str, hs_from: Path) -> None:
    """PEER/data from FEATURES with `mask`; hs, d2t.npy and t2d.npy symlinked to HS_FROM's conversion of the
    same FEATURES (the hs files are read by row index: the same rows in the same order)."""
    from datasets import Dataset

    from draftsmith.distill.features import FeatureStore

    info = json.loads((hs_from / "peer.json").read_text())
    if Path(info["features"]).resolve() != features.resolve():
        raise SystemExit(f"--hs-from {hs_from}: converted from {info['features']}, not {features}: its "
                         "hidden states are other rows")
    peer.mkdir(parents=True, exist_ok=True)
    rows = {"input_ids": [], "loss_mask": [], "seq_len": []}
    for split in ("train", "validation"):
        if (features / split / "index.json").is_file():
            store = FeatureStore(features / split)
            for s in range(len(store)):
                item = store[s]
                rows["input_ids"].append(item["input_ids"].long().tolist())
                rows["loss_mask"].append(peer_mask(item["loss_mask"], mask))
                rows["seq_len"].append(len(item["input_ids"]))
    if len(rows["seq_len"]) != info["sequences"]:
        raise SystemExit(f"{features}: {len(rows['seq_len'])} sequences, {hs_from} holds {info['sequences']}")
    data = Dataset.from_dict(rows)
    data.set_format("torch")
    data.save_to_disk(str(peer / "data"))
    for name in ("hs", "d2t.npy", "t2d.npy"):
        if not (peer / name).is_symlink():
            (peer / name).symlink_to((hs_from / name).resolve())
    info.update(mask=mask, hs_from=str(hs_from))
    (peer / "peer.json").write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps(info))


def same_vocab(drafter: Path, peer: Path) -> None:
    import numpy as np
    from safetensors.torch import load_file

    d2t = load_file(str(drafter / "model.safetensors"))["d2t"].long().numpy()
    theirs = np.load(peer / "d2t.npy")
    if d2t.shape != theirs.shape or not (d2t == theirs).all():
        raise SystemExit(f"{drafter}: its draft vocabulary ({d2t.shape[0]} tokens) is not {peer}/d2t.npy "
                         f"({theirs.shape[0]}): the two drafters would not draft over the same tokens")
    print(f"same draft vocabulary: {d2t.shape[0]} tokens")


def seq_len(peer: Path, batch: int) -> None:
    import numpy as np
    from datasets import load_from_disk
    from speculators.train.distributed_batch_sampler import _assign_to_packed_batches

    info = json.loads((peer / "peer.json").read_text())
    data = load_from_disk(str(peer / "data"))
    # its split
    lengths = np.array(data.with_format(None)["seq_len"][: int(len(data) * info["train_data_ratio"])])
    # its epoch-0 order at --seed 0 (_generate_batches)
    order = np.random.default_rng(seed=0).permutation(len(lengths))
    want = math.ceil(len(lengths) / batch)

    def steps(total: int) -> int:
        return len(_assign_to_packed_batches(np.clip(lengths[order], 0, total), total, 0, 1))

    # steps(hi) = 1 <= want; find the smallest total with steps <= want
    lo, hi = int(lengths.max()), int(lengths.sum())
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if steps(mid) <= want else (mid + 1, hi)
    print(lo, steps(lo), want)


def anchors(peer: Path, batch: int, per_seq: int, block: int, max_anchors: int) -> None:
    import numpy as np
    from datasets import load_from_disk
    from speculators.train.distributed_batch_sampler import _assign_to_packed_batches

    info = json.loads((peer / "peer.json").read_text())
    data = load_from_disk(str(peer / "data")).with_format(None)
    n = int(len(data) * info["train_data_ratio"])
    masks = [np.asarray(m, dtype=bool) for m in data["loss_mask"][:n]]
    lengths = np.array([len(m) for m in masks])
    total = int((peer / "seq_len").read_text().split()[0])
    order = np.random.default_rng(seed=0).permutation(n)  # its epoch-0 order at --seed 0, as seq-len
    candidates = []
    for rows in _assign_to_packed_batches(np.clip(lengths[order], 0, total), total, 0, 1):
        row = np.zeros(total, dtype=bool)
        packed = np.concatenate([masks[i] for i in order[rows]])[:total]
        row[:len(packed)] = packed
        row[-block:] = False  # select_anchors: not in the row's last block_size positions
        candidates.append(int(row.sum()))
    candidates = np.array(candidates)

    def theirs(cap: int) -> float:
        return float(np.minimum(candidates, cap).mean())

    # ours: a in [1, T-2] with the token a+1 counted, at most PER_SEQ a sequence
    ours = sum(min(per_seq, int(m[2:].sum())) for m in masks) / math.ceil(n / batch)
    out = {"peer_blocks_per_step": round(theirs(max_anchors), 1), "ours_blocks_per_step": round(ours, 1),
           "peer_steps": len(candidates), "ours_steps": math.ceil(n / batch), "max_anchors": max_anchors,
           "anchors_per_sequence": per_seq}
    if abs(theirs(max_anchors) - ours) > 0.02 * ours:  # the smallest cap whose mean reaches ours's
        lo, hi = 1, max(int(candidates.max()), 1)
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if theirs(mid) >= ours else (mid + 1, hi)
        out["equalising_max_anchors"] = lo
    print(json.dumps(out))


def ratio(peer: Path) -> None:
    print(json.loads((peer / "peer.json").read_text())["train_data_ratio"])


def finished(peer: Path) -> None:
    state = peer / "ckpt" / "0" / "training_state.json"
    if not state.is_file() or json.loads(state.read_text()).get("local_step") != 0:
        raise SystemExit(f"{peer}/ckpt: the trainer stopped before the end of its training (no "
                         "end-of-training checkpoint): rerun to resume from its last checkpoint")


def train(argv: list[str]) -> None:
    import torch

    torch.accelerator.synchronize = lambda *a, **k: None  # the step timer's sync raises on a CPU-only torch
    import speculators.train.trainer as trainer

    trainer.get_local_rank = lambda: "cpu"  # the trainer moves the model and batches to its local rank
    import speculators.train.checkpointer as checkpointer

    # resumable on a CPU (--checkpoint-freq < 1 saves mid-epoch, SP/train/trainer.py train_epoch; a rerun
    # resumes at that step, fast-skipping the sampler's batches): the checkpointer loads onto
    # get_current_device(), "cuda:0" on a CPU-only torch, and saves weights and Adam state in bf16 by default,
    # which a resumed run would continue from -- fp32 here, so a resumed run continues exactly where the
    # uninterrupted one would be
    checkpointer.get_current_device = lambda: "cpu"
    save = checkpointer.SingleGPUCheckpointer.save_checkpoint

    def save_fp32(self, model, optimizer, epoch, float_dtype=None):
        return save(self, model, optimizer, epoch, float_dtype=torch.float32)

    checkpointer.SingleGPUCheckpointer.save_checkpoint = save_fp32
    from speculators.train.cli import main
    from speculators.train.config import TrainConfig

    main(TrainConfig.resolve(argv))


def run() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "train":
        train(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("convert")
    c.add_argument("features", type=Path)
    c.add_argument("target", type=Path, help="the target's folder (its config.json: the vocabulary size)")
    c.add_argument("peer", type=Path)
    c.add_argument("--draft-vocab", type=int, required=True,
                   help="draft vocabulary size (drafter.eagle3.draft_vocab)")
    c.add_argument("--mask", choices=("shifted", "plain"), default="shifted",
                   help="shifted: EAGLE-3's (speculators' shift_batch); plain: DFlash's")
    c.add_argument("--hs-from", type=Path,
                   help="a conversion of the same features: symlink its hidden states")
    v = sub.add_parser("same-vocab")
    v.add_argument("drafter", type=Path)
    v.add_argument("peer", type=Path)
    q = sub.add_parser("seq-len", help="run with the speculators venv (its own packer)")
    q.add_argument("peer", type=Path)
    q.add_argument("batch", type=int)
    a = sub.add_parser("anchors", help="run with the speculators venv (its own packer)")
    a.add_argument("peer", type=Path)
    for name in ("batch", "per_seq", "block", "max_anchors"):
        a.add_argument(name, type=int)
    f = sub.add_parser("finished")
    f.add_argument("peer", type=Path)
    r = sub.add_parser("ratio")
    r.add_argument("peer", type=Path)
    sub.add_parser("train", help="speculators' trainer with the given flags (run with the speculators venv)")
    args = parser.parse_args()
    if args.cmd == "same-vocab":
        same_vocab(args.drafter, args.peer)
    elif args.cmd == "seq-len":
        seq_len(args.peer, args.batch)
    elif args.cmd == "finished":
        finished(args.peer)
    elif args.cmd == "ratio":
        ratio(args.peer)
    elif args.cmd == "anchors":
        anchors(args.peer, args.batch, args.per_seq, args.block, args.max_anchors)
    else:
        convert(args.features, args.target, args.peer, args.draft_vocab, args.mask, args.hs_from)


if __name__ == "__main__":
    run()
