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
from draftsmith.heads.files import load_strict
from draftsmith.heads.medusa import MedusaHeads


@dataclass(frozen=True)
class ExportFormat:
    """One serving layout: `write(drafter, out, base_model, dtype, source) -> out`, `read(folder, config,
    target_model) -> drafter module`, `detect(config) -> bool` (is a config.json this format's?)."""

    name: str
    write: Callable
    read: Callable
    detect: Callable[[dict], bool]
    summary: str
    reads_features: bool = True  # the drafter reads the target's hidden states (so its width must match)


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
    load_strict(heads, {ours[k]: t.float() for k, t in tensors.items()}, str(path))
    return heads


# ---- EAGLE-1 (`eagle`) and EAGLE-3 (`eagle3`) -------------------------------------------------------------
EAGLE_CLASSES = {"eagle": Eagle1Drafter, "eagle3": Eagle3Drafter}
EAGLE_ARCHITECTURES = {"eagle": "EagleLlamaForCausalLM", "eagle3": "LlamaForCausalLMEagle3"}


def write_eagle(drafter: EagleDrafter, fmt: str, out_folder: str | Path, base_model: str,
                dtype: torch.dtype = torch.bfloat16) -> Path:
    """The EAGLE-1 or EAGLE-3 folder: Llama-style config.json + model.safetensors, names checked exactly.

    Our state-dict names already are the consumers' names (`layers.0.*` / `midlayer.*`), so the key map
    is the identity minus the frozen target copies."""
    state = drafter.trained_state()
    tensors = {k: (v.detach().to(dtype) if v.is_floating_point() else v.detach()).contiguous() for k, v in state.items()}
    check_tensors(tensors, drafter.expected_shapes(), f"export '{fmt}' ({drafter.target_config.model_type} layer)")
    config = drafter.target_config.to_dict()
    config.update(architectures=[EAGLE_ARCHITECTURES[fmt]], num_hidden_layers=1, tie_word_embeddings=False,
                  base_model_name_or_path=base_model, bias=drafter.fc_bias)
    config.pop("layer_types", None)
    if isinstance(drafter, Eagle3Drafter):
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


def eagle_format(config: dict) -> str | None:
    """'eagle' / 'eagle3' for an exported EAGLE folder's config, else None."""
    arch = " ".join(config.get("architectures") or [])
    return "eagle3" if "Eagle3" in arch else "eagle" if "Eagle" in arch else None


def read_eagle(folder: str | Path, fmt: str, target_model: torch.nn.Module) -> EagleDrafter:
    """Read an `eagle` / `eagle3` export back (fp32) for `target_model`; names and shapes checked exactly."""
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    tensors = load_file(str(folder / "model.safetensors"))
    tc = target_model.config.get_text_config()
    if fmt == "eagle3":
        layers = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        vocab = list(range(config.get("draft_vocab_size", tc.vocab_size)))
        drafter = Eagle3Drafter(tc, layers, vocab, fc_bias="fc.bias" in tensors)
    else:
        drafter = Eagle1Drafter(tc, fc_bias="fc.bias" in tensors)
    check_tensors(tensors, drafter.expected_shapes(), str(folder / "model.safetensors"))
    drafter.load_trained({k: v.float() if v.is_floating_point() else v for k, v in tensors.items()}, str(folder))
    drafter.copy_target_weights(target_model)
    return drafter


# ---- the table ---------------------------------------------------------------------------------------------
def _hf_model(config: dict) -> bool:
    return "model_type" in config and config.get("model_type") != "medusa" and eagle_format(config) is None


def _write_hf(drafter, out, base_model, dtype, source):
    return drafter.export_hf(out, dtype, tokenizer_from=source)


FORMATS: dict[str, ExportFormat] = {f.name: f for f in [
    ExportFormat("hf", _write_hf, lambda folder, config, target_model: DraftLM.from_pretrained(folder), _hf_model,
                 "a plain HF causal LM folder (AutoModelForCausalLM, HF assisted generation)", reads_features=False),
    ExportFormat("medusa", lambda d, out, base, dtype, src: write_medusa(d, "medusa", out, base, dtype),
                 lambda folder, config, target_model: read_medusa(folder, "medusa"),
                 lambda config: "medusa_num_heads" in config, "FasterDecoding/Medusa heads-only folder"),
    ExportFormat("medusa-vllm", lambda d, out, base, dtype, src: write_medusa(d, "medusa-vllm", out, base, dtype),
                 lambda folder, config, target_model: read_medusa(folder, "medusa-vllm"),
                 lambda config: config.get("model_type") == "medusa", "vLLM MedusaModel"),
    ExportFormat("eagle", lambda d, out, base, dtype, src: write_eagle(d, "eagle", out, base, dtype),
                 lambda folder, config, target_model: read_eagle(folder, "eagle", target_model),
                 lambda config: eagle_format(config) == "eagle", "EAGLE-1 drafter (vLLM, SGLang, EAGLE repo)"),
    ExportFormat("eagle3", lambda d, out, base, dtype, src: write_eagle(d, "eagle3", out, base, dtype),
                 lambda folder, config, target_model: read_eagle(folder, "eagle3", target_model),
                 lambda config: eagle_format(config) == "eagle3", "EAGLE-3 drafter (vLLM, SGLang, EAGLE repo)"),
]}


def register_format(fmt: ExportFormat) -> ExportFormat:
    """Add (or replace) an export format at run time (a kind registered elsewhere brings its own)."""
    FORMATS[fmt.name] = fmt
    return fmt


def detect_format(config: dict) -> str | None:
    """The export format an exported folder's config.json was written in (None: not one of ours)."""
    return next((name for name, f in FORMATS.items() if f.detect(config)), None)


def export_drafter(folder, fmt: str, out_folder: str | Path, base_model: str | None = None,
                   dtype: str | torch.dtype = "bfloat16") -> Path:
    """Write the drafter of `folder` (a `DrafterFolder`, heads/folder.py) in layout `fmt` to `out_folder`."""
    if fmt not in FORMATS:
        raise ValueError(f"export format '{fmt}' unknown; valid: {', '.join(FORMATS)}")
    if fmt not in folder.formats:
        raise ValueError(f"export format '{fmt}' is not one of a {folder.kind} drafter's; {folder.path} holds kind "
                         f"'{folder.kind}' (its formats: {', '.join(folder.formats) or 'none'})")
    drafter = folder.load()
    return FORMATS[fmt].write(drafter, out_folder, base_model or folder.target, export_dtype(dtype), folder.path)
