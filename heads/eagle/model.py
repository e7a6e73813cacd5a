"""EAGLE drafters: what EAGLE-1 and EAGLE-3 share, and EAGLE-1 (kind `eagle`: one decoder layer in the
target's feature space). EAGLE-3 (kind `eagle3`) is `heads/eagle/eagle3.py`, built on the pieces here.

In the flow: the target (live or from shards) supplies its hidden states — EAGLE-1 reads `"final"`
(the last hidden state *after* the final norm: that is what vLLM, SGLang and the EAGLE repo feed an
EAGLE-1 drafter and why its output goes straight into the target's lm_head), EAGLE-3 reads the
residual stream entering decoder layers (2, N//2, N-3) by default (vLLM's `aux_hidden_state_layers`
convention; our feature key for "entering layer l" is l-1, the output of layer l-1). `train/` calls
`compute_loss`; `heads/eagle/proposer.py` drafts static or dynamic trees with `step`;
`heads/export.py` writes the `eagle` / `eagle3` layouts (state-dict names here already follow them).

One drafter step at sequence position t (x = tokens, g = fused target feature or the drafter's own
previous output):

    EAGLE-1:  out_t = layer(fc([embed(x_{t+1}), g_t]))                 logits = target lm_head(out_t)
    EAGLE-3:  out_t = midlayer(embed(x_{t+1}), g_t)  (q/k/v read [norm(e), norm(g)], 2H wide)
              logits = lm_head(norm(out_t))  over the draft vocabulary, target id = d + d2t[d]

out_t predicts x_{t+2}. Training-time test (EAGLE-3): step j feeds out^{j-1}_{t-1} in place of the
target's feature at t and attends to step-0 keys up to t-j plus the one key of every later step on
its own path — exactly what drafting j tokens ahead sees at inference. EAGLE-1 is the one-step case.
Shapes: features `[B, T, H]`, fused `[B, T, H]`, logits `[B, T, V]` (EAGLE-1) or `[B, T, Vd]` (EAGLE-3).

`EagleDrafter` holds what both share (the family's embedding and RoPE, fc, the unrolled loss, files);
`Eagle1Drafter` here and `Eagle3Drafter` add their layer, their logits and their vocabulary. The settings and
the layer's Llama config are heads/eagle/config.py, the training-time test's mask and joint counters
heads/eagle/ttt.py. Frozen copies of the target's embedding (and EAGLE-1's lm_head) are part of the module but
not of its saved folder: `from_pretrained(folder, target_model)` copies them from the target again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from draftsmith.distill.hf_compat import cache_kwargs
from draftsmith.heads.eagle.config import drafter_config, text_config
from draftsmith.heads.eagle.ttt import joint_metrics, ttt_mask
from draftsmith.heads.eagle.weights import acceptance_weights, step_masks
from draftsmith.heads.files import TargetCopyDrafter
from draftsmith.heads.losses import (
    TOKEN_LOSSES,
    lookup_predicted,
    restrict_topk,
    to_draft_index,
    token_loss,
    weighted_mean,
)
from draftsmith.heads.runtime.acceptance import RANKS, chain_tau, rank_metrics


class EagleDrafter(TargetCopyDrafter, nn.Module):
    """What EAGLE-1 and EAGLE-3 share; a subclass adds `_build_layers`, `step`, `logits` and its files."""

    kind: ClassVar[str]
    version: ClassVar[int]
    fc_inputs: ClassVar[int]  # target-width inputs of fc: [embed, feature] (2) or three aux features (3)
    attention_width: ClassVar[int]  # width of the layer's q/k/v input, in units of the hidden size
    layer_prefix: ClassVar[str]

    def __init__(self, target_config, fc_bias: bool = False, ttt_steps: int = 1, decay: float = 0.8,
                 loss: str = "kl", temperature: float = 1.0):
        super().__init__()
        from transformers import AutoModel

        if loss not in TOKEN_LOSSES:
            raise ValueError(f"eagle: drafter.loss '{loss}' unknown; valid: {', '.join(TOKEN_LOSSES)}")
        H, V = target_config.hidden_size, target_config.vocab_size
        self.target_config, self.hidden_size, self.vocab_size = target_config, H, V
        self.ttt_steps, self.decay, self.loss = ttt_steps, decay, loss
        self.temperature, self.fc_bias = temperature, fc_bias
        self.jsd_beta = 0.5  # loss jsd only (set from drafter.jsd_beta by build)
        # training only (set by build from drafter.lookup_weight, drafter.prompt_lookup's n-grams): the loss
        # weight of positions prompt lookup over the sequence's prefix already drafts; 1 = off
        self.lookup_weight, self.lookup_ngrams = 1.0, (3, 1)
        # each unrolled step's loss weight: "decay" = decay**j; "acceptance" = each position's share of its
        # chain's expected accepted length (`acceptance_weights`; EAGLE-3's drafter.eagle3.step_weights)
        self.step_weights = "decay"
        base = AutoModel.from_config(drafter_config(target_config))  # the family's own modules, one layer
        self.embed_tokens = base.get_input_embeddings().requires_grad_(False)
        self.rotary_emb = base.rotary_emb
        self.fc = nn.Linear(self.fc_inputs * H, H, bias=fc_bias)
        self._build_layers(base)
        self.attn_config = drafter_config(target_config)  # the Llama layer's config (the KV cache's too)
        self.serving_tree: dict | None = None  # dynamic-tree settings of the recipe (draftsmith.json "tree")

    def _build_layers(self, base: nn.Module) -> None:
        raise NotImplementedError

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def build(cls, cfg, target_model: nn.Module, token_counts: torch.Tensor | None = None) -> EagleDrafter:
        """A drafter for `target_model` (a DrafterConfig of this kind): frozen target copies, recipe tree."""
        drafter = cls.from_settings(cfg, text_config(target_model), token_counts)
        drafter.jsd_beta = cfg.jsd_beta
        lookup = cfg.sections["prompt_lookup"]
        drafter.lookup_weight, drafter.lookup_ngrams = cfg.lookup_weight, (lookup.ngram_max, lookup.ngram_min)
        drafter.copy_target_weights(target_model)
        if cfg.tree_nodes > 0:  # the recipe's dynamic tree travels with the folder (eval --drafter reuses it)
            drafter.serving_tree = {"topk": cfg.tree_topk, "depth": cfg.num_speculative_tokens,
                                    "budget": cfg.tree_nodes}
        return drafter

    @classmethod
    def from_settings(cls, cfg, target_config, token_counts) -> EagleDrafter:
        raise NotImplementedError

    @torch.no_grad()
    def copy_target_weights(self, target_model: nn.Module) -> None:
        """Frozen copy of the target's input embedding (shape checked)."""
        emb = target_model.get_input_embeddings().weight
        if tuple(emb.shape) != tuple(self.embed_tokens.weight.shape):
            raise ValueError(f"eagle: the target's embedding is {tuple(emb.shape)}, the drafter expects "
                             f"{tuple(self.embed_tokens.weight.shape)}: this drafter was trained for another "
                             "target")
        self.embed_tokens.weight.copy_(emb.detach().float())

    @property
    def draft_vocab_size(self) -> int:
        return self.vocab_size

    @property
    def reduced(self) -> bool:
        """Does the drafter score a draft vocabulary smaller than the target's?"""
        return self.draft_vocab_size < self.vocab_size

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids

    # ---- the drafter ----------------------------------------------------------------------------
    def fuse(self, features: dict) -> torch.Tensor:
        """Target features (keyed by layer, int or str as shards store them) -> step 0's hidden input
        `[B, T, H]`."""
        raise NotImplementedError

    def step(self, hidden, input_ids, position_ids, attention_mask, cache) -> torch.Tensor:
        """One drafter pass: hidden `[B, T, H]` + tokens x_{t+1} `[B, T]` -> output features `[B, T, H]`.

        `attention_mask` is boolean `[B or 1, 1, T, keys]` over the cache's keys plus these T (True = see).
        """
        raise NotImplementedError

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """Output features -> logits over the draft vocabulary."""
        raise NotImplementedError

    def new_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.attn_config)

    # ---- training ---------------------------------------------------------------------------------
    def compute_loss(self, batch: dict) -> tuple[torch.Tensor, dict[str, float]]:
        """Unrolled drafter loss over `ttt_steps` steps (weights decay**j); per-step accuracies and chain
        τ."""
        ids, attn = batch["input_ids"], batch["attention_mask"].bool()  # [B, T]
        B, T = ids.shape
        n = T - 2  # position t (0..T-3) reads x_{t+1} and predicts x_{t+2}
        if n < 1:
            raise ValueError(f"eagle: sequences of {T} tokens are too short to train on (need >= 3)")
        fused = self.fuse(batch["features"])  # [B, T, H]
        inputs, labels = ids[:, 1:T - 1], ids[:, 2:]  # [B, n]
        counted = batch["loss_mask"][:, 2:].bool() & attn[:, 2:]  # [B, n]
        teacher = self._teacher(batch, n)  # soft targets at t+1, already on the draft vocabulary (or None)
        total, weight_sum, metrics, accs, hits = 0.0, 0.0, {}, [], []
        weights = None  # [B, n]: drafter.lookup_weight where prompt lookup already drafts x_{t+2}, else 1
        if self.lookup_weight != 1:
            looked = lookup_predicted(ids, *self.lookup_ngrams)[:, 2:]  # [B, n]
            weights = torch.where(looked, self.lookup_weight, 1.0)
            metrics["lookup_share"] = looked[counted].float().mean().item() if counted.any() else 0.0
        outs = self.unroll(fused[:, :n], inputs, self.ttt_steps)
        masks = step_masks(counted, len(outs))  # step j: no real feature left for t < j
        by_accept, step_logits = None, [None] * len(outs)  # decay: each step's logits made in its own loss
        if self.step_weights == "acceptance":  # the weights read every step's logits first: made once
            step_logits = [self.logits(out[mask]) for out, mask in zip(outs, masks)]  # [N_j, Vd]
            by_accept = acceptance_weights(self, step_logits, masks, labels, teacher)  # [B, n] per step
        for j, (out, mask) in enumerate(zip(outs, masks)):
            own = weights if by_accept is None else by_accept[j] * (1.0 if weights is None else weights)
            loss_j, acc, ranks, hit = self._step_loss(out[mask], labels[mask], teacher, mask, j,
                                                      None if own is None else own[mask], step_logits[j])
            step_logits[j] = None  # its loss holds what backward needs: no more than one step's logits live
            if not self.training:  # the step's hits back on [B, n], for the joint counters
                hits.append(torch.zeros_like(mask).masked_scatter(mask, hit))
            loss_j = self.step_objective(loss_j, out, fused, mask, metrics)
            # the step's share: decay**j, or the sum of its acceptance weights (so the whole loss is
            # sum W x divergence / sum W over every step and position)
            w = self.decay**j if by_accept is None else own[mask].sum()
            total, weight_sum = total + w * loss_j, weight_sum + w
            accs.append(acc)
            metrics.update({f"loss/step{j}": loss_j.item(), f"acc_top1/step{j}": acc, **ranks})
        if by_accept is not None:
            metrics["step_weight_mean"] = (weight_sum / counted.sum().clamp_min(1)).item()
        loss = total / weight_sum if weight_sum > 0 else fused.sum() * 0.0
        # chain estimate over 5 tokens, the last step's accuracy extrapolated past the unrolled ones
        metrics["loss"], metrics["expected_tau"] = loss.item(), chain_tau(accs, max(self.ttt_steps, 5))
        if hits:
            metrics.update(joint_metrics(hits, counted, max(self.ttt_steps, 5)))
        return loss, metrics

    def step_objective(self, logit_loss, out, fused, mask, metrics) -> torch.Tensor:
        """One unrolled step's objective from its logit loss (EAGLE-1 adds the feature regression)."""
        return logit_loss

    def unroll(self, fused: torch.Tensor, inputs: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Training-time test: outputs `[B, n, H]` of steps 0..steps-1; step j at t drafts j tokens past
        t-j."""
        B, n = inputs.shape
        positions = torch.arange(n, device=inputs.device).expand(B, n)
        cache, hidden, outs = self.new_cache(), fused, []
        for j in range(steps):
            if j:  # the drafter's own output at t-1 stands in for the target's feature at t
                hidden = torch.cat([torch.zeros_like(outs[-1][:, :1]), outs[-1][:, :-1]], dim=1)  # [B, n, H]
            outs.append(self.step(hidden, inputs, positions, ttt_mask(n, j, inputs.device), cache))
        return outs

    def _teacher(self, batch: dict, n: int):
        """Target distribution for x_{t+2} (logits at t+1) restricted to the draft vocabulary."""
        if self.loss == "ce":
            return None
        dense = batch.get("target_logits")
        if dense is not None:
            dense = dense[:, 1:n + 1]  # [B, n, V]
            if self.reduced:
                dense = dense[..., self.draft_to_target(torch.arange(self.draft_vocab_size,
                                                                     device=dense.device))]
            return ("dense", dense)
        if batch.get("target_topk_values") is None:
            return None
        values = batch["target_topk_values"][:, 1:n + 1]
        indices = batch["target_topk_indices"][:, 1:n + 1].long()
        if self.reduced:
            values, indices = restrict_topk(values, indices, self.t2d)
        return ("sparse", values, indices)

    def _step_loss(self, out: torch.Tensor, labels: torch.Tensor, teacher, mask: torch.Tensor, depth: int,
                   weights: torch.Tensor | None = None, logits: torch.Tensor | None = None):
        """(loss, top-1 accuracy vs the data token, rank accuracies in eval mode, the per-position top-1 hits
        [N]) at the counted positions of one unrolled step (step j drafts depth j); the loss is the mean over
        positions, weighted by `weights [N]` when given (accuracies never are); `logits` are `out`'s when the
        caller has them."""
        ranks = min(RANKS, self.draft_vocab_size)
        if not labels.numel():
            return (out.sum() * 0.0, 0.0,
                    {} if self.training else rank_metrics(depth, labels.new_zeros(0, ranks), labels),
                    labels.new_zeros(0, dtype=torch.bool))
        logits = self.logits(out) if logits is None else logits  # [N, Vd]
        if teacher is None:
            if self.reduced:
                ok = self.t2d[labels]
                loss = weighted_mean(F.cross_entropy(logits[ok].float(), to_draft_index(self.t2d)[labels[ok]],
                                                     reduction="none"),
                                     None if weights is None else weights[ok]) \
                    if ok.any() else logits.sum() * 0.0
            else:
                loss = weighted_mean(F.cross_entropy(logits.float(), labels, reduction="none"), weights)
        elif teacher[0] == "dense":
            loss = weighted_mean(token_loss(self.loss, logits, teacher[1][mask], beta=self.jsd_beta,
                                            temperature=self.temperature), weights)
        else:
            values, indices = teacher[1][mask], teacher[2][mask]
            ok = torch.isfinite(values).any(-1)  # positions whose top-k has a draft-vocabulary token
            loss = (weighted_mean(token_loss(self.loss, logits[ok], values[ok], indices[ok],
                                             beta=self.jsd_beta, temperature=self.temperature),
                                  None if weights is None else weights[ok])
                    if ok.any() else logits.sum() * 0.0)
        with torch.no_grad():
            hits = self.draft_to_target(logits.argmax(-1)) == labels  # [N]
            by_rank = {} if self.training else \
                rank_metrics(depth, self.draft_to_target(logits.topk(ranks, -1).indices), labels)
        return loss, hits.float().mean().item(), by_rank, hits

    # ---- files ---------------------------------------------------------------------------------------
    def config_dict(self) -> dict:
        return {"version": self.version, "target_config": self.target_config.to_dict(),
                "fc_bias": self.fc_bias, "ttt_steps": self.ttt_steps, "decay": self.decay, "loss": self.loss,
                "temperature": self.temperature, "draft_vocab_size": self.draft_vocab_size,
                **({"jsd_beta": self.jsd_beta} if self.loss == "jsd" else {}),
                **({"step_weights": self.step_weights} if self.step_weights != "decay" else {})}

    def expected_shapes(self) -> dict[str, tuple]:
        """Name -> shape of every trained tensor, derived from the target's config alone (what the eagle /
        eagle3 exports must hold: a family whose layer carries other tensors, e.g. Qwen3's q_norm, fails
        the export's check instead of loading half a drafter in a serving engine)."""
        c, H, p = self.attn_config, self.hidden_size, self.layer_prefix  # the Llama layer's config
        nh, nkv, width = c.num_attention_heads, c.num_key_value_heads, self.attention_width * self.hidden_size
        hd = c.head_dim
        shapes = {"fc.weight": (H, self.fc_inputs * H),
                  f"{p}.self_attn.q_proj.weight": (nh * hd, width),
                  f"{p}.self_attn.k_proj.weight": (nkv * hd, width),
                  f"{p}.self_attn.v_proj.weight": (nkv * hd, width),
                  f"{p}.self_attn.o_proj.weight": (H, nh * hd),
                  f"{p}.mlp.gate_proj.weight": (c.intermediate_size, H),
                  f"{p}.mlp.up_proj.weight": (c.intermediate_size, H), f"{p}.mlp.down_proj.weight": (
                      H, c.intermediate_size), f"{p}.post_attention_layernorm.weight": (H,)}
        if self.fc_bias:
            shapes["fc.bias"] = (H,)
        return shapes


    @staticmethod
    def target_config_of(config: dict):
        from transformers import AutoConfig

        tc = dict(config["target_config"])
        return AutoConfig.for_model(tc.pop("model_type"), **tc)

    @classmethod
    def from_config_dict(cls, config: dict) -> EagleDrafter:
        raise NotImplementedError

    @classmethod
    def from_pretrained(cls, folder: str | Path, target_model: nn.Module | None = None,
                        meta: dict | None = None
                        ) -> EagleDrafter:
        """Rebuild from a drafter folder; the frozen embedding/lm_head come from `target_model` (zeros without
        it)."""
        folder = Path(folder)
        config = json.loads((folder / "config.json").read_text())
        drafter = cls.from_config_dict(config)
        drafter.jsd_beta = config.get("jsd_beta", 0.5)
        drafter.step_weights = config.get("step_weights", "decay")
        drafter.load_trained(load_file(str(folder / "model.safetensors")), str(folder))
        if target_model is not None:
            drafter.copy_target_weights(target_model)
        return drafter


class Eagle1Drafter(EagleDrafter):
    """EAGLE-1: `fc([embed, feature])` -> one decoder layer (no input norm) -> the target's lm_head."""

    kind, version, fc_inputs = "eagle", 1, 2
    feature_layers = ("final",)
    layer_prefix = "layers.0"  # state-dict (and export) prefix of the decoder layer
    attention_width = 1  # q/k/v read H-wide inputs (fc's output)

    def __init__(self, target_config, fc_bias: bool = False, decay: float = 0.8, loss: str = "kl",
                 temperature: float = 1.0, feature_weight: float = 1.0, logit_weight: float = 0.1):
        self.feature_weight, self.logit_weight = feature_weight, logit_weight
        super().__init__(target_config, fc_bias, 1, decay, loss, temperature)

    def _build_layers(self, base: nn.Module) -> None:
        layer = base.layers[0]
        layer.input_layernorm = nn.Identity()  # EAGLE-1's layer 0 has no input norm
        self.layers = nn.ModuleList([layer])
        self.target_lm_head = nn.Linear(self.hidden_size, self.vocab_size, bias=False).requires_grad_(False)

    @classmethod
    def from_settings(cls, cfg, target_config, token_counts) -> Eagle1Drafter:
        own = cfg.settings
        return cls(target_config, own.fc_bias, cfg.head_decay, cfg.loss, cfg.distill_temperature,
                   own.feature_weight, own.logit_weight)

    @torch.no_grad()
    def copy_target_weights(self, target_model: nn.Module) -> None:
        """The frozen embedding and lm_head copies."""
        super().copy_target_weights(target_model)
        self.target_lm_head.weight.copy_(target_model.get_output_embeddings().weight.detach().float())

    def fuse(self, features: dict) -> torch.Tensor:
        features = {str(k): v for k, v in features.items()}
        return features["final"].to(self.fc.weight.dtype)

    def step(self, hidden, input_ids, position_ids, attention_mask, cache) -> torch.Tensor:
        embeds = self.embed_tokens(input_ids).to(hidden.dtype)  # [B, T, H]
        rope = self.rotary_emb(hidden, position_ids)
        x = self.fc(torch.cat([embeds, hidden], dim=-1))  # [B, T, H]
        return self.layers[0](x, attention_mask=attention_mask, position_ids=position_ids,
                              use_cache=cache is not None, position_embeddings=rope,
                              **cache_kwargs(self.layers[0], cache))

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        return self.target_lm_head(out)  # [.., V]

    def step_objective(self, logit_loss, out, fused, mask, metrics) -> torch.Tensor:
        if not self.feature_weight:
            return logit_loss
        n = out.shape[1]
        target_feat = fused[:, 1:n + 1][mask].detach().float()  # the target's own feature at t+1
        feat = F.smooth_l1_loss(out[mask].float(), target_feat) if mask.any() else out.sum() * 0.0
        metrics["loss/feature"] = feat.item()
        return self.logit_weight * logit_loss + self.feature_weight * feat

    def config_dict(self) -> dict:
        return dict(super().config_dict(), feature_layers=None, feature_weight=self.feature_weight,
                    logit_weight=self.logit_weight)

    @classmethod
    def from_config_dict(cls, config: dict) -> Eagle1Drafter:
        keys = ("fc_bias", "decay", "loss", "temperature", "feature_weight", "logit_weight")
        return cls(cls.target_config_of(config), **{k: config[k] for k in keys if k in config})
