"""EAGLE drafters: EAGLE-1 (one decoder layer in the target's feature space) and EAGLE-3 (fused
low/mid/high features, training-time test, reduced draft vocabulary).

In the flow: the target (live or from shards) supplies its hidden states — EAGLE-1 reads `"final"`
(the last hidden state *after* the final norm: that is what vLLM, SGLang and the EAGLE repo feed an
EAGLE-1 drafter and why its output goes straight into the target's lm_head), EAGLE-3 reads the
residual stream entering decoder layers (2, N//2, N-3) by default (vLLM's `aux_hidden_state_layers`
convention; our feature key for "entering layer l" is l-1, the output of layer l-1). `train/` calls
`compute_loss`; `eval/eagle_proposer.py` drafts static or dynamic trees with `step`; `heads/export.py`
writes the `eagle` / `eagle3` layouts (state-dict names here already follow them).

One drafter step at sequence position t (x = tokens, g = fused target feature or the drafter's own
previous output):

    EAGLE-1:  out_t = layer(fc([embed(x_{t+1}), g_t]))                 logits = target lm_head(out_t)
    EAGLE-3:  out_t = midlayer(embed(x_{t+1}), g_t)  (q/k/v read [norm(e), norm(g)], 2H wide)
              logits = lm_head(norm(out_t))  over the draft vocabulary, target id = d + d2t[d]

out_t predicts x_{t+2}. Training-time test (EAGLE-3): step j feeds out^{j-1}_{t-1} in place of the
target's feature at t and attends to step-0 keys up to t-j plus the one key of every later step on
its own path — exactly what drafting j tokens ahead sees at inference. Shapes: features `[B, T, H]`,
fused `[B, T, H]`, logits `[B, T, V]` (EAGLE-1) or `[B, T, Vd]` (EAGLE-3).

Frozen copies of the target's embedding (and EAGLE-1's lm_head) are part of the module but not of its
saved folder: `from_pretrained(folder, target_model)` copies them from the target again.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from draftsmith.heads.losses import distill_kl
from draftsmith.heads.registry import load_strict, write_folder, write_meta

FROZEN = ("embed_tokens.", "target_lm_head.")  # copied from the target, never trained, never saved


def default_feature_layers(num_layers: int) -> list[int]:
    """EAGLE-3's low/mid/high layers, as "the hidden state entering decoder layer l"."""
    return [2, num_layers // 2, num_layers - 3]


def drafter_config(target_config, attention_width: int | None = None):
    """A one-layer copy of the target's HF config (full attention, sdpa), optionally with wider q/k/v input."""
    cfg = copy.deepcopy(target_config)
    cfg.num_hidden_layers = 1
    if getattr(cfg, "layer_types", None) is not None:
        cfg.layer_types = ["full_attention"]
    if hasattr(cfg, "sliding_window"):
        cfg.sliding_window = None
    cfg.use_cache = True
    cfg._attn_implementation = "sdpa"  # boolean masks (TTT, trees) go straight to torch SDPA
    if attention_width is not None:
        cfg.head_dim = getattr(target_config, "head_dim", None) or target_config.hidden_size // target_config.num_attention_heads
        cfg.hidden_size = attention_width
    return cfg


class Eagle3Layer(nn.Module):
    """EAGLE-3's `midlayer`: attention over [input_layernorm(embeds), hidden_norm(hidden)] (2H wide),
    the residual being `hidden`; then the family's MLP. Attention/MLP/norm classes are the target's."""

    def __init__(self, layer_template: nn.Module, norm_template: nn.Module, config, hidden_size: int):
        super().__init__()
        wide = drafter_config(config, attention_width=2 * hidden_size)
        self.self_attn = type(layer_template.self_attn)(wide, layer_idx=0)
        bias = getattr(config, "attention_bias", False)
        self.self_attn.o_proj = nn.Linear(self.self_attn.o_proj.in_features, hidden_size, bias=bias)
        self.mlp = layer_template.mlp
        self.input_layernorm = copy.deepcopy(norm_template)
        self.hidden_norm = copy.deepcopy(norm_template)
        self.post_attention_layernorm = copy.deepcopy(norm_template)

    def forward(self, embeds, hidden, attention_mask, position_embeddings, cache):
        residual = hidden
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)  # [B, T, 2H]
        x, _ = self.self_attn(x, position_embeddings=position_embeddings, attention_mask=attention_mask, cache=cache)
        x = residual + x  # [B, T, H]
        return x + self.mlp(self.post_attention_layernorm(x))


class EagleDrafter(nn.Module):
    """EAGLE-1 (`version` 1) or EAGLE-3 (`version` 3) drafter for one target family."""

    needs_token_counts = True  # EAGLE-3's draft vocabulary = the most frequent training labels

    def __init__(self, target_config, version: int = 3, feature_layers: list[int] | None = None,
                 draft_vocab: list[int] | None = None, fc_bias: bool = False, ttt_steps: int = 7,
                 decay: float = 0.8, loss: str = "kl", temperature: float = 1.0, feature_weight: float = 1.0,
                 logit_weight: float = 0.1):
        super().__init__()
        from transformers import AutoModel

        if version not in (1, 3):
            raise ValueError(f"eagle: version must be 1 or 3, got {version}")
        if loss not in ("kl", "ce"):
            raise ValueError(f"eagle: drafter.loss '{loss}' is not available for EAGLE drafters; use kl or ce")
        H, V, N = target_config.hidden_size, target_config.vocab_size, target_config.num_hidden_layers
        self.target_config, self.version, self.hidden_size, self.vocab_size = target_config, version, H, V
        self.ttt_steps = 1 if version == 1 else ttt_steps
        self.decay, self.loss, self.temperature = decay, loss, temperature
        self.feature_weight, self.logit_weight, self.fc_bias = feature_weight, logit_weight, fc_bias
        if version == 1:
            self.serving_layers: list[int] = []
            self.feature_layers: tuple = ("final",)
        else:
            self.serving_layers = list(feature_layers or default_feature_layers(N))
            bad = [layer for layer in self.serving_layers if not 1 <= layer < N]
            if len(self.serving_layers) != 3 or bad:
                raise ValueError(f"drafter.eagle_feature_layers must be 3 layers in 1..{N - 1} (the hidden state "
                                 f"entering that decoder layer); got {self.serving_layers}")
            self.feature_layers = tuple(layer - 1 for layer in self.serving_layers)  # our keys: output of layer l-1
        base = AutoModel.from_config(drafter_config(target_config))  # the family's own modules, one layer
        self.embed_tokens = base.get_input_embeddings().requires_grad_(False)
        self.rotary_emb = base.rotary_emb
        self.fc = nn.Linear((2 if version == 1 else 3) * H, H, bias=fc_bias)
        if version == 1:
            layer = base.layers[0]
            layer.input_layernorm = nn.Identity()  # EAGLE-1's layer 0 has no input norm
            self.layers = nn.ModuleList([layer])
            self.target_lm_head = nn.Linear(H, V, bias=False).requires_grad_(False)
        else:
            self.midlayer = Eagle3Layer(base.layers[0], base.norm, target_config, H)
            self.norm = copy.deepcopy(base.norm)
            vocab = sorted(draft_vocab) if draft_vocab is not None else list(range(V))
            if len(set(vocab)) != len(vocab) or not all(0 <= t < V for t in vocab):
                raise ValueError("eagle3: the draft vocabulary must be distinct target token ids")
            ids = torch.tensor(vocab, dtype=torch.long)
            self.lm_head = nn.Linear(H, len(vocab), bias=False)
            self.register_buffer("d2t", ids - torch.arange(len(vocab)))  # target id = draft id + d2t[draft id]
            t2d = torch.zeros(V, dtype=torch.bool)
            t2d[ids] = True
            self.register_buffer("t2d", t2d)
        self.attn_config = drafter_config(target_config)
        self.serving_tree: dict | None = None  # dynamic-tree settings of the recipe (draftsmith.json "tree")

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def build(cls, cfg, target_model: nn.Module, token_counts: torch.Tensor | None = None) -> EagleDrafter:
        """A drafter for `target_model`: frozen embedding/lm_head copies, EAGLE-3 vocabulary from `token_counts`."""
        tc = target_model.config.get_text_config() if hasattr(target_model.config, "get_text_config") else target_model.config
        version = 1 if cfg.kind == "eagle" else 3
        vocab = None
        if version == 3 and cfg.eagle_draft_vocab and cfg.eagle_draft_vocab < tc.vocab_size:
            vocab = draft_vocabulary(token_counts, tc.vocab_size, cfg.eagle_draft_vocab)
        drafter = cls(tc, version, cfg.eagle_feature_layers or None, vocab, cfg.eagle_fc_bias, cfg.eagle_ttt_steps,
                      cfg.head_decay, cfg.loss, cfg.distill_temperature, cfg.eagle_feature_weight, cfg.eagle_logit_weight)
        drafter.copy_target_weights(target_model)
        if cfg.tree_nodes > 0:  # the recipe's dynamic tree travels with the folder (eval --drafter reuses it)
            drafter.serving_tree = {"topk": cfg.tree_topk, "depth": cfg.num_speculative_tokens, "budget": cfg.tree_nodes}
        if version == 3:
            with torch.no_grad():  # a draft lm_head that starts as the target's rows for the draft vocabulary
                rows = drafter.draft_to_target(torch.arange(drafter.draft_vocab_size))
                drafter.lm_head.weight.copy_(target_model.get_output_embeddings().weight.detach()[rows].float())
        return drafter

    @torch.no_grad()
    def copy_target_weights(self, target_model: nn.Module) -> None:
        """Frozen copies of the target's input embedding (and EAGLE-1's lm_head); shapes checked."""
        emb = target_model.get_input_embeddings().weight
        if tuple(emb.shape) != tuple(self.embed_tokens.weight.shape):
            raise ValueError(f"eagle: the target's embedding is {tuple(emb.shape)}, the drafter expects "
                             f"{tuple(self.embed_tokens.weight.shape)}: this drafter was trained for another target")
        self.embed_tokens.weight.copy_(emb.detach().float())
        if self.version == 1:
            self.target_lm_head.weight.copy_(target_model.get_output_embeddings().weight.detach().float())

    @property
    def kind(self) -> str:
        return "eagle" if self.version == 1 else "eagle3"

    @property
    def draft_vocab_size(self) -> int:
        return self.vocab_size if self.version == 1 else self.lm_head.out_features

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids if self.version == 1 else draft_ids + self.d2t[draft_ids]

    # ---- the drafter ----------------------------------------------------------------------------
    def fuse(self, features: dict) -> torch.Tensor:
        """Target features (keyed by layer, int or str as shards store them) -> step 0's hidden input `[B, T, H]`."""
        dtype = self.fc.weight.dtype
        features = {str(k): v for k, v in features.items()}
        if self.version == 1:
            return features["final"].to(dtype)
        return self.fc(torch.cat([features[str(k)].to(dtype) for k in self.feature_layers], dim=-1))  # [B, T, 3H] -> H

    def step(self, hidden, input_ids, position_ids, attention_mask, cache) -> torch.Tensor:
        """One drafter pass: hidden `[B, T, H]` + tokens x_{t+1} `[B, T]` -> output features `[B, T, H]`.

        `attention_mask` is boolean `[B or 1, 1, T, keys]` over the cache's keys plus these T (True = see).
        """
        embeds = self.embed_tokens(input_ids).to(hidden.dtype)  # [B, T, H]
        rope = self.rotary_emb(hidden, position_ids)
        if self.version == 1:
            x = self.fc(torch.cat([embeds, hidden], dim=-1))  # [B, T, H]
            return self.layers[0](x, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
                                  use_cache=cache is not None, position_embeddings=rope)
        return self.midlayer(embeds, hidden, attention_mask, rope, cache)

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """Output features -> logits over the draft vocabulary (`[.., V]` EAGLE-1, `[.., Vd]` EAGLE-3)."""
        if self.version == 1:
            return self.target_lm_head(out)
        return self.lm_head(self.norm(out))

    def new_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.attn_config)

    # ---- training ---------------------------------------------------------------------------------
    def compute_loss(self, batch: dict) -> tuple[torch.Tensor, dict[str, float]]:
        """Unrolled drafter loss (one step for EAGLE-1, `ttt_steps` for EAGLE-3); per-step accuracies."""
        ids, attn = batch["input_ids"], batch["attention_mask"].bool()  # [B, T]
        B, T = ids.shape
        n = T - 2  # position t (0..T-3) reads x_{t+1} and predicts x_{t+2}
        if n < 1:
            raise ValueError(f"eagle: sequences of {T} tokens are too short to train on (need >= 3)")
        fused = self.fuse(batch["features"])  # [B, T, H]
        inputs, labels = ids[:, 1:T - 1], ids[:, 2:]  # [B, n]
        counted = batch["loss_mask"][:, 2:].bool() & attn[:, 2:]  # [B, n]
        teacher = self._teacher(batch, n)  # soft targets at t+1, already on the draft vocabulary (or None)
        total, weight_sum, metrics, chain, tau = 0.0, 0.0, {}, 1.0, 1.0
        for j, out in enumerate(self.unroll(fused[:, :n], inputs, self.ttt_steps)):
            mask = counted.clone()
            mask[:, :j] = False  # no real feature left for t < j
            loss_j, acc = self._step_loss(out[mask], labels[mask], teacher, mask)
            if self.version == 1 and self.feature_weight:
                target_feat = fused[:, 1:n + 1][mask].detach().float()  # the target's own feature at t+1
                feat = F.smooth_l1_loss(out[mask].float(), target_feat) if mask.any() else out.sum() * 0.0
                metrics["loss/feature"] = feat.item()
                loss_j = self.logit_weight * loss_j + self.feature_weight * feat
            w = self.decay**j
            total, weight_sum = total + w * loss_j, weight_sum + w
            chain *= acc
            tau += chain
            metrics.update({f"loss/step{j}": loss_j.item(), f"acc_top1/step{j}": acc})
        for _ in range(self.ttt_steps, 5):  # extrapolate the chain estimate to 5 tokens with the last step's accuracy
            chain *= acc
            tau += chain
        loss = total / weight_sum
        metrics["loss"], metrics["expected_tau"] = loss.item(), tau
        return loss, metrics

    def unroll(self, fused: torch.Tensor, inputs: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Training-time test: outputs `[B, n, H]` of steps 0..steps-1; step j at t drafts j tokens past t-j."""
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
            if self.version == 3 and self.draft_vocab_size < self.vocab_size:
                dense = dense[..., self.draft_to_target(torch.arange(self.draft_vocab_size, device=dense.device))]
            return ("dense", dense)
        if batch.get("target_topk_values") is None:
            return None
        values, indices = batch["target_topk_values"][:, 1:n + 1], batch["target_topk_indices"][:, 1:n + 1].long()
        if self.version == 3 and self.draft_vocab_size < self.vocab_size:
            to_draft = torch.cumsum(self.t2d.long(), 0) - 1  # target id -> draft id (valid where t2d)
            keep = self.t2d[indices]
            values = values.masked_fill(~keep, float("-inf"))
            indices = torch.where(keep, to_draft[indices], torch.zeros_like(indices))
        return ("sparse", values, indices)

    def _step_loss(self, out: torch.Tensor, labels: torch.Tensor, teacher, mask: torch.Tensor):
        """(loss, top-1 accuracy vs the data token) at the counted positions of one unrolled step."""
        if not labels.numel():
            return out.sum() * 0.0, 0.0
        logits = self.logits(out)  # [N, Vd]
        if teacher is None:
            if self.version == 3 and self.draft_vocab_size < self.vocab_size:
                to_draft = torch.cumsum(self.t2d.long(), 0) - 1
                ok = self.t2d[labels]
                loss = F.cross_entropy(logits[ok].float(), to_draft[labels[ok]]) if ok.any() else logits.sum() * 0.0
            else:
                loss = F.cross_entropy(logits.float(), labels)
        elif teacher[0] == "dense":
            loss = distill_kl(logits, teacher[1][mask], None, self.temperature).mean()
        else:
            values, indices = teacher[1][mask], teacher[2][mask]
            ok = torch.isfinite(values).any(-1)  # positions whose top-k has a draft-vocabulary token
            loss = (distill_kl(logits[ok], values[ok], indices[ok], self.temperature).mean()
                    if ok.any() else logits.sum() * 0.0)
        with torch.no_grad():
            acc = (self.draft_to_target(logits.argmax(-1)) == labels).float().mean().item()
        return loss, acc

    # ---- files ---------------------------------------------------------------------------------------
    def config_dict(self) -> dict:
        return {"version": self.version, "target_config": self.target_config.to_dict(),
                "feature_layers": self.serving_layers or None, "fc_bias": self.fc_bias, "ttt_steps": self.ttt_steps,
                "decay": self.decay, "loss": self.loss, "temperature": self.temperature,
                "feature_weight": self.feature_weight, "logit_weight": self.logit_weight,
                "draft_vocab_size": self.draft_vocab_size}

    def trained_state(self) -> dict[str, torch.Tensor]:
        """The state dict without the frozen target copies (what a drafter folder and the exports hold)."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith(FROZEN)}

    def save_pretrained(self, folder: str | Path, target: str, tokenizer=None) -> Path:
        folder = write_folder(folder, self.config_dict(), self.trained_state())
        extra = {"tree": self.serving_tree} if self.serving_tree else {}
        write_meta(folder, self.kind, target, self.feature_layers, **extra)
        return folder

    @classmethod
    def from_config_dict(cls, config: dict) -> EagleDrafter:
        from transformers import AutoConfig

        tc = dict(config["target_config"])
        target_config = AutoConfig.for_model(tc.pop("model_type"), **tc)
        vocab = None
        if config["version"] == 3 and config["draft_vocab_size"] < target_config.vocab_size:
            vocab = list(range(config["draft_vocab_size"]))  # placeholder; d2t/t2d are loaded with the weights
        keys = ("fc_bias", "ttt_steps", "decay", "loss", "temperature", "feature_weight", "logit_weight")
        return cls(target_config, config["version"], config["feature_layers"], vocab, **{k: config[k] for k in keys})

    @classmethod
    def from_pretrained(cls, folder: str | Path, target_model: nn.Module | None = None) -> EagleDrafter:
        """Rebuild from a drafter folder; the frozen embedding/lm_head come from `target_model` (zeros without it)."""
        folder = Path(folder)
        drafter = cls.from_config_dict(json.loads((folder / "config.json").read_text()))
        drafter.load_trained(load_file(str(folder / "model.safetensors")), str(folder))
        meta = folder / "draftsmith.json"
        drafter.serving_tree = json.loads(meta.read_text()).get("tree") if meta.is_file() else None
        if target_model is not None:
            drafter.copy_target_weights(target_model)
        return drafter

    def load_trained(self, state: dict[str, torch.Tensor], source: str) -> None:
        """Strict load of the trained weights (every name and shape checked); frozen copies untouched."""
        frozen = {k: v for k, v in self.state_dict().items() if k.startswith(FROZEN)}
        load_strict(self, {**frozen, **state}, source)


def ttt_mask(n: int, step: int, device) -> torch.Tensor:
    """Keys visible at training-time-test step `step`: `[1, 1, n, (step+1)*n]` bool.

    Query t sees step-0 keys s <= t - step (real features) and, of every later step i, the one key at
    s = t - (step - i) — its own drafted path. Step 0 is plain causal attention.
    """
    t = torch.arange(n, device=device)[:, None]  # [n, 1]
    s = torch.arange(n, device=device)[None, :]  # [1, n]
    blocks = [s <= t - step] + [s == t - (step - i) for i in range(1, step + 1)]
    return torch.cat(blocks, dim=1)[None, None]  # [1, 1, n, (step+1)n]


def draft_vocabulary(token_counts: torch.Tensor | None, vocab_size: int, size: int) -> list[int]:
    """The `size` most frequent target tokens (ties -> lower id), sorted by id."""
    if token_counts is None:
        raise ValueError("eagle3: a reduced draft vocabulary (drafter.eagle_draft_vocab > 0) needs token counts from "
                         "the training data; set drafter.eagle_draft_vocab: 0 for the full vocabulary")
    counts = token_counts.double().clone()
    counts -= torch.arange(vocab_size, dtype=torch.float64) * 1e-9  # stable tie-break towards lower ids
    return sorted(counts.topk(size).indices.tolist())
