"""`draftsmith size`: figures from config.json files alone, equal to the hand-computed ones on a tiny target,
and the vendored public configs give their known parameter counts."""

from __future__ import annotations

import json

import pytest
from helpers import write_pattern_conversations

from draftsmith.train import cli
from draftsmith.train.config import load_config
from draftsmith.train.sizing import size_recipe


def test_a_tiny_target_gives_the_hand_computed_figures(tiny_llama_dir, tmp_path):
    data = write_pattern_conversations(tmp_path / "c.jsonl", 6)
    cfg = load_config(None, [f"model.target={tiny_llama_dir}", f"data.train=[{data}]", "drafter.kind=medusa",
                             "drafter.medusa.heads=2", "data.max_length=16", "train.batch_size=2",
                             "train.mixed_precision=no"])
    s = size_recipe(cfg)
    # target: H 32, MLP 64, 2 layers, 4 heads (2 KV, head 8), vocab 259, untied:
    # embed 259x32 + 2 x (q 32x32 + k 32x16 + v 32x16 + o 32x32 + MLP 3x32x64 + 2 norms 32) + norm 32 +
    # lm_head 259x32
    assert (s["target_shape"]["parameters"] == 8288 + 2 * (1024 + 512 + 512 + 1024 + 6144 + 64) + 32
            + 8288 == 35168)
    # Medusa, 2 heads x (ResBlock 32x32 + bias 32, lm_head 32x259)
    assert s["drafter"]["trainable_parameters"] == 2 * (1024 + 32 + 8288) == 18688
    # one feature ("final") x H x 2 B (bf16) + top-64 x (2 + 4) + 4 + 1
    assert s["features"]["bytes_per_token"] == 1 * 32 * 2 + 64 * 6 + 5 == 453
    gb = s["memory"]["gb"]["ddp"]
    assert gb["target"] * 1e9 == pytest.approx(35168 * 4)  # model.dtype float32
    assert gb["drafter+optimizer"] * 1e9 == pytest.approx(18688 * 16)
    # 2 x 16 tokens x [target logits 259 x (4 + 4) + features 32 x 4 + drafter logits 1 step x 518 x 4 x 2]
    assert gb["activations"] * 1e9 == pytest.approx(2 * 16 * (259 * 8 + 32 * 4 + 518 * 8))
    # every conversation is longer than 16
    assert s["data"]["conversations"] == 6 and s["data"]["tokens"] == 6 * 16


@pytest.mark.parametrize("name,params,eagle3_bytes", [("llama-3.1-8b", 8_030_261_248, 24_965),
                                                       ("qwen3-8b", 8_190_735_360, 24_965),
                                                       ("llama-3.1-70b", 70_553_706_496, 49_541)])
def test_vendored_public_configs(name, params, eagle3_bytes):
    s = size_recipe(load_config(None, ["drafter.kind=eagle3"]), name, count_data=False)
    assert s["target_shape"]["parameters"] == params and s["features"]["bytes_per_token"] == eagle3_bytes
    assert s["data"]["tokens"] is None


def test_the_command_prints_json_and_names_a_missing_config(tmp_path, capsys):
    assert cli.main(["size", "--target-config", "llama-3.1-8b", "--json", "drafter.kind=medusa"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["drafter"]["trainable_parameters"] == 4 * (4096 * 4096 + 4096 + 4096 * 128256)
    assert cli.main(["size", "--target-config", str(tmp_path / "none.json")]) == 2
    assert ("neither a file nor a vendored config (deepseek-v3, gpt-oss-120b, llama-3.1-70b, llama-3.1-8b, "
            "qwen3-8b, qwen3.5-default)"
            in capsys.readouterr().err)
