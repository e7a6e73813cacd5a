"""Exact sampling by enumeration: every random outcome of the real decoder replayed, no sampling noise.

The histogram tests (tests/unit/test_exact_depth.py) detect a total variation of 0.03-0.05 at 95 %. Here the
decoder's randomness is replayed instead (tests/exactness.py `enumerate_decoder`): `torch.multinomial` and the
acceptance rule's uniforms answer from a script, and one run per script visits every outcome of the
prefill token and the first verifications once, with its exact probability — through the batch-1 path
(`SpeculativeDecoder.generate`), the real proposer and the real acceptance rule. The outcomes, continued by
the target's own sampling (`composed_law`), must give the target's law of the first LENGTH tokens: within fp32
noise (TOL on dense targets, measured <= 2.2e-7; HYBRID_TOL where recurrent kernels run chunked in the prefill
and step-wise in verification). Every test checks that its enumeration reached a verification's depth 2 (and,
for trees, accepted a node that is not its parent's first child), and each drafting mode has a negative twin
whose total variation from the target's law must exceed TWIN_TV: a test that sees every outcome detects any
error above its tolerance with certainty, so the twins can be subtle ones (q rows shifted by one slot, an
unnormalised residual, the recurrent state kept from the wrong branch).

Modes: a draft LM's sampled chain (with the confidence stop; with top-k; with top-p), argmax drafts with
one-hot q (the engines' rule, `draft_sampling: greedy`), a hybrid tree (sampled chain + a lookup branch), a
lookup trie with a datastore, DFlash, DSpark (its Markov head and confidence stop) and P-EAGLE blocks, EAGLE-3
dynamic trees (full and reduced draft vocabulary), Medusa trees, and a ranked tree over two verifications on
every windowed, latent-attention and recurrent family (tests/families.py).
scripts/bench/exactness/exactness_power.py writes these figures to docs/results/exactness.md.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from unittest import mock

import exactness
import families
import pytest
import test_exact_depth as depth
import torch

from draftsmith.distill.target import Target
from draftsmith.eval.decode import decoder as decoder_module
from draftsmith.eval.decode.decoder import SpeculativeDecoder
from draftsmith.heads.runtime import hybrid, kv_cache
from draftsmith.heads.runtime.proposer import Draft, Proposer
from draftsmith.heads.runtime.tree import ServingTree
from draftsmith.heads.runtime.verify import SamplingConfig

TOL, HYBRID_TOL, TWIN_TV = 1e-5, 1e-4, 2e-3
LENGTH = 4  # the prefill's token, a verification's depth-1 and depth-2 tokens and its bonus
T1 = SamplingConfig(temperature=1.0)
TOPK = SamplingConfig(temperature=0.7, top_k=2)
TOPP = SamplingConfig(temperature=1.3, top_p=0.8)
ENGINE_RULE = SamplingConfig(temperature=0.7, draft="greedy")
PROMPT_LONG = [1, 3, 0, 2, 1, 3, 0, 2, 1, 3]  # past the families' windows (8) after the first verification

pytestmark = pytest.mark.usefixtures("one_thread")


@dataclass
class Case:
    """One enumeration: a target, a proposer built fresh per run of the test, the prompt and settings."""

    target: Target
    proposer: object  # () -> Proposer
    prompt: list[int]
    sampling: SamplingConfig
    verifications: int = 1
    length: int = LENGTH
    tree: bool = False  # siblings: a non-first child must be accepted on some outcome
    tol: float = TOL
    patch: object = None  # () -> context manager (a twin's patch), or None


def measure(case: Case) -> dict:
    """Enumerate the case; its law's distance from the target's and what the outcomes reached."""
    with case.patch() if case.patch else _nothing():
        e = exactness.enumerate_decoder(SpeculativeDecoder(case.target, case.proposer()), case.prompt,
                                        case.sampling, case.verifications)
    model = case.target.model
    got = exactness.composed_law(model, case.prompt, case.sampling, e.law, case.length)
    exact = exactness.exact_law(model, case.prompt, case.sampling, case.length)
    return {"tv": exactness.law_tv(got, exact), "outcomes": len(e.law), "runs": e.runs,
            "mass": sum(e.law.values()), "deep": e.deep, "non_first": e.non_first}


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


# ---- the targets and drafters (test_exact_depth's: a V=4 llama target and a 1-layer draft LM) --------------
@functools.lru_cache(maxsize=None)
def llama_pair():
    return depth.pair.__wrapped__()


@functools.lru_cache(maxsize=None)
def eagle_pair(draft_vocab: int):
    """The parallel drafters' V=4 target with an untrained EAGLE-3 drafter (full or reduced vocabulary)."""
    from draftsmith.heads.registry import DrafterConfig, build_drafter

    target, _ = depth.parallel_pair("dflash")
    torch.manual_seed(4)
    cfg = DrafterConfig.for_kind("eagle3", num_speculative_tokens=2, aux_layers=[1, 2, 3],
                                 draft_vocab=draft_vocab)
    drafter = build_drafter(cfg, target.model, torch.arange(depth.V).flip(0)).eval()
    _jolt(drafter)
    return target, drafter


@functools.lru_cache(maxsize=None)
def medusa_pair():
    from draftsmith.heads.registry import DrafterConfig, build_drafter

    target, _ = depth.parallel_pair("dflash")
    torch.manual_seed(6)
    heads = build_drafter(DrafterConfig.for_kind("medusa", heads=2), target.model).eval()
    _jolt(heads)
    return target, heads


def _jolt(module):
    with torch.no_grad():  # away from the initialisation's near-uniform rows
        for p in module.parameters():
            if p.requires_grad:
                p.add_(0.3 * torch.randn_like(p))


class ArgmaxTokensSampledQ(Proposer):
    """Twin: a proposer's sampled draft with every token replaced by its q row's argmax while q is still
    reported (greedy drafting passed off as sampled)."""

    def __init__(self, inner):
        self.inner, self.name, self.tree = inner, inner.name, inner.tree
        self.feature_layers = inner.feature_layers

    def begin(self, prompt_ids, features):
        self.inner.begin(prompt_ids, features)

    def commit(self, new_tokens, features):
        self.inner.commit(new_tokens, features)

    def propose(self, context, sampling, generator) -> Draft:
        d = self.inner.propose(context, sampling, generator)
        return Draft(tokens=[int(r.argmax()) for r in d.probs], parents=d.parents, probs=d.probs)


class ShiftedQ(ArgmaxTokensSampledQ):
    """Subtle twin of a block drafter: the tokens right, every slot's q taken from the slot before (slot 1
    keeps its own) — an off-by-one between a block's rows and its slots."""

    def propose(self, context, sampling, generator) -> Draft:
        d = self.inner.propose(context, sampling, generator)
        probs = d.probs if d.probs is None or d.n < 2 else torch.cat([d.probs[:1], d.probs[:-1]])
        return Draft(tokens=d.tokens, parents=d.parents, probs=probs)


class MarkovlessQ(ArgmaxTokensSampledQ):
    """Subtle twin of DSpark: the tokens drawn with the Markov bias of the token before each slot, every q row
    reported from the block's base logits (the bias left out of the law handed to the verifier)."""

    def propose(self, context, sampling, generator) -> Draft:
        from draftsmith.heads.runtime.proposer import target_vocabulary
        from draftsmith.heads.runtime.verify import logits_to_probs

        d = self.inner.propose(context, sampling, generator)
        if d.probs is None or not d.n:
            return d
        drafter = self.inner.drafter
        with torch.no_grad():
            base = target_vocabulary(drafter.logits(self.inner.block_outputs(context)).float(), drafter)
        return Draft(tokens=d.tokens, parents=d.parents,
                     probs=torch.stack([logits_to_probs(base[i], sampling) for i in range(d.n)]))


def _patch(obj, name, value):
    return lambda: mock.patch.object(obj, name, value)


def _residual(update):
    return _patch(decoder_module, "verify_sampling",
                  functools.partial(decoder_module.verify_sampling, residual=update))


def _chain(threshold=depth.THRESHOLD, **twin):
    target, draft = llama_pair()
    cls = depth.TwinChain if twin else depth.DraftModelProposer
    return lambda: cls(draft, depth.load_tree("chain-2"), threshold, **twin)


def _block(kind, wrap=None):
    target, drafter = depth.parallel_pair(kind)
    proposer = depth.parallel_proposer  # a block of 2 with the confidence stop
    return lambda: (wrap or (lambda p: p))(proposer(kind, drafter))


def _eagle(draft_vocab=0, topk=2):
    from draftsmith.heads.eagle.proposer import EagleProposer

    _, drafter = eagle_pair(draft_vocab)
    return lambda: EagleProposer(drafter, ServingTree(topk=topk, depth=2, budget=4, label="d2"))


def _medusa():
    from draftsmith.heads.medusa.proposer import MedusaProposer

    _, heads = medusa_pair()
    return lambda: MedusaProposer(heads, [[0], [1], [0, 0], [1, 0]])


def cases() -> dict[str, Case]:
    """Every drafting mode the decoder samples in, exact."""
    llama, _ = llama_pair()
    block_target, _ = depth.parallel_pair("dflash")
    peagle_target, _ = depth.parallel_pair("peagle")
    out = {
        "draft LM chain-2, confidence stop, T=1": Case(llama, _chain(), depth.PROMPT, T1),
        "draft LM chain-2, T=0.7 top-k 2": Case(llama, _chain(0.0), depth.PROMPT, TOPK),
        "draft LM chain-2, T=1.3 top-p 0.8": Case(llama, _chain(0.0), depth.PROMPT, TOPP),
        "draft LM chain-2, argmax drafts (engines' rule), T=0.7": Case(llama, _chain(0.0), depth.PROMPT,
                                                                       ENGINE_RULE),
        "hybrid: sampled chain-2 + lookup branch, T=1": Case(
            llama, lambda: depth.hybrid_proposer(llama_pair()[1]), depth.PROMPT, T1, tree=True),
        "lookup trie, 2 matches + datastore, T=1": Case(llama, depth.trie_proposer, depth.PROMPT_TRIE, T1,
                                                         tree=True),
        "dflash block of 2, T=1": Case(block_target, _block("dflash"), depth.PROMPT, T1),
        "dflash block of 2, T=1.3 top-p 0.8": Case(block_target, _block("dflash"), depth.PROMPT, TOPP),
        "dspark block of 2, Markov head + confidence stop, T=1": Case(
            depth.parallel_pair("dspark")[0], _block("dspark"), depth.PROMPT, T1),
        "dspark block of 2, T=1.3 top-p 0.8": Case(depth.parallel_pair("dspark")[0], _block("dspark"),
                                                   depth.PROMPT, TOPP),
        "peagle block of 2, T=1": Case(peagle_target, _block("peagle"), depth.PROMPT, T1),
        "peagle block of 2, T=1.3 top-p 0.8": Case(peagle_target, _block("peagle"), depth.PROMPT, TOPP),
        "eagle3 dynamic tree top-2 depth 2, T=1": Case(block_target, _eagle(), depth.PROMPT, T1, tree=True),
        "eagle3 reduced vocabulary (3 of 4), T=1": Case(block_target, _eagle(3), depth.PROMPT, T1, tree=True),
        "medusa tree (2 heads, 4 nodes), T=1": Case(block_target, _medusa(), depth.PROMPT, T1, tree=True),
    }
    return out


def twins() -> dict[str, tuple[str, Case]]:
    """(the mode it breaks, the broken case) for each negative twin."""
    llama, _ = llama_pair()
    block_target, _ = depth.parallel_pair("dflash")
    keep_p, unnormalised = _residual(exactness.keep_p_update), _residual(exactness.unnormalised_update)
    given_q = _patch(hybrid, "merge", exactness.lookup_given_root_q(hybrid.merge))
    return {
        "old confidence stop (token dropped)": (
            "draft LM chain-2, confidence stop, T=1",
            Case(llama, _chain(drop_unconfident=True), depth.PROMPT, T1)),
        "q without its top-k": ("draft LM chain-2, T=0.7 top-k 2", Case(
            llama, _chain(0.0, reported=SamplingConfig(temperature=0.7)), depth.PROMPT, TOPK)),
        "q without its top-p": ("draft LM chain-2, T=1.3 top-p 0.8", Case(
            llama, _chain(0.0, reported=SamplingConfig(temperature=1.3)), depth.PROMPT, TOPP)),
        "argmax drafts handed the sampled q": ("draft LM chain-2, argmax drafts (engines' rule), T=0.7", Case(
            llama, lambda: ArgmaxTokensSampledQ(_chain(0.0)()), depth.PROMPT,
            SamplingConfig(temperature=0.7))),
        "lookup branch given the drafter's q": ("hybrid: sampled chain-2 + lookup branch, T=1", Case(
            llama, lambda: depth.hybrid_proposer(llama_pair()[1]), depth.PROMPT, T1, patch=given_q)),
        "p kept after a rejected sibling": ("lookup trie, 2 matches + datastore, T=1", Case(
            llama, depth.trie_proposer, depth.PROMPT_TRIE, T1, patch=keep_p)),
        "dflash q rows shifted by one slot": ("dflash block of 2, T=1", Case(
            block_target, _block("dflash", ShiftedQ), depth.PROMPT, T1)),
        "dspark q without its Markov bias": ("dspark block of 2, Markov head + confidence stop, T=1", Case(
            depth.parallel_pair("dspark")[0], _block("dspark", MarkovlessQ), depth.PROMPT, T1)),
        "peagle greedy slots reported as sampled": ("peagle block of 2, T=1", Case(
            depth.parallel_pair("peagle")[0], _block("peagle", ArgmaxTokensSampledQ), depth.PROMPT, T1)),
        "eagle3 tree, residual left unnormalised": ("eagle3 dynamic tree top-2 depth 2, T=1", Case(
            block_target, _eagle(), depth.PROMPT, T1, patch=unnormalised)),
        "medusa tree, residual left unnormalised": ("medusa tree (2 heads, 4 nodes), T=1", Case(
            block_target, _medusa(), depth.PROMPT, T1, patch=unnormalised)),
    }


# ---- every windowed, latent-attention and recurrent family: a ranked tree over two verifications ----------
FAMILIES = ["mistral", "gpt_oss", "deepseek_v3", "qwen3_5", "qwen3_next", "falcon_h1", "lfm2", "nemotron_h",
            "granitemoehybrid"]


@functools.lru_cache(maxsize=None)
def family_target(name: str) -> Target:
    model = families.build_family_model(name, layers=2, seed=3, vocab_size=depth.V)
    model.generation_config.eos_token_id = 99  # outside the vocabulary: outputs never end early
    return Target(model, tokenizer=None, name=f"{name}-v4")


def family_case(name: str, patch=None) -> Case:
    """Two verifications of a 3-level ranked tree (its argmax on a non-first branch on every third step), the
    second one after the first's rollback; top-k 2 keeps the outcomes few. LENGTH + 2 tokens: the second
    verification's first tokens are inside the law."""
    target = family_target(name)
    return Case(target, lambda: families.RankedTree(target), PROMPT_LONG, SamplingConfig(temperature=1.0,
                top_k=2), verifications=2, length=LENGTH + 2, tree=True,
                tol=HYBRID_TOL if kv_cache.recurrent(target.config) else TOL, patch=patch)


def family_twin(name: str) -> Case:
    """Subtle twin of a recurrent target: after a tree's verification the cache keeps branch row 0 (the
    first path's states), whatever path was accepted: wrong only after a non-first branch was accepted."""
    real = decoder_module.keep_row
    return family_case(name, patch=_patch(decoder_module, "keep_row",
                                          lambda cache, row, length: real(cache, 0, length)))


# ---- the tests ---------------------------------------------------------------------------------------------
def _assert_exact(row: dict, case: Case):
    assert abs(row["mass"] - 1) < 1e-9, "the outcomes' probabilities must sum to one"
    assert row["deep"] > 0, "depth 2 of a verification must be reached on some outcome"
    if case.tree:
        assert row["non_first"] > 0, "a node that is not its parent's first child must be accepted"
    assert row["tv"] < case.tol, row


@pytest.mark.parametrize("mode", list(cases()))
def test_each_drafting_mode_is_exact_by_enumeration(mode):
    case = cases()[mode]
    _assert_exact(measure(case), case)


@pytest.mark.parametrize("twin", list(twins()))
def test_each_modes_negative_twin_is_caught_by_enumeration(twin):
    mode, case = twins()[twin]
    assert mode in cases()
    assert measure(case)["tv"] > TWIN_TV


@pytest.mark.parametrize("name", FAMILIES)
def test_a_tree_over_two_verifications_is_exact_on_each_family(name):
    case = family_case(name)
    _assert_exact(measure(case), case)


@pytest.mark.parametrize("name", ["qwen3_5", "falcon_h1"])
def test_a_recurrent_state_kept_from_the_wrong_branch_is_caught(name):
    assert measure(family_twin(name))["tv"] > TWIN_TV
