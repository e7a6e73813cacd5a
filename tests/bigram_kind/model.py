"""The bigram drafter: a `[V, V]` table of next-token logits given the current token, and its settings."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from draftsmith.heads.files import load_strict, write_folder, write_meta
from draftsmith.heads.losses import token_loss
from draftsmith.heads.runtime.acceptance import chain_tau
from draftsmith.heads.settings import KindSettings


@dataclass
class BigramConfig(KindSettings):
    """`drafter.bigram`: the scale of the random initial table (0 = uniform drafts)."""

    init_scale: float = 0.5


class BigramDrafter(nn.Module):
    kind = "bigram"
    feature_layers = ()

    def __init__(self, vocab_size: int, loss: str = "kl", init_scale: float = 0.5):
        super().__init__()
        self.vocab_size, self.hidden_size, self.loss = vocab_size, None, loss
        self.table = nn.Parameter(init_scale * torch.randn(vocab_size, vocab_size))

    @classmethod
    def build(cls, cfg, target_model, token_counts=None) -> BigramDrafter:
        return cls(target_model.get_output_embeddings().weight.shape[0], cfg.loss, cfg.settings.init_scale)

    def compute_loss(self, batch: dict):
        ids, attn = batch["input_ids"], batch["attention_mask"]
        mask = batch["loss_mask"][:, 1:].bool() & attn[:, 1:].bool()  # position t predicts t+1
        logits = self.table[ids[:, :-1][mask]]  # [N, V]
        teacher = batch.get("target_logits")
        teacher = teacher[:, :-1][mask] if teacher is not None else None
        indices = None
        if teacher is None and batch.get("target_topk_values") is not None:
            teacher = batch["target_topk_values"][:, :-1][mask]
            indices = batch["target_topk_indices"][:, :-1][mask]
        kind = self.loss if teacher is not None else "ce"
        loss = token_loss(kind, logits, teacher, indices, ids[:, 1:][mask]).mean()
        acc = (logits.argmax(-1) == ids[:, 1:][mask]).float().mean().item()
        return loss, {"loss": loss.item(), "acc_top1": acc, "expected_tau": chain_tau([acc], 3)}

    def save_pretrained(self, folder, target: str, tokenizer=None, signature=None) -> Path:
        folder = write_folder(folder, {"vocab_size": self.vocab_size, "loss": self.loss}, self.state_dict())
        write_meta(folder, self.kind, target, self.feature_layers, signature)
        return folder

    @classmethod
    def from_pretrained(cls, folder, target_model=None, meta=None) -> BigramDrafter:
        config = json.loads((Path(folder) / "config.json").read_text())
        drafter = cls(config["vocab_size"], config["loss"])
        load_strict(drafter, load_file(str(Path(folder) / "model.safetensors")), str(folder))
        return drafter
