"""DFlash (kind `dflash`): a block drafter that predicts the next k tokens in ONE forward from mask-token
inputs.

In the flow: the target (live or from shards) supplies the residual stream entering decoder layers
`aux_layers` (vLLM's aux ids, as EAGLE-3: our feature key for "entering layer l" is l-1); `fc` fuses them (nH
-> H) and `hidden_norm` normalises the result: the *context*. Every draft layer projects the context to keys
and values of its own (k_proj, v_proj, k_norm, RoPE at the context's positions); the block's queries never
pass through it.

One block at the last verified position p (the anchor x_p: the token the target emitted but has not
processed):

    queries   [embed(x_p), m, m, ..., m]  at positions p, p+1, ..., p+k    (m: the learned mask embedding)
    attention each query sees every context key (target features of positions < p) and every query of its
    block
              (non-causal inside the block)
    layers    pre-norm Qwen3-style: q/k per-head RMSNorm before RoPE, SiLU-gated MLP
    logits    lm_head(norm(out)) at the k mask slots: slot i (position p+i) predicts x_{p+i}; lm_head = the
              target's rows for the draft vocabulary (`draft_vocab` most frequent training labels, target id =
              draft id + d2t[draft id]; all of them when it is the target's size)

This mirrors vLLM 0.32.0's `DFlashQwen3ForCausalLM` (vllm/model_executor/models/qwen3_dflash.py: context K/V
from `hidden_norm(fc(aux))` in `precompute_and_store_context_kv`, `DFlashQwen3DecoderLayer`, final `norm`, the
bonus token then `mask_token_id` queries of vllm/v1/spec_decode/utils.py
`copy_and_expand_dflash_inputs_kernel`, non-causal by default; the layer itself is heads/dflash/layers.py);
parameter names and shapes are vLLM's, so the export (heads/dflash/export.py) is a key-for-key copy.
The embedding and lm_head are frozen copies of the target's (vLLM shares the target's when the checkpoint has
none: vllm/v1/spec_decode/llm_base_proposer.py `_maybe_share_embeddings` / `_maybe_share_lm_head`); they are
not saved. A reduced draft vocabulary keeps only its rows of the lm_head: on a CPU the draft is bound by
reading that matrix (SmolLM2's 49,152 x 576 in fp32 is 113 MB a draft, about 20 ms here; 16,384 rows a third
of it), and vLLM serves it as its own lm_head plus `d2t` (qwen3_dflash.py DFlashQwen3ForCausalLM:
`draft_vocab_size`, `draft_id_to_target_id`, compute_logits scattering the draft logits into the target's
vocabulary with -inf elsewhere). The mask embedding is trained (vLLM reads it from `mask_embedding.pt`:
qwen3_dflash.py `_read_mask_embedding`).

Training: a sequence gives up to `anchors` blocks, one per anchor position a (random among those whose next
token is counted), all in one forward: queries `[B, A*(k+1), H]` attend to the context `[B, T]` before their
anchor and to their own block. The loss is the run's divergence (heads/losses.py `token_loss`) at every
counted mask slot, slot i weighted `head_decay`^(i-1); the teacher for x_j is the target's distribution at
j-1.

Shapes: features `[B, T, H]` x n -> context `[B, T, H]`; block queries `[B, Q, H]`; mask `[B, 1, Q, T + Q]`
bool; logits `[.., Vd]` (Vd = V without a reduced vocabulary); `d2t [Vd]`, `t2d [V]` bool (only when Vd < V).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from draftsmith.heads.dflash.layers import DFlashLayer, rms_norm
from draftsmith.heads.dflash.settings import DFlashConfig, check_layers  # noqa: F401  (DFlashConfig: the kind's row)
from draftsmith.heads.dflash.slots import SlotTeacher
from draftsmith.heads.eagle.config import drafter_config, text_config
from draftsmith.heads.eagle.eagle3 import default_feature_layers, draft_vocabulary
from draftsmith.heads.files import TargetCopyDrafter
from draftsmith.heads.losses import TOKEN_LOSSES, position_weights, restrict_topk, to_draft_index, token_loss
from draftsmith.heads.runtime.tree import chain_entry


class DFlashDrafter(SlotTeacher, TargetCopyDrafter, nn.Module):
    """The block drafter (module doc); `context_kv` + `block` are one draft, `compute_loss` trains many at
    once."""

    kind = "dflash"
    version = 1
    own_config_keys: tuple[str, ...] = ()  # a subclass's config.json keys that are constructor arguments

    def __init__(self, target_config, aux_layers: list[int] | None = None, num_layers: int = 2,
                 block_size: int = 4, mask_token_id: int = -1, anchors: int = 128, decay: float = 0.8,
                 loss: str = "kl", temperature: float = 1.0, draft_vocab: list[int] | None = None):
        super().__init__()
        if loss not in TOKEN_LOSSES:
            raise ValueError(f"dflash: drafter.loss '{loss}' unknown; valid: {', '.join(TOKEN_LOSSES)}")
        N, H, V = target_config.num_hidden_layers, target_config.hidden_size, target_config.vocab_size
        if not -V <= mask_token_id < V or block_size < 1:
            raise ValueError(f"dflash: mask_token_id {mask_token_id} outside the vocabulary of {V} or block "
                             f"size {block_size} < 1")
        self.serving_layers = check_layers(aux_layers or default_feature_layers(N), N)
        # our keys: output of layer l-1
        self.feature_layers = tuple(layer - 1 for layer in self.serving_layers)
        self.target_config, self.hidden_size, self.vocab_size = target_config, H, V
        self.block_size, self.mask_token_id, self.anchors = block_size, mask_token_id % V, anchors
        self.decay, self.loss, self.temperature, self.jsd_beta = decay, loss, temperature, 0.5
        self.slot_weights = "decay"  # acceptance, dpace (settings.py; set by build, kept in config.json)
        # the target's widths, heads, head size, eps and RoPE (a Llama config)
        c = drafter_config(target_config)
        c.num_hidden_layers = num_layers
        self.attn_config = c
        self.embed_tokens = nn.Embedding(V, H).requires_grad_(False)
        vocab = sorted(draft_vocab) if draft_vocab is not None and len(draft_vocab) < V else None
        if vocab is not None and (len(set(vocab)) != len(vocab) or not all(0 <= t < V for t in vocab)):
            raise ValueError("dflash: the draft vocabulary must be distinct target token ids")
        self.target_lm_head = nn.Linear(H, V if vocab is None else len(vocab),
                                        bias=False).requires_grad_(False)
        if vocab is not None:  # buffers only for a reduced vocabulary: a full-vocabulary folder holds neither
            ids = torch.tensor(vocab, dtype=torch.long)
            # target id = draft id + d2t[draft id]
            self.register_buffer("d2t", ids - torch.arange(len(vocab)))
            self.register_buffer("t2d", torch.zeros(V, dtype=torch.bool).index_fill(0, ids, True))
        self.mask_embedding = nn.Parameter(torch.zeros(H))
        self.fc = nn.Linear(len(self.serving_layers) * H, H, bias=False)
        self.hidden_norm = rms_norm(H, c.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(c) for _ in range(num_layers))
        self.norm = rms_norm(H, c.rms_norm_eps)
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        self.rotary_emb = LlamaRotaryEmbedding(config=c)
        for module in self.modules():  # HF's initialisation of the trained linears
            if isinstance(module, nn.Linear) and module.weight.requires_grad:
                nn.init.normal_(module.weight, std=c.initializer_range)
        self.serving_tree: dict | None = None

    # ---- construction --------------------------------------------------------------------------------------
    @classmethod
    def build(cls, cfg, target_model: nn.Module, token_counts=None) -> DFlashDrafter:
        """A drafter for `target_model` (a DrafterConfig of kind dflash): frozen target copies, mask = its
        token's embedding, the recipe's chain recorded."""
        own, tc = cfg.settings, text_config(target_model)
        vocab = None
        if own.draft_vocab and own.draft_vocab < tc.vocab_size:
            vocab = draft_vocabulary(token_counts, tc.vocab_size, own.draft_vocab)
        drafter = cls(tc, own.aux_layers or None, own.num_layers,
                      own.block_size or cfg.num_speculative_tokens, own.mask_token_id, own.anchors,
                      cfg.head_decay, cfg.loss, cfg.distill_temperature, vocab, **cls.own_args(own))
        drafter.jsd_beta, drafter.slot_weights = cfg.jsd_beta, own.slot_weights
        drafter.copy_target_weights(target_model)
        with torch.no_grad():
            drafter.mask_embedding.copy_(drafter.embed_tokens.weight[drafter.mask_token_id])
        drafter.serving_tree = chain_entry(cfg.num_speculative_tokens)
        return drafter

    @staticmethod
    def own_args(settings) -> dict:
        """Constructor arguments a subclass reads from its settings section (DSpark's heads); DFlash: none."""
        return {}

    @torch.no_grad()
    def copy_target_weights(self, target_model: nn.Module) -> None:
        """Frozen copies of the target's input embedding and of its lm_head's rows for the draft
        vocabulary."""
        emb, head = target_model.get_input_embeddings().weight, target_model.get_output_embeddings().weight
        if tuple(emb.shape) != tuple(self.embed_tokens.weight.shape) or head.shape[0] != self.vocab_size:
            raise ValueError(f"dflash: the target's embedding is {tuple(emb.shape)}, the drafter expects "
                             f"{tuple(self.embed_tokens.weight.shape)}: this drafter was trained for another "
                             "target")
        self.embed_tokens.weight.copy_(emb.detach().float())
        rows = self.draft_to_target(torch.arange(self.draft_vocab_size, device=head.device))
        self.target_lm_head.weight.copy_(head.detach()[rows].float())

    @property
    def draft_vocab_size(self) -> int:
        return self.target_lm_head.out_features

    @property
    def reduced(self) -> bool:
        """Does the drafter score a draft vocabulary smaller than the target's?"""
        return self.draft_vocab_size < self.vocab_size

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t.to(draft_ids.device)[draft_ids] if self.reduced else draft_ids

    # ---- the drafter ---------------------------------------------------------------------------------------
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings `[.., H]`; the mask id gets the mask embedding (vLLM's embed_input_ids, even for a
        real token of that id)."""
        out = self.embed_tokens(ids).to(self.fc.weight.dtype)
        return torch.where((ids == self.mask_token_id)[..., None], self.mask_embedding.to(out.dtype), out)

    def fuse(self, features: dict) -> torch.Tensor:
        """Target features (keyed by layer, int or str as shards store them) -> the context `[B, T, H]`."""
        features = {str(k): v for k, v in features.items()}
        # [B, T, nH]
        x = torch.cat([features[str(k)].to(self.fc.weight.dtype) for k in self.feature_layers], dim=-1)
        return self.hidden_norm(self.fc(x))

    def context_kv(self, context: torch.Tensor,
                   positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per draft layer, the context's keys and values `[B, nkv, T, hd]` (vLLM
        precompute_and_store_context_kv)."""
        cos, sin = self.rotary_emb(context, positions)
        return [layer.self_attn.kv(context, cos, sin) for layer in self.layers]

    def block(self, ids: torch.Tensor, positions: torch.Tensor, context: list,
              mask: torch.Tensor) -> torch.Tensor:
        """Block queries (anchor / mask ids `[B, Q]` at `positions [B, Q]`) over `context` -> outputs
        `[B, Q, H]`; `mask [B, 1, Q, T + Q]` bool (True = see)."""
        x = self.embed(ids)  # [B, Q, H]
        cos, sin = self.rotary_emb(x, positions)
        for layer, kv in zip(self.layers, context):
            x = layer(x, kv, cos, sin, mask)
        return x

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        return self.target_lm_head(self.norm(out))  # [.., Vd]

    def slot_logits(self, out: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        """A mask slot's logits `[N, Vd]` from its output `[N, H]` and the token before it `[N]` (target ids:
        the anchor for slot 1, the label or draft of the slot before for the others); DFlash ignores the
        latter (DSpark adds its Markov bias)."""
        return self.logits(out)

    def slot_extra_loss(self, out, prev, logits, labels, batch, teacher_at, sel, accept=None):
        """A kind's own loss term at one slot, added before the slot's weight (DSpark: its confidence head),
        and its metrics; `accept` the slot's acceptance when compute_loss has it already; DFlash has none."""
        return None, {}

    # ---- training ------------------------------------------------------------------------------------------
    def pick_anchors(self, counted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Anchor positions `[B, A]` and which are real: a >= 1 whose next token x_{a+1} is counted, up to
        `anchors` per sequence (random while training, the first ones in eval mode)."""
        B, T = counted.shape
        candidate = torch.zeros_like(counted)
        candidate[:, 1:T - 1] = counted[:, 2:]
        score = torch.rand(B, T, device=counted.device) if self.training else \
            -torch.arange(T, device=counted.device, dtype=torch.float).expand(B, T)
        score = score.masked_fill(~candidate, float("-inf"))
        top = score.topk(min(self.anchors, T), dim=1)
        return top.indices, torch.isfinite(top.values)  # [B, A] each

    def compute_loss(self, batch: dict) -> tuple[torch.Tensor, dict[str, float]]:
        """The divergence at every counted mask slot of up to `anchors` blocks per sequence, in one
        forward."""
        ids, attn = batch["input_ids"], batch["attention_mask"].bool()  # [B, T]
        B, T = ids.shape
        if T < 3:
            raise ValueError(f"dflash: sequences of {T} tokens are too short to train on (need >= 3)")
        k, dev = self.block_size, ids.device
        counted = batch["loss_mask"].bool() & attn  # [B, T]: token j is a label
        anchors, real = self.pick_anchors(counted)  # [B, A]
        A = anchors.shape[1]
        pos = anchors[..., None] + torch.arange(k + 1, device=dev)  # [B, A, k+1]
        at = pos.clamp(max=T - 1).view(B, -1)
        labels = ids.gather(1, at).view(B, A, k + 1)[..., 1:]  # [B, A, k]
        # [B, A, k]
        ok = real[..., None] & (pos[..., 1:] < T) & counted.gather(1, at).view(B, A, k + 1)[..., 1:]
        queries = torch.full_like(pos, self.mask_token_id)
        queries[..., 0] = ids.gather(1, anchors)
        prev = torch.cat([queries[..., :1], labels[..., :-1]], -1)  # [B, A, k]: the token before each slot
        context = self.fuse(batch["features"])  # [B, T, H]
        ctx_pos = torch.arange(T, device=dev).expand(B, T)
        # [B, Q, T]
        sees_ctx = (ctx_pos[:, None, :] < anchors.repeat_interleave(k + 1, 1)[..., None]) & attn[:, None, :]
        blocks = torch.arange(A, device=dev).repeat_interleave(k + 1)
        mask = torch.cat([sees_ctx, (blocks[:, None] == blocks[None, :]).expand(B, -1, -1)], dim=-1)[:, None]
        out = self.block(queries.view(B, -1), pos.view(B, -1), self.context_kv(context, ctx_pos), mask)
        out = out.view(B, A, k + 1, -1)[:, :, 1:]  # [B, A, k, H]: the mask slots
        total, weight_sum, metrics, right = 0.0, 0.0, {}, torch.zeros_like(ok)
        accept, per_slot = torch.zeros(ok.shape, device=dev), []  # slot_weights: acceptance
        for i in range(k):
            sel = ok[..., i]
            if not sel.any():
                continue
            hidden, before, at = out[:, :, i][sel], prev[..., i][sel], pos[..., i + 1][sel] - 1  # [N, H], [N]
            logits = self.slot_logits(hidden, before)  # [N, Vd]
            values, kept = self._slot_loss(logits, labels[..., i][sel], batch, at, sel)  # [N] each
            loss_i = values[kept].mean() if kept.any() else logits.sum() * 0.0
            weigh = self.slot_weights != "decay"  # the slot's acceptance, computed once for both uses
            slot_accept = self.slot_acceptance(logits, labels[..., i][sel], batch, sel, at) if weigh else None
            extra, extra_metrics = self.slot_extra_loss(hidden, before, logits, labels[..., i][sel], batch,
                                                        at, sel, slot_accept)
            with torch.no_grad():
                hit = self.draft_to_target(logits.argmax(-1)) == labels[..., i][sel]
                right[..., i][sel] = hit
            metrics.update({f"loss/slot{i + 1}": loss_i.item(),  # the divergence alone
                            f"acc_top1/slot{i + 1}": hit.float().mean().item(),
                            **{f"{name}/slot{i + 1}": v for name, v in extra_metrics.items()}})
            if weigh:
                accept[..., i][sel] = slot_accept
                per_slot.append((i, sel, values, kept, extra))
                continue
            if extra is not None:
                loss_i = loss_i + extra
            total, weight_sum = total + self.decay**i * loss_i, weight_sum + self.decay**i
        loss = total / weight_sum if weight_sum else out.sum() * 0.0
        if per_slot:  # each slot's share of the block's expected accepted length (settings.py)
            weights = position_weights(self.slot_weights, accept, ok)
            loss = self._acceptance_weighted(weights, per_slot, metrics, self.slot_weights == "dpace")
        accepted = right.long().cumprod(-1).sum(-1)[real]  # leading right slots per block: greedy chain of k
        metrics["loss"] = loss.item()
        metrics["expected_tau"] = 1.0 + (accepted.float().mean().item() if accepted.numel() else 0.0)
        return loss, metrics

    def _acceptance_weighted(self, weights: torch.Tensor, per_slot: list, metrics: dict,
                             by_count: bool = False) -> torch.Tensor:
        """sum over slots and blocks of W x divergence / sum of W (W `[B, A, k]`: position_weights; D-PACE's
        `by_count`: / the number of counted slots), plus each slot's own extra term (DSpark's confidence BCE)
        averaged over the slots."""
        total, weight_sum, extras = 0.0, 0.0, []
        for i, sel, values, kept, extra in per_slot:  # i: the slot (one with no counted block is absent)
            w = weights[..., i][sel] * kept
            total, weight_sum = total + (w * values).sum(), weight_sum + w.sum()
            extras += [extra] if extra is not None else []
        metrics["slot_weight_mean"] = (weight_sum / max(1, sum(int(s.sum()) for _, s, *_ in per_slot))).item()
        if by_count:
            loss = total / max(1, sum(int(kept.sum()) for *_, kept, _ in per_slot))
        else:
            loss = total / weight_sum.clamp_min(1e-12)
        return loss + sum(extras) / len(extras) if extras else loss

    def _slot_loss(self, logits, labels, batch, teacher_at, sel) -> tuple[torch.Tensor, torch.Tensor]:
        """One slot's divergence per selected block `[N]` and which of them count `[N]` bool; the teacher for
        x_j is the target at j-1, restricted to the draft vocabulary (a label or a top-k outside it cannot be
        drafted and is left out)."""
        rows, n = sel.nonzero()[:, 0], logits.shape[0]  # batch row of each selected block
        every = torch.ones(n, dtype=torch.bool, device=logits.device)
        if self.loss == "ce" or (batch.get("target_logits") is None
                                 and batch.get("target_topk_values") is None):
            if not self.reduced:
                return token_loss("ce", logits, labels=labels), every
            ok = self.t2d[labels]
            return self._scatter(token_loss("ce", logits[ok], labels=to_draft_index(self.t2d)[labels[ok]]),
                                 ok), ok
        if batch.get("target_logits") is not None:
            dense = batch["target_logits"][rows, teacher_at]  # [N, V]
            if self.reduced:
                dense = dense[:, self.draft_to_target(torch.arange(self.draft_vocab_size,
                                                                   device=dense.device))]
            return token_loss(self.loss, logits, dense, beta=self.jsd_beta,
                              temperature=self.temperature), every
        values = batch["target_topk_values"][rows, teacher_at]
        indices = batch["target_topk_indices"][rows, teacher_at]
        ok = every
        if self.reduced:
            values, indices = restrict_topk(values, indices.long(), self.t2d)
            ok = torch.isfinite(values).any(-1)
            logits, values, indices = logits[ok], values[ok], indices[ok]
        return self._scatter(token_loss(self.loss, logits, values, indices, beta=self.jsd_beta,
                                        temperature=self.temperature), ok), ok

    @staticmethod
    def _scatter(values: torch.Tensor, ok: torch.Tensor) -> torch.Tensor:
        """Per-row values of the `ok` rows -> `[N]`, 0 elsewhere (differentiable)."""
        return values.new_zeros(ok.shape[0], dtype=values.dtype).index_put((ok.nonzero()[:, 0],), values)

    # ---- files ---------------------------------------------------------------------------------------------
    def config_dict(self) -> dict:
        return {"version": self.version, "target_config": self.target_config.to_dict(),
                "feature_layers": list(self.serving_layers), "num_layers": len(self.layers),
                "block_size": self.block_size, "mask_token_id": self.mask_token_id, "anchors": self.anchors,
                "decay": self.decay, "loss": self.loss, "temperature": self.temperature,
                "draft_vocab_size": self.draft_vocab_size,
                **({"jsd_beta": self.jsd_beta} if self.loss == "jsd" else {}),
                **({"slot_weights": self.slot_weights} if self.slot_weights != "decay" else {})}

    def expected_shapes(self) -> dict[str, tuple]:
        """Name -> shape of every trained tensor, from the target's config and the drafter's depth alone."""
        c, H = self.attn_config, self.hidden_size
        nh, nkv, hd, inner = c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.intermediate_size
        shapes = {"mask_embedding": (H,), "fc.weight": (H, len(self.serving_layers) * H),
                  "hidden_norm.weight": (H,), "norm.weight": (H,)}
        if self.reduced:
            shapes.update({"d2t": (self.draft_vocab_size,), "t2d": (self.vocab_size,)})
        for i in range(len(self.layers)):
            p = f"layers.{i}"
            shapes.update({f"{p}.self_attn.q_proj.weight": (nh * hd, H),
                           f"{p}.self_attn.k_proj.weight": (nkv * hd, H),
                           f"{p}.self_attn.v_proj.weight": (nkv * hd, H),
                           f"{p}.self_attn.o_proj.weight": (H, nh * hd),
                           f"{p}.self_attn.q_norm.weight": (hd,), f"{p}.self_attn.k_norm.weight": (hd,),
                           f"{p}.mlp.gate_proj.weight": (inner, H), f"{p}.mlp.up_proj.weight": (inner, H),
                           f"{p}.mlp.down_proj.weight": (H, inner), f"{p}.input_layernorm.weight": (H,),
                           f"{p}.post_attention_layernorm.weight": (H,)})
        return shapes


    @classmethod
    def from_config_dict(cls, config: dict, target_config=None) -> DFlashDrafter:
        if target_config is None:
            from transformers import AutoConfig

            tc = dict(config["target_config"])
            target_config = AutoConfig.for_model(tc.pop("model_type"), **tc)
        keys = ("num_layers", "block_size", "mask_token_id", "anchors", "decay", "loss", "temperature",
                *cls.own_config_keys)
        size = config.get("draft_vocab_size", target_config.vocab_size)
        # placeholder: d2t/t2d load after
        vocab = list(range(size)) if size < target_config.vocab_size else None
        drafter = cls(target_config, config["feature_layers"], **{k: config[k] for k in keys if k in config},
                      draft_vocab=vocab)
        drafter.jsd_beta = config.get("jsd_beta", 0.5)
        drafter.slot_weights = config.get("slot_weights", "decay")
        return drafter

    @classmethod
    def from_pretrained(cls, folder: str | Path, target_model: nn.Module | None = None,
                        meta: dict | None = None
                        ) -> DFlashDrafter:
        """Rebuild from a drafter folder; the frozen embedding/lm_head come from `target_model` (zeros without
        it)."""
        folder = Path(folder)
        drafter = cls.from_config_dict(json.loads((folder / "config.json").read_text()))
        drafter.load_trained(load_file(str(folder / "model.safetensors")), str(folder))
        if target_model is not None:
            drafter.copy_target_weights(target_model)
        return drafter
