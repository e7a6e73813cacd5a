"""Every target family of tests/families.py through the decoder: lossless chains and trees, exact node laws.

Dense, MoE, sliding windows however declared (Gemma-3 `layer_types`, Mistral `sliding_window` alone), latent
attention (DeepSeek-V3), sinks (gpt-oss, eager attention), shared KV (Gemma-4), and the hybrids whose
recurrent layers cannot be cut back (Qwen3.5 / Qwen3-Next gated delta nets, Falcon-H1 / Nemotron-H / Granite-4
Mamba-2, LFM2 short convolutions: chains roll back through recorded states, trees verify one branch per row).

- Greedy (fp32): output equal to the target's own HF `generate`, for a prompt-lookup chain and for a tree
  whose drafts put the target's token at rank 1 on some steps, so the accepted path goes through a non-first
  branch.
- Sampled (T = 0.05: the tiny random targets are nearly flat; a low temperature gets drafts accepted): at
  every verification of a 3-level tree, the law the acceptance rule is handed for each node equals the
  target's law after that node's own path, computed by a plain forward of the whole sequence (max |Δp| < 2e-3:
  fp32 noise of ~1e-4 in the logits, times 1/T), on runs that accepted depth >= 2 and non-first branches. The
  acceptance rule itself is exact given those laws (test_verify.py and test_exact_depth.py enumerate it):
  together, sampling keeps the target's law on every family. Negative twin: a hybrid whose recurrent layers
  are fed the flattened tree (no branch rows) hands the rule wrong laws.
"""

from __future__ import annotations

import families
import pytest
import torch
from helpers import build_tiny_tokenizer

from draftsmith.distill.target import Target
from draftsmith.eval.decode import decoder as decoder_module
from draftsmith.eval.decode.decoder import SpeculativeDecoder, hf_generate
from draftsmith.heads.prompt_lookup.proposer import PromptLookupProposer

pytestmark = pytest.mark.usefixtures("one_thread")

FAMILIES = list(families.FAMILIES)
HYBRIDS = [name for name, spec in families.FAMILIES.items()
           if {"gated_delta", "mamba2", "short_conv", "parallel_hybrid"} & set(spec.kinds)]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def target_of(name: str, tokenizer) -> Target:
    return Target(families.build_family_model(name), tokenizer, name=name)


def prompt_of(seed: int = 1, length: int = 24) -> list[int]:
    body = torch.randint(3, 259, (length,), generator=torch.Generator().manual_seed(seed)).tolist()
    return [1, *body, *body[4:12]]  # a repeat, so prompt lookup drafts


@pytest.mark.parametrize("name", FAMILIES)
def test_greedy_chain_and_tree_equal_the_targets_own(name, tokenizer):
    target = target_of(name, tokenizer)
    prompt = prompt_of()
    reference, _ = hf_generate(target, prompt, 24)
    chain = SpeculativeDecoder(target, PromptLookupProposer(4, 3, 1)).generate(prompt, 24)
    assert chain.output_ids == reference
    ranked = families.RankedTree(target)
    tree = SpeculativeDecoder(target, ranked).generate(prompt, 24)
    assert tree.output_ids == reference
    assert max(tree.accepted_drafts) >= 2  # depth >= 2 accepted (with rank swaps: through non-first branches)


SAMPLING = families.SAMPLING


def sampled_steps(target: Target, monkeypatch, steps: list, seed: int = 0):
    """Decode at T = 0.05 with RankedTree, appending every verification's (context, draft tokens, parents,
    p rows) to `steps`; returns the result."""
    ranked, rule = families.RankedTree(target), decoder_module.verify_sampling

    def recording(tokens, buf, probs, q, generator):
        steps.append((ranked.contexts[-1], list(tokens), list(buf.parents), probs.detach().clone()))
        return rule(tokens, buf, probs, q, generator)

    monkeypatch.setattr(decoder_module, "verify_sampling", recording)
    generator = torch.Generator().manual_seed(seed)
    return SpeculativeDecoder(target, ranked).generate(prompt_of(), 24, SAMPLING, generator)


@pytest.mark.parametrize("name", FAMILIES)
def test_sampling_sees_the_targets_exact_law_at_every_node(name, tokenizer, monkeypatch):
    target, steps = target_of(name, tokenizer), []
    out = sampled_steps(target, monkeypatch, steps)
    assert max(out.accepted_drafts) >= 2, "depth >= 2 must be accepted for the later laws to be tested"
    # fp32 noise (chunked vs step-wise kernels: ~1e-4 in the logits), times 1/T = 20
    assert families.node_laws(target, steps) < 2e-3


@pytest.mark.parametrize("name", HYBRIDS[:2])
def test_a_flattened_tree_on_recurrent_layers_is_caught(name, tokenizer, monkeypatch):
    """Twin: without branch rows the recurrent layers read the tree's nodes as one sequence (the first
    verification's laws are already wrong; the cache then refuses to drop its rejected nodes)."""
    target, steps = target_of(name, tokenizer), []
    monkeypatch.setattr(decoder_module, "recurrent", lambda config: False)
    refused = "only plain attention layers|does not track past states"
    with pytest.raises((TypeError, RuntimeError), match=refused):
        sampled_steps(target, monkeypatch, steps)
    assert steps and families.node_laws(target, steps) > 1e-2


@pytest.mark.parametrize("name", ["mistral", "qwen3_5", "falcon_h1"])
def test_a_batch_of_a_windowed_or_recurrent_target_is_refused_in_one_sentence(name, tokenizer):
    """Holes of a batch would count as tokens in a window or a recurrent state: refused, by the decoder and
    before any work by bench and plan (they ask the same `one_at_a_time`)."""
    target = target_of(name, tokenizer)
    said = decoder_module.one_at_a_time(target.model)
    assert said and "use batch size 1" in said and "\n" not in said
    with pytest.raises(ValueError, match="one sequence at a time"):
        decoder = SpeculativeDecoder(target, PromptLookupProposer(2, 2, 1))
        decoder.generate_batch([prompt_of(1), prompt_of(2)], 4)
    assert decoder_module.one_at_a_time(target_of("llama", tokenizer).model) is None


def test_an_encoder_decoder_target_is_refused_by_name(tmp_path):
    from transformers import T5Config, T5ForConditionalGeneration

    from draftsmith.distill.loading import load_target

    T5ForConditionalGeneration(T5Config(d_model=16, d_ff=32, num_layers=1, num_heads=2, vocab_size=64,
                                        d_kv=8)).save_pretrained(tmp_path / "t5")
    with pytest.raises(ValueError, match="is not a decoder-only causal LM"):
        load_target(str(tmp_path / "t5"))
