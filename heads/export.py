"""Export of trained drafters into the layouts serving engines load (the `export:` section).

End of the training flow: a drafter folder (`save_pretrained`: config.json + model.safetensors +
draftsmith.json) becomes a folder that the Medusa repo, EAGLE repo, vLLM, SGLang or HF `generate`
loads. Every format is an explicit key map from our state-dict names to theirs; the produced key
set is checked *exactly* (and every shape) before anything is written, because the consumers load
with `strict=False` or skip unknown names, so a wrong name would load nothing without an error.
Layouts: /work/shared/reference/serving-formats.md (1a `medusa`, 1b `medusa-vllm`).

Medusa shapes (K heads, L ResBlocks, H hidden, V vocab): ResBlock weight `[H, H]`, bias `[H]`,
head output `[V, H]`. EAGLE (2a/2b/2c, 3a/3b/3c): `fc.weight [H, 2H]` (EAGLE-1) or `[H, 3H]` (EAGLE-3),
attention `[nh·hd | nkv·hd, H or 2H]`, MLP `[I, H]`/`[H, I]`, EAGLE-3 `lm_head [Vd, H]`, `d2t [Vd]`,
`t2d [V]`; never the target's embedding or lm_head (every consumer takes those from the target).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from draftsmith.heads.medusa import MedusaHeads
from draftsmith.heads.registry import load_drafter, load_strict

FORMATS = ("hf", "medusa", "medusa-vllm", "eagle", "eagle3")
MEDUSA_FORMATS = ("medusa", "medusa-vllm")
FORMAT_KINDS = {"hf": "draft-lm", "medusa": "medusa", "medusa-vllm": "medusa", "eagle": "eagle", "eagle3": "eagle3"}
EAGLE_FORMATS = ("eagle", "eagle3")
EAGLE_ARCHITECTURES = {"eagle": "EagleLlamaForCausalLM", "eagle3": "LlamaForCausalLMEagle3"}
WEIGHTS = {"medusa": "medusa_lm_head.pt", "medusa-vllm": "model.safetensors"}


@dataclass
class ExportConfig:
    """`export:` section — which serving layouts to write after training."""

    formats: list[str] = field(default_factory=list)
    dtype: str = "bfloat16"

    def __post_init__(self):
        unknown = [f for f in self.formats if f not in FORMATS]
        if unknown:
            raise ValueError(f"export.formats: unknown {unknown}; valid: {', '.join(FORMATS)}")


def medusa_key_map(fmt: str, num_heads: int, num_layers: int) -> dict[str, str]:
    """Our `heads.{i}...` state-dict names -> the names `fmt` expects (complete: nothing optional)."""
    out = {}
    for i in range(num_heads):
        for j in range(num_layers):
            for p in ("weight", "bias"):
                theirs = f"{i}.{j}.linear.{p}" if fmt == "medusa" else f"blocks.{i}.layers.{j}.{p}"
                out[f"heads.{i}.{j}.linear.{p}"] = theirs
        out[f"heads.{i}.{num_layers}.weight"] = f"{i}.{num_layers}.weight" if fmt == "medusa" else f"lm_heads.{i}.weight"
    return out


def medusa_shapes(fmt: str, num_heads: int, num_layers: int, hidden_size: int, vocab_size: int) -> dict[str, tuple]:
    """Exported name -> shape, for every tensor `fmt` must hold."""
    block = {"weight": (hidden_size, hidden_size), "bias": (hidden_size,)}  # ResBlock linear
    return {theirs: block[ours.rsplit(".", 1)[1]] if ".linear." in ours else (vocab_size, hidden_size)
            for ours, theirs in medusa_key_map(fmt, num_heads, num_layers).items()}


def check_tensors(tensors: dict[str, torch.Tensor], expected: dict[str, tuple], where: str) -> None:
    """Exact key set and shapes, or a ValueError naming every missing, extra and mis-shaped key."""
    missing, extra = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    shapes = [f"{k}: {tuple(tensors[k].shape)} != {expected[k]}"
              for k in sorted(set(expected) & set(tensors)) if tuple(tensors[k].shape) != expected[k]]
    if missing or extra or shapes:
        raise ValueError(f"{where}: key map mismatch; missing {missing}, extra {extra}, wrong shapes {shapes}")


def _dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"export dtype '{name}' is not a torch floating dtype (e.g. bfloat16, float16, float32)")
    return dtype


def export_drafter(drafter_folder: str | Path, fmt: str, out_folder: str | Path, base_model: str,
                   dtype: str | torch.dtype = "bfloat16") -> Path:
    """Write the drafter in `drafter_folder` to `out_folder` in layout `fmt`; returns `out_folder`."""
    if fmt not in FORMATS:
        raise ValueError(f"export format '{fmt}' unknown; valid: {', '.join(FORMATS)}")
    drafter = load_drafter(drafter_folder)
    if drafter.kind != FORMAT_KINDS[fmt]:
        raise ValueError(f"export format '{fmt}' needs a {FORMAT_KINDS[fmt]} drafter; {drafter_folder} holds kind "
                         f"'{drafter.kind}' (its formats: {', '.join(f for f, k in FORMAT_KINDS.items() if k == drafter.kind)})")
    if fmt == "hf":  # a draft LM is already an HF causal LM: cast it, keep its tokenizer and generation config
        return drafter.export_hf(out_folder, _dtype(dtype), tokenizer_from=drafter_folder)
    if fmt in EAGLE_FORMATS:
        return write_eagle(drafter, out_folder, base_model, _dtype(dtype))
    return write_medusa(drafter, fmt, out_folder, base_model, _dtype(dtype))


def write_medusa(heads: MedusaHeads, fmt: str, out_folder: str | Path, base_model: str,
                 dtype: torch.dtype = torch.bfloat16) -> Path:
    """Rename, check against the expected map, cast, and write the `medusa` or `medusa-vllm` folder."""
    K, L, H, V = heads.num_heads, heads.num_layers, heads.hidden_size, heads.vocab_size
    names = medusa_key_map(fmt, K, L)
    state = heads.state_dict()
    unmapped = sorted(set(state) - set(names))
    if unmapped:
        raise ValueError(f"export '{fmt}': our weights {unmapped} have no name in the key map")
    tensors = {names[k]: v.detach().to(dtype).contiguous() for k, v in state.items()}
    check_tensors(tensors, medusa_shapes(fmt, K, L, H, V), f"export '{fmt}'")
    out = Path(out_folder)
    out.mkdir(parents=True, exist_ok=True)
    if fmt == "medusa":
        # The Medusa repo reads this folder only when config.json has no model_type. Its loader
        # hard-codes 5 heads and loads with strict=False (fewer heads -> random extras, more ->
        # ignored), and its L>1 heads repeat ONE ResBlock, so only L=1 round-trips faithfully.
        config = {"medusa_num_heads": K, "medusa_num_layers": L, "base_model_name_or_path": base_model,
                  "hidden_size": H, "vocab_size": V}
        notes = []
        if L > 1:
            notes.append(f"{L} distinct ResBlocks per head; the Medusa repo shares one block per head, "
                         f"so loading there keeps only the last ({{i}}.{L - 1}.linear.*) for every layer")
        if K != 5:
            notes.append(f"{K} heads; the Medusa repo's heads-only loader builds 5 and loads strict=False")
        if notes:
            config["draftsmith_note"] = "; ".join(notes)
        torch.save(tensors, out / WEIGHTS[fmt])
    else:
        config = {"model_type": "medusa", "architectures": ["MedusaModel"], "hidden_size": H, "vocab_size": V,
                  "num_heads": K, "num_hidden_layers": L, "medusa_fc_bias": True, "truncated_vocab_size": V}
        save_file(tensors, str(out / WEIGHTS[fmt]), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def load_medusa_export(folder: str | Path, fmt: str) -> MedusaHeads:
    """Read a `medusa` or `medusa-vllm` export back (fp32); any missing or extra key raises, named."""
    if fmt not in MEDUSA_FORMATS:
        raise ValueError(f"'{fmt}' is not a Medusa export format; valid: {', '.join(MEDUSA_FORMATS)}")
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    path = folder / WEIGHTS[fmt]
    if fmt == "medusa":
        K, L = config["medusa_num_heads"], config["medusa_num_layers"]
        tensors = torch.load(path, map_location="cpu", weights_only=True)
    else:
        K, L = config["num_heads"], config["num_hidden_layers"]
        tensors = load_file(str(path))
    H, V = config["hidden_size"], config["vocab_size"]
    check_tensors(tensors, medusa_shapes(fmt, K, L, H, V), str(path))
    heads = MedusaHeads(H, V, K, L)
    ours = {v: k for k, v in medusa_key_map(fmt, K, L).items()}
    load_strict(heads, {ours[k]: t.float() for k, t in tensors.items()}, str(path))
    return heads


def eagle_shapes(drafter) -> dict[str, tuple]:
    """Exported name -> shape for an EAGLE-1 (`eagle`) or EAGLE-3 (`eagle3`) drafter, from its target config."""
    c, H = drafter.target_config, drafter.hidden_size
    nh, nkv = c.num_attention_heads, c.num_key_value_heads
    hd = getattr(c, "head_dim", None) or H // nh
    qkv_bias = getattr(c, "attention_bias", False) or c.model_type == "qwen2"
    width, prefix = (H, "layers.0") if drafter.version == 1 else (2 * H, "midlayer")
    shapes = {"fc.weight": (H, (2 if drafter.version == 1 else 3) * H),
              f"{prefix}.self_attn.q_proj.weight": (nh * hd, width), f"{prefix}.self_attn.k_proj.weight": (nkv * hd, width),
              f"{prefix}.self_attn.v_proj.weight": (nkv * hd, width), f"{prefix}.self_attn.o_proj.weight": (H, nh * hd),
              f"{prefix}.mlp.gate_proj.weight": (c.intermediate_size, H), f"{prefix}.mlp.up_proj.weight": (c.intermediate_size, H),
              f"{prefix}.mlp.down_proj.weight": (H, c.intermediate_size), f"{prefix}.post_attention_layernorm.weight": (H,)}
    if drafter.fc_bias:
        shapes["fc.bias"] = (H,)
    if qkv_bias:
        shapes.update({f"{prefix}.self_attn.{p}_proj.bias": (n * hd,) for p, n in (("q", nh), ("k", nkv), ("v", nkv))})
    if getattr(c, "attention_bias", False):
        shapes[f"{prefix}.self_attn.o_proj.bias"] = (H,)
    if drafter.version == 3:
        Vd = drafter.draft_vocab_size
        shapes.update({f"{prefix}.input_layernorm.weight": (H,), f"{prefix}.hidden_norm.weight": (H,), "norm.weight": (H,),
                       "lm_head.weight": (Vd, H), "d2t": (Vd,), "t2d": (drafter.vocab_size,)})
    return shapes


def write_eagle(drafter, out_folder: str | Path, base_model: str, dtype: torch.dtype = torch.bfloat16) -> Path:
    """The EAGLE-1 or EAGLE-3 folder: Llama-style config.json + model.safetensors, names checked exactly.

    Our state-dict names already are the consumers' names (`layers.0.*` / `midlayer.*`), so the key map
    is the identity minus the frozen target copies; any family whose layer holds other tensors (e.g.
    Qwen3's q_norm) fails the check here instead of loading half a drafter in a serving engine.
    """
    fmt = drafter.kind
    state = drafter.trained_state()
    tensors = {k: (v.detach().to(dtype) if v.is_floating_point() else v.detach()).contiguous() for k, v in state.items()}
    check_tensors(tensors, eagle_shapes(drafter), f"export '{fmt}' ({drafter.target_config.model_type} layer)")
    config = drafter.target_config.to_dict()
    config.update(architectures=[EAGLE_ARCHITECTURES[fmt]], num_hidden_layers=1, tie_word_embeddings=False,
                  base_model_name_or_path=base_model, bias=drafter.fc_bias)
    config.pop("layer_types", None)
    if fmt == "eagle3":
        config.update(draft_vocab_size=drafter.draft_vocab_size, target_hidden_size=drafter.hidden_size,
                      eagle_config={"use_aux_hidden_state": True,
                                    "eagle_aux_hidden_state_layer_ids": list(drafter.serving_layers)},
                      draftsmith_note="no embed_tokens: the engine shares the target's; the EAGLE repo's loader "
                                      "needs embed_tokens when target_hidden_size is set (drop that key there)")
    out = Path(out_folder)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def eagle_export_kind(config: dict) -> str | None:
    """'eagle' / 'eagle3' for an exported EAGLE folder's config, else None."""
    arch = " ".join(config.get("architectures") or [])
    return "eagle3" if "Eagle3" in arch else "eagle" if "Eagle" in arch else None


def detect_export(config: dict) -> str | None:
    """The export format an exported folder's config.json was written in (None: not one of ours)."""
    if "medusa_num_heads" in config:
        return "medusa"
    if config.get("model_type") == "medusa":
        return "medusa-vllm"
    return eagle_export_kind(config)


def load_export(folder: str | Path, target_model: torch.nn.Module | None = None):
    """Any Medusa / EAGLE export back as a drafter module (EAGLE needs the target for its shared weights)."""
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text()) if (folder / "config.json").is_file() else {}
    fmt = detect_export(config)
    if fmt is None:
        raise FileNotFoundError(f"{folder}: neither a drafter folder (draftsmith.json) nor an export draftsmith reads "
                                f"({', '.join([*MEDUSA_FORMATS, *EAGLE_FORMATS])})")
    if fmt in MEDUSA_FORMATS:
        return load_medusa_export(folder, fmt)
    if target_model is None:
        raise ValueError(f"{folder}: an {fmt} export takes its embedding from the target; pass target_model")
    return load_eagle_export(folder, target_model)


def load_eagle_export(folder: str | Path, target_model: torch.nn.Module):
    """Read an `eagle` / `eagle3` export back (fp32) for `target_model`; names and shapes checked exactly."""
    from draftsmith.heads.eagle import EagleDrafter

    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    kind = eagle_export_kind(config)
    if kind is None:
        raise ValueError(f"{folder}: config.json architectures {config.get('architectures')} is not an EAGLE drafter")
    tensors = load_file(str(folder / "model.safetensors"))
    tc = target_model.config.get_text_config()
    layers = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    vocab = list(range(config.get("draft_vocab_size", tc.vocab_size))) if kind == "eagle3" else None
    drafter = EagleDrafter(tc, 1 if kind == "eagle" else 3, layers, vocab, fc_bias="fc.bias" in tensors)
    check_tensors(tensors, eagle_shapes(drafter), str(folder / "model.safetensors"))
    drafter.load_trained({k: v.float() if v.is_floating_point() else v for k, v in tensors.items()}, str(folder))
    drafter.copy_target_weights(target_model)
    return drafter
