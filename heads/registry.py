"""Drafter kinds, the `drafter:` config section, and the factories for trainable drafters.

Sits under everything else (heads imports nothing outside heads/). A drafter kind is named once
here; `eval/proposers.py` maps each name to the proposer that runs it. Trainable kinds are built
from the target's HF model (`build_drafter`: sizes from its config, frozen copies of the weights
they share — lm_head, embeddings, layers) and reloaded from a drafter folder — `config.json` +
`model.safetensors` + `draftsmith.json` — by `load_drafter`. Each trainable class implements
`build(cfg, target_model)`, `compute_loss(batch)`, `save_pretrained(folder, target, tokenizer=None)`
and `from_pretrained(folder)`, and names the target features it reads in `feature_layers`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
from torch import nn

FORMAT_VERSION = 1

# kind -> one-line description (shown by `draftsmith eval --help` and in config errors)
KINDS = {
    "prompt-lookup": "n-gram lookup in the context, training-free",
    "layer-skip": "the target's first N layers + final norm + lm_head, training-free",
    "draft-lm": "a small causal LM on the target's tokenizer (drafter.path = HF folder)",
    "medusa": "K heads on the target's last hidden state (Medusa-1; Medusa-2 with drafter.medusa_lora_rank > 0)",
    "eagle": "EAGLE-1: one decoder layer on the target's last hidden state + the next token's embedding",
    "eagle3": "EAGLE-3: low/mid/high target features fused, training-time test, reduced draft vocabulary",
}

# trainable kind -> "module:Class" under draftsmith.heads (imported on use)
_CLASSES = {"medusa": "medusa:MedusaHeads", "draft-lm": "draft_lm:DraftLM",
            "eagle": "eagle:EagleDrafter", "eagle3": "eagle:EagleDrafter"}
TRAINABLE = tuple(_CLASSES)
LOSSES = ("kl", "ce", "rkl", "tvd", "jsd")  # kl = forward KL(target ‖ drafter)


@dataclass
class DrafterConfig:
    """`drafter:` section — what proposes tokens, and the shape of its proposals."""

    kind: str = "prompt-lookup"
    path: str | None = None  # draft-lm: HF model folder; trained kinds: exported drafter folder
    num_speculative_tokens: int = 5  # chain length / maximum tree depth
    tree: str | None = None  # static tree (name in configs/trees or a JSON file); None = chain
    top_k: int = 1  # draft-lm: branching per depth for a top-k tree (1 = chain)
    layer_skip_layers: int = 8  # layer-skip: how many of the target's first layers draft
    ngram_max: int = 3  # prompt lookup: longest suffix n-gram matched
    ngram_min: int = 1
    medusa_heads: int = 4  # medusa: K heads, head k guesses token t+k+2
    medusa_layers: int = 1  # medusa: ResBlocks per head
    loss: Literal["kl", "ce", "rkl", "tvd", "jsd"] = "kl"  # divergence to the target (kl = forward); medusa/eagle: kl|ce
    head_decay: float = 0.8  # weight of head/step k is head_decay**k
    distill_temperature: float = 1.0  # softmax temperature of both sides of the KL
    medusa_lora_rank: int = 0  # > 0: Medusa-2, heads trained jointly with LoRA on the target (peft)
    medusa_lora_alpha: float = 16.0
    medusa_lora_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    medusa_keep_kl: float = 1.0  # Medusa-2: weight of KL(original target || LoRA target), keeps its outputs
    jsd_beta: float = 0.5  # loss jsd: JSD_beta (0 -> forward KL, 1 -> reverse KL, as DistillSpec)
    # node budget of the draft tree: Medusa -> `pipeline` builds the best static tree of this size from
    # validation accuracies (tree-opt) into the drafter folder; EAGLE -> the dynamic tree's budget
    tree_nodes: int = 0
    tree_topk: int = 4  # dynamic tree (EAGLE-2): children per expanded node and nodes expanded per depth
    # draft-lm students: target layers kept (explicit ids), or the first/strided `draft_num_layers`;
    # `draft_config` (a config.json of the target's family on its tokenizer) builds a fresh small model instead
    draft_layers: list[int] = field(default_factory=list)
    draft_num_layers: int = 4
    draft_layer_pick: Literal["first", "strided"] = "strided"
    draft_config: str | None = None
    draft_lora_rank: int = 0  # > 0: train LoRA adapters (peft) on the copied layers instead of all weights
    draft_lora_alpha: float = 16.0
    # eagle/eagle3
    eagle_feature_layers: list[int] = field(default_factory=list)  # eagle3 low/mid/high; [] = 2, N//2, N-3
    eagle_ttt_steps: int = 7  # eagle3 training-time test: unrolled steps, each with a loss (weight head_decay**k)
    eagle_draft_vocab: int = 32000  # eagle3 reduced vocabulary (most frequent target tokens); 0 = full vocab
    eagle_fc_bias: bool = False  # vLLM/SGLang build fc without bias; true = EAGLE-1 repo's original
    eagle_feature_weight: float = 1.0  # smooth-L1 on predicted features (EAGLE-1's v-loss; eagle3 uses 0)
    eagle_logit_weight: float = 0.1  # weight of the KL/CE on the drafter's logits (EAGLE-1's p-loss)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"drafter.kind '{self.kind}' unknown; valid kinds: {', '.join(KINDS)}")
        if self.num_speculative_tokens < 1:
            raise ValueError("drafter.num_speculative_tokens must be >= 1")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError("drafter.ngram_min must be >= 1 and <= drafter.ngram_max")
        if self.medusa_heads < 1 or self.medusa_layers < 1:
            raise ValueError("drafter.medusa_heads and drafter.medusa_layers must be >= 1")
        if self.loss not in LOSSES:
            raise ValueError(f"drafter.loss '{self.loss}' unknown; valid: {', '.join(LOSSES)}")
        if not 0 <= self.jsd_beta <= 1:
            raise ValueError("drafter.jsd_beta must be in [0, 1]")
        if self.tree_nodes < 0 or self.tree_topk < 1:
            raise ValueError("drafter.tree_nodes must be >= 0 and drafter.tree_topk >= 1")
        if self.draft_num_layers < 1 or self.draft_lora_rank < 0:
            raise ValueError("drafter.draft_num_layers must be >= 1 and drafter.draft_lora_rank >= 0")
        if self.eagle_ttt_steps < 1 or self.eagle_draft_vocab < 0:
            raise ValueError("drafter.eagle_ttt_steps must be >= 1 and drafter.eagle_draft_vocab >= 0")
        if not 0 < self.head_decay <= 1:
            raise ValueError("drafter.head_decay must be in (0, 1]")
        if self.medusa_lora_rank < 0 or self.medusa_keep_kl < 0:
            raise ValueError("drafter.medusa_lora_rank and drafter.medusa_keep_kl must be >= 0")
        if self.distill_temperature <= 0:
            raise ValueError("drafter.distill_temperature must be > 0")


def write_folder(folder: str | Path, config: dict, state: dict[str, torch.Tensor]) -> Path:
    """`config.json` + `model.safetensors` of a drafter folder (draftsmith.json comes from `write_meta`)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file({k: v.detach().contiguous() for k, v in state.items()}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    return folder


def write_meta(folder: Path, kind: str, target: str, feature_layers, **extra) -> None:
    """`draftsmith.json`: what a drafter folder holds and which target (and features) it reads."""
    meta = {"kind": kind, "target": target, "feature_layers": list(feature_layers), "format_version": FORMAT_VERSION,
            **extra}
    (Path(folder) / "draftsmith.json").write_text(json.dumps(meta, indent=2) + "\n")


def load_strict(model: nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """`load_state_dict` that names every missing, unexpected or mis-shaped key before loading anything."""
    own = model.state_dict()
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    shapes = [f"{k}: {tuple(state[k].shape)} != {tuple(own[k].shape)}"
              for k in sorted(set(own) & set(state)) if state[k].shape != own[k].shape]
    if missing or unexpected or shapes:
        raise ValueError(f"{source}: weights do not match {type(model).__name__}; missing {missing}, "
                       f"unexpected {unexpected}, wrong shapes {shapes}")
    model.load_state_dict(state, strict=True)


def drafter_class(kind: str) -> type[nn.Module]:
    import importlib

    if kind not in _CLASSES:
        raise ValueError(f"drafter.kind '{kind}' is not trainable; trainable kinds: {', '.join(TRAINABLE)}")
    module, name = _CLASSES[kind].split(":")
    return getattr(importlib.import_module(f"draftsmith.heads.{module}"), name)


def build_drafter(cfg: DrafterConfig, target_model: nn.Module, token_counts: torch.Tensor | None = None) -> nn.Module:
    """A fresh trainable drafter for the target's HF model (sizes from its config, shared weights copied).

    `token_counts [V]` (how often each target token is a training label) feeds kinds whose class sets
    `needs_token_counts` (EAGLE-3's reduced draft vocabulary)."""
    cls = drafter_class(cfg.kind)
    return cls.build(cfg, target_model, **({"token_counts": token_counts} if token_counts is not None else {}))


def load_drafter(folder: str | Path, target_model: nn.Module | None = None) -> nn.Module:
    """Reload a drafter saved with `save_pretrained`; the kind comes from its `draftsmith.json`.

    Kinds that keep frozen copies of target weights (EAGLE's embedding) take them from `target_model`."""
    meta_path = Path(folder) / "draftsmith.json"
    if not meta_path.is_file():
        raise FileNotFoundError(
            f"{folder}: no draftsmith.json — a drafter folder holds config.json, model.safetensors and "
            f"draftsmith.json (kind, target, feature_layers), as written by the drafter's save_pretrained")
    meta = json.loads(meta_path.read_text())
    kind = meta.get("kind")
    if kind not in _CLASSES:
        raise ValueError(f"{meta_path}: kind '{kind}' cannot be loaded; trainable kinds: {', '.join(TRAINABLE)}")
    if meta.get("format_version", 0) > FORMAT_VERSION:
        raise ValueError(f"{meta_path}: format_version {meta['format_version']} is newer than this "
                         f"draftsmith reads ({FORMAT_VERSION})")
    if target_model is not None:
        return drafter_class(kind).from_pretrained(folder, target_model=target_model)
    return drafter_class(kind).from_pretrained(folder)
