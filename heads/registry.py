"""Drafter kinds, the `drafter:` config section, and the factories for trainable drafters.

Sits under everything else (heads imports nothing outside heads/). A drafter kind is named once
here; `eval/proposers.py` maps each name to the proposer that runs it. Trainable kinds (Medusa now,
EAGLE-1/3 later) are built here from the target's sizes (`build_drafter`) and reloaded from a
drafter folder — `config.json` + `model.safetensors` + `draftsmith.json` — by `load_drafter`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from draftsmith.heads.medusa import FORMAT_VERSION, MedusaHeads

# kind -> one-line description (shown by `draftsmith eval --help` and in config errors)
KINDS = {
    "prompt-lookup": "n-gram lookup in the context, training-free",
    "layer-skip": "the target's first N layers + final norm + lm_head, training-free",
    "draft-lm": "a small causal LM on the target's tokenizer (drafter.path = HF folder)",
    "medusa": "K heads on the target's last hidden state (Medusa-1)",
}

# trainable kind -> its module class (each has `kind`, `feature_layers`, `compute_loss`,
# `save_pretrained(folder, target)` and `from_pretrained(folder)`)
_CLASSES = {"medusa": MedusaHeads}
TRAINABLE = tuple(_CLASSES)


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
    loss: Literal["kl", "ce"] = "kl"  # trainable kinds: KL to the target's logits, or CE on tokens
    head_decay: float = 0.8  # weight of head/step k is head_decay**k
    distill_temperature: float = 1.0  # softmax temperature of both sides of the KL
    medusa_lora_rank: int = 0  # > 0: Medusa-2, heads trained jointly with LoRA on the target (peft)
    medusa_lora_alpha: float = 16.0
    medusa_lora_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    medusa_keep_kl: float = 1.0  # Medusa-2: weight of KL(original target || LoRA target), keeps its outputs

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"drafter.kind '{self.kind}' unknown; valid kinds: {', '.join(KINDS)}")
        if self.num_speculative_tokens < 1:
            raise ValueError("drafter.num_speculative_tokens must be >= 1")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError("drafter.ngram_min must be >= 1 and <= drafter.ngram_max")
        if self.medusa_heads < 1 or self.medusa_layers < 1:
            raise ValueError("drafter.medusa_heads and drafter.medusa_layers must be >= 1")
        if self.loss not in ("kl", "ce"):
            raise ValueError(f"drafter.loss '{self.loss}' unknown; valid: kl, ce")
        if not 0 < self.head_decay <= 1:
            raise ValueError("drafter.head_decay must be in (0, 1]")
        if self.medusa_lora_rank < 0 or self.medusa_keep_kl < 0:
            raise ValueError("drafter.medusa_lora_rank and drafter.medusa_keep_kl must be >= 0")
        if self.distill_temperature <= 0:
            raise ValueError("drafter.distill_temperature must be > 0")


def build_drafter(cfg: DrafterConfig, hidden_size: int, vocab_size: int,
                  lm_head_weight: torch.Tensor | None = None) -> nn.Module:
    """A fresh trainable drafter sized to the target; `lm_head_weight [V, H]` seeds its output layers."""
    if cfg.kind not in TRAINABLE:
        raise ValueError(f"drafter.kind '{cfg.kind}' is not trainable; trainable kinds: {', '.join(TRAINABLE)}")
    drafter = MedusaHeads(hidden_size, vocab_size, cfg.medusa_heads, cfg.medusa_layers, loss=cfg.loss,
                          decay=cfg.head_decay, temperature=cfg.distill_temperature)
    if lm_head_weight is not None:
        drafter.init_from_target(lm_head_weight)
    return drafter


def load_drafter(folder: str | Path) -> nn.Module:
    """Reload a drafter saved with `save_pretrained`; the kind comes from its `draftsmith.json`."""
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
    return _CLASSES[kind].from_pretrained(folder)
