"""Exact sampling through the whole decoder: speculative samples follow the target's distribution.

A tiny random Llama over 8 tokens is the target. For each proposer (sampled draft-LM chain with its
q; deterministic top-k trees, the path prompt lookup and Medusa/EAGLE top-k also take) thousands of 3-token continuations are generated at
T=1 and their 512-cell histogram is compared (chi-square) with the exact product
p(x1) p(x2|x1) p(x3|x1,x2) computed by plain forwards. A decoder whose acceptance rule is
replaced by "always accept" must fail the same test.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from helpers import build_tiny_model, chi_square_p_value

from draftsmith.distill.target import Target
from draftsmith.eval import decoder as decoder_module
from draftsmith.eval.decoder import SpeculativeDecoder
from draftsmith.eval.proposers.draft_model import DraftModelProposer, truncated_target
from draftsmith.eval.tree import load_tree, topk_chain_paths
from draftsmith.eval.verify import SamplingConfig, Verdict

V, NEW, DRAWS = 8, 3, 2000
PROMPT = [1, 4, 1, 4, 1]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def target() -> Target:
    model = build_tiny_model("llama", layers=3, seed=11, vocab_size=V)
    model.generation_config.eos_token_id = 99  # outside the vocabulary: sequences never end early
    return Target(model, tokenizer=None, name="tiny-v8")


@pytest.fixture(scope="module")
def exact(target) -> torch.Tensor:
    """p(x1, x2, x3 | PROMPT) by plain forwards: [V, V, V]."""
    probs = torch.zeros(V, V, V, dtype=torch.float64)
    with torch.no_grad():
        for x1, x2 in itertools.product(range(V), range(V)):
            logits = target.model(torch.tensor([PROMPT + [x1, x2]])).logits[0].double()  # [T, V]
            p = logits.softmax(-1)
            probs[x1, x2] = p[-3, x1] * p[-2, x2] * p[-1]
    return probs


def histogram(decoder: SpeculativeDecoder, seed: int) -> tuple[torch.Tensor, float]:
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(V, V, V, dtype=torch.long)
    accepted = steps = 0
    for _ in range(DRAWS):
        out = decoder.generate(PROMPT, NEW, SamplingConfig(temperature=1.0), g)
        counts[tuple(out.output_ids)] += 1
        accepted += sum(out.accepted_drafts)
        steps += len(out.accepted_drafts)
    return counts, accepted / max(steps, 1)


def proposers(target):
    draft = build_tiny_model("llama", layers=1, seed=5, vocab_size=V)
    return {
        "draft-lm sampled chain": DraftModelProposer(draft, load_tree("chain-3")),
        "draft-lm top-2 tree": DraftModelProposer(draft, topk_chain_paths(2, 2)),
        "layer-skip top-3 tree": DraftModelProposer(truncated_target(target, 2), topk_chain_paths(3, 2)),
    }


@pytest.mark.parametrize("name", ["draft-lm sampled chain", "draft-lm top-2 tree", "layer-skip top-3 tree"])
def test_speculative_sampling_matches_the_target(target, exact, name):
    counts, mean_accepted = histogram(SpeculativeDecoder(target, proposers(target)[name]), seed=1)
    assert mean_accepted > 0.1, "drafts must really be accepted for the test to mean anything"
    assert chi_square_p_value(counts, exact) > 1e-3


def test_a_wrong_rule_fails_the_test(target, exact, monkeypatch):
    def accept_everything(tokens, bufs, target_probs, draft_probs, generator):
        path = [i + 1 for i, p in enumerate(bufs.parents) if p == i - 1]  # the first chain
        bonus = int(torch.multinomial(target_probs[len(path)], 1, generator=generator))
        return Verdict(path, [tokens[j - 1] for j in path] + [bonus])

    monkeypatch.setattr(decoder_module, "verify_sampling", accept_everything)
    counts, _ = histogram(SpeculativeDecoder(target, proposers(target)["draft-lm sampled chain"]), seed=1)
    assert chi_square_p_value(counts, exact) < 1e-6
