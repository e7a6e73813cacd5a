"""EAGLE-3 (kind `eagle3`): fused low/mid/high target features, training-time test, reduced draft vocabulary.

In the flow: the target (live or from shards) supplies the residual stream entering decoder layers
(2, N//2, N-3) by default (vLLM's `aux_hidden_state_layers` convention; our feature key for
"entering layer l" is l-1, the output of layer l-1); `fc` fuses the three (3H -> H). One step at
position t: out_t = midlayer(embed(x_{t+1}), g_t) with q/k/v reading [norm(e), norm(g)] (2H wide),
logits = lm_head(norm(out_t)) over the draft vocabulary (target id = d + d2t[d]). Training-time test:
step j feeds out^{j-1}_{t-1} in place of the target's feature at t (`EagleDrafter.unroll`,
heads/eagle/model.py, which holds what EAGLE-1 and EAGLE-3 share). The draft vocabulary is the `draft_vocab`
most frequent training labels (`draft_vocabulary`, from the label counts the kind's row asks for).

Shapes: features `[B, T, H]` x 3 -> fused `[B, T, H]`; logits `[B, T, Vd]`; `d2t [Vd]`, `t2d [V]` (bool).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from torch import nn

from draftsmith.distill.hf_compat import cache_kwargs
from draftsmith.heads.eagle.config import drafter_config, eagle_serving_candidates
from draftsmith.heads.eagle.model import EagleDrafter
from draftsmith.heads.settings import KindSettings

STEP_WEIGHTS = ("decay", "acceptance")


def default_feature_layers(num_layers: int) -> list[int]:
    """EAGLE-3's low/mid/high layers, as "the hidden state entering decoder layer l": 2, N/2, N-3; a target
    too shallow for three distinct ones of those (N < 7; the engines need them distinct) gets 1, N/2, N-1."""
    if num_layers < 4:
        raise ValueError(f"eagle3: a target of {num_layers} decoder layers has no three distinct layers "
                         "1..N-1 to fuse; EAGLE-3 needs a target of at least 4 layers")
    layers = [2, num_layers // 2, num_layers - 3]
    if not layers[0] < layers[1] < layers[2]:
        layers = [1, max(2, num_layers // 2), num_layers - 1]
    return layers


def check_aux_layers(layers: list[int], num_layers: int) -> list[int]:
    bad = [layer for layer in layers if not 1 <= layer < num_layers]
    if len(layers) != 3 or bad:
        raise ValueError(f"drafter.eagle3.aux_layers must be 3 layers in 1..{num_layers - 1} (the hidden "
                         f"state entering that decoder layer); got {list(layers)}")
    return list(layers)


@dataclass
class Eagle3Config(KindSettings):
    """`drafter.eagle3`: fused aux layers, training-time test, reduced draft vocabulary."""

    # entering decoder layers l (vLLM's ids); [] = 2, N//2, N-3
    aux_layers: list[int] = field(default_factory=list)
    ttt_steps: int = 7  # training-time test: unrolled steps, each with a loss (weight head_decay**k)
    draft_vocab: int = 32000  # reduced vocabulary (most frequent target tokens); 0 = full vocab
    fc_bias: bool = False
    # EAGLE-3.1 norms (speculators' names and semantics): one RMSNorm over the fused 3H input
    # (`norm_before_fc`), one per aux feature (`fc_norm`), and the normed output carried to the next step
    # (`norm_output`)
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_output: bool = False
    # the draft lm_head starts as the target's rows for the draft vocabulary; false keeps it there (frozen, as
    # speculators 0.9.0 does: speculators/model.py), true trains it with the layer
    train_lm_head: bool = True
    # each unrolled step's loss weight: decay = drafter.head_decay^j; acceptance = each position's share of
    # its chain's expected accepted length, from the exact acceptance of every step (heads/eagle/model.py
    # `acceptance_weights`; D-PACE / D-PARD's position weights along the training-time test; no gradient)
    step_weights: str = "decay"

    def __post_init__(self):
        if self.step_weights not in STEP_WEIGHTS:
            raise ValueError(f"drafter.eagle3.step_weights '{self.step_weights}' unknown; valid: "
                             f"{', '.join(STEP_WEIGHTS)}")
        if self.ttt_steps < 1 or self.draft_vocab < 0:
            raise ValueError("drafter.eagle3.ttt_steps must be >= 1 and drafter.eagle3.draft_vocab >= 0")
        # speculators refuses the pair (Eagle3SpeculatorConfig, 0.9.0)
        if self.norm_before_fc and self.fc_norm:
            raise ValueError("drafter.eagle3.norm_before_fc and drafter.eagle3.fc_norm are two ways to norm "
                             "the fc input (one norm over all three features, or one per feature): enable "
                             "one of them")
        if self.aux_layers and len(self.aux_layers) != 3:
            raise ValueError(f"drafter.eagle3.aux_layers: EAGLE-3 fuses 3 target layers (low, middle, high), "
                             f"got {list(self.aux_layers)}; leave it empty for the default")

    def serving_candidates(self, folder_config: dict) -> list[dict]:
        return eagle_serving_candidates()

    def feature_layers(self, target_config) -> list:
        layers = self.aux_layers or default_feature_layers(target_config.num_hidden_layers)
        return [layer - 1 for layer in check_aux_layers(layers, target_config.num_hidden_layers)]


class Eagle3Layer(nn.Module):
    """EAGLE-3's `midlayer`: attention over [input_layernorm(embeds), hidden_norm(hidden)] (2H wide),
    the residual being `hidden` un-normed (engines: norm_before_residual false); then the MLP. A Llama
    layer."""

    def __init__(self, layer_template: nn.Module, norm_template: nn.Module, config, hidden_size: int):
        super().__init__()
        wide = drafter_config(config, attention_width=2 * hidden_size)
        self.self_attn = type(layer_template.self_attn)(wide, layer_idx=0)
        self.self_attn.o_proj = nn.Linear(self.self_attn.o_proj.in_features, hidden_size, bias=False)
        self.mlp = layer_template.mlp
        self.input_layernorm = copy.deepcopy(norm_template)
        self.hidden_norm = copy.deepcopy(norm_template)
        self.post_attention_layernorm = copy.deepcopy(norm_template)

    def forward(self, embeds, hidden, attention_mask, position_embeddings, cache):
        residual = hidden
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)  # [B, T, 2H]
        x, _ = self.self_attn(x, position_embeddings=position_embeddings, attention_mask=attention_mask,
                              **cache_kwargs(self.self_attn, cache))
        x = residual + x  # [B, T, H]
        return x + self.mlp(self.post_attention_layernorm(x))


class Eagle3Drafter(EagleDrafter):
    """EAGLE-3: `fc` fuses three aux features; `midlayer` reads [embed, hidden] 2H wide; own norm + lm_head
    over the draft vocabulary (`d2t`: target id = draft id + d2t[draft id]; `t2d`: mask over target ids)."""

    kind, version, fc_inputs = "eagle3", 3, 3
    layer_prefix = "midlayer"
    attention_width = 2  # q/k/v read [norm(embed), norm(hidden)]

    def __init__(self, target_config, aux_layers: list[int] | None = None,
                 draft_vocab: list[int] | None = None, fc_bias: bool = False, ttt_steps: int = 7,
                 decay: float = 0.8, loss: str = "kl", temperature: float = 1.0, norm_before_fc: bool = False,
                 fc_norm: bool = False, norm_output: bool = False):
        N = target_config.num_hidden_layers
        self.serving_layers = check_aux_layers(list(aux_layers or default_feature_layers(N)), N)
        # our keys: output of layer l-1
        self.feature_layers = tuple(layer - 1 for layer in self.serving_layers)
        self._vocab = draft_vocab
        self.norms = {"norm_before_fc": norm_before_fc, "fc_norm": fc_norm, "norm_output": norm_output}
        super().__init__(target_config, fc_bias, ttt_steps, decay, loss, temperature)

    def _build_layers(self, base: nn.Module) -> None:
        H, V = self.hidden_size, self.vocab_size
        self.midlayer = Eagle3Layer(base.layers[0], base.norm, self.target_config, H)
        self.norm = copy.deepcopy(base.norm)
        self.input_norm = resized_norm(base.norm,
                                       self.fc_inputs * H) if self.norms["norm_before_fc"] else None
        self.fc_norm = nn.ModuleList(resized_norm(base.norm, H) for _ in range(self.fc_inputs)) \
            if self.norms["fc_norm"] else None
        vocab = sorted(self._vocab) if self._vocab is not None else list(range(V))
        if len(set(vocab)) != len(vocab) or not all(0 <= t < V for t in vocab):
            raise ValueError("eagle3: the draft vocabulary must be distinct target token ids")
        ids = torch.tensor(vocab, dtype=torch.long)
        self.lm_head = nn.Linear(H, len(vocab), bias=False)
        self.register_buffer("d2t", ids - torch.arange(len(vocab)))  # target id = draft id + d2t[draft id]
        t2d = torch.zeros(V, dtype=torch.bool)
        t2d[ids] = True
        self.register_buffer("t2d", t2d)
        del self._vocab

    @classmethod
    def from_settings(cls, cfg, target_config, token_counts) -> Eagle3Drafter:
        own = cfg.settings
        vocab = None
        if own.draft_vocab and own.draft_vocab < target_config.vocab_size:
            vocab = draft_vocabulary(token_counts, target_config.vocab_size, own.draft_vocab)
        drafter = cls(target_config, own.aux_layers or None, vocab, own.fc_bias, own.ttt_steps,
                      cfg.head_decay, cfg.loss, cfg.distill_temperature, own.norm_before_fc, own.fc_norm,
                      own.norm_output)
        drafter.step_weights = own.step_weights
        return drafter

    @classmethod
    def build(cls, cfg, target_model: nn.Module, token_counts: torch.Tensor | None = None) -> Eagle3Drafter:
        drafter = super().build(cfg, target_model, token_counts)
        with torch.no_grad():  # a draft lm_head that starts as the target's rows for the draft vocabulary
            rows = drafter.draft_to_target(torch.arange(drafter.draft_vocab_size))
            drafter.lm_head.weight.copy_(target_model.get_output_embeddings().weight.detach()[rows].float())
        drafter.lm_head.weight.requires_grad_(getattr(cfg.settings, "train_lm_head", True))
        return drafter

    @property
    def draft_vocab_size(self) -> int:
        return self.lm_head.out_features

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def fuse(self, features: dict) -> torch.Tensor:
        dtype = self.fc.weight.dtype
        features = {str(k): v for k, v in features.items()}
        x = torch.cat([features[str(k)].to(dtype) for k in self.feature_layers], dim=-1)  # [B, T, 3H]
        if self.input_norm is not None:  # speculators' order: the whole input first, then per feature
            x = self.input_norm(x)
        if self.fc_norm is not None:
            x = torch.cat([norm(part) for norm, part in zip(self.fc_norm, x.chunk(self.fc_inputs, dim=-1))],
                          dim=-1)
        return self.fc(x)  # -> [B, T, H]

    def step(self, hidden, input_ids, position_ids, attention_mask, cache) -> torch.Tensor:
        embeds = self.embed_tokens(input_ids).to(hidden.dtype)  # [B, T, H]
        rope = self.rotary_emb(hidden, position_ids)
        out = self.midlayer(embeds, hidden, attention_mask, rope, cache)
        return self.norm(out) if self.norms["norm_output"] else out  # what the next step reads

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        return self.lm_head(out if self.norms["norm_output"] else self.norm(out))  # [.., Vd]

    def config_dict(self) -> dict:
        return dict(super().config_dict(), feature_layers=list(self.serving_layers), **self.norms)

    def expected_shapes(self) -> dict[str, tuple]:
        H, p = self.hidden_size, self.layer_prefix
        norms = {"input_norm.weight": (self.fc_inputs * H,)} if self.input_norm is not None else {}
        norms.update({f"fc_norm.{i}.weight": (H,) for i in range(self.fc_inputs)} if self.fc_norm is not None
                     else {})
        return dict(super().expected_shapes(), **norms, **{
            f"{p}.input_layernorm.weight": (H,), f"{p}.hidden_norm.weight": (H,), "norm.weight": (H,),
            "lm_head.weight": (self.draft_vocab_size, H), "d2t": (self.draft_vocab_size,),
            "t2d": (self.vocab_size,)})

    @classmethod
    def from_config_dict(cls, config: dict) -> Eagle3Drafter:
        target_config = cls.target_config_of(config)
        vocab = None
        if config["draft_vocab_size"] < target_config.vocab_size:
            # placeholder; d2t/t2d are loaded with the weights
            vocab = list(range(config["draft_vocab_size"]))
        keys = ("fc_bias", "ttt_steps", "decay", "loss", "temperature")
        norms = {k: bool(config.get(k, False)) for k in ("norm_before_fc", "fc_norm", "norm_output")}
        return cls(target_config, config["feature_layers"], vocab, **{k: config[k] for k in keys}, **norms)


def resized_norm(template: nn.Module, width: int) -> nn.Module:
    """A fresh norm of the target's own class (its eps, its weight convention) over `width` features."""
    eps = getattr(template, "variance_epsilon", getattr(template, "eps", 1e-6))
    return type(template)(width, eps=eps)


def draft_vocabulary(token_counts: torch.Tensor | None, vocab_size: int, size: int) -> list[int]:
    """The `size` most frequent target tokens (ties -> lower id), sorted by id."""
    if token_counts is None:
        raise ValueError("eagle3: a reduced draft vocabulary (drafter.eagle3.draft_vocab > 0) needs token "
                         "counts from the training data; set drafter.eagle3.draft_vocab: 0 for the full "
                         "vocabulary")
    counts = token_counts.double().clone()
    counts -= torch.arange(vocab_size, dtype=torch.float64) * 1e-9  # stable tie-break towards lower ids
    return sorted(counts.topk(size).indices.tolist())
