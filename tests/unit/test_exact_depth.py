"""Exact sampling at depth, through the batched decoder: the law of whole outputs, not of their first token.

Each test draws DRAWS outputs of LENGTH = 4 tokens (V = 4: 256 cells) and compares their histogram with the
target's exact law of 4 tokens under the same sampling settings (tests/exactness.py `output_law`, by plain
forwards). The first token comes from the prefill; the drafts are chains of 2 (or trees of depth 2), so the
first verification's depth-1 node, its depth-2 node and the bonus token after a fully accepted path are all
inside the histogram (a 2-token histogram sees only the depth-1 node's first try). Every mode the decoder
samples in: a sampled chain with the confidence stop, the same at T != 1 with top-k and with top-p, a hybrid
tree (sampled chain + a lookup branch), and a lookup trie with a datastore path. Each test states the
distance it detects (a generic alternative at that TV fails with probability >= 0.95: `detectable_tv`),
checks that depth-2 paths were really accepted, and has a negative twin that must fail: the old confidence
stop (a low-confidence token dropped), the drafter's q reported without its top-k / top-p, a lookup branch
handed the drafter's q, and p kept after a rejected sibling. The parallel drafters (DFlash, P-EAGLE: a block
of 2 drawn from one forward, each slot from its own row) are exact at depth the same way; their twin takes
every slot by argmax at T > 0 and reports the sampled law. scripts/bench/exactness/exactness_power.py writes
the figures of every test here, the parallel drafters' included.
"""

from __future__ import annotations

import functools

import exactness
import pytest
import torch
from helpers import build_tiny_model, chi_square_p_value

from draftsmith.distill.target import Target
from draftsmith.eval.decode import decoder as decoder_module
from draftsmith.eval.decode.decoder import SpeculativeDecoder
from draftsmith.heads.draft_lm.proposer import DraftModelProposer
from draftsmith.heads.prompt_lookup.datastore import Datastore
from draftsmith.heads.prompt_lookup.proposer import PromptLookupProposer
from draftsmith.heads.runtime import hybrid
from draftsmith.heads.runtime.hybrid import HybridProposer
from draftsmith.heads.runtime.proposer import Draft
from draftsmith.heads.runtime.tree import chain_parents, load_tree
from draftsmith.heads.runtime.verify import SamplingConfig, logits_to_probs

V, LENGTH, DRAWS = 4, 4, 10000
PROMPT = [1, 3, 1, 3, 1]  # prompt lookup copies "3 1" here
PROMPT_TRIE = [0, 1, 0, 3, 0]  # "0" seen twice before: a lookup trie of two branches, plus the datastore's
DATASTORE = [[2, 0, 2, 2], [0, 2, 1, 0]]  # after "0": "2" twice, "2 2" and "2 1": a third root branch
THRESHOLD = 0.4  # the drafter's top probability is 0.26-0.49 here: the stop fires on most drafts
SAMPLINGS = {
    "T=1": SamplingConfig(temperature=1.0),
    "T=0.7 top-k 2": SamplingConfig(temperature=0.7, top_k=2),
    "T=1.3 top-p 0.8": SamplingConfig(temperature=1.3, top_p=0.8),
}

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def pair():
    model = build_tiny_model("llama", layers=3, seed=11, vocab_size=V)
    model.generation_config.eos_token_id = 99  # outside the vocabulary: outputs never end early
    return Target(model, tokenizer=None, name="tiny-v4"), build_tiny_model("llama", layers=1, seed=5,
                                                                           vocab_size=V)


class TwinChain(DraftModelProposer):
    """A sampled chain with one of two bugs: `drop_unconfident` (the old confidence stop: a token below the
    threshold is dropped and ends the draft, so kept tokens follow q restricted to confident ones) or
    `reported` (the q rows handed to the verifier warped by other settings than the draws)."""

    def __init__(self, *args, drop_unconfident: bool = False, reported: SamplingConfig | None = None):
        super().__init__(*args)
        self.drop_unconfident, self.reported = drop_unconfident, reported

    def _chain(self, logits, sampling, generator) -> Draft:
        tokens, probs = [], []
        for depth in range(self.length):
            tok = int(torch.multinomial(logits_to_probs(logits, sampling), 1, generator=generator))
            unconfident = float(logits.float().softmax(-1)[tok]) < self.threshold
            if self.drop_unconfident and depth and unconfident:
                break
            tokens.append(tok)
            probs.append(logits_to_probs(logits, self.reported or sampling))  # [V]
            if (unconfident and not self.drop_unconfident) or depth + 1 == self.length:
                break
            logits = self._forward(tokens[-1:])[-1]
            self.cached.append(tokens[-1])
        self.drafted = len(tokens)
        return Draft(tokens=tokens, parents=chain_parents(len(tokens)), probs=torch.stack(probs))


def chain(draft, cls=DraftModelProposer, **twin) -> DraftModelProposer:
    return cls(draft, load_tree("chain-2"), THRESHOLD, **twin)


def counts_of(target, proposer, prompt, sampling, seed=1):
    return exactness.decoder_counts(SpeculativeDecoder(target, proposer), prompt, LENGTH, sampling, DRAWS,
                                    seed)


def assert_exact(target, proposer, prompt, sampling):
    exact = exactness.output_law(target.model, prompt, LENGTH, sampling)
    assert exactness.detectable_tv(exact, DRAWS) <= 0.05  # the stated power: TV 0.05 is caught at >= 95 %
    counts, accepted, deep = counts_of(target, proposer, prompt, sampling)
    assert deep > DRAWS // 20, "depth-2 paths must really be accepted"
    assert chi_square_p_value(counts, exact) > exactness.ALPHA


def assert_caught(target, proposer, prompt, sampling):
    counts, _, _ = counts_of(target, proposer, prompt, sampling)
    assert (chi_square_p_value(counts, exactness.output_law(target.model, prompt, LENGTH,
                                                            sampling)) < exactness.ALPHA)


@pytest.mark.parametrize("setting", list(SAMPLINGS))
def test_sampled_chain_with_confidence_stop_is_exact_at_depth(pair, setting):
    target, draft = pair
    assert_exact(target, chain(draft), PROMPT, SAMPLINGS[setting])


def test_old_confidence_stop_is_caught(pair):
    """Twin (the rule before this fix): the unconfident token dropped at depth 2; measured p ~ 1e-34."""
    target, draft = pair
    assert_caught(target, chain(draft, TwinChain, drop_unconfident=True), PROMPT, SAMPLINGS["T=1"])


@pytest.mark.parametrize("setting", ["T=0.7 top-k 2", "T=1.3 top-p 0.8"])
def test_q_without_its_truncation_is_caught(pair, setting):
    """Twin: tokens drawn with top-k / top-p, q handed to the verifier with the temperature alone."""
    target, draft = pair
    sampling = SAMPLINGS[setting]
    twin = chain(draft, TwinChain, reported=SamplingConfig(temperature=sampling.temperature))
    assert_caught(target, twin, PROMPT, sampling)


def hybrid_proposer(draft) -> HybridProposer:
    return HybridProposer(chain(draft), PromptLookupProposer(2, 2, 1))


def test_hybrid_tree_is_exact_at_depth(pair):
    target, draft = pair
    assert hybrid_proposer(draft).propose(PROMPT, SAMPLINGS["T=1"], torch.Generator().manual_seed(0)).n >= 3
    assert_exact(target, hybrid_proposer(draft), PROMPT, SAMPLINGS["T=1"])


def test_hybrid_lookup_branch_passed_off_as_sampled_is_caught(pair, monkeypatch):
    """Twin: the lookup nodes handed the drafter's q of the root instead of a point mass."""
    target, draft = pair
    monkeypatch.setattr(hybrid, "merge", exactness.lookup_given_root_q(hybrid.merge))
    assert_caught(target, hybrid_proposer(draft), PROMPT, SAMPLINGS["T=1"])


def trie_proposer() -> PromptLookupProposer:
    return PromptLookupProposer(2, 2, 1, matches=2, datastore=Datastore(DATASTORE, ngram_max=2),
                                datastore_tokens=2)


def test_lookup_trie_with_datastore_is_exact_at_depth(pair):
    target, _ = pair
    draft = trie_proposer().propose(PROMPT_TRIE, SAMPLINGS["T=1"], None)
    assert draft.parents.count(-1) == 3 and 2 in draft.tokens  # two context matches and the datastore's path
    assert_exact(target, trie_proposer(), PROMPT_TRIE, SAMPLINGS["T=1"])


def test_lookup_trie_keeping_p_after_a_rejection_is_caught(pair, monkeypatch):
    """Twin: after a rejected sibling the verifier keeps p (the rejected token can come back)."""
    target, _ = pair
    monkeypatch.setattr(decoder_module, "verify_sampling",
                        functools.partial(decoder_module.verify_sampling, residual=exactness.keep_p_update))
    assert_caught(target, trie_proposer(), PROMPT_TRIE, SAMPLINGS["T=1"])


# ---- parallel drafters: every slot of a block drawn from its own row in one forward ------------------------
@functools.lru_cache(maxsize=None)
def parallel_pair(kind: str):
    """A V=4 target of 4 layers and an untrained `kind` drafter on it (fused layers 1/2/3, a block of 2)."""
    from draftsmith.heads.registry import DrafterConfig, build_drafter

    model = build_tiny_model("llama", layers=4, seed=11, vocab_size=V)
    model.generation_config.eos_token_id = 99
    torch.manual_seed(3)
    cfg = DrafterConfig.for_kind(kind, num_speculative_tokens=2, aux_layers=[1, 2, 3])
    drafter = build_drafter(cfg, model, torch.arange(V).flip(0)).eval()
    with torch.no_grad():  # away from the initialisation's near-uniform rows
        for p in drafter.parameters():
            if p.requires_grad:
                p.add_(0.3 * torch.randn_like(p))
    return Target(model, tokenizer=None, name=f"tiny-v4-{kind}"), drafter


def parallel_proposer(kind: str, drafter, greedy_slots: bool = False):
    """The kind's own proposer (a chain of 2 with the confidence stop), or its twin: every slot taken by
    argmax at T > 0 while the sampled law is reported as q (a "greedy block" shortcut: the verifier is told
    the wrong law)."""
    from draftsmith.heads.dflash.proposer import DFlashProposer
    from draftsmith.heads.dspark.proposer import DSparkProposer
    from draftsmith.heads.peagle.proposer import PEagleProposer

    base = {"dflash": DFlashProposer, "peagle": PEagleProposer, "dspark": DSparkProposer}[kind]
    if not greedy_slots:
        return base(drafter, 2, THRESHOLD)

    class GreedySlots(base):
        def propose(self, context, sampling, generator) -> Draft:
            draft = super().propose(context, sampling, generator)
            if draft.probs is None:
                return draft
            return Draft(tokens=[int(row.argmax()) for row in draft.probs][:len(draft.tokens)],
                         parents=draft.parents, probs=draft.probs)

    return GreedySlots(drafter, 2, THRESHOLD)


@pytest.mark.parametrize("kind", ["dflash", "peagle"])
@pytest.mark.parametrize("setting", ["T=1", "T=1.3 top-p 0.8"])
def test_parallel_drafter_block_is_exact_at_depth(kind, setting):
    target, drafter = parallel_pair(kind)
    assert_exact(target, parallel_proposer(kind, drafter), PROMPT, SAMPLINGS[setting])


@pytest.mark.parametrize("kind", ["dflash", "peagle"])
def test_parallel_drafter_greedy_slots_passed_off_as_sampled_are_caught(kind):
    target, drafter = parallel_pair(kind)
    assert_caught(target, parallel_proposer(kind, drafter, greedy_slots=True), PROMPT, SAMPLINGS["T=1"])
