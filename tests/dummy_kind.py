"""A fifth drafter kind that lives only in the tests: proof that a kind is one unit.

`bigram` drafts with a table `[V, V]` of next-token logits given the current token (no target
features), trained with the run's divergence against the target's next-token distribution. Adding
it takes exactly what DESIGN.md promises: this file (settings, module, proposer, an export format)
and one `register_kind` row; conftest registers it before collection, so every test parametrised
over `KINDS` (greedy equivalence, export round trips, the pipeline) runs it too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from draftsmith.eval.proposers.base import Draft, Proposer, trained_drafter
from draftsmith.eval.tree import chain_parents
from draftsmith.heads.acceptance import chain_tau
from draftsmith.heads.files import load_strict, write_folder, write_meta
from draftsmith.heads.kind import ExportFormat, register_format
from draftsmith.heads.losses import TOKEN_LOSSES, token_loss
from draftsmith.heads.registry import KindSpec, register_kind
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
            teacher, indices = batch["target_topk_values"][:, :-1][mask], batch["target_topk_indices"][:, :-1][mask]
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


class BigramProposer(Proposer):
    name = "bigram"

    def __init__(self, drafter: BigramDrafter, length: int):
        self.drafter, self.length = drafter.eval().requires_grad_(False), length
        self.tree = f"chain-{length}"

    def propose(self, context, sampling, generator) -> Draft:
        tokens, last = [], context[-1]
        for _ in range(self.length):
            last = int(self.drafter.table[last].argmax())
            tokens.append(last)
        return Draft(tokens=tokens, parents=chain_parents(len(tokens)))


def build_proposer(cfg, target, folder=None) -> BigramProposer:
    return BigramProposer(trained_drafter(folder, target), cfg.num_speculative_tokens)


def write_export(drafter, out, base_model, dtype, source) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file({"table": drafter.table.detach().to(dtype).contiguous()}, str(out / "bigram.safetensors"))
    (out / "config.json").write_text(json.dumps({"bigram_vocab": drafter.vocab_size, "base_model": base_model}))
    return out


def read_export(folder, config, target_model) -> BigramDrafter:
    drafter = BigramDrafter(config["bigram_vocab"])
    load_strict(drafter, {k: v.float() for k, v in load_file(str(Path(folder) / "bigram.safetensors")).items()},
                str(folder))
    return drafter


def register() -> None:
    register_format(ExportFormat("bigram-table", write_export, read_export, lambda config: "bigram_vocab" in config,
                                 "the bigram table (tests only)", reads_features=False))
    register_kind(KindSpec("bigram", "a next-token table (registered by the tests)", BigramConfig, build_proposer,
                           module=BigramDrafter, formats=("bigram-table",), losses=TOKEN_LOSSES))
