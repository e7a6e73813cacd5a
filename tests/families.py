"""Tiny random causal LMs of many architecture families, built offline from transformers' own config classes.

`FAMILIES` maps a family name to a `FamilySpec`: the transformers config and model class names, the config
kwargs that shrink it (hidden 32, vocab 259 — the byte tokenizer of `tests/helpers.py`), the attention
implementation it must run with, and the kinds of layers / cache state it has (`KINDS`). Layer patterns mix
kinds on purpose: a 4-layer hybrid holds at least one attention layer and one recurrent layer (Falcon-H1's
layers are all attention + mamba2 in parallel). `build_family_model(name)` returns the model in eval mode,
fp32, with `<|im_end|>` (id 2) as eos and pad, like `tests/helpers.build_tiny_model`.

Windows are small (8) so a test's context passes them after a few steps; mamba2 chunk sizes are small (8) so a
prefill spans several chunks. Layer patterns are given for 4 layers and start with a recurrent then an
attention layer, so `layers=2` still mixes kinds; `layers=n` repeats the pattern (hybrids need n >= 2:
transformers sizes masks from an attention layer). Qwen3-VL has no text-only causal LM class in transformers
5.25 (only Qwen3VLTextModel), so the VLM text halves here are Qwen3.5 (dense and MoE) and Gemma-4.

Checked against transformers 5.25 (`python tests/families.py` runs greedy `generate` on every family).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from draftsmith.heads.runtime.proposer import Draft, Proposer
from draftsmith.heads.runtime.tree import paths_to_parents
from draftsmith.heads.runtime.verify import SamplingConfig, logits_to_probs

IM_START, IM_END = 1, 2  # tests/helpers.py SPECIAL_TOKENS: <|endoftext|>, <|im_start|>, <|im_end|>

# Layer / cache-state kinds a family may hold.
KINDS = {
    "full": "full (global) causal attention, DynamicLayer",
    "sliding": "sliding-window attention, DynamicSlidingWindowLayer (window in config.sliding_window)",
    "gated_delta": "gated delta net linear attention: conv state + recurrent (delta rule) state, "
                   "LinearAttentionLayer",
    "mamba2": "mamba2 SSM: conv state + SSM state, LinearAttentionLayer (or the 'hybrid' combined layer)",
    "short_conv": "LFM2 gated short convolution: conv state only, LinearAttentionLayer",
    "parallel_hybrid": "attention and mamba2 side by side in every layer: "
                       "LinearAttentionAndFullAttentionLayer",
    "mla": "multi-head latent attention (DeepSeek): the cache holds latents (keys [B, 1, T, kv_lora_rank], "
           "values [B, 1, T, qk_rope_head_dim]); q/k head dim != v head dim; num_key_value_heads must equal "
           "the heads",
    "sinks": "learned attention sinks per head (gpt-oss): sdpa refused; eager (flex_attention on CUDA only)",
    "kv_shared": "later layers reuse earlier layers' KV (Gemma-4 num_kv_shared_layers): DummyLayer in the "
                 "cache",
    "moe": "mixture-of-experts MLP (top-k routing per token)",
    "mrope": "multimodal RoPE (position_ids may be [3 or 4, B, T]); text-only here",
    "vlm_text": "the language model of a vision-language model, as a text-only causal LM class",
}

_BASE = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2)
_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
_GDN = dict(head_dim=8, linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2,
            linear_num_value_heads=4, linear_conv_kernel_dim=4)
_ALT = ("sliding_attention", "full_attention")
# the sizes `width` scales (vLLM's CPU attention refuses head size 8: width 4 gives 32)
WIDE = ("hidden_size", "intermediate_size", "head_dim", "global_head_dim", "linear_key_head_dim",
        "linear_value_head_dim", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "q_lora_rank",
        "kv_lora_rank", "moe_intermediate_size", "shared_expert_intermediate_size", "mamba_d_ssm",
        "mamba_d_head", "mamba_head_dim", "moe_shared_expert_intermediate_size", "shared_intermediate_size",
        "hidden_size_per_layer_input", "mamba_d_state", "ssm_state_size")


@dataclass(frozen=True)
class FamilySpec:
    config_cls: str  # a class of `transformers`
    model_cls: str  # its causal LM class (text-only)
    # tiny sizes and the kinds' settings, on top of _BASE and vocab
    kwargs: dict = field(default_factory=dict)
    # layer types of 4 layers (repeated for more), set as `pattern_key`
    pattern: tuple[str, ...] | None = None
    pattern_key: str = "layer_types"
    attn_implementation: str = "sdpa"
    kinds: tuple[str, ...] = ("full",)
    notes: str = ""

    def config_kwargs(self, layers: int, vocab_size: int, width: int = 1) -> dict:
        kw = dict(_BASE, vocab_size=vocab_size, initializer_range=0.2, bos_token_id=IM_START,
                  eos_token_id=IM_END, pad_token_id=IM_END)
        kw.update(self.kwargs)
        if width != 1:  # every size scaled, the head and expert counts kept (heads `width` times wider)
            kw.update({k: v * width for k, v in kw.items() if k in WIDE and isinstance(v, int)})
        if "vocab_size_per_layer_input" in kw:  # Gemma-4's per-layer input embeddings share the vocabulary
            kw["vocab_size_per_layer_input"] = vocab_size
        if self.pattern is not None:
            chosen = [self.pattern[i % len(self.pattern)] for i in range(layers)]
            if "full_attention" in self.pattern and "full_attention" not in chosen:
                raise ValueError(f"{layers} layer(s) of {self.pattern} hold no attention layer (transformers "
                                 "needs one to size its masks): use layers >= 2")
            kw[self.pattern_key] = chosen
        if self.pattern_key != "layers_block_type":  # Nemotron-H counts its layers from the pattern
            kw["num_hidden_layers"] = layers
        return kw


FAMILIES: dict[str, FamilySpec] = {
    # ---- plain attention -----------------------------------------------------------------------------------
    "llama": FamilySpec("LlamaConfig", "LlamaForCausalLM", dict(max_position_embeddings=1024)),
    "qwen2": FamilySpec("Qwen2Config", "Qwen2ForCausalLM", dict(max_position_embeddings=1024)),
    "qwen3": FamilySpec("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=8, max_position_embeddings=1024)),
    "phi3": FamilySpec("Phi3Config", "Phi3ForCausalLM", dict(max_position_embeddings=1024,
                                                             original_max_position_embeddings=1024)),
    "olmo2": FamilySpec("Olmo2Config", "Olmo2ForCausalLM", dict(max_position_embeddings=1024)),
    # ---- sliding windows -----------------------------------------------------------------------------------
    "gemma3": FamilySpec("Gemma3TextConfig", "Gemma3ForCausalLM", dict(head_dim=8, sliding_window=8),
                         pattern=_ALT, kinds=("sliding", "full")),
    "mistral": FamilySpec(
        "MistralConfig", "MistralForCausalLM",
                          dict(head_dim=8, sliding_window=8, max_position_embeddings=1024),
        kinds=("sliding",),
        notes="Mistral-7B-v0.1 style: sliding_window set and no layer_types; the cache infers a window on "
              "every layer"),
    # ---- mixture of experts --------------------------------------------------------------------------------
    "qwen3_moe": FamilySpec("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(head_dim=8, **_MOE),
                            kinds=("full", "moe")),
    "mixtral": FamilySpec("MixtralConfig", "MixtralForCausalLM",
                          dict(head_dim=8, num_local_experts=4, num_experts_per_tok=2, sliding_window=None),
                          kinds=("full", "moe")),
    "deepseek_v3": FamilySpec(
        "DeepseekV3Config", "DeepseekV3ForCausalLM",
        dict(num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
             v_head_dim=8, n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1,
             moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1,
             # DeepSeek-V3's public config.json says so; HF's router always is that (sigmoid scores + the
             # correction bias) and drops the key, vLLM reads it to build the bias (0.32.0
             # model_executor/models/deepseek_v2.py:327: without it the checkpoint's bias is a KeyError)
             topk_method="noaux_tc", scoring_func="sigmoid"),
        kinds=("full", "mla", "moe"),
        notes="MLA: q/k carry qk_nope_head_dim + qk_rope_head_dim = 12 dims, values v_head_dim = 8; layer 0 "
              "dense. num_key_value_heads must equal num_attention_heads: HF expands the latent to every "
              "head, and fewer kv heads make attention repeat them again (size of tensor a (4) must match b "
              "(8)). topk_method noaux_tc as in the public config.json (vLLM builds the router's correction "
              "bias from it)"),
    "gpt_oss": FamilySpec(
        "GptOssConfig", "GptOssForCausalLM",
        dict(head_dim=8, num_local_experts=4, num_experts_per_tok=2, sliding_window=8),
        pattern=_ALT, attn_implementation="eager", kinds=("sliding", "full", "sinks", "moe"),
        notes="sdpa is refused (sinks); eager or flex_attention"),
    # ---- vision-language models' text halves ---------------------------------------------------------------
    "gemma4": FamilySpec(
        "Gemma4TextConfig", "Gemma4ForCausalLM",
        dict(head_dim=8, global_head_dim=16, sliding_window=8, vocab_size_per_layer_input=259,
             hidden_size_per_layer_input=8),
        pattern=_ALT, kinds=("sliding", "full", "vlm_text"),
        notes="full-attention layers use global_head_dim (16), sliding layers head_dim (8)"),
    "gemma4_kv_shared": FamilySpec(
        "Gemma4TextConfig", "Gemma4ForCausalLM",
        dict(head_dim=8, global_head_dim=16, sliding_window=8, vocab_size_per_layer_input=259,
             hidden_size_per_layer_input=8, num_kv_shared_layers=2),
        pattern=_ALT, kinds=("sliding", "full", "kv_shared", "vlm_text"),
        notes="Gemma-4 E2B/E4B style: the last 2 of 4 layers read layers 0/1's KV; their cache layers are "
              "DummyLayer"),
    # ---- hybrids: attention + recurrent --------------------------------------------------------------------
    "qwen3_5": FamilySpec(
        "Qwen3_5TextConfig", "Qwen3_5ForCausalLM", dict(_GDN),
        pattern=("linear_attention", "full_attention", "linear_attention", "linear_attention"),
        kinds=("gated_delta", "full", "mrope", "vlm_text"),
        notes="text half of the Qwen3.5 VLM (Qwen3_5ForConditionalGeneration); 3 linear : 1 full as the real "
              "model (which puts the full layer last); partial rotary 0.25"),
    "qwen3_5_moe": FamilySpec(
        "Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM",
        dict(_GDN, **_MOE, shared_expert_intermediate_size=32),
        pattern=("linear_attention", "full_attention", "linear_attention", "full_attention"),
        kinds=("gated_delta", "full", "moe", "mrope", "vlm_text")),
    "qwen3_next": FamilySpec(
        "Qwen3NextConfig", "Qwen3NextForCausalLM", dict(_GDN, **_MOE, shared_expert_intermediate_size=32),
        pattern=("linear_attention", "full_attention", "linear_attention", "full_attention"),
        kinds=("gated_delta", "full", "moe")),
    "falcon_h1": FamilySpec(
        "FalconH1Config", "FalconH1ForCausalLM",
        dict(head_dim=8, mamba_d_ssm=32, mamba_n_heads=4, mamba_d_head=8, mamba_n_groups=1, mamba_d_state=8,
             mamba_d_conv=4, mamba_chunk_size=8, max_position_embeddings=1024),
        kinds=("parallel_hybrid", "full", "mamba2"),
        notes="every layer runs attention and mamba2 in parallel (layer type 'hybrid')"),
    "lfm2": FamilySpec(
        "Lfm2Config", "Lfm2ForCausalLM",
        dict(conv_L_cache=3, block_auto_adjust_ff_dim=False, block_multiple_of=16,
             max_position_embeddings=1024),
        pattern=("conv", "full_attention", "conv", "full_attention"), kinds=("short_conv", "full")),
    "nemotron_h": FamilySpec(
        "NemotronHConfig", "NemotronHForCausalLM",
        dict(head_dim=8, ssm_state_size=8, mamba_num_heads=4, mamba_head_dim=8, n_groups=2, conv_kernel=4,
             chunk_size=8, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
             moe_shared_expert_intermediate_size=32, max_position_embeddings=1024),
        pattern=("linear_attention", "full_attention", "moe", "mlp"), pattern_key="layers_block_type",
        kinds=("mamba2", "full", "moe"),
        notes="each block is one mixer: mamba2, MoE MLP, attention or MLP (no KV in 'moe'/'mlp' blocks: "
              "DummyLayer)"),
    "granitemoehybrid": FamilySpec(
        "GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM",
        dict(mamba_n_heads=4, mamba_n_groups=1, mamba_d_state=8, mamba_d_head=8, mamba_d_conv=4,
             mamba_expand=1, mamba_chunk_size=8, num_local_experts=4, num_experts_per_tok=2,
             shared_intermediate_size=32, max_position_embeddings=1024),
        pattern=("linear_attention", "full_attention", "linear_attention", "linear_attention"),
        kinds=("mamba2", "full", "moe"), notes="Granite-4.0-H style"),
}


def build_family_model(name: str, layers: int = 4, seed: int = 0, vocab_size: int = 259, width: int = 1):
    """A tiny random causal LM of family `name` (see FAMILIES), eval mode, fp32, eos/pad = `<|im_end|>`;
    `width` scales its sizes (WIDE)."""
    import transformers

    if name not in FAMILIES:
        raise ValueError(f"family '{name}' unknown; use one of {', '.join(FAMILIES)}")
    spec = FAMILIES[name]
    config = getattr(transformers, spec.config_cls)(**spec.config_kwargs(layers, vocab_size, width))
    config._attn_implementation = spec.attn_implementation
    torch.manual_seed(seed)
    model = getattr(transformers, spec.model_cls)(config).eval().float()
    model.generation_config.eos_token_id = IM_END
    model.generation_config.pad_token_id = IM_END
    model.generation_config.bos_token_id = IM_START
    return model


# The draft tree the family tests and the targets campaign verify: 3 levels, two branches below the root.
TREE = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 1, 0]]


SAMPLING = SamplingConfig(temperature=0.05)  # the tiny random targets are nearly flat: a low T accepts drafts


class RankedTree(Proposer):
    """A proposer drafting TREE from the target itself: a node of rank r holds the target's r-th likeliest
    token after its path (ranks 0 and 1 swapped on every third step: the argmax on a non-first branch)."""

    name, tree, feature_layers = "ranked", "ranked", ()

    def __init__(self, target):
        self.target, (self.parents, self.ranks) = target, paths_to_parents(TREE)
        self.contexts: list[list[int]] = []

    def begin(self, prompt_ids, features) -> None:
        self.contexts = []

    @torch.inference_mode()
    def propose(self, context, sampling, generator) -> Draft:
        self.contexts.append(list(context))
        swap = len(self.contexts) % 3 == 0
        tokens: list[int] = []
        for parent, rank in zip(self.parents, self.ranks):
            path, q = [], parent
            while q >= 0:
                path.append(tokens[q])
                q = self.parents[q]
            logits = self.target.forward(torch.tensor([context + path[::-1]])).logits[0, -1]
            order = logits.topk(2).indices.tolist()
            tokens.append(order[1 - rank] if swap else order[rank])
        return Draft(tokens=tokens, parents=list(self.parents))


def node_laws(target, steps, sampling=None) -> float:
    """Max |p - p_exact| over every node of every recorded verification (`steps`: (context, tokens,
    parents, p)), p_exact from a plain forward of each node's whole sequence, warped by `sampling`."""
    sampling = sampling or SAMPLING
    worst = 0.0
    with torch.inference_mode():
        for context, tokens, parents, probs in steps:
            for j in range(len(tokens) + 1):  # tree index j: 0 = the root (the context's last token)
                path, q = [], j - 1
                while q >= 0:
                    path.append(tokens[q])
                    q = parents[q]
                logits = target.forward(torch.tensor([context + path[::-1]])).logits[0, -1]
                exact = logits_to_probs(logits, sampling)
                worst = max(worst, float((probs[j] - exact).abs().max()))
    return worst



def cache_layer_kinds(model) -> list[str]:
    """The cache layer class of every decoder layer in the DynamicCache transformers builds for `model`."""
    from transformers import DynamicCache

    return [type(layer).__name__ for layer in DynamicCache(config=model.config).layers]


def _smoke(names=None) -> None:
    """Greedy generate 24 tokens from a 16-token prompt on every family; prints what each cache holds."""
    prompt = torch.arange(3, 19).unsqueeze(0)  # [1, 16]
    for name in names or FAMILIES:
        model = build_family_model(name)
        with torch.inference_mode():
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=24,
                                 min_new_tokens=24, do_sample=False)
        assert out.shape == (1, 40), (name, out.shape)
        print(f"{name:18s} ok  {model.config._attn_implementation:5s} {cache_layer_kinds(model)}")


if __name__ == "__main__":
    import sys

    _smoke(sys.argv[1:] or None)
