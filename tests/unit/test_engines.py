"""Engine conformance: each serving engine's load rules, as read in its source (heads/engines.py cites the
file and version of every rule), applied to real draftsmith exports on tiny Llama, Qwen2, Qwen3 and
Gemma 3 targets. The engine view of an export — the parameters it would build and fill, the target
features it would capture, its vocabulary map — must be exactly the drafter we trained: same tensors,
same features (computed with the engine's capture rule on the target), same logits. Each rule has a
negative twin: an export written the old or the wrong way, which the same check must reject.

Emulated (no engine runs on this machine): vLLM 0.33.0 (EAGLE-1/3, speculators), vLLM 0.32.0 (Medusa),
SGLang 0.5.23 (EAGLE-1/3), SafeAILab/EAGLE @ cb7e0841 (its embedding-copy rule). The speculators
library itself loads our export in scripts/dev/engine_check.sh (a separate venv), and HF's loader runs here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import build_tiny_model
from safetensors.torch import load_file, save_file

from draftsmith.heads.export import export_drafter
from draftsmith.heads.folder import read_folder
from draftsmith.heads.registry import DrafterConfig, build_drafter

FAMILIES = ["llama", "qwen2", "qwen3", "gemma3"]
N = 6  # target layers


class EngineRefuses(AssertionError):
    """The emulated engine would fail to load (or load wrongly) what it was given."""


# ---- the engines' load rules, as read (see heads/engines.py RULES for the files) ---------------------------
def vllm_eagle3(folder: Path) -> dict:
    """vLLM 0.33.0 llama_eagle3.py + eagle3_utils.py: (aux ids, parameter name -> tensor, how ids map)."""
    config = json.loads((folder / "config.json").read_text())
    if not set(config.get("architectures", [])) & {"Eagle3LlamaForCausalLM", "LlamaForCausalLMEagle3"}:
        raise EngineRefuses(f"vLLM: architectures {config.get('architectures')} is not an EAGLE-3 drafter")
    ids = config.get("eagle_aux_hidden_state_layer_ids") or [2, N // 2, N - 3]  # MRV2: top level only
    attention_bias = bool(config.get("attention_bias", False))
    o_bias = attention_bias or bool(config.get("bias", False))
    expected = {"fc.weight", "norm.weight", "lm_head.weight", "layers.0.hidden_norm.weight",
                "layers.0.input_layernorm.weight", "layers.0.post_attention_layernorm.weight",
                *(f"layers.0.mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
                *(f"layers.0.self_attn.{p}_proj.weight" for p in "qkvo"),
                *([f"layers.0.self_attn.{p}_proj.bias" for p in "qkv"] if attention_bias else []),
                *(["layers.0.self_attn.o_proj.bias"] if o_bias else [])}
    if config.get("draft_vocab_size", config["vocab_size"]) != config["vocab_size"]:
        expected.add("draft_id_to_target_id")
    # EAGLE-3.1's norms (RULES["eagle3-norms-vllm"]): input_norm only with its flag (dropped silently without)
    norm_before_fc = (config.get("eagle_config") or {}).get("norm_before_fc", config.get("norm_before_fc"))
    expected |= ({"input_norm.weight"} if norm_before_fc else set()) | (
        {f"fc_norm.{i}.weight" for i in range(len(ids))} if config.get("fc_norm") else set())
    params = {}
    for name, tensor in load_file(str(folder / "model.safetensors")).items():
        name = name.replace("midlayer.", "layers.0.").replace("d2t", "draft_id_to_target_id")
        if name in ("t2d", "embed_tokens.weight"):  # t2d skipped; embed: the target's when absent or equal
            continue
        if name not in expected:
            if name.endswith(".bias") or name == "input_norm.weight":  # dropped silently (see below)
                continue
            raise EngineRefuses(f"vLLM: no module or parameter named {name}")
        params[name] = tensor
    norm_before_residual = config.get("norm_before_residual", False)
    return {"ids": ids, "params": params, "unfilled": expected - set(params),
            "norm_before_residual": norm_before_residual,
            "targets": lambda d: torch.arange(len(params["lm_head.weight"])) + params.get(
                "draft_id_to_target_id", torch.zeros(len(params["lm_head.weight"]), dtype=torch.long))}


def sglang_eagle3(folder: Path) -> dict:
    """SGLang 0.5.23 llama_eagle3.py + llama.py set_eagle3_layers_to_capture."""
    config = json.loads((folder / "config.json").read_text())
    if "LlamaForCausalLMEagle3" not in config.get("architectures", []):
        raise EngineRefuses(f"SGLang: architectures {config.get('architectures')}: no LlamaForCausalLMEagle3")
    given = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    ids = [v + 1 for v in given] if given else [2, N // 2, N - 3]  # captured: the input of layer val + 1
    fc_bias, o_bias = bool(config.get("bias", False)), bool(config.get("attention_bias")
                                                            or config.get("bias"))
    expected = {"fc.weight", "norm.weight", "layers.0.hidden_norm.weight", "layers.0.input_layernorm.weight",
                "layers.0.post_attention_layernorm.weight",
                *(f"layers.0.mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
                *(f"layers.0.self_attn.{p}_proj.weight" for p in "qkvo"), *(["fc.bias"] if fc_bias else []),
                *(["layers.0.self_attn.o_proj.bias"] if o_bias else [])}
    own_head = config.get("draft_vocab_size") is not None and not config.get("tie_word_embeddings", False)
    if own_head:
        expected.add("lm_head.weight")
    params = {}
    for name, tensor in load_file(str(folder / "model.safetensors")).items():
        name = name.replace("midlayer", "layers.0")
        if name == "d2t":
            params["hot_token_id"] = tensor + torch.arange(len(tensor))
        elif name in expected:
            params[name] = tensor  # anything else (t2d, embed_tokens, unknown) is skipped silently
    if not own_head:
        params.pop("lm_head.weight", None)
    return {"ids": ids, "params": params, "unfilled": expected - set(params), "norm_before_residual": False,
            "own_head": own_head, "targets": lambda d: params.get("hot_token_id", torch.arange(d))}


def engine_features(target_model, ids: list[int], input_ids) -> dict:
    """What the engine feeds the drafter: the residual stream entering layer l (HF hidden_states[l])."""
    with torch.no_grad():
        hs = target_model(input_ids, output_hidden_states=True).hidden_states
    return [hs[layer] for layer in ids]


def ours_features(target_model, drafter, input_ids):
    from draftsmith.distill.target import Target
    return [Target(target_model, None).forward(input_ids, layers=[k]).hidden[k]
            for k in drafter.feature_layers]


# ---- fixtures ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    return request.param


def trained(kind: str, family: str, tmp_path: Path, **own):
    target = build_tiny_model(family, layers=N)
    torch.manual_seed(3)
    drafter = build_drafter(DrafterConfig.for_kind(kind, **own), target, torch.arange(259).flip(0))
    with torch.no_grad():
        for p in drafter.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    return target, drafter, read_folder(drafter.save_pretrained(tmp_path / kind, target="tiny"))


def same_drafter(view: dict, drafter, folder_names: dict[str, str]):
    """Every parameter the engine builds is filled with exactly the tensor we trained (none left at init)."""
    assert not view["unfilled"], f"the engine would leave {sorted(view['unfilled'])} at their random init"
    ours = drafter.trained_state()
    for theirs, tensor in view["params"].items():
        if theirs in ("draft_id_to_target_id", "hot_token_id"):
            continue
        assert torch.equal(tensor.float(), ours[folder_names[theirs]].float()), theirs


EAGLE3_NAMES = lambda d: {k.replace("midlayer.", "layers.0."): k for k in d.trained_state()}  # noqa: E731


# ---- EAGLE-3: one folder, two engines ----------------------------------------------------------------------
@pytest.mark.parametrize("engine", [vllm_eagle3, sglang_eagle3], ids=["vllm", "sglang"])
def test_eagle3_export_is_the_trained_drafter_to_each_engine(engine, family, tmp_path):
    target, drafter, folder = trained("eagle3", family, tmp_path, draft_vocab=100, aux_layers=[1, 3, 4])
    out = export_drafter(folder, "eagle3", tmp_path / "out", base_model="tiny", dtype="float32")
    view = engine(out)
    same_drafter(view, drafter, EAGLE3_NAMES(drafter))
    assert view["norm_before_residual"] is False  # what our Eagle3Layer computes
    ids = torch.randint(3, 259, (1, 9), generator=torch.Generator().manual_seed(0))
    for theirs, mine in zip(engine_features(target, view["ids"], ids), ours_features(target, drafter, ids)):
        assert torch.equal(theirs, mine)  # fed the features it was trained on
    assert torch.equal(view["targets"](drafter.draft_vocab_size), drafter.draft_to_target(torch.arange(100)))
    if engine is sglang_eagle3:
        assert view["own_head"]


def test_eagle3_full_vocabulary_export_starts_in_vllm(tmp_path):
    """RULES["vllm-full-vocab"] (found serving SERVE.md's command, tests/integration/test_serve_md.py): with
    the full vocabulary the export carries no d2t/t2d, vLLM fills every parameter, the read-back is the same
    drafter; twin: the maps written anyway make vLLM refuse to start."""
    target, drafter, folder = trained("eagle3", "llama", tmp_path, draft_vocab=0, aux_layers=[1, 3, 4])
    assert not drafter.reduced
    out = export_drafter(folder, "eagle3", tmp_path / "out", base_model="tiny", dtype="float32")
    assert not {"d2t", "t2d"} & set(load_file(str(out / "model.safetensors")))
    same_drafter(vllm_eagle3(out), drafter, EAGLE3_NAMES(drafter))
    # identity maps read back
    ours, back = drafter.trained_state(), read_folder(out).load(target).trained_state()
    assert ours.keys() == back.keys() and all(torch.equal(ours[k].float(), back[k].float()) for k in ours)
    tensors = load_file(str(out / "model.safetensors"))
    tensors.update(d2t=torch.zeros(drafter.draft_vocab_size, dtype=torch.long),
                   t2d=torch.ones(259, dtype=torch.bool))
    save_file(tensors, str(out / "model.safetensors"))
    with pytest.raises(EngineRefuses, match="draft_id_to_target_id"):
        vllm_eagle3(out)


def test_eagle3_negative_twins(tmp_path):
    """The conventions that fail silently, each written the wrong way: the same checks must reject them."""
    target, drafter, folder = trained("eagle3", "llama", tmp_path, draft_vocab=100, aux_layers=[1, 3, 4])
    out = export_drafter(folder, "eagle3", tmp_path / "out", base_model="tiny", dtype="float32")
    config = json.loads((out / "config.json").read_text())
    ids = torch.randint(3, 259, (1, 9), generator=torch.Generator().manual_seed(0))

    def rewrite(**changes):
        (out / "config.json").write_text(json.dumps({k: v for k, v in {**config, **changes}.items()
                                                     if v is not None}))

    # old draftsmith eagle3 exports: vLLM's ids under eagle_config -> SGLang captures one layer off
    rewrite(eagle_config={"use_aux_hidden_state": True, "eagle_aux_hidden_state_layer_ids": [1, 3, 4]})
    view = sglang_eagle3(out)
    assert not all(torch.equal(a, b) for a, b in zip(engine_features(target, view["ids"], ids),
                                                     ours_features(target, drafter, ids)))
    # custom layers only under eagle_config -> vLLM feeds its defaults
    rewrite(eagle_aux_hidden_state_layer_ids=None)
    assert vllm_eagle3(out)["ids"] != [1, 3, 4]
    # tied embeddings -> SGLang uses the embedding as the draft lm_head
    rewrite(tie_word_embeddings=True)
    assert not sglang_eagle3(out)["own_head"] and "lm_head.weight" not in sglang_eagle3(out)["params"]
    # `bias: true` -> SGLang builds an fc bias (and both an o_proj bias) the checkpoint lacks
    rewrite(bias=True)
    with pytest.raises(AssertionError, match="random init"):
        same_drafter(sglang_eagle3(out), drafter, EAGLE3_NAMES(drafter))
    with pytest.raises(AssertionError, match="random init"):
        same_drafter(vllm_eagle3(out), drafter, EAGLE3_NAMES(drafter))
    # a renamed tensor: vLLM refuses, SGLang would skip it silently (caught as unfilled)
    rewrite()
    tensors = load_file(str(out / "model.safetensors"))
    tensors["fc.weights"] = tensors.pop("fc.weight")
    save_file(tensors, str(out / "model.safetensors"))
    with pytest.raises(EngineRefuses, match="no module or parameter named fc.weights"):
        vllm_eagle3(out)
    with pytest.raises(AssertionError, match=r"random init"):
        same_drafter(sglang_eagle3(out), drafter, EAGLE3_NAMES(drafter))


def test_eagle3_refuses_a_trained_fc_bias(tmp_path):
    target, _, folder = trained("eagle3", "llama", tmp_path, draft_vocab=0, fc_bias=True)
    for fmt in ("eagle3", "speculators"):
        with pytest.raises(ValueError, match="trained with an fc bias"):
            export_drafter(folder, fmt, tmp_path / fmt, base_model="tiny", target_model=target)


def test_eagle_repo_copies_its_embedding_only_without_target_hidden_size(tmp_path):
    """SafeAILab/EAGLE cnets.py: embed_tokens is copied from the base only when the config has no
    target_hidden_size; with it (and no embed_tokens in the checkpoint) the embedding stays random."""
    _, _, folder = trained("eagle3", "llama", tmp_path, draft_vocab=100)
    config = json.loads((export_drafter(folder, "eagle3", tmp_path / "out",
                                        base_model="tiny") / "config.json").read_text())
    copies_embedding = lambda c: "target_hidden_size" not in c  # noqa: E731  (the repo's condition)
    assert copies_embedding(config) and "draft_vocab_size" in config
    assert not copies_embedding(dict(config, target_hidden_size=config["hidden_size"]))  # the old export


# ---- speculators (vLLM's speculators path; the library itself: scripts/dev/engine_check.sh) ----------------
def vllm_speculators(folder: Path) -> dict:
    """vLLM 0.33.0 transformers_utils/configs/speculators/{base,algos}.py: required keys and derived
    values."""
    config = json.loads((folder / "config.json").read_text())
    if "model_type" in config or "speculators_config" not in config:
        raise EngineRefuses("vLLM: not detected as speculators (needs speculators_config and no model_type)")
    sc = config["speculators_config"]
    for path, value in (("proposal_methods[0].speculative_tokens",
                         (sc.get("proposal_methods") or [{}])[0].get("speculative_tokens")),
                        ("verifier.name_or_path", (sc.get("verifier") or {}).get("name_or_path")),
                        ("speculators_model_type", config.get("speculators_model_type"))):
        if value is None:
            raise EngineRefuses(f"vLLM: speculators config lacks {path}")
    if not isinstance(config.get("transformer_layer_config"), dict):
        raise EngineRefuses("vLLM: transformer_layer_config must be a dict")
    return {"k": sc["proposal_methods"][0]["speculative_tokens"],
            # True when absent, on this path
            "ids": config.get("eagle_aux_hidden_state_layer_ids"),
            "norm_before_residual": config.get("norm_before_residual", True),
            "model_type": config["transformer_layer_config"].get("model_type")}


def test_speculators_export_reads_right_in_vllm_and_back_in_draftsmith(family, tmp_path):
    target, drafter, folder = trained("eagle3", family, tmp_path, draft_vocab=100, aux_layers=[1, 3, 4])
    folder.meta["tree"] = {"topk": 2, "depth": 4, "budget": 6}
    out = export_drafter(folder, "speculators", tmp_path / "spec", base_model="org/tiny-target",
                         dtype="float32", target_model=target)
    view = vllm_speculators(out)
    assert view == {"k": 4, "ids": [1, 3, 4], "norm_before_residual": False, "model_type": "llama"}
    tensors = load_file(str(out / "model.safetensors"))
    assert ("layers.0.self_attn.q_proj.weight" in tensors
            and not any(k.startswith("midlayer") for k in tensors))
    assert torch.equal(tensors["embed_tokens.weight"], target.get_input_embeddings().weight)
    back = read_folder(out).load(target)
    x, ids = torch.randn(1, 4, target.config.hidden_size), torch.randint(0, 259, (1, 4))
    from draftsmith.heads.eagle.ttt import ttt_mask

    with torch.no_grad():
        ref = drafter.logits(drafter.step(x, ids, torch.arange(4)[None], ttt_mask(4, 0, "cpu"),
                                          drafter.new_cache()))
        got = back.logits(back.step(x, ids, torch.arange(4)[None], ttt_mask(4, 0, "cpu"), back.new_cache()))
    assert torch.equal(ref, got)
    # negative twins: without norm_before_residual vLLM's speculators path normalises before the residual
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({k: v for k, v in config.items()
                                                 if k != "norm_before_residual"}))
    assert vllm_speculators(out)["norm_before_residual"] is True
    # ... and our reader refuses what it does not compute, by name, instead of loading another layer
    with pytest.raises(ValueError,
                       match="norm_before_residual is true .absent: the format's default is true"):
        read_folder(out).load(target)
    (out / "config.json").write_text(json.dumps(dict(config, norm_before_residual=True)))
    with pytest.raises(ValueError, match="norm_before_residual is true; .*--no-norm-before-residual"):
        read_folder(out).load(target)
    sliding = dict(config["transformer_layer_config"], layer_types=["sliding_attention"], sliding_window=2048)
    (out / "config.json").write_text(json.dumps(dict(config, transformer_layer_config=sliding)))
    with pytest.raises(ValueError, match="sliding-window attention .*--full-attention-indices 0"):
        read_folder(out).load(target)
    (out / "config.json").write_text(json.dumps(dict(config, model_type="eagle3")))
    with pytest.raises(EngineRefuses, match="not detected as speculators"):
        vllm_speculators(out)


# ---- EAGLE-1: vLLM and SGLang build different fcs ----------------------------------------------------------
def eagle1(folder: Path, engine: str) -> dict:
    """vLLM 0.33.0 llama_eagle.py (fc bias-free, layer-0 input norm Identity, unknown names raise) and SGLang
    0.5.23 llama_eagle.py (fc with a bias, layer-0 input norm deleted, unknown names skipped with a
    warning)."""
    config = json.loads((folder / "config.json").read_text())
    arch = {"vllm": "EagleLlamaForCausalLM", "sglang": "LlamaForCausalLMEagle"}[engine]
    if arch not in config.get("architectures", []):
        raise EngineRefuses(f"{engine}: architectures {config.get('architectures')} lacks {arch}")
    bias = bool(config.get("attention_bias") or config.get("bias"))
    expected = {"fc.weight", "layers.0.post_attention_layernorm.weight",
                *(f"layers.0.mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
                *(f"layers.0.self_attn.{p}_proj.weight" for p in "qkvo"),
                *([f"layers.0.self_attn.{p}_proj.bias" for p in "qkvo"] if bias else []),
                *(["fc.bias"] if engine == "sglang" else [])}
    params = {}
    for name, tensor in load_file(str(folder / "model.safetensors")).items():
        if name in expected:
            params[name] = tensor
        elif engine == "vllm" and not name.endswith(".bias") and name != "embed_tokens.weight":
            raise EngineRefuses(f"vLLM: no module or parameter named {name}")
    return {"params": params, "unfilled": expected - set(params)}


@pytest.mark.parametrize("engine,fmt", [("vllm", "eagle"), ("sglang", "eagle-sglang")])
def test_eagle1_export_is_the_trained_drafter_to_each_engine(engine, fmt, family, tmp_path):
    _, drafter, folder = trained("eagle", family, tmp_path)
    out = export_drafter(folder, fmt, tmp_path / fmt, base_model="tiny", dtype="float32")
    view = eagle1(out, engine)
    names = {k: k for k in drafter.trained_state()}
    if engine == "sglang":  # the zero bias SGLang's fc needs: the same function as none
        assert not view["params"]["fc.bias"].any()
        view["params"].pop("fc.bias")
    same_drafter(view, drafter, names)
    # negative twin: each engine given the other's folder
    other = {"vllm": "sglang", "sglang": "vllm"}[engine]
    with pytest.raises(EngineRefuses):
        eagle1(out, other)


# ---- Medusa in vLLM 0.32.0 ---------------------------------------------------------------------------------
def vllm_medusa(folder: Path) -> dict:
    """vLLM 0.32.0 models/medusa.py: blocks.{h}.layers.{l} (+bias iff medusa_fc_bias), lm_heads.{h}; unknown
    names dropped silently; the loaded set is checked (missing raises)."""
    config = json.loads((folder / "config.json").read_text())
    if config.get("model_type") != "medusa":
        raise EngineRefuses("vLLM: model_type is not medusa")
    heads, layers, bias = config["num_heads"], config["num_hidden_layers"], config.get("medusa_fc_bias",
                                                                                       False)
    expected = {f"blocks.{h}.layers.{j}.{p}" for h in range(heads) for j in range(layers)
                for p in (("weight", "bias") if bias else ("weight",))} | {f"lm_heads.{h}.weight"
                                                                           for h in range(heads)}
    params = {k: v for k, v in load_file(str(folder / "model.safetensors")).items() if k in expected}
    if expected - set(params):
        raise EngineRefuses("vLLM: weights not initialized from checkpoint: "
                            f"{sorted(expected - set(params))}")
    return {"params": params, "dropped": set(load_file(str(folder / "model.safetensors"))) - expected}


def test_medusa_vllm_export_is_the_trained_heads(family, tmp_path):
    _, heads, folder = trained("medusa", family, tmp_path, heads=3, layers=2)
    out = export_drafter(folder, "medusa-vllm", tmp_path / "mv", base_model="tiny", dtype="float32")
    view = vllm_medusa(out)
    assert not view["dropped"]
    ours = heads.state_dict()
    for h in range(3):
        for j in range(2):
            assert (torch.equal(view["params"][f"blocks.{h}.layers.{j}.weight"],
                                ours[f"heads.{h}.{j}.linear.weight"]))
            assert (torch.equal(view["params"][f"blocks.{h}.layers.{j}.bias"],
                                ours[f"heads.{h}.{j}.linear.bias"]))
        assert torch.equal(view["params"][f"lm_heads.{h}.weight"], ours[f"heads.{h}.2.weight"])
    # negative twin: without medusa_fc_bias vLLM drops the ResBlock biases without a word
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(dict(config, medusa_fc_bias=False)))
    assert any(k.endswith(".bias") for k in vllm_medusa(out)["dropped"])


# ---- HF (the draft LM): transformers' own loader -----------------------------------------------------------
def test_hf_export_loads_in_transformers_with_identical_logits(family, tmp_path):
    from transformers import AutoModelForCausalLM

    _, student, folder = trained("draft-lm", family, tmp_path, num_layers=2)
    out = export_drafter(folder, "hf", tmp_path / "hf", base_model="tiny", dtype="float32")
    loaded = AutoModelForCausalLM.from_pretrained(out)
    ids = torch.randint(3, 259, (1, 7))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, student(ids).logits)
    # negative twin: a bf16 export is not the same function in fp32 (the cast is a choice the export records)
    bf16 = AutoModelForCausalLM.from_pretrained(export_drafter(folder, "hf", tmp_path / "hf16",
                                                               base_model="tiny"))
    assert bf16.config.dtype == torch.bfloat16 or str(bf16.config.dtype).endswith("bfloat16")


def test_serve_notes_name_each_engine_and_the_tree(tmp_path):
    _, _, folder = trained("eagle3", "llama", tmp_path, draft_vocab=100)
    folder.meta["tree"] = {"topk": 4, "depth": 5, "budget": 16}
    out = export_drafter(folder, "eagle3", tmp_path / "out", base_model="org/target")
    notes = (out / "SERVE.md").read_text()
    assert "--speculative-algorithm EAGLE3" in notes and "--speculative-algorithm EAGLE " not in notes
    assert "--speculative-num-steps 5 --speculative-eagle-topk 4 --speculative-num-draft-tokens 17" in notes
    assert ('"method": "eagle3"' in notes and '"num_speculative_tokens": 5' in notes
            and "vllm serve org/target" in notes)
    assert "dynamic-k4-d5-n16" in notes


def test_serve_notes_medusa_chain_is_at_most_the_heads_and_odd_paths_are_quoted(tmp_path):
    """vLLM's Medusa drafts one token per head (RULES["vllm-medusa"]): with no recorded tree SERVE.md's chain
    is the heads, not the default 5; a path with a space stays one shell word."""
    import shlex

    _, _, folder = trained("medusa", "llama", tmp_path, heads=3, layers=1)
    out = export_drafter(folder, "medusa-vllm", tmp_path / "odd dir", base_model=str(tmp_path / "my target"))
    line = next(x for x in (out / "SERVE.md").read_text().splitlines() if x.startswith("vllm serve "))
    words = shlex.split(line)
    assert words[2] == str(tmp_path / "my target")
    assert (json.loads(words[4]) == {"method": "medusa", "model": str(out.resolve()),
                                     "num_speculative_tokens": 3})


def test_aux_layers_an_engine_would_reorder_or_merge_are_refused(tmp_path):
    """vLLM sorts and de-duplicates aux ids, speculators refuses duplicates: such a drafter cannot be
    served."""
    _, _, folder = trained("eagle3", "llama", tmp_path, draft_vocab=100, aux_layers=[2, 3, 3])
    with pytest.raises(ValueError, match=r"aux layers \[2, 3, 3\]: vLLM sorts and de-duplicates"):
        export_drafter(folder, "eagle3", tmp_path / "out", base_model="tiny")
    _, _, folder = trained("eagle3", "llama", tmp_path / "b", draft_vocab=100, aux_layers=[4, 1, 3])
    with pytest.raises(ValueError, match="distinct increasing"):
        export_drafter(folder, "eagle3", tmp_path / "out2", base_model="tiny")


@pytest.mark.parametrize("norms", [{"fc_norm": True, "norm_output": True}, {"norm_before_fc": True}])
def test_eagle31_norms_train_serve_and_export_where_read(tmp_path, norms):
    """norm_before_fc / fc_norm / norm_output (speculators' EAGLE-3.1 options): the drafter computes them; the
    speculators and eagle3 exports carry them (flags and tensors, vLLM's loader fills every norm, read back to
    the same logits), SERVE.md says who reads them, and llama.cpp's GGUF, which builds norm_before_fc alone
    (RULES["llamacpp-eagle3-norms"]), refuses the others by name."""
    from draftsmith.heads.eagle.export import NORMS, read_eagle, read_speculators, write_eagle

    with pytest.raises(ValueError, match="enable one of them"):  # speculators refuses the pair
        DrafterConfig.for_kind("eagle3", norm_before_fc=True, fc_norm=True)
    target, drafter, folder = trained("eagle3", "llama", tmp_path, draft_vocab=100, **norms)
    names = {"input_norm.weight"} if norms.get("norm_before_fc") else {"fc_norm.0.weight", "fc_norm.2.weight"}
    assert names <= set(drafter.trained_state())
    feats = {str(k): torch.randn(1, 5, target.config.hidden_size) for k in drafter.feature_layers}
    ids = torch.randint(3, 259, (1, 5))

    def logits(d):  # two chained steps: the second reads what the first carries on (norm_output's doing)
        with torch.no_grad():
            return torch.stack([d.eval().logits(o) for o in d.unroll(d.fuse(feats), ids, 2)])

    e3 = export_drafter(folder, "eagle3", tmp_path / "e3", base_model="tiny", dtype="float32")
    served = vllm_eagle3(e3)
    assert names <= set(served["params"]) and not served["unfilled"]
    written = json.loads((e3 / "config.json").read_text())
    assert all(written.get(k, False) == norms.get(k, False) for k in NORMS)  # the flags vLLM reads
    assert "EAGLE-3.1 norms" in (e3 / "SERVE.md").read_text()
    out = export_drafter(folder, "speculators", tmp_path / "spec", base_model="tiny", dtype="float32",
                         target_model=target)
    config = json.loads((out / "config.json").read_text())
    assert all(config[k] == norms.get(k, False) for k in NORMS)
    assert "EAGLE-3.1 norms" in (out / "SERVE.md").read_text()
    a = logits(drafter)
    assert torch.allclose(a, logits(read_speculators(out, target)), atol=1e-6)
    assert torch.allclose(a, logits(read_eagle(e3, "eagle3", target)), atol=1e-6)
    if norms.get("norm_output"):  # llama.cpp carries the pre-norm state on: refused, not served as another
        with pytest.raises(ValueError, match="export 'gguf'.*fc_norm, norm_output.*llama.cpp b11434 builds "
                                             "norm_before_fc alone"):
            write_eagle(drafter, "eagle3", tmp_path / "g", "tiny", reader="gguf")
    else:
        hf = write_eagle(drafter, "eagle3", tmp_path / "g", "tiny", reader="gguf")
        assert json.loads((hf / "config.json").read_text())["norm_before_fc"] is True  # the converter's key
    # negative twins: the same weights read without the flags are another function, or refused
    key = next(iter(norms))
    (out / "config.json").write_text(json.dumps({**config, key: False}))
    if key == "fc_norm":
        with pytest.raises(ValueError):
            read_speculators(out, target)  # fc_norm tensors have no place without their flag
    for key in norms:  # each flag dropped from the eagle3 config
        (e3 / "config.json").write_text(json.dumps({**written, key: False}))
        if key == "norm_output":  # no tensor of its own: it reads back as another drafter from step 2 on
            b = logits(read_eagle(e3, "eagle3", target))
            assert torch.allclose(a[0], b[0], atol=1e-6) and not torch.allclose(a[1], b[1], atol=1e-3)
            continue
        if key == "norm_before_fc":  # vLLM drops input_norm.weight silently: the flag alone decides
            assert "input_norm.weight" not in vllm_eagle3(e3)["params"]
        with pytest.raises(ValueError):
            read_eagle(e3, "eagle3", target)  # our reader names the tensor it has no place for
    # SGLang would drop them silently (RULES["sglang-eagle3-norms"]): SERVE.md gives it no command
    assert "sglang.launch_server" not in (e3 / "SERVE.md").read_text()
