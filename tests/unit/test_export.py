"""Export key maps: exact key sets and shapes of the `medusa` and `medusa-vllm` layouts, their configs,
export -> load round trips with identical logits, and tampered exports that must fail by name."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from draftsmith.heads.export import FORMATS, export_drafter
from draftsmith.heads.folder import read_folder
from draftsmith.heads.medusa.export import read_medusa
from draftsmith.heads.medusa.model import MedusaHeads

H, V, K = 32, 259, 3


@pytest.fixture(params=[1, 2], ids=["L1", "L2"])
def drafter_dir(request, tmp_path):
    torch.manual_seed(0)
    heads = MedusaHeads(H, V, num_heads=K, num_layers=request.param)
    for p in heads.parameters():
        torch.nn.init.normal_(p, std=0.05)
    return read_folder(heads.save_pretrained(tmp_path / "drafter", target="tiny/llama")), heads


def medusa_keys(L):
    return {f"{i}.{j}.linear.{p}" for i in range(K) for j in range(L) for p in ("weight", "bias")} | \
        {f"{i}.{L}.weight" for i in range(K)}


def vllm_keys(L):
    return {f"blocks.{i}.layers.{j}.{p}" for i in range(K) for j in range(L) for p in ("weight", "bias")} | \
        {f"lm_heads.{i}.weight" for i in range(K)}


def test_medusa_repo_layout(drafter_dir, tmp_path):
    folder, heads = drafter_dir
    L = heads.num_layers
    out = export_drafter(folder, "medusa", tmp_path / "out", base_model="tiny/llama")
    assert sorted(p.name for p in out.iterdir()) == ["SERVE.md", "config.json", "medusa_lm_head.pt"]
    config = json.loads((out / "config.json").read_text())
    assert "model_type" not in config
    assert (config["medusa_num_heads"], config["medusa_num_layers"], config["base_model_name_or_path"]) == \
        (K, L, "tiny/llama")
    assert ("draftsmith_note" in config) and (("shares one block" in config["draftsmith_note"]) == (L > 1))
    state = torch.load(out / "medusa_lm_head.pt", weights_only=True)
    assert set(state) == medusa_keys(L)
    assert all(t.dtype == torch.bfloat16 and t.is_contiguous() for t in state.values())
    assert state["0.0.linear.weight"].shape == (H, H) and state[f"2.{L - 1}.linear.bias"].shape == (H,)
    assert state[f"1.{L}.weight"].shape == (V, H)


def test_vllm_layout(drafter_dir, tmp_path):
    folder, heads = drafter_dir
    L = heads.num_layers
    out = export_drafter(folder, "medusa-vllm", tmp_path / "out", base_model="tiny/llama", dtype="float16")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "medusa" and config["architectures"] == ["MedusaModel"]
    assert config["medusa_fc_bias"] is True
    assert (config["hidden_size"], config["vocab_size"], config["num_heads"], config["num_hidden_layers"],
            config["truncated_vocab_size"]) == (H, V, K, L, V)
    state = load_file(str(out / "model.safetensors"))
    assert set(state) == vllm_keys(L)
    assert all(t.dtype == torch.float16 for t in state.values())
    assert (state[f"blocks.2.layers.{L - 1}.weight"].shape == (H, H)
            and state["blocks.0.layers.0.bias"].shape == (H,))
    assert state["lm_heads.1.weight"].shape == (V, H)


@pytest.mark.parametrize("fmt", ["medusa", "medusa-vllm"])
def test_round_trip_identical_logits(drafter_dir, tmp_path, fmt):
    folder, heads = drafter_dir
    out = export_drafter(folder, fmt, tmp_path / fmt, base_model="tiny/llama", dtype="float32")
    loaded = read_medusa(out, fmt)
    x = torch.randn(2, 6, H)
    assert torch.equal(loaded(x), heads(x))
    # the Medusa repo's key names, de-prefixed, are exactly our ModuleList's state dict
    if fmt == "medusa":
        repo_heads = torch.load(out / "medusa_lm_head.pt", weights_only=True)
        heads.heads.load_state_dict(repo_heads, strict=True)


def test_tampered_exports_fail_by_name(tmp_path):
    folder = read_folder(MedusaHeads(H, V, num_heads=K).save_pretrained(tmp_path / "d", target="t"))
    pt = export_drafter(folder, "medusa", tmp_path / "m", "t", dtype="float32") / "medusa_lm_head.pt"
    state = torch.load(pt, weights_only=True)
    state["1.0.linear.w"] = state.pop("1.0.linear.weight")
    torch.save(state, pt)
    with pytest.raises(ValueError, match=r"missing \['1.0.linear.weight'\], extra \['1.0.linear.w'\]"):
        read_medusa(pt.parent, "medusa")

    st = export_drafter(folder, "medusa-vllm", tmp_path / "v", "t", dtype="float32") / "model.safetensors"
    state = {k: v for k, v in load_file(str(st)).items() if not k.startswith(("blocks.2.", "lm_heads.2."))}
    save_file(state, str(st))
    with pytest.raises(ValueError, match=r"missing \['blocks.2.layers.0.bias', 'blocks.2.layers.0.weight', "
                                         r"'lm_heads.2.weight'\]"):
        read_medusa(st.parent, "medusa-vllm")

    state = load_file(str(st))
    state.update({"blocks.2.layers.0.weight": torch.zeros(H, H), "blocks.2.layers.0.bias": torch.zeros(H),
                  "lm_heads.2.weight": torch.zeros(V, H + 1)})
    save_file(state, str(st))
    with pytest.raises(ValueError, match=r"lm_heads.2.weight: \(259, 33\) != \(259, 32\)"):
        read_medusa(st.parent, "medusa-vllm")


def test_format_errors(tmp_path):
    folder = read_folder(MedusaHeads(H, V, num_heads=2).save_pretrained(tmp_path / "d", target="t"))
    assert {"medusa", "medusa-vllm"} <= set(FORMATS)
    with pytest.raises(ValueError, match="'onnx' unknown"):
        export_drafter(folder, "onnx", tmp_path / "o", "t")
    for fmt in ("hf", "eagle", "eagle3", "gguf"):
        with pytest.raises(ValueError, match=f"'{fmt}' is not one of a medusa drafter's.*kind 'medusa' "
                                             "\\(its formats: medusa, medusa-vllm\\)"):
            export_drafter(folder, fmt, tmp_path / "o", "t")
    with pytest.raises(ValueError, match="not a torch floating dtype"):
        export_drafter(folder, "medusa", tmp_path / "o", "t", dtype="int8")
    with pytest.raises(ValueError, match="not a Medusa export format"):
        read_medusa(tmp_path / "o", "eagle")
    with pytest.raises(FileNotFoundError, match="draftsmith.json"):
        read_folder(tmp_path)


def test_medusa_note_mentions_five_heads(tmp_path):
    folder = read_folder(MedusaHeads(H, V, num_heads=5).save_pretrained(tmp_path / "d", target="t"))
    config = json.loads((export_drafter(folder, "medusa", tmp_path / "o", "t") / "config.json").read_text())
    assert "draftsmith_note" not in config
    folder = read_folder(MedusaHeads(H, V, num_heads=4).save_pretrained(tmp_path / "d4", target="t"))
    config = json.loads((export_drafter(folder, "medusa", tmp_path / "o4", "t") / "config.json").read_text())
    assert "builds 5" in config["draftsmith_note"]


def test_damaged_folders_are_refused_with_the_reason(tmp_path):
    """What scripts/dev/fuzz.py found: integer weights were cast silently, a draftsmith.json naming another
    kind crashed inside a constructor, and mistyped fields reached the code that reads them."""
    src = MedusaHeads(H, V, num_heads=K).save_pretrained(tmp_path / "d", target="t")
    state = load_file(str(src / "model.safetensors"))
    state["heads.0.1.weight"] = state["heads.0.1.weight"].to(torch.int32)
    save_file(state, str(src / "model.safetensors"))
    with pytest.raises(ValueError,
                       match=r"wrong dtypes \['heads.0.1.weight: torch.int32 for torch.float32'\]"):
        read_folder(src).load()

    other = MedusaHeads(H, V, num_heads=K).save_pretrained(tmp_path / "e", target="t")
    meta = json.loads((other / "draftsmith.json").read_text())
    # a Medusa config read as EAGLE
    (other / "draftsmith.json").write_text(json.dumps(dict(meta, kind="eagle")))
    with pytest.raises(ValueError,
                       match=r"config.json does not describe a eagle drafter .*names the wrong kind"):
        read_folder(other).load()
    (other / "draftsmith.json").write_text(json.dumps(dict(meta, target=5, tree="../../etc/passwd")))
    with pytest.raises(ValueError,
                       match=r"target: int, expected str; tree: str, expected dict; the folder is damaged"):
        read_folder(other)
