"""`draftsmith pipeline` for every trainable kind in `KINDS` (the test-only `bigram` kind included), online
and from offline shards: train -> every export format of the kind -> eval, on a tiny 10-layer target with
every kind's default settings. The loss is finite and logged each step, each export reads back as its
kind, the serving tree eval used is the one the folder records (Medusa's post-train tree search, EAGLE's
dynamic tree), and greedy output equals the target's."""

from __future__ import annotations

import json
import math

import pytest
from helpers import build_tiny_model_dir

from draftsmith.heads.folder import read_folder
from draftsmith.heads.registry import FORMATS, KINDS
from draftsmith.train.config import load_config
from draftsmith.train.pipeline import run_pipeline

TRAINABLE = [kind for kind, spec in KINDS.items() if spec.trainable]


@pytest.fixture(scope="module")
def target_dir(workspace, tmp_path_factory):
    return build_tiny_model_dir(tmp_path_factory.mktemp("kinds-pipeline"), "llama", layers=10)


@pytest.mark.parametrize("offline", [False, True], ids=["online", "offline"])
@pytest.mark.parametrize("kind", TRAINABLE)
def test_pipeline_trains_exports_and_evaluates_every_kind(kind, offline, workspace, target_dir, tmp_path):
    _, _, data = workspace
    # the formats read back (a GGUF needs llama.cpp's converter, which refuses this byte-level tokenizer)
    formats = ",".join(f for f in KINDS[kind].formats if FORMATS[f].reads_back)
    cfg = load_config(None, [
        f"model.target={target_dir}", "model.dtype=float32", f"data.train=[{data}]", "data.max_length=160",
        "data.val_fraction=0.1", f"drafter.kind={kind}", "drafter.num_speculative_tokens=3",
        "drafter.tree_nodes=4", "train.batch_size=4",
        "train.max_steps=3", "train.lr=3e-3", "train.log_every=1", "train.eval_every=0", "train.save_every=0",
        "train.mixed_precision=no", "log.progress=false", f"export.formats=[{formats}]",
        "export.dtype=float32",
        f"extract.enabled={str(offline).lower()}", "extract.top_k_logits=16", "eval.prompts=mt-bench",
        "eval.limit=2", "eval.max_new_tokens=8", "eval.warmup=0", "eval.dtype=float32"])
    summary = run_pipeline(cfg, tmp_path)
    assert summary["greedy_equal"] is True and summary["n_prompts"] == 2 and summary["drafter_kind"] == kind
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["split"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3] and all(math.isfinite(r["loss"]) for r in train)
    folder = read_folder(tmp_path / "drafter")
    assert folder.kind == kind and folder.meta["target_signature"]["vocab_size"] == 259
    for fmt in formats.split(","):
        exported = read_folder(tmp_path / "export" / fmt)
        assert (exported.kind, exported.format) == (kind, fmt)
    if folder.tree is not None:  # a tree the recipe or a post-train stage chose is the one eval served with
        assert summary["tree"] == folder.tree.label
