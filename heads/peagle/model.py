"""P-EAGLE (kind `peagle`): EAGLE-3 that drafts all k tokens in ONE drafter forward (parallel drafting).

In the flow: the same target features as EAGLE-3 (the residual stream entering decoder layers `aux_layers`,
vLLM's aux ids; our feature key for "entering layer l" is l-1) and the same module — `fc` (3H -> H), the
`midlayer` reading [norm(embed), norm(hidden)] 2H wide, `norm`, an own `lm_head` over a draft vocabulary
(`d2t`/`t2d`): this class IS an `Eagle3Drafter` (heads/eagle/eagle3.py) plus two trained tensors, and `train/`
calls `compute_loss`, `heads/peagle/proposer.py` drafts with `step`, `heads/peagle/export.py` writes vLLM
0.32.0's layout.

One draft at the last verified position p (the root token x_{p+1}: emitted by the target, not yet processed):

    slot 0     token x_{p+1}            hidden fc(target features of p)   position p      -> draft token 1
    slot i     token mask_token_id      hidden fc(mask_hidden)            position p + i  -> draft token i+1
               (embedding: mask_embedding)                                                 (i = 1 .. k-1)
    attention  causal: every slot sees the drafter's keys of all verified positions (real features), slot 0
               and the mask slots before it; nothing is fed back, so the k tokens come from one forward

This is what vLLM 0.32.0 runs with method eagle3 + parallel_drafting (vllm/v1/spec_decode/utils.py
`copy_and_expand_eagle_inputs_kernel`: bonus token, then `parallel_drafting_token_id` at positions p+1..;
llm_base_proposer.py: the mask slots' hidden is `combine_hidden_states(mask_hidden)` = fc(mask_hidden), the
draft layer is a causal decoder layer). `mask_hidden [3H]` is learned in the 3H feature space (speculators'
and vLLM's name; it goes through fc and the optional input norm like real features); `mask_embedding [H]` is
the learned embedding row of `mask_token_id` (vLLM: the drafter's own `embed_tokens` with that row,
heads/peagle/export.py); the rest of the embedding is the target's, frozen and not saved.

Training (no training-time test: P-EAGLE's chains replace it): every position t is a depth-0 query (x_{t+1},
the fused feature of t, predicts x_{t+2}); up to `anchors` random chains per sequence add, for an anchor a,
the k-1 mask queries (a, d) at positions a+d predicting x_{a+d+2}; one forward, speculators' P-EAGLE mask (a
chain query sees depth-0 keys <= a and its own chain up to itself). The loss is the run's divergence at every
counted query, depth d's mean weighted `head_decay`^d; the teacher for x_j is the target's distribution at
j-1.

Shapes: features `[B, T, H]` x 3 -> fused `[B, T, H]`; queries `[B, n + A(k-1), H]` (n = T-2 depth-0
positions, A chains); mask `[B, 1, Q, Q]` bool; logits `[.., Vd]`; `mask_hidden [3H]`, `mask_embedding [H]`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from draftsmith.heads.eagle.eagle3 import (
    Eagle3Drafter,
    check_aux_layers,
    default_feature_layers,
    draft_vocabulary,
)
from draftsmith.heads.runtime.tree import chain_entry
from draftsmith.heads.settings import KindSettings


@dataclass
class PEagleConfig(KindSettings):
    """`drafter.peagle`: EAGLE-3's fused layers and draft vocabulary, the parallel depth, the mask token,
    chains.

    EAGLE-3.1's `fc_norm` and `norm_output` are not offered: vLLM 0.32.0's speculators reader for P-EAGLE
    (`update_peagle`) does not pass them on, so a drafter trained with them would be served as another
    computation.
    """

    # entering decoder layers l (vLLM's ids); [] = 2, N//2, N-3
    aux_layers: list[int] = field(default_factory=list)
    draft_vocab: int = 32000  # reduced vocabulary (most frequent target tokens); 0 = full vocab
    # tokens drafted in parallel (one forward) while training; 0 = drafter.num_speculative_tokens
    depth: int = 0
    # the id vLLM feeds the mask slots (its embedding row is trained); -1 = the last id
    mask_token_id: int = -1
    # mask chains per training sequence (random anchors; every candidate when there are fewer)
    anchors: int = 64
    norm_before_fc: bool = False  # one RMSNorm over the fused 3H input (speculators' name; vLLM passes it on)

    def __post_init__(self):
        if self.depth < 0 or self.anchors < 1 or self.draft_vocab < 0:
            raise ValueError("drafter.peagle.depth must be >= 0 (0 = drafter.num_speculative_tokens), "
                             "drafter.peagle.anchors >= 1 and drafter.peagle.draft_vocab >= 0")
        if self.aux_layers and len(self.aux_layers) != 3:
            raise ValueError(f"drafter.peagle.aux_layers: P-EAGLE fuses 3 target layers as EAGLE-3 does, got "
                             f"{list(self.aux_layers)}; leave it empty for the default")

    def feature_layers(self, target_config) -> list:
        layers = self.aux_layers or default_feature_layers(target_config.num_hidden_layers)
        return [layer - 1 for layer in check_aux_layers(layers, target_config.num_hidden_layers)]

    def serving_candidates(self, folder_config: dict) -> list[dict]:
        """Chains up to the trained depth (one drafter forward each; vLLM drafts chains only), one beside a
        prompt-lookup branch."""
        depth = int(folder_config.get("depth") or 4)
        chains = [{"tree": f"chain-{n}",
                   "num_speculative_tokens": n} for n in sorted({1, 2, 3, 4, 6, 8, depth})
                  if n <= depth]
        return chains + [{"tree": f"chain-{depth}", "num_speculative_tokens": depth, "lookup_branch": 4}]


def parallel_mask(n: int, anchors: torch.Tensor, chain: int) -> torch.Tensor:
    """Who sees whom in one training forward: `[B, 1, n + A*chain, n + A*chain]` bool (True = see).

    Depth-0 query t sees depth-0 keys s <= t (plain causal). Chain query (anchor a, depth d) sees depth-0 keys
    s <= a (the verified context of a draft rooted at a) and the queries of its own chain at depths <= d —
    what slot d of a draft sees at inference (speculators `create_peagle_mask_mod`, vLLM's causal draft
    layer)."""
    B, A = anchors.shape
    dev = anchors.device
    t = torch.arange(n, device=dev)
    top = torch.cat([(t[:, None] >= t[None, :]).expand(B, n, n),
                     torch.zeros(B, n, A * chain, dtype=torch.bool, device=dev)], dim=-1)  # [B, n, Q]
    root = anchors.repeat_interleave(chain, 1)  # [B, A*chain]: the anchor of each chain query
    slot = torch.arange(A, device=dev).repeat_interleave(chain)
    depth = torch.arange(chain, device=dev).repeat(A)
    own = (slot[:, None] == slot[None, :]) & (depth[:, None] >= depth[None, :])  # [A*chain, A*chain]
    # [B, A*chain, Q]
    bottom = torch.cat([t[None, None, :] <= root[..., None], own.expand(B, -1, -1)], dim=-1)
    return torch.cat([top, bottom], dim=1)[:, None]


def gather_teacher(teacher, at: torch.Tensor):
    """`EagleDrafter._teacher`'s rows at positions `at [B, A]` (dense `[B, A, Vd]`, sparse `[B, A, k]`
    each)."""
    if teacher is None:
        return None
    rows = torch.arange(at.shape[0], device=at.device)[:, None]
    return (teacher[0], *(part[rows, at] for part in teacher[1:]))


class PEagleDrafter(Eagle3Drafter):
    """EAGLE-3's module + `mask_hidden [3H]` and `mask_embedding [H]`; `compute_loss` trains k tokens a
    forward."""

    kind, version = "peagle", 1
    # drafts its k slots; validation depths are not extrapolated past them (heads/runtime/acceptance.py)
    recurrent = False

    def __init__(self, target_config, aux_layers: list[int] | None = None,
                 draft_vocab: list[int] | None = None, depth: int = 4, mask_token_id: int = -1,
                 anchors: int = 64, decay: float = 0.8, loss: str = "kl", temperature: float = 1.0,
                 norm_before_fc: bool = False):
        V = target_config.vocab_size
        if depth < 1 or anchors < 1 or not -V <= mask_token_id < V:
            raise ValueError(f"peagle: depth {depth} and anchors {anchors} must be >= 1 and mask_token_id "
                             f"{mask_token_id} inside the vocabulary of {V} (drafter.peagle.*)")
        self.depth, self.anchors, self.mask_token_id = depth, anchors, mask_token_id % V
        super().__init__(target_config, aux_layers, draft_vocab, False, 1, decay, loss, temperature,
                         norm_before_fc=norm_before_fc)
        self.mask_hidden = nn.Parameter(torch.randn(self.fc_inputs * self.hidden_size))  # speculators: randn
        self.mask_embedding = nn.Parameter(torch.zeros(self.hidden_size))  # build: the mask id's target row

    # ---- construction --------------------------------------------------------------------------------------
    @classmethod
    def from_settings(cls, cfg, target_config, token_counts) -> PEagleDrafter:
        own = cfg.settings
        vocab = None
        if own.draft_vocab and own.draft_vocab < target_config.vocab_size:
            vocab = draft_vocabulary(token_counts, target_config.vocab_size, own.draft_vocab)
        return cls(target_config, own.aux_layers or None, vocab, own.depth or cfg.num_speculative_tokens,
                   own.mask_token_id, own.anchors, cfg.head_decay, cfg.loss, cfg.distill_temperature,
                   own.norm_before_fc)

    @classmethod
    def build(cls, cfg, target_model: nn.Module, token_counts: torch.Tensor | None = None) -> PEagleDrafter:
        """EAGLE-3's build (frozen embedding, lm_head rows of the target) + the mask row starting as the mask
        id's target embedding; the recipe's chain recorded (P-EAGLE drafts chains, never trees)."""
        drafter = super().build(cfg, target_model, token_counts)
        with torch.no_grad():
            drafter.mask_embedding.copy_(drafter.embed_tokens.weight[drafter.mask_token_id])
        drafter.serving_tree = chain_entry(cfg.num_speculative_tokens)
        return drafter

    # ---- the drafter ---------------------------------------------------------------------------------------
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings `[.., H]`; the mask id gets the trained row (vLLM: its own embed_tokens holds it,
        so a real token of that id gets it too)."""
        out = self.embed_tokens(ids).to(self.fc.weight.dtype)
        return torch.where((ids == self.mask_token_id)[..., None], self.mask_embedding.to(out.dtype), out)

    def mask_state(self) -> torch.Tensor:
        """The hidden every mask slot reads, `[H]`: `mask_hidden` through the same fuse as real features
        (input norm, fc), as vLLM's `combine_hidden_states(mask_hidden)`."""
        parts = self.mask_hidden.chunk(self.fc_inputs)
        return self.fuse({str(k): part for k, part in zip(self.feature_layers, parts)})

    def step(self, hidden, input_ids, position_ids, attention_mask, cache) -> torch.Tensor:
        embeds = self.embed(input_ids).to(hidden.dtype)  # [B, T, H]
        rope = self.rotary_emb(hidden, position_ids)
        return self.midlayer(embeds, hidden, attention_mask, rope, cache)

    # ---- training ------------------------------------------------------------------------------------------
    def pick_anchors(self, counted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Chain anchors `[B, A]` and which are real: positions a whose depth-1 label x_{a+3} is counted, up
        to `anchors` per sequence (random while training, the first ones in eval mode). `counted [B, n]`:
        position t's label x_{t+2} counts."""
        B, n = counted.shape
        candidate = torch.zeros_like(counted)
        candidate[:, : n - 1] = counted[:, 1:]
        score = torch.rand(B, n, device=counted.device) if self.training else \
            -torch.arange(n, device=counted.device, dtype=torch.float).expand(B, n)
        top = score.masked_fill(~candidate, float("-inf")).topk(min(self.anchors, n), dim=1)
        return top.indices, torch.isfinite(top.values)

    def parallel_forward(self, fused: torch.Tensor, ids: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        """One forward over the depth-0 queries (`fused [B, n, H]`, tokens x_{t+1}) and the chains of `anchors
        [B, A]` -> outputs `[B, n + A(k-1), H]`."""
        B, n, H = fused.shape
        chain, dev = self.depth - 1, ids.device
        root = anchors.repeat_interleave(chain, 1)  # [B, A*chain]
        depth = torch.arange(1, chain + 1, device=dev).repeat(anchors.shape[1])
        hidden = torch.cat([fused, self.mask_state().to(fused.dtype).expand(B, root.shape[1], H)], dim=1)
        tokens = torch.cat([ids[:, 1:n + 1], torch.full_like(root, self.mask_token_id)], dim=1)
        positions = torch.cat([torch.arange(n, device=dev).expand(B, n), root + depth], dim=1)
        return self.step(hidden, tokens, positions, parallel_mask(n, anchors, chain), None)

    def compute_loss(self, batch: dict) -> tuple[torch.Tensor, dict[str, float]]:
        """The divergence at every counted depth-0 position and chain slot, all from one forward."""
        ids, attn = batch["input_ids"], batch["attention_mask"].bool()  # [B, T]
        B, T = ids.shape
        n = T - 2  # position t (0..n-1) reads x_{t+1} and predicts x_{t+2}
        if n < 1:
            raise ValueError(f"peagle: sequences of {T} tokens are too short to train on (need >= 3)")
        counted = batch["loss_mask"][:, 2:].bool() & attn[:, 2:]  # [B, n]
        labels = ids[:, 2:]  # [B, n]: position t's label
        anchors, real = self.pick_anchors(counted)  # [B, A]
        out = self.parallel_forward(self.fuse(batch["features"])[:, :n], ids, anchors)
        A, H = anchors.shape[1], out.shape[-1]
        # depth 0 [B, n, H]; [B, A, k-1, H]
        out0, chains = out[:, :n], out[:, n:].reshape(B, A, self.depth - 1, H)
        teacher = self._teacher(batch, n)
        total, weight_sum, metrics = 0.0, 0.0, {}
        right = torch.zeros(B, A, self.depth, dtype=torch.bool, device=ids.device)
        for d in range(self.depth):
            at = (anchors + d).clamp(max=n - 1)  # [B, A]: where slot d of each chain sits
            ok = real & (anchors + d < n) & counted.gather(1, at)
            if d == 0:  # every counted position (the plain EAGLE-3 step), not only the anchors
                loss_d, acc, ranks, _ = self._step_loss(out0[counted], labels[counted], teacher, counted, 0)
            else:
                loss_d, acc, ranks, _ = self._step_loss(chains[:, :, d - 1][ok], labels.gather(1, at)[ok],
                                                     gather_teacher(teacher, at), ok, d)
            right[..., d] = self._right(out0, chains, anchors, d, labels, ok)
            total, weight_sum = total + self.decay**d * loss_d, weight_sum + self.decay**d
            metrics.update({f"loss/depth{d}": loss_d.item(), f"acc_top1/depth{d}": acc, **ranks})
        loss = total / weight_sum
        # leading right slots of each chain: one greedy draft
        accepted = right.long().cumprod(-1).sum(-1)[real]
        metrics["loss"] = loss.item()
        metrics["expected_tau"] = 1.0 + (accepted.float().mean().item() if accepted.numel() else 0.0)
        return loss, metrics

    @torch.no_grad()
    def _right(self, out0, chains, anchors, d, labels, ok) -> torch.Tensor:
        """`[B, A]`: slot d of each chain's draft (depth 0 = the anchor's own query) is its data label."""
        H = out0.shape[-1]
        at = (anchors + d).clamp(max=labels.shape[1] - 1)
        rows = out0.gather(1, anchors[..., None].expand(-1, -1, H)) if d == 0 else chains[:, :, d - 1]
        return ok & (self.draft_to_target(self.logits(rows).argmax(-1)) == labels.gather(1, at))

    # ---- files ---------------------------------------------------------------------------------------------
    def config_dict(self) -> dict:
        return dict(super().config_dict(), depth=self.depth, mask_token_id=self.mask_token_id,
                    anchors=self.anchors)

    def expected_shapes(self) -> dict[str, tuple]:
        return dict(super().expected_shapes(), mask_hidden=(self.fc_inputs * self.hidden_size,),
                    mask_embedding=(self.hidden_size,))

    @classmethod
    def from_config_dict(cls, config: dict) -> PEagleDrafter:
        target_config = cls.target_config_of(config)
        vocab = None
        if config["draft_vocab_size"] < target_config.vocab_size:
            # placeholder; d2t/t2d are loaded with the weights
            vocab = list(range(config["draft_vocab_size"]))
        keys = ("depth", "mask_token_id", "anchors", "decay", "loss", "temperature")
        return cls(target_config, config["feature_layers"], vocab, **{k: config[k] for k in keys},
                   norm_before_fc=bool(config.get("norm_before_fc", False)))
