"""Writing a drafter folder: `config.json` + `model.safetensors` + `draftsmith.json`, and strict loads.

The bottom of the heads layer: every trainable kind's `save_pretrained` writes through here and every
`from_pretrained` loads its weights with `load_strict`, so a renamed or mis-shaped tensor is named
instead of loading nothing. Reading a folder back (which kind, which target, which serving tree) is
`heads/folder.py`.

`draftsmith.json` holds what the folder is: `kind`, `target` (what it was trained for, as the run
named it), `target_signature` (architecture, layer count, vocabulary size, hidden size, a tokenizer
fingerprint and its bos/eos ids: what `folder.check_target` compares, so a drafter for another model is
refused before any work), `feature_layers` (the target features it reads), `format_version`, and kind extras
(a serving `tree`, Medusa-2's `serve_target`, ...).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from draftsmith.distill.cache import tokenizer_fingerprint

FORMAT_VERSION = 1
META = "draftsmith.json"
# beside an export: the tree its drafter folder served with (engines ignore it)
SERVING_TREE = "serving_tree.json"


def write_folder(folder: str | Path, config: dict, state: dict[str, torch.Tensor]) -> Path:
    """`config.json` + `model.safetensors` of a drafter folder (draftsmith.json comes from `write_meta`)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file({k: v.detach().contiguous() for k, v in state.items()}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    return folder


def special_ids(tokenizer) -> dict | None:
    """The tokenizer's bos / eos ids: the same token map with another end-of-turn token generates
    differently."""
    if tokenizer is None:
        return None
    return {"bos": getattr(tokenizer, "bos_token_id", None), "eos": getattr(tokenizer, "eos_token_id", None)}


def text_config(target_model: nn.Module):
    config = target_model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def target_signature(target_model: nn.Module | None, tokenizer=None) -> dict | None:
    """What makes a drafter usable with a target: its architecture and layer count, vocabulary, hidden size
    and tokenizer (token map and special ids); `heads/folder.py check_target` compares each."""
    if target_model is None:
        return None
    config = text_config(target_model)
    return {"vocab_size": int(target_model.get_output_embeddings().weight.shape[0]),
            "hidden_size": int(config.hidden_size), "tokenizer": tokenizer_fingerprint(tokenizer),
            "architectures": list(getattr(target_model.config, "architectures", None) or []),
            "num_layers": getattr(config, "num_hidden_layers", None), "special_ids": special_ids(tokenizer)}


def write_meta(folder: Path, kind: str, target: str, feature_layers, signature: dict | None = None,
               **extra) -> None:
    """`draftsmith.json`: what a drafter folder holds and which target (and features) it reads."""
    meta = {"kind": kind, "target": target, "feature_layers": list(feature_layers),
            "format_version": FORMAT_VERSION, **({"target_signature": signature} if signature else {}),
            **extra}
    (Path(folder) / META).write_text(json.dumps(meta, indent=2) + "\n")


def read_meta(folder: Path) -> dict:
    """The `draftsmith.json` of a drafter folder this run wrote (heads/folder.py reads and checks
    anyone's)."""
    return json.loads((Path(folder) / META).read_text())


def update_meta(folder: Path, **extra) -> None:
    """Add keys to an existing `draftsmith.json` (a post-train stage recording what it chose)."""
    path = Path(folder) / META
    meta = read_meta(folder)
    meta.update(extra)
    path.write_text(json.dumps(meta, indent=2) + "\n")


def load_strict(model: nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """`load_state_dict` that names every missing, unexpected, mis-shaped or mis-typed key before loading
    anything."""
    own = model.state_dict()
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    shapes = [f"{k}: {tuple(state[k].shape)} != {tuple(own[k].shape)}"
              for k in sorted(set(own) & set(state)) if state[k].shape != own[k].shape]
    # a float weight stored as integers (or an index table as floats) would be cast silently by
    # load_state_dict
    dtypes = [f"{k}: {state[k].dtype} for {own[k].dtype}" for k in sorted(set(own) & set(state))
              if state[k].is_floating_point() != own[k].is_floating_point()]
    if missing or unexpected or shapes or dtypes:
        raise ValueError(f"{source}: weights do not match {type(model).__name__}; missing {missing}, "
                         f"unexpected {unexpected}, wrong shapes {shapes}"
                         + (f", wrong dtypes {dtypes}" if dtypes else ""))
    model.load_state_dict(state, strict=True)


def check_tensors(tensors: dict[str, torch.Tensor], expected: dict[str, tuple], where: str) -> None:
    """Exact key set and shapes, or a ValueError naming every missing, extra and mis-shaped key."""
    missing, extra = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    shapes = [f"{k}: {tuple(tensors[k].shape)} != {expected[k]}"
              for k in sorted(set(expected) & set(tensors)) if tuple(tensors[k].shape) != expected[k]]
    if missing or extra or shapes:
        raise ValueError(f"{where}: key map mismatch; missing {missing}, extra {extra}, wrong shapes "
                         f"{shapes}")


def export_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"export dtype '{name}' is not a torch floating dtype (e.g. bfloat16, float16, "
                         "float32)")
    return dtype


FROZEN = ("embed_tokens.", "target_lm_head.")  # copied from the target, never trained, never saved


class TargetCopyDrafter:
    """What EAGLE and DFlash drafters share on disk: they hold frozen copies of the target's embedding /
    lm_head (names starting with `FROZEN`), which a folder never stores and a load never overwrites. Mixed
    into an `nn.Module` with `config_dict()`, `kind`, `feature_layers` and `serving_tree`."""

    def trained_state(self) -> dict[str, torch.Tensor]:
        """The state dict without the frozen target copies (what a drafter folder and the exports hold)."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith(FROZEN)}

    def save_pretrained(self, folder: str | Path, target: str, tokenizer=None,
                        signature: dict | None = None) -> Path:
        folder = write_folder(folder, self.config_dict(), self.trained_state())
        extra = {"tree": self.serving_tree} if self.serving_tree else {}
        write_meta(folder, self.kind, target, self.feature_layers, signature, **extra)
        return folder

    def load_trained(self, state: dict[str, torch.Tensor], source: str) -> None:
        """Strict load of the trained weights (every name and shape checked); frozen copies untouched."""
        frozen = {k: v for k, v in self.state_dict().items() if k.startswith(FROZEN)}
        load_strict(self, {**frozen, **state}, source)
