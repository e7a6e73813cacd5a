"""Every target family of tests/families.py trains a drafter, exports it and serves it losslessly (the CLI).

The model-neutral `eagle3` recipe (features captured by hooks on whatever layers the family has: attention,
latent attention, gated delta nets, Mamba-2 or convolutions) for 3 steps on the tests' learnable
conversations, exported in its default layout, then `draftsmith eval` on the trained drafter as a chain of 3
and as an EAGLE-2 dynamic tree of 8 nodes (a tree on a hybrid target is verified one branch per batch row):
greedy output equal to the target's own HF `generate` in fp32 (CI: one family per kind of layer; `-m slow`:
every family). The layer-skip drafter (the target's first layers: a layer subset of a hybrid is itself a
hybrid) likewise, as a chain, on every family.
"""

from __future__ import annotations

import json

import families
import pytest
from helpers import build_tiny_tokenizer

from draftsmith.train.cli import main

TINY = ["model.dtype=float32", "train.mixed_precision=no", "log.progress=false", "eval.prompts=mt-bench",
        "eval.limit=2", "eval.max_new_tokens=12", "eval.warmup=0", "eval.dtype=float32"]
TRAIN = ["data.max_length=160", "data.val_fraction=0.2", "train.max_steps=3", "train.max_minutes=null",
         "drafter.tree=chain-3", "drafter.num_speculative_tokens=3", "export.dtype=float32"]


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    root, tokenizer, made = tmp_path_factory.mktemp("families"), build_tiny_tokenizer(), {}

    def folder(name):
        if name not in made:
            made[name] = root / name
            families.build_family_model(name).save_pretrained(made[name])
            tokenizer.save_pretrained(made[name])
        return made[name]

    return folder


def summary(folder) -> dict:
    return json.loads((folder / "summary.json").read_text())


# CI trains one family per kind of layer (a sliding window without layer_types, latent attention, sinks,
# gated delta nets, Mamba-2 beside attention, shared KV); `-m slow` trains every family (so does
# docs/results/targets.md)
CI_FAMILIES = ("mistral", "deepseek_v3", "gpt_oss", "qwen3_5", "falcon_h1", "gemma4_kv_shared")
TRAINED = [pytest.param(name, marks=[pytest.mark.slow, *([pytest.mark.ci] if name in CI_FAMILIES else [])])
           for name in families.FAMILIES]


@pytest.mark.parametrize("name", TRAINED)
def test_eagle3_trains_exports_and_serves_losslessly_on_every_family(name, family_dirs, workspace, tmp_path):
    _, _, data = workspace
    target = family_dirs(name)
    run = tmp_path / "run"
    assert main(["pipeline", "-c", "eagle3", "--out", str(run), f"model.target={target}",
                 f"data.train=[{data}]", *TRAIN, *TINY]) == 0
    assert summary(run / "eval")["greedy_equal"] is True
    assert (run / "export" / "eagle3" / "config.json").is_file()
    tree = tmp_path / "tree"
    assert main(["eval", "--drafter", str(run / "drafter"), "--tree", "dynamic-8", "--out", str(tree),
                 *TINY]) == 0
    assert summary(tree)["greedy_equal"] is True


# Gemma-4 sets its layers' fields one by one (a heterogeneous config): layer skip refuses it (tested below)
UNIFORM = [name for name in families.FAMILIES if not name.startswith("gemma4")]


@pytest.mark.parametrize("name", UNIFORM)
def test_layer_skip_drafts_losslessly_on_every_family(name, family_dirs, tmp_path):
    target = family_dirs(name)
    assert main(["eval", "--target", str(target), "--drafter", "layer-skip", "--tree", "chain-3",
                 "--out", str(tmp_path / "eval"), "drafter.layer_skip.layers=2", *TINY]) == 0
    assert summary(tmp_path / "eval")["greedy_equal"] is True


def test_layer_skip_refuses_a_heterogeneous_stack(family_dirs, tmp_path, capsys):
    target = family_dirs("gemma4")
    assert main(["eval", "--target", str(target), "--drafter", "layer-skip", "--tree", "chain-3",
                 "--out", str(tmp_path / "eval"), "drafter.layer_skip.layers=2", *TINY]) == 2
    assert "first layers of a uniform stack" in capsys.readouterr().err
