"""Medusa-1 drafter: K heads that read the target's final hidden state and each guess one future token.

In the flow: `distill/` (or the live target) supplies `features["final"]`, the target's last hidden
state after its final norm, `[B, T, H]`; `train/` calls `compute_loss(batch)`; the trained heads are
saved with `save_pretrained` (our folder layout) and converted by `heads/export.py` into the layouts
the Medusa repo and vLLM load; `eval/serving.py` turns `forward` into a top-k draft tree.

Head i is `Sequential(ResBlock × L, Linear(H, V, bias=False))`; each ResBlock is `x + SiLU(Wx + b)`
with its own parameters (the Medusa repo's `[ResBlock(H)] * L` shares one block L times). Shapes:
hidden `[B, T, H]` -> logits `[K, B, T, V]`. At position t the target's lm_head predicts token t+1
and head k (0-based) predicts token t+k+2, so its soft label is the target's distribution at t+k+1.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from draftsmith.heads.files import load_strict, write_folder, write_meta
from draftsmith.heads.losses import TOKEN_LOSSES, token_loss
from draftsmith.heads.runtime.acceptance import RANKS, chain_tau, rank_metrics
from draftsmith.heads.settings import KindSettings


@dataclass
class MedusaConfig(KindSettings):
    """`drafter.medusa`: K heads of L ResBlocks; Medusa-2 trains LoRA on the target jointly (peft)."""

    heads: int = 4  # K heads, head k guesses token t+k+2
    layers: int = 1  # ResBlocks per head
    lora_rank: int = 0  # > 0: Medusa-2, heads trained jointly with LoRA on the target
    lora_alpha: float = 16.0
    lora_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    keep_kl: float = 1.0  # Medusa-2: weight of KL(original target || LoRA target), keeps its outputs

    def __post_init__(self):
        if self.heads < 1 or self.layers < 1:
            raise ValueError("drafter.medusa.heads and drafter.medusa.layers must be >= 1")
        if self.lora_rank < 0 or self.keep_kl < 0:
            raise ValueError("drafter.medusa.lora_rank and drafter.medusa.keep_kl must be >= 0")

    def feature_layers(self, target_config) -> list:
        return ["final"]

    def serving_candidates(self, folder_config: dict) -> list[dict]:
        """Chains up to the heads' depth, the folder's own (tree-opt) tree, each with a lookup branch."""
        depth = folder_config.get("num_heads") or self.heads
        # None: the recorded tree
        out = [{"tree": f"chain-{n}"} for n in range(1, depth + 1)] + [{"tree": None}]
        return out + [{"tree": "chain-2", "lookup_branch": 4}, {"tree": None, "lookup_branch": 4}]

    def trains_target(self) -> bool:
        return self.lora_rank > 0


class ResBlock(nn.Module):
    """`x + SiLU(linear(x))`; weight and bias start at zero, so an untrained block is the identity."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        # Medusa zeroes only the weight; zeroing the bias too makes an untrained head *exactly*
        # the target's lm_head (SiLU(0) = 0), and the gradient at zero is still nonzero.
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))  # [..., H]


class MedusaHeads(nn.Module):
    """K Medusa heads; `heads` is the ModuleList whose state-dict keys the exporters map."""

    kind = "medusa"
    feature_layers = ("final",)  # "final" = last hidden state after the target's final norm
    # drafts exactly its K heads deep (an EAGLE drafter or a draft LM feeds itself to any depth)
    recurrent = False

    def __init__(self, hidden_size: int, vocab_size: int, num_heads: int = 4, num_layers: int = 1,
                 loss: str = "kl", decay: float = 0.8, temperature: float = 1.0, jsd_beta: float = 0.5):
        super().__init__()
        if num_heads < 1 or num_layers < 1:
            raise ValueError(f"medusa: num_heads ({num_heads}) and num_layers ({num_layers}) must be >= 1")
        if loss not in TOKEN_LOSSES:
            raise ValueError(f"medusa: loss '{loss}' unknown; valid: {', '.join(TOKEN_LOSSES)}")
        if not 0 < decay <= 1 or temperature <= 0:
            raise ValueError(f"medusa: need 0 < decay <= 1 (got {decay}) and temperature > 0 (got "
                             f"{temperature})")
        self.hidden_size, self.vocab_size = hidden_size, vocab_size
        self.num_heads, self.num_layers = num_heads, num_layers
        self.loss, self.decay, self.temperature, self.jsd_beta = loss, decay, temperature, jsd_beta
        self.heads = nn.ModuleList(
            nn.Sequential(*[ResBlock(hidden_size) for _ in range(num_layers)],
                          nn.Linear(hidden_size, vocab_size, bias=False))
            for _ in range(num_heads))

    @classmethod
    def build(cls, cfg, target_model: nn.Module, token_counts=None) -> MedusaHeads:
        """Heads sized to the target, each output layer a copy of the target's lm_head."""
        lm_head = target_model.get_output_embeddings().weight.detach().float().cpu()  # [V, H]
        own = cfg.settings
        heads = cls(lm_head.shape[1], lm_head.shape[0], own.heads, own.layers, loss=cfg.loss,
                    decay=cfg.head_decay, temperature=cfg.distill_temperature, jsd_beta=cfg.jsd_beta)
        heads.init_from_target(lm_head)
        return heads

    @torch.no_grad()
    def init_from_target(self, lm_head_weight: torch.Tensor) -> None:
        """Copy the target's lm_head `[V, H]` into every head's final Linear (a copy, never shared)."""
        expected = (self.vocab_size, self.hidden_size)
        if tuple(lm_head_weight.shape) != expected:
            raise ValueError(f"medusa: lm_head weight has shape {tuple(lm_head_weight.shape)}, expected "
                             f"{expected}")
        for head in self.heads:
            head[-1].weight.copy_(lm_head_weight)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden `[B, T, H]` (target's final-normed last hidden state) -> logits `[K, B, T, V]`."""
        hidden = hidden.to(self.heads[0][-1].weight.dtype)  # features may be stored in bf16
        return torch.stack([head(hidden) for head in self.heads])  # [K, B, T, V]

    def compute_loss(self, batch: dict) -> tuple[torch.Tensor, dict[str, float]]:
        """Decayed mean over heads of the divergence to the target (CE on the data without its logits);
        metrics per head and the chain estimate of τ."""
        ids, hidden = batch["input_ids"], batch["features"]["final"]  # [B, T], [B, T, H]
        hidden = hidden.to(self.heads[0][-1].weight.dtype)
        real = batch["attention_mask"].bool()  # [B, T]
        counted = batch["loss_mask"].bool() & real  # [B, T]: label tokens that count
        dense, top_v = batch.get("target_logits"), batch.get("target_topk_values")
        # no target logits: hard labels
        loss_kind = self.loss if dense is not None or top_v is not None else "ce"
        T = ids.shape[1]
        total, weight_sum, metrics, accs = None, 0.0, {}, []
        for k, head in enumerate(self.heads):
            s = k + 2  # head k at position t predicts token t+s
            n = max(T - s, 0)
            mask = counted[:, s:] & real[:, :n]  # [B, n]: label counted and the source position real
            logits = head(hidden[:, :n][mask])  # [N, V]: only counted positions reach the V-wide Linear
            labels = ids[:, s:][mask]  # [N]
            teacher = indices = None  # the target's distribution of token t+s: its logits at t+s-1
            if loss_kind != "ce" and dense is not None:
                teacher = dense[:, k + 1:k + 1 + n][mask]  # [N, V]
            elif loss_kind != "ce":
                teacher = top_v[:, k + 1:k + 1 + n][mask]  # [N, k]
                indices = batch["target_topk_indices"][:, k + 1:k + 1 + n][mask]  # [N, k]
            if labels.numel():
                per_pos = token_loss(loss_kind, logits, teacher, indices, labels, self.jsd_beta,
                                     self.temperature)
                loss_k = per_pos.mean()
            else:
                loss_k = logits.sum() * 0.0
            with torch.no_grad():
                # [N, 5] in training; validation also reads the first RANKS for the serving-tree simulation
                ranks = 5 if self.training else max(5, RANKS)
                top = logits.topk(min(ranks, self.vocab_size), dim=-1).indices  # [N, R]
                acc1 = (top[:, 0] == labels).float().mean().item() if labels.numel() else 0.0
                acc5 = (
                    top[:, :5] == labels[:, None]).any(-1).float().mean().item() if labels.numel() else 0.0
                if not self.training:  # the tree a serving budget buys is simulated from these (train.select)
                    metrics.update(rank_metrics(k, top[:, :RANKS], labels))
            if labels.numel():  # a head with no counted position adds nothing (and no weight)
                w = self.decay**k
                total = w * loss_k if total is None else total + w * loss_k
                weight_sum += w
            accs.append(acc1)
            metrics.update({f"loss/head{k}": loss_k.item(), f"acc_top1/head{k}": acc1,
                            f"acc_top5/head{k}": acc5})
        loss = total / weight_sum if total is not None else loss_k  # no counted position: a 0 in the graph
        metrics["loss"], metrics["expected_tau"] = loss.item(), chain_tau(accs, len(accs))
        return loss, metrics

    def config_dict(self) -> dict:
        config = {"hidden_size": self.hidden_size, "vocab_size": self.vocab_size, "num_heads": self.num_heads,
                  "num_layers": self.num_layers, "loss": self.loss, "decay": self.decay,
                  "temperature": self.temperature}
        return config if self.loss != "jsd" else dict(config, jsd_beta=self.jsd_beta)

    def save_pretrained(self, folder: str | Path, target: str, tokenizer=None,
                        signature: dict | None = None) -> Path:
        """Write `config.json`, `model.safetensors` and `draftsmith.json` (kind, target, feature layers)."""
        folder = write_folder(folder, self.config_dict(), self.state_dict())
        write_meta(folder, self.kind, target, self.feature_layers, signature)
        return folder

    @classmethod
    def from_pretrained(cls, folder: str | Path, target_model: nn.Module | None = None,
                        meta: dict | None = None
                        ) -> MedusaHeads:
        """Rebuild from a `save_pretrained` folder; missing or unexpected weight names raise, named."""
        folder = Path(folder)
        model = cls(**json.loads((folder / "config.json").read_text()))
        load_strict(model, load_file(str(folder / "model.safetensors")), str(folder))
        return model
