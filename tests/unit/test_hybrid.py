"""Adaptive drafting and hybrid (model + prompt-lookup) trees: lossless at T=0, exact at T>0.

Greedy: fp32 outputs equal the target's own greedy decoding for every mode (tiny models, prompts with
repeats so prompt lookup really proposes; a datastore of the tiny target's answers to other prompts).
Sampling: the verifier sees the exact target law at every node and, for sampled chains, the exact q, with the
lookup branch's q one-hot (tests/exactness.py); the batched path's histogram over a hybrid tree matches the
target, and a twin that hands the lookup nodes the drafter's q instead of a point mass fails.
"""

from __future__ import annotations

import exactness
import pytest
import torch
from helpers import build_tiny_model, chi_square_p_value

from draftsmith.distill.target import Target
from draftsmith.eval.decode import decoder as decoder_module
from draftsmith.eval.decode.decoder import SpeculativeDecoder, hf_generate
from draftsmith.heads.draft_lm.proposer import DraftModelProposer
from draftsmith.heads.prompt_lookup.datastore import Datastore
from draftsmith.heads.prompt_lookup.proposer import PromptLookupProposer
from draftsmith.heads.runtime import hybrid
from draftsmith.heads.runtime.hybrid import HybridProposer, merge
from draftsmith.heads.runtime.proposer import Draft
from draftsmith.heads.runtime.tree import load_tree, topk_chain_paths
from draftsmith.heads.runtime.verify import SamplingConfig

pytestmark = pytest.mark.usefixtures("one_thread")


def test_merge_shares_deterministic_nodes_and_never_sampled_ones():
    tree = Draft(tokens=[5, 6, 7, 8], parents=[-1, -1, 0, 1])  # 5 -> 7, 6 -> 8
    merged = merge(tree, Draft(tokens=[5, 7, 9], parents=[-1, 0, 1]))
    assert merged.tokens == [5, 6, 7, 8, 9] and merged.parents == [-1, -1, 0, 1, 2]  # 5, 7 shared; 9 under 7
    assert merge(tree, Draft(tokens=[4], parents=[-1])).parents == [-1, -1, 0, 1, -1]  # a new root branch
    q = torch.full((2, 10), 0.1)
    sampled = merge(Draft(tokens=[5, 7], parents=[-1, 0], probs=q), Draft(tokens=[5, 7], parents=[-1, 0]))
    assert sampled.parents == [-1, 0, -1, 2]  # not merged into sampled nodes: a separate branch
    assert torch.equal(sampled.probs[2:], torch.nn.functional.one_hot(torch.tensor([5, 7]), 10).float())


@pytest.fixture(scope="module")
def pair():
    target_model = build_tiny_model("llama", layers=3, seed=11)
    target_model.generation_config.eos_token_id = 999  # never: full-length answers
    return Target(target_model, tokenizer=None, name="tiny"), build_tiny_model("llama", layers=1, seed=5)


PROMPTS = [[5, 9, 17, 5, 9, 17, 5, 9], [40, 41, 42, 43, 40, 41, 42], [7, 8, 7, 8, 7, 8, 7, 8, 7, 8]]


_STORES: dict[int, Datastore] = {}


def tiny_store(target) -> Datastore:
    """A datastore of the tiny target's own greedy answers to other prompts (the PROMPTS less their first
    token)."""
    if id(target) not in _STORES:
        _STORES[id(target)] = Datastore([hf_generate(target, p[1:], 24)[0] for p in PROMPTS], ngram_max=3)
    return _STORES[id(target)]


def modes(target, draft):
    lookup = PromptLookupProposer(4, 3, 1)
    return {
        "adaptive chain": DraftModelProposer(draft, load_tree("chain-4"), adaptive_length=True),
        "confident chain": DraftModelProposer(draft, load_tree("chain-5"), confidence_threshold=0.06),
        "hybrid chain": HybridProposer(DraftModelProposer(draft, load_tree("chain-3")), lookup),
        "hybrid tree": HybridProposer(DraftModelProposer(draft, topk_chain_paths(2, 2)), lookup),
        "lookup trie": PromptLookupProposer(4, 3, 1, matches=3),
        "hybrid trie": HybridProposer(DraftModelProposer(draft, topk_chain_paths(2, 2)),
                                      PromptLookupProposer(3, 3, 1, matches=3)),
        "lookup datastore": PromptLookupProposer(4, 3, 1, datastore=tiny_store(target), datastore_tokens=3),
        "hybrid datastore": HybridProposer(DraftModelProposer(draft, topk_chain_paths(2, 2)),
                                           PromptLookupProposer(3, 3, 1, matches=2,
                                                                datastore=tiny_store(target))),
    }


MODES = ["adaptive chain", "confident chain", "hybrid chain", "hybrid tree", "lookup trie", "hybrid trie",
         "lookup datastore", "hybrid datastore"]


@pytest.mark.parametrize("mode", MODES)
def test_greedy_is_lossless(pair, mode):
    target, draft = pair
    proposer = modes(target, draft)[mode]
    decoder = SpeculativeDecoder(target, proposer)
    for prompt in PROMPTS:
        out = decoder.generate(prompt, 24)
        assert out.output_ids == hf_generate(target, prompt, 24)[0], (mode, prompt)
    batch = decoder.generate_batch(PROMPTS, 24)
    assert [r.output_ids for r in batch.results] == [hf_generate(target, p, 24)[0] for p in PROMPTS]


def test_adaptive_and_confident_chains_change_their_length(pair):
    target, draft = pair
    lengths = {}
    for name in ("adaptive chain", "confident chain"):
        out = SpeculativeDecoder(target, modes(target, draft)[name]).generate(PROMPTS[0], 40)
        lengths[name] = set(out.draft_depths)
    assert len(lengths["adaptive chain"]) > 1 and len(lengths["confident chain"]) > 1, lengths


def test_hybrid_drafts_really_use_the_lookup_branch(pair):
    target, draft = pair
    inner = SpeculativeDecoder(target, DraftModelProposer(draft, load_tree("chain-3"))).generate(PROMPTS[2],
                                                                                                 40)
    both = SpeculativeDecoder(target, modes(target, draft)["hybrid chain"]).generate(PROMPTS[2], 40)
    assert sum(both.accepted_drafts) > sum(inner.accepted_drafts)  # copying the repeats pays


def test_the_datastore_drafts_where_the_context_cannot(pair):
    target, draft = pair
    alone, store = PromptLookupProposer(4, 3, 1), tiny_store(target)
    gains = []
    for prompt in PROMPTS:
        plain_lookup = SpeculativeDecoder(target, alone).generate(prompt, 24)
        with_store = SpeculativeDecoder(target, modes(target, draft)["lookup datastore"]).generate(prompt, 24)
        gains.append(sum(with_store.accepted_drafts) - sum(plain_lookup.accepted_drafts))
    assert store.tokens == 3 * 24 and max(gains) > 0, gains


@pytest.mark.parametrize("mode", MODES)
def test_every_verification_sees_the_exact_laws(pair, mode, monkeypatch):
    target, draft = pair
    law, q_law = exactness.model_law(target.model), exactness.model_law(draft)
    decoder, g, checked = SpeculativeDecoder(target,
                                             modes(target, draft)[mode]), torch.Generator().manual_seed(3), 0
    for prompt in PROMPTS:
        calls = exactness.record_verifications(monkeypatch, decoder_module)
        out = decoder.generate(prompt, 12, SamplingConfig(temperature=1.0), g)
        checked += exactness.check_verifier_inputs(calls, prompt, out.output_ids, law, q_law,
                                                   point_masses=True)
    assert checked > 30


V = 4
PROMPT = [1, 3, 1, 3, 1]
DRAWS = 6000


@pytest.fixture(scope="module")
def small():
    model = build_tiny_model("llama", layers=3, seed=11, vocab_size=V)
    model.generation_config.eos_token_id = 99
    target = Target(model, tokenizer=None, name="tiny-v4")
    law = exactness.model_law(model)
    first = law(PROMPT)
    exact = torch.stack([first[x1] * law(PROMPT + [x1]) for x1 in range(V)])
    return target, build_tiny_model("llama", layers=1, seed=5, vocab_size=V), exact


def hybrid_counts(target, draft, seed):
    decoder = SpeculativeDecoder(target, HybridProposer(DraftModelProposer(draft, load_tree("chain-2")),
                                                        PromptLookupProposer(2, 2, 1)))
    g, counts, lookup_accepted = torch.Generator().manual_seed(seed), torch.zeros(V, V, dtype=torch.long), 0
    for _ in range(DRAWS // 200):
        for r in decoder.generate_batch([PROMPT] * 200, 2, SamplingConfig(temperature=1.0), g).results:
            counts[tuple(r.output_ids)] += 1
            lookup_accepted += sum(r.accepted_drafts)
    return counts, lookup_accepted


def test_batched_sampling_over_a_hybrid_tree_matches_the_target(small):
    target, draft, exact = small
    assert exactness.power(exact, exactness.perturbed(exact, 0.03), DRAWS) >= exactness.POWER
    counts, accepted = hybrid_counts(target, draft, 1)
    assert accepted > DRAWS // 4
    assert chi_square_p_value(counts, exact) > exactness.ALPHA


def test_a_lookup_branch_passed_off_as_sampled_fails(small, monkeypatch):
    """Twin: the lookup nodes handed the drafter's q of the root (as if they were sampled) instead of a point
    mass."""
    target, draft, exact = small
    monkeypatch.setattr(hybrid, "merge", exactness.lookup_given_root_q(hybrid.merge))
    counts, _ = hybrid_counts(target, draft, 1)
    assert chi_square_p_value(counts, exact) < exactness.ALPHA


# "0" seen twice before, followed by 3 0 and by 1 0: a lookup trie of two branches, and the target gives 3 and
# 1 0.44 and 0.35 after the prompt, so both siblings are tried and accepted often
PROMPT_TRIE = [0, 1, 0, 3, 0]


def trie_counts(target, seed):
    decoder = SpeculativeDecoder(target, PromptLookupProposer(2, 2, 1, matches=2))
    g, counts, second_branch = torch.Generator().manual_seed(seed), torch.zeros(V, V, dtype=torch.long), 0
    for _ in range(DRAWS // 200):
        for r in decoder.generate_batch([PROMPT_TRIE] * 200, 2, SamplingConfig(temperature=1.0), g).results:
            counts[tuple(r.output_ids)] += 1
            second_branch += r.output_ids[0] == 1 and r.accepted_drafts[0] > 0
    return counts, second_branch


def test_sampling_over_a_lookup_trie_matches_the_target(small):
    """Sibling lookup nodes are point masses: after the first is rejected the target's p loses that token."""
    target, _, _ = small
    law = exactness.model_law(target.model)
    p = law(PROMPT_TRIE)
    exact = torch.stack([p[x1] * law(PROMPT_TRIE + [x1]) for x1 in range(V)])
    # the twin below (p kept after the first sibling is rejected): its first token alone is already this far
    # off
    twin_first = p * (1 - p[3]) * (1 - p[1])
    twin_first[3] += p[3]
    twin_first[1] += (1 - p[3]) * p[1]
    assert exactness.tv(twin_first, p) > 0.1
    assert exactness.power(exact, exactness.perturbed(exact, 0.05), DRAWS) >= exactness.POWER
    counts, second_branch = trie_counts(target, 2)
    assert second_branch > DRAWS // 20  # the second match's branch is really verified and accepted
    assert chi_square_p_value(counts, exact) > exactness.ALPHA


def test_a_lookup_trie_keeping_p_after_a_rejection_fails(small, monkeypatch):
    """Twin: after a rejected lookup sibling the verifier keeps p (the rejected token can come back as the
    bonus)."""
    import functools

    target, _, _ = small
    law = exactness.model_law(target.model)
    exact = torch.stack([law(PROMPT_TRIE)[x1] * law(PROMPT_TRIE + [x1]) for x1 in range(V)])
    monkeypatch.setattr(decoder_module, "verify_sampling",
                        functools.partial(decoder_module.verify_sampling, residual=exactness.keep_p_update))
    counts, _ = trie_counts(target, 2)
    assert chi_square_p_value(counts, exact) < exactness.ALPHA


@pytest.mark.parametrize("kind", ["eagle", "eagle3", "medusa"])
def test_hybrid_over_trained_kinds_is_lossless(kind):
    """EAGLE (dynamic tree, with a confidence floor) and Medusa (static tree) with a lookup branch merged
    in."""
    from helpers import randomised

    from draftsmith.heads.eagle.proposer import EagleProposer
    from draftsmith.heads.medusa.model import MedusaHeads
    from draftsmith.heads.medusa.proposer import MedusaProposer
    from draftsmith.heads.runtime.tree import ServingTree

    model = build_tiny_model("llama", layers=4, seed=11)
    model.generation_config.eos_token_id = 999
    target = Target(model, tokenizer=None, name="tiny")
    if kind == "medusa":
        torch.manual_seed(0)
        inner = MedusaProposer(MedusaHeads(model.config.hidden_size, model.config.vocab_size, 4).eval(),
                               load_tree("medusa-k4-default"))
    else:
        inner = EagleProposer(randomised(kind, target), ServingTree(topk=2, depth=3, budget=6),
                              confidence_threshold=0.01)
    decoder = SpeculativeDecoder(target, HybridProposer(inner, PromptLookupProposer(4, 3, 1)))
    for prompt in PROMPTS:
        assert decoder.generate(prompt, 20).output_ids == hf_generate(target, prompt, 20)[0], (kind, prompt)
