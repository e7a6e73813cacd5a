"""Export of trained drafters into the layouts serving engines load (the `export:` section).

End of the training flow: a drafter folder (`save_pretrained`: config.json + model.safetensors +
draftsmith.json, opened by `heads/folder.py`) becomes a folder that the Medusa repo, EAGLE repo,
vLLM, SGLang or HF `generate` loads. `FORMATS` is the one table of export formats: per format its
writer, its reader (an export back as a drafter module, for `eval --drafter EXPORT`) and how to
recognise its config.json; which kind can be written in which format is the kind's row in
`heads/registry.py` (`KindSpec.formats`). Every format is an explicit key map from our state-dict
names to theirs; the produced key set is checked *exactly* (and every shape) before anything is
written, because the consumers load with `strict=False` or skip unknown names, so a wrong name
would load nothing without an error.

Medusa shapes (K heads, L ResBlocks, H hidden, V vocab): ResBlock weight `[H, H]`, bias `[H]`,
head output `[V, H]`. EAGLE: `fc.weight [H, 2H]` (EAGLE-1) or `[H, 3H]` (EAGLE-3), attention
`[nh·hd | nkv·hd, H or 2H]`, MLP `[I, H]`/`[H, I]`, EAGLE-3 `lm_head [Vd, H]`, `d2t [Vd]`, `t2d [V]`;
never the target's embedding or lm_head (every consumer takes those from the target).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from draftsmith.heads.draft_lm import DraftLM
from draftsmith.heads.eagle import Eagle1Drafter, EagleDrafter
from draftsmith.heads.eagle3 import Eagle3Drafter
from draftsmith.heads.engines import chain_length, serve_commands, sglang_aux_ids, vllm_aux_ids
from draftsmith.heads.files import SERVING_TREE, load_strict
from draftsmith.heads.medusa import MedusaHeads


@dataclass(frozen=True)
class ExportFormat:
    """One serving layout: `write(drafter, out, base_model, dtype, drafter_folder) -> out`, `read(folder, config,
    target_model) -> drafter module`, `detect(config) -> bool` (is a config.json this format's?)."""

    name: str
    write: Callable
    read: Callable
    detect: Callable[[dict], bool]
    summary: str
    reads_features: bool = True  # the drafter reads the target's hidden states (so its width must match)
    needs_target: bool = False  # the layout holds target weights the drafter folder does not (an embedding)


@dataclass
class ExportConfig:
    """`export:` section — which serving layouts to write after training."""

    formats: list[str] = field(default_factory=list)
    dtype: str = "bfloat16"

    def __post_init__(self):
        unknown = [f for f in self.formats if f not in FORMATS]
        if unknown:
            raise ValueError(f"export.formats: unknown {unknown}; valid: {', '.join(FORMATS)}")


def check_tensors(tensors: dict[str, torch.Tensor], expected: dict[str, tuple], where: str) -> None:
    """Exact key set and shapes, or a ValueError naming every missing, extra and mis-shaped key."""
    missing, extra = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    shapes = [f"{k}: {tuple(tensors[k].shape)} != {expected[k]}"
              for k in sorted(set(expected) & set(tensors)) if tuple(tensors[k].shape) != expected[k]]
    if missing or extra or shapes:
        raise ValueError(f"{where}: key map mismatch; missing {missing}, extra {extra}, wrong shapes {shapes}")


def export_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"export dtype '{name}' is not a torch floating dtype (e.g. bfloat16, float16, float32)")
    return dtype


# ---- Medusa: the Medusa repo (`medusa`) and vLLM (`medusa-vllm`) ---------------------------------------
MEDUSA_WEIGHTS = {"medusa": "medusa_lm_head.pt", "medusa-vllm": "model.safetensors"}


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
        torch.save(tensors, out / MEDUSA_WEIGHTS[fmt])
    else:
        config = {"model_type": "medusa", "architectures": ["MedusaModel"], "hidden_size": H, "vocab_size": V,
                  "num_heads": K, "num_hidden_layers": L, "medusa_fc_bias": True, "truncated_vocab_size": V}
        save_file(tensors, str(out / MEDUSA_WEIGHTS[fmt]), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def read_medusa(folder: str | Path, fmt: str) -> MedusaHeads:
    """Read a `medusa` or `medusa-vllm` export back (fp32); any missing or extra key raises, named."""
    if fmt not in MEDUSA_WEIGHTS:
        raise ValueError(f"'{fmt}' is not a Medusa export format; valid: {', '.join(MEDUSA_WEIGHTS)}")
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    path = folder / MEDUSA_WEIGHTS[fmt]
    if fmt == "medusa":
        K, L = config["medusa_num_heads"], config["medusa_num_layers"]
        tensors = torch.load(path, map_location="cpu", weights_only=True)  # never unpickle code
    else:
        K, L = config["num_heads"], config["num_hidden_layers"]
        tensors = load_file(str(path))
    H, V = config["hidden_size"], config["vocab_size"]
    check_tensors(tensors, medusa_shapes(fmt, K, L, H, V), str(path))
    heads = MedusaHeads(H, V, K, L)
    ours = {v: k for k, v in medusa_key_map(fmt, K, L).items()}
    load_strict(heads, {ours[k]: t.float() if t.is_floating_point() else t for k, t in tensors.items()}, str(path))
    return heads


# ---- EAGLE-1 and EAGLE-3: per engine, the conventions of heads/engines.py ------------------------------------
EAGLE_ARCHITECTURES = {"eagle": "EagleLlamaForCausalLM", "eagle-sglang": "LlamaForCausalLMEagle",
                       "eagle3": "LlamaForCausalLMEagle3"}
EAGLE3_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")  # vLLM registers both, SGLang the first


def layer_config(drafter: EagleDrafter, dtype: torch.dtype) -> dict:
    """The drafter layer's Llama config as the engines read it (`rope_theta` too, for readers on transformers 4)."""
    c = drafter.attn_config.to_dict()
    keep = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
            "hidden_act", "max_position_embeddings", "initializer_range", "rms_norm_eps", "rope_parameters",
            "attention_bias", "mlp_bias", "pad_token_id")
    out = {k: c[k] for k in keep if k in c}
    rope = dict(out.get("rope_parameters") or {})
    out.update(model_type="llama", num_hidden_layers=1, tie_word_embeddings=False, rope_theta=rope.get("rope_theta"),
               rope_scaling=None if rope.get("rope_type", "default") == "default" else rope,
               torch_dtype=str(dtype).replace("torch.", ""))
    return out


def eagle_tensors(drafter: EagleDrafter, dtype: torch.dtype, where: str) -> dict[str, torch.Tensor]:
    """The trained tensors (no frozen target copies), checked against the shapes the target's sizes imply."""
    state = drafter.trained_state()
    tensors = {k: (v.detach().to(dtype) if v.is_floating_point() else v.detach()).contiguous() for k, v in state.items()}
    check_tensors(tensors, drafter.expected_shapes(), where)
    return tensors


def _refuse_fc_bias(drafter: EagleDrafter, fmt: str, why: str) -> None:
    if drafter.fc_bias:
        raise ValueError(f"export '{fmt}': this drafter was trained with an fc bias, which {why}; retrain with "
                         f"drafter.{drafter.kind}.fc_bias: false" + (" or export eagle-sglang" if fmt == "eagle" else ""))


def write_eagle(drafter: EagleDrafter, fmt: str, out_folder: str | Path, base_model: str,
                dtype: torch.dtype = torch.bfloat16) -> Path:
    """`eagle` (vLLM EagleLlamaForCausalLM, the EAGLE repo), `eagle-sglang` (SGLang LlamaForCausalLMEagle) or
    `eagle3` (one folder for vLLM, SGLang and the EAGLE repo): a Llama config + model.safetensors.

    Names are ours already (`layers.0.*` / `midlayer.*`); what differs per engine is in heads/engines.py: aux ids
    (l at the top level for vLLM, l-1 under eagle_config for SGLang), `bias` (fc bias for SGLang, attention bias
    for vLLM: false, so eagle and eagle3 refuse a trained fc bias), SGLang's EAGLE-1 fc always having a bias (a
    zero one is written when the drafter has none), norm_before_residual false, tie_word_embeddings false,
    draft_vocab_size always set, no target_hidden_size (the EAGLE repo would then skip its embeddings)."""
    if fmt in ("eagle", "eagle3"):
        _refuse_fc_bias(drafter, fmt, "vLLM drops silently (its fc has none) and a `bias: true` would give both engines "
                                      "attention biases the checkpoint lacks")
    used = [k for k, on in getattr(drafter, "norms", {}).items() if on]
    if used:  # the EAGLE-3.1 norms: speculators' loader is checked with them (scripts/dev/engine_check.sh --norms ...)
        raise ValueError(f"export '{fmt}': this drafter uses {', '.join(used)} (EAGLE-3.1 norms), which this layout's "
                         "loaders are not checked to build; export 'speculators' (speculators' own Eagle3DraftModel "
                         "builds them: scripts/dev/engine_check.sh --norms ...)")
    tensors = eagle_tensors(drafter, dtype, f"export '{fmt}'")
    if fmt == "eagle-sglang" and "fc.bias" not in tensors:
        tensors["fc.bias"] = torch.zeros(drafter.hidden_size, dtype=dtype)  # SGLang's EAGLE-1 fc has a bias
    config = dict(layer_config(drafter, dtype), architectures=[EAGLE_ARCHITECTURES[fmt]], bias=False,
                  base_model_name_or_path=base_model)
    if isinstance(drafter, Eagle3Drafter):
        config.update(draft_vocab_size=drafter.draft_vocab_size, norm_before_residual=False,
                      eagle_aux_hidden_state_layer_ids=vllm_aux_ids(drafter.serving_layers),
                      eagle_config={"use_aux_hidden_state": True,
                                    "eagle_aux_hidden_state_layer_ids": sglang_aux_ids(drafter.serving_layers)})
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
    """Our serving layers from an EAGLE-3 config: vLLM's top-level ids, else SGLang's eagle_config ids (+1)."""
    if config.get("eagle_aux_hidden_state_layer_ids"):
        return list(config["eagle_aux_hidden_state_layer_ids"])
    sglang = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    return [layer + 1 for layer in sglang] if sglang else None


def refuse_unread_semantics(config: dict, folder: Path, fmt: str, residual_default: bool) -> None:
    """Config keys that change what the draft layer computes but that our EAGLE-3 layer does not implement: refused
    by name rather than loaded as another computation. `norm_before_residual` (the residual taken after
    input_layernorm) defaults to True in speculators (`speculators/models/eagle3` schema, 0.9.0) and is absent
    (False) in EAGLE-repo folders; a sliding-window draft layer (speculators' default unless
    `--full-attention-indices 0`) would attend to fewer positions than ours past its window."""
    if config.get("norm_before_residual", residual_default):
        default = " (absent: the format's default is true)" if "norm_before_residual" not in config else ""
        raise ValueError(f"{folder}/config.json: norm_before_residual is true{default}; draftsmith's EAGLE-3 layer adds "
                         "the un-normed input as the residual (norm_before_residual false) and would compute "
                         "something else: retrain with norm_before_residual false (speculators: "
                         "--no-norm-before-residual), or serve this folder with its own engine")
    layer = config.get("transformer_layer_config") or {}
    types = layer.get("layer_types") or []
    if "sliding_attention" in types or layer.get("use_sliding_window"):
        raise ValueError(f"{folder}/config.json: the draft layer uses sliding-window attention "
                         f"(transformer_layer_config layer_types {types}, sliding_window {layer.get('sliding_window')}); "
                         f"draftsmith's {fmt} reader implements full attention: retrain with a full-attention layer "
                         "(speculators: --full-attention-indices 0)")


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
        drafter = Eagle3Drafter(tc, aux_ids_of(config), vocab, fc_bias="fc.bias" in tensors)
    else:
        drafter = Eagle1Drafter(tc, fc_bias="fc.bias" in tensors)
    check_tensors(tensors, drafter.expected_shapes(), str(folder / "model.safetensors"))
    drafter.load_trained({k: v.float() if v.is_floating_point() else v for k, v in tensors.items()}, str(folder))
    drafter.copy_target_weights(target_model)
    return drafter


# ---- vLLM's speculators format ---------------------------------------------------------------------------------
def speculators_names(drafter: Eagle3Drafter) -> dict[str, str]:
    """Our EAGLE-3 names -> speculators' Eagle3DraftModel names (our `midlayer.` is its `layers.0.`)."""
    return {k: k.replace("midlayer.", "layers.0.", 1) for k in drafter.trained_state()}


def write_speculators(drafter: Eagle3Drafter, out_folder: str | Path, base_model: str, dtype: torch.dtype,
                      tree=None, target_architectures=None) -> Path:
    """`vllm serve DRAFTER` (or --speculative-config): config.json without model_type (so vLLM reads it as
    speculators), transformer_layer_config, speculators_config with the proposal method from the serving tree,
    the verifier = the target; weights in speculators' names, with the frozen embedding (speculators saves it)."""
    _refuse_fc_bias(drafter, "speculators", "speculators' Eagle3DraftModel has no place for")
    names = speculators_names(drafter)
    tensors = {names[k]: v for k, v in eagle_tensors(drafter, dtype, "export 'speculators'").items()}
    if not drafter.reduced:  # speculators keeps the vocabulary maps only for a reduced draft vocabulary
        tensors.pop("d2t"), tensors.pop("t2d")
    tensors["embed_tokens.weight"] = drafter.embed_tokens.weight.detach().to(dtype).contiguous()
    config = {
        "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "speculators_version": "0.9.0",
        "transformer_layer_config": layer_config(drafter, dtype), "draft_vocab_size": drafter.draft_vocab_size,
        "norm_before_residual": False, **drafter.norms,
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
    """A speculators EAGLE-3 folder back as our drafter (its embedding is the target's: ours is a frozen copy)."""
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    if config.get("speculators_model_type") != "eagle3":
        raise ValueError(f"{folder}: speculators_model_type {config.get('speculators_model_type')!r}: only eagle3 reads")
    refuse_unread_semantics(config, folder, "speculators", residual_default=True)
    tensors = load_file(str(folder / "model.safetensors"))
    tc = target_model.config.get_text_config()
    drafter = Eagle3Drafter(tc, config.get("eagle_aux_hidden_state_layer_ids"), list(range(config["draft_vocab_size"])),
                            **{k: bool(config.get(k, False)) for k in ("norm_before_fc", "fc_norm", "norm_output")})
    ours = {v: k for k, v in speculators_names(drafter).items()}
    embed = tensors.pop("embed_tokens.weight", None)
    if "d2t" not in tensors and not drafter.reduced:  # full vocabulary: identity maps
        tensors.update(d2t=torch.zeros(drafter.draft_vocab_size, dtype=torch.long),
                       t2d=torch.ones(tc.vocab_size, dtype=torch.bool))
    unknown = sorted(set(tensors) - set(ours))
    if unknown:
        raise ValueError(f"{folder}/model.safetensors: names speculators' Eagle3DraftModel does not have: {unknown}")
    tensors = {ours[k]: v.float() if v.is_floating_point() else v for k, v in tensors.items()}
    check_tensors(tensors, drafter.expected_shapes(), str(folder / "model.safetensors"))
    drafter.load_trained(tensors, str(folder))
    drafter.copy_target_weights(target_model)
    if embed is not None and embed.shape != drafter.embed_tokens.weight.shape:
        raise ValueError(f"{folder}: embed_tokens {tuple(embed.shape)} is not the target's "
                         f"{tuple(drafter.embed_tokens.weight.shape)}: this drafter was made for another target")
    return drafter


# ---- the table ---------------------------------------------------------------------------------------------
def _hf_model(config: dict) -> bool:
    return ("model_type" in config and config.get("model_type") != "medusa" and eagle_format(config) is None
            and "speculators_model_type" not in config)


def _write_hf(drafter, out, base_model, dtype, folder):
    return drafter.export_hf(out, dtype, tokenizer_from=folder.path)


FORMATS: dict[str, ExportFormat] = {f.name: f for f in [
    ExportFormat("hf", _write_hf, lambda folder, config, target_model: DraftLM.from_pretrained(folder), _hf_model,
                 "a plain HF causal LM folder (AutoModelForCausalLM, HF assisted generation)", reads_features=False),
    ExportFormat("medusa", lambda d, out, base, dtype, f: write_medusa(d, "medusa", out, base, dtype),
                 lambda folder, config, target_model: read_medusa(folder, "medusa"),
                 lambda config: "medusa_num_heads" in config, "FasterDecoding/Medusa heads-only folder"),
    ExportFormat("medusa-vllm", lambda d, out, base, dtype, f: write_medusa(d, "medusa-vllm", out, base, dtype),
                 lambda folder, config, target_model: read_medusa(folder, "medusa-vllm"),
                 lambda config: config.get("model_type") == "medusa", "vLLM MedusaModel (vLLM <= 0.32)"),
    ExportFormat("eagle", lambda d, out, base, dtype, f: write_eagle(d, "eagle", out, base, dtype),
                 lambda folder, config, target_model: read_eagle(folder, "eagle", target_model),
                 lambda config: eagle_format(config) == "eagle", "EAGLE-1 for vLLM and the EAGLE repo"),
    ExportFormat("eagle-sglang", lambda d, out, base, dtype, f: write_eagle(d, "eagle-sglang", out, base, dtype),
                 lambda folder, config, target_model: read_eagle(folder, "eagle-sglang", target_model),
                 lambda config: eagle_format(config) == "eagle-sglang", "EAGLE-1 for SGLang"),
    ExportFormat("eagle3", lambda d, out, base, dtype, f: write_eagle(d, "eagle3", out, base, dtype),
                 lambda folder, config, target_model: read_eagle(folder, "eagle3", target_model),
                 lambda config: eagle_format(config) == "eagle3", "EAGLE-3 for vLLM, SGLang and the EAGLE repo"),
    ExportFormat("speculators", lambda d, out, base, dtype, f: write_speculators(
                     d, out, base, dtype, f.tree, (f.meta.get("target_signature") or {}).get("architectures")),
                 lambda folder, config, target_model: read_speculators(folder, target_model),
                 lambda config: config.get("speculators_model_type") is not None and "model_type" not in config,
                 "vLLM's speculators format (vllm serve DRAFTER)", needs_target=True),
]}


def register_format(fmt: ExportFormat) -> ExportFormat:
    """Add (or replace) an export format at run time (a kind registered elsewhere brings its own)."""
    FORMATS[fmt.name] = fmt
    return fmt


def detect_format(config: dict) -> str | None:
    """The export format an exported folder's config.json was written in (None: not one of ours)."""
    return next((name for name, f in FORMATS.items() if f.detect(config)), None)


def export_drafter(folder, fmt: str, out_folder: str | Path, base_model: str | None = None,
                   dtype: str | torch.dtype = "bfloat16", target_model: torch.nn.Module | None = None) -> Path:
    """Write the drafter of `folder` (a `DrafterFolder`, heads/folder.py) in layout `fmt` to `out_folder`, with
    SERVE.md beside it; layouts that hold target weights take them from `target_model`."""
    if fmt not in FORMATS:
        raise ValueError(f"export format '{fmt}' unknown; valid: {', '.join(FORMATS)}")
    if fmt not in folder.formats:
        raise ValueError(f"export format '{fmt}' is not one of a {folder.kind} drafter's; {folder.path} holds kind "
                         f"'{folder.kind}' (its formats: {', '.join(folder.formats) or 'none'})")
    if FORMATS[fmt].needs_target and target_model is None:
        raise ValueError(f"export format '{fmt}' carries the target's embedding: pass the target (target_model)")
    drafter = folder.load(target_model)
    out = Path(FORMATS[fmt].write(drafter, out_folder, base_model or folder.target, export_dtype(dtype), folder))
    (out / "SERVE.md").write_text(serve_notes(fmt, out, base_model or folder.target, folder))
    if folder.tree is not None:  # so `eval --drafter EXPORT` serves what the folder served (the engines read SERVE.md's flags)
        (out / SERVING_TREE).write_text(json.dumps({"tree": folder.tree.entry()}) + "\n")
    else:
        (out / SERVING_TREE).unlink(missing_ok=True)  # a re-export into an old folder keeps no stale tree
    return out


def serve_notes(fmt: str, out: Path, base_model: str, folder) -> str:
    """SERVE.md: what was exported, for which target, with which serving tree, and each engine's command."""
    tree, plan = folder.tree, folder.plan
    lines = [f"# Serving {out.name}", "",
             f"- drafter: {folder.kind}, exported as `{fmt}` ({FORMATS[fmt].summary}) from `{folder.path}`",
             f"- target: `{base_model}`, with the chat template the drafter was trained on",
             f"- serving tree: {tree.label if tree else 'none recorded (a chain of drafter.num_speculative_tokens)'}"
             " (the recipe's choice: the engine flags below use it)"]
    norms = [k for k in ("norm_before_fc", "fc_norm", "norm_output") if folder.config.get(k)] if fmt == "speculators" else []
    if norms:
        lines.append(f"- EAGLE-3.1 norms: {', '.join(norms)}. speculators' Eagle3DraftModel builds them (checked by "
                     "scripts/dev/engine_check.sh --norms ...); that a given vLLM or SGLang version does is not checked here: "
                     "compare its acceptance with `draftsmith eval --drafter` on a few prompts before serving")
    if plan:
        chosen = plan.get("chosen") or {}
        lines.append(f"- `draftsmith plan` measured {chosen.get('label') or 'plain decoding'} fastest on "
                     f"{(plan.get('machine') or {}).get('device')} ({plan.get('dtype')}, batch {plan.get('batch_size')}); "
                     "that is a choice for that machine and draftsmith's decoder, not these engines' flags: re-plan "
                     "on the serving GPU (or use the engine's own tuning) before copying it")
    lines.append("")
    for engine, command in serve_commands(fmt, out.resolve(), base_model, tree):
        lines += [f"## {engine}", "", "```bash", command, "```", ""]
    return "\n".join(lines)
