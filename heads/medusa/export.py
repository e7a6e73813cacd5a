"""Medusa's export formats: the Medusa repo's heads-only folder (`medusa`) and vLLM's MedusaModel
(`medusa-vllm`).

Shapes (K heads, L ResBlocks, H hidden, V vocab): ResBlock weight `[H, H]`, bias `[H]`, head output `[V, H]`;
never the target's lm_head (every consumer takes it from the target). Registered in heads/kind.py FORMATS.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from draftsmith.heads.engines import VLLM_MEDUSA, Rule, register_rule
from draftsmith.heads.files import check_tensors, load_strict
from draftsmith.heads.kind import ExportFormat, register_format
from draftsmith.heads.medusa.model import MedusaHeads

MEDUSA_WEIGHTS = {"medusa": "medusa_lm_head.pt", "medusa-vllm": "model.safetensors"}


def medusa_key_map(fmt: str, num_heads: int, num_layers: int) -> dict[str, str]:
    """Our `heads.{i}...` state-dict names -> the names `fmt` expects (complete: nothing optional)."""
    out = {}
    for i in range(num_heads):
        for j in range(num_layers):
            for p in ("weight", "bias"):
                theirs = f"{i}.{j}.linear.{p}" if fmt == "medusa" else f"blocks.{i}.layers.{j}.{p}"
                out[f"heads.{i}.{j}.linear.{p}"] = theirs
        theirs = f"{i}.{num_layers}.weight" if fmt == "medusa" else f"lm_heads.{i}.weight"
        out[f"heads.{i}.{num_layers}.weight"] = theirs
    return out


def medusa_shapes(fmt: str, num_heads: int, num_layers: int, hidden_size: int,
                  vocab_size: int) -> dict[str, tuple]:
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
    load_strict(heads, {ours[k]: t.float() if t.is_floating_point() else t for k, t in tensors.items()},
                str(path))
    return heads


def heads_of(export: Path) -> int | None:
    """How many heads a medusa-vllm export has (its config.json `num_heads`): vLLM drafts one token per head
    (RULES["vllm-medusa"]); None where it cannot be read."""
    try:
        return int(json.loads((Path(export) / "config.json").read_text())["num_heads"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


register_rule(Rule(VLLM_MEDUSA, "vllm/model_executor/models/medusa.py (blocks.{h}.layers.{l}, lm_heads.{h}, "
                                "medusa_fc_bias; unknown names dropped) — removed in vLLM 0.33.0",
                   "vllm-medusa: model_type medusa, medusa_fc_bias true for ResBlocks with a bias; serve "
         "with vLLM <= 0.32; it drafts one token per head (v1/spec_decode/medusa.py MedusaProposer.propose), "
         "so num_speculative_tokens is at most num_heads"))
register_format(ExportFormat(
    "medusa", lambda d, out, base, dtype, f: write_medusa(d, "medusa", out, base, dtype),
    lambda folder, config, target_model: read_medusa(folder, "medusa"),
    lambda config: "medusa_num_heads" in config, "FasterDecoding/Medusa heads-only folder",
    serve=lambda s: [("FasterDecoding/Medusa",
                      f"python -m medusa.inference.cli --model {s.drafter}  # base: {s.target}")]))
register_format(ExportFormat(
    "medusa-vllm", lambda d, out, base, dtype, f: write_medusa(d, "medusa-vllm", out, base, dtype),
    lambda folder, config, target_model: read_medusa(folder, "medusa-vllm"),
    lambda config: config.get("model_type") == "medusa", "vLLM MedusaModel (vLLM <= 0.32)",
    vllm_method="medusa",
    max_chain=heads_of, serve=lambda s: [(f"{VLLM_MEDUSA} (Medusa was removed in vLLM 0.33)", s.vllm())]))
