"""Exact sampling through the whole decoder: speculative samples follow the target's distribution.

Two halves, each exact where it can be:
- the acceptance rule itself is exact (tests/unit/test_verify.py: toy laws, subtle twins, stated power);
- here, the decoder hands that rule the right laws: every verification of real generations (batch 1,
  each proposer kind at T > 0) sees, for every tree node, the target's exact next-token law after the
  node's context and, for a sampled chain, the exact law each draft token was drawn from — checked
  against plain forwards to 1e-5, with the contexts rebuilt from what the decoder emitted. Nothing
  statistical: a wrong row, a stale cache or an emitted token the verdict did not choose fails.
- and the batched path end to end: the first two tokens (16 cells, V = 4) of DRAWS samples, rows of
  different lengths side by side, against the exact law by chi-square, with the power against a
  TV 0.03 alternative stated and asserted (tests/exactness.py), and a wrong-q twin that must fail.
"""

from __future__ import annotations

import exactness
import pytest
import torch
from helpers import build_tiny_model, chi_square_p_value

from draftsmith.distill.target import Target
from draftsmith.eval.decode import decoder as decoder_module
from draftsmith.eval.decode.decoder import SpeculativeDecoder
from draftsmith.heads.draft_lm.proposer import DraftModelProposer, truncated_target
from draftsmith.heads.runtime.tree import load_tree, topk_chain_paths
from draftsmith.heads.runtime.verify import SamplingConfig, verify_sampling

V = 4
PROMPT, LONGER = [1, 3, 1, 3, 1], [2, 0, 1, 3, 1, 3, 1]
# batched: 200 PROMPT rows (+ 50 LONGER) x 30 calls; power >= 0.95 against TV 0.03 (asserted below)
DRAWS = 6000
T1 = SamplingConfig(temperature=1.0)
T1_ARGMAX_DRAFTS = SamplingConfig(temperature=1.0, draft="greedy")  # vLLM's default and llama.cpp's rule

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def target() -> Target:
    model = build_tiny_model("llama", layers=3, seed=11, vocab_size=V)
    model.generation_config.eos_token_id = 99  # outside the vocabulary: sequences never end early
    return Target(model, tokenizer=None, name="tiny-v4")


@pytest.fixture(scope="module")
def draft():
    return build_tiny_model("llama", layers=1, seed=5, vocab_size=V)


@pytest.fixture(scope="module")
def exact(target) -> torch.Tensor:
    """p(x1, x2 | PROMPT) by plain forwards: [V, V]."""
    law = exactness.model_law(target.model)
    first = law(PROMPT)
    return torch.stack([first[x1] * law(PROMPT + [x1]) for x1 in range(V)])


def proposers(target, draft):
    return {
        "draft-lm sampled chain": (DraftModelProposer(draft, load_tree("chain-3")),
                                   exactness.model_law(draft)),
        "draft-lm top-2 tree": (DraftModelProposer(draft, topk_chain_paths(2, 2)), None),
        "layer-skip top-3 tree": (DraftModelProposer(truncated_target(target, 2), topk_chain_paths(3, 2)),
                                  None),
    }


@pytest.mark.parametrize("name", ["draft-lm sampled chain", "draft-lm top-2 tree", "layer-skip top-3 tree"])
def test_every_verification_sees_the_exact_laws(target, draft, name, monkeypatch):
    proposer, draft_law = proposers(target, draft)[name]
    decoder, g = SpeculativeDecoder(target, proposer), torch.Generator().manual_seed(1)
    law, checked, accepted = exactness.model_law(target.model), 0, 0
    for _ in range(12):
        calls = exactness.record_verifications(monkeypatch, decoder_module)
        out = decoder.generate(PROMPT, 8, T1, g)
        checked += exactness.check_verifier_inputs(calls, PROMPT, out.output_ids, law, draft_law)
        accepted += sum(out.accepted_drafts)
    assert checked > 50 and accepted > 5, (checked, accepted)  # real trees, really accepted


def batched_counts(decoder, seed: int, sampling: SamplingConfig = T1) -> tuple[torch.Tensor, int]:
    """First two tokens of the PROMPT rows (left-padded beside LONGER rows) over DRAWS samples."""
    g = torch.Generator().manual_seed(seed)
    rows = [PROMPT] * 200 + [LONGER] * 50
    counts, accepted = torch.zeros(V, V, dtype=torch.long), 0
    for _ in range(DRAWS // 200):
        for r in decoder.generate_batch(rows, 2, sampling, g).results[:200]:
            counts[tuple(r.output_ids)] += 1
            accepted += sum(r.accepted_drafts)
    return counts, accepted


def test_batched_sampling_matches_the_target(target, draft, exact):
    assert exactness.power(exact, exactness.perturbed(exact, 0.03), DRAWS) >= exactness.POWER
    counts, accepted = batched_counts(SpeculativeDecoder(target, proposers(target, draft)["draft-lm sampled "
                                                                                          "chain"][0]), 1)
    assert counts.sum() == DRAWS and accepted > DRAWS // 4, "drafts must really be accepted"
    assert chi_square_p_value(counts, exact) > exactness.ALPHA


def test_a_wrong_q_in_the_batched_path_fails(target, draft, exact, monkeypatch):
    """Twin: each draft token checked against its child's q (rows off by one: a plumbing slip)."""
    def wrong_q(tokens, buffers, target_probs, draft_probs=None, generator=None):
        shifted = None if draft_probs is None else draft_probs.roll(-1, 0)
        return verify_sampling(tokens, buffers, target_probs, shifted, generator)

    monkeypatch.setattr(decoder_module, "verify_sampling", wrong_q)
    counts, _ = batched_counts(SpeculativeDecoder(target,
                                                  proposers(target, draft)["draft-lm sampled chain"][0]), 1)
    assert chi_square_p_value(counts, exact) < exactness.ALPHA


def test_the_engines_draft_rule_drafts_the_argmax_and_stays_exact(target, draft, exact, monkeypatch):
    """eval.draft_sampling greedy (what vLLM by default and llama.cpp serve at T > 0): every drafted token is
    the drafter's argmax after its parent, no q rows are reported (the verifier takes q one-hot, accepting
    token d with probability p(d)), every verification sees the target's exact laws, and the batched samples
    still follow the target (chi-square at the power asserted above)."""
    decoder = SpeculativeDecoder(target, DraftModelProposer(draft, load_tree("chain-3")))
    law, draft_law, checked, accepted = exactness.model_law(target.model), exactness.model_law(draft), 0, 0
    g = torch.Generator().manual_seed(1)
    for _ in range(12):
        calls = exactness.record_verifications(monkeypatch, decoder_module)
        out = decoder.generate(PROMPT, 8, T1_ARGMAX_DRAFTS, g)
        checked += exactness.check_verifier_inputs(calls, PROMPT, out.output_ids, law)
        context = PROMPT + out.output_ids[:1]
        for tokens, _, _, draft_probs, verdict in calls:
            assert draft_probs is None
            assert tokens == [int(draft_law(context + tokens[:i]).argmax()) for i in range(len(tokens))]
            context = context + verdict.tokens
        accepted += sum(out.accepted_drafts)
    assert checked > 50 and accepted > 5, (checked, accepted)
    counts, accepted = batched_counts(decoder, 1, T1_ARGMAX_DRAFTS)
    assert counts.sum() == DRAWS and accepted > DRAWS // 4, "drafts must really be accepted"
    assert chi_square_p_value(counts, exact) > exactness.ALPHA


def test_argmax_drafts_verified_as_if_drawn_from_q_fail(target, draft, exact, monkeypatch):
    """Twin: argmax drafts reported with the drafter's law as their q (so d is accepted with min(1, p(d)/q(d))
    instead of p(d): an eval that mixed the two rules) no longer follow the target."""
    law, argmax_propose = exactness.model_law(draft), DraftModelProposer.propose

    def mixed(self, context, sampling, generator):
        d = argmax_propose(self, context, T1_ARGMAX_DRAFTS, generator)
        d.probs = torch.stack([law(list(context) + d.tokens[:i]).float() for i in range(d.n)])  # [n, V]
        return d

    monkeypatch.setattr(DraftModelProposer, "propose", mixed)
    counts, _ = batched_counts(SpeculativeDecoder(target, DraftModelProposer(draft, load_tree("chain-3"))), 1)
    assert chi_square_p_value(counts, exact) < exactness.ALPHA
