"""Acceptance rules (heads/runtime/verify.py): exact stub outcomes and exact-sampling chi-square tests.

The chi-square tests run a tiny speculative loop over a toy Markov "target" P and "draft" Q on
V = 6 tokens and compare the empirical law of the first two generated tokens with P's exact law, each
rule beside subtle negative twins whose enumerated laws give the test's power (tests/exactness.py).
"""

import bisect
import itertools
import random

import exactness
import pytest
import torch
from helpers import chi_square_p_value, leaf_paths

from draftsmith.heads.runtime.tree import build_tree_buffers, chain_parents, paths_to_parents
from draftsmith.heads.runtime.verify import (
    SamplingConfig,
    Verdict,
    logits_to_probs,
    verify_greedy,
    verify_sampling,
)

V = 10
TWO_LEVEL = [[0], [1], [0, 0], [0, 1], [1, 0]]


def _logits_with_argmax(tops: list[int]) -> torch.Tensor:
    logits = torch.randn(len(tops), V, generator=torch.Generator().manual_seed(0))  # [n+1, V]
    logits[torch.arange(len(tops)), tops] = 10.0
    return logits


# ---------------------------------------------------------------- greedy, stub targets


@pytest.mark.parametrize(
    "tops, expected",
    [
        ([9, 6, 7, 8], Verdict([], [9])),  # never accepts
        ([5, 6, 7, 8], Verdict([1, 2, 3], [5, 6, 7, 8])),  # always accepts
        ([5, 6, 2, 0], Verdict([1, 2], [5, 6, 2])),  # partly accepts
    ],
)
def test_greedy_chain(tops, expected):
    buffers = build_tree_buffers(chain_parents(3))
    assert verify_greedy([5, 6, 7], buffers, _logits_with_argmax(tops)) == expected
    assert verify_greedy(torch.tensor([5, 6, 7]), buffers, _logits_with_argmax(tops)) == expected


@pytest.mark.parametrize(
    "tops, expected",
    [
        ([0, 5, 7, 1, 1, 1], Verdict([], [0])),
        ([4, 5, 7, 1, 1, 2], Verdict([2, 5], [4, 7, 2])),  # second branch, to its leaf
        ([3, 6, 7, 1, 8, 1], Verdict([1, 4], [3, 6, 8])),  # first branch, second child
        ([3, 9, 7, 1, 1, 1], Verdict([1], [3, 9])),  # stops after depth 1
    ],
)
def test_greedy_tree(tops, expected):
    buffers = build_tree_buffers(paths_to_parents(TWO_LEVEL)[0])
    tokens = [3, 4, 5, 6, 7]  # tree index 1..5
    assert verify_greedy(tokens, buffers, _logits_with_argmax(tops)) == expected


def test_greedy_duplicate_siblings_take_the_longest_path():
    buffers = build_tree_buffers(paths_to_parents(TWO_LEVEL)[0])
    tokens = [3, 3, 5, 6, 7]  # both depth-1 nodes carry token 3
    # Only the second sibling's child matches: it must win although it comes later.
    verdict = verify_greedy(tokens, buffers, _logits_with_argmax([3, 9, 7, 0, 0, 4]))
    assert verdict == Verdict([2, 5], [3, 7, 4])
    # Both continue equally far: first in node order.
    verdict = verify_greedy(tokens, buffers, _logits_with_argmax([3, 5, 7, 1, 0, 4]))
    assert verdict == Verdict([1, 3], [3, 5, 1])


# ---------------------------------------------------------------- logits_to_probs


def test_logits_to_probs_warping():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    assert logits_to_probs(logits, SamplingConfig()).tolist() == [[1.0, 0.0, 0.0, 0.0]]
    full = logits_to_probs(logits, SamplingConfig(temperature=1.0))
    assert torch.allclose(full, logits.softmax(-1))
    top2 = logits_to_probs(logits, SamplingConfig(temperature=1.0, top_k=2))
    assert top2[0, 2:].tolist() == [0.0, 0.0] and torch.allclose(top2[0, :2], logits[0, :2].softmax(-1))
    # Sorted masses ~ [.64, .24, .09, .03]: top_p 0.8 keeps two, 0.5 keeps the top token only.
    nucleus = logits_to_probs(logits, SamplingConfig(temperature=1.0, top_p=0.8))
    assert torch.allclose(nucleus[0, :2], logits[0, :2].softmax(-1)) and nucleus[0, 2:].sum() == 0
    assert logits_to_probs(logits, SamplingConfig(temperature=1.0, top_p=0.5)).tolist() == [[1.0, 0, 0, 0]]
    hot = logits_to_probs(logits, SamplingConfig(temperature=0.5))
    assert torch.allclose(hot, (logits / 0.5).softmax(-1))
    with pytest.raises(ValueError):
        SamplingConfig(top_p=0.0)


# ---------------------------------------------------------------- sampling, stub targets


def _random_probs(rows: int, support: range, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    probs = torch.zeros(rows, V)  # [rows, V]
    probs[:, support.start : support.stop] = torch.rand(rows, len(support), generator=g) + 0.1
    return probs / probs.sum(-1, keepdim=True)


@pytest.mark.parametrize("parents", [chain_parents(4), paths_to_parents(TWO_LEVEL)[0]])
def test_sampling_accepts_everything_when_draft_equals_target(parents):
    buffers = build_tree_buffers(parents)
    target = _random_probs(buffers.n + 1, range(V), seed=1)  # [n+1, V]
    draft = target[[p + 1 for p in parents]]  # node i drawn from its parent's target row
    expected_path = leaf_paths(buffers.parents)[0][1:]  # first child at every level
    for seed in range(50):
        tokens = [int(torch.multinomial(row, 1)) for row in draft]
        verdict = verify_sampling(tokens, buffers, target, draft, torch.Generator().manual_seed(seed))
        assert verdict.accepted == [j for j in expected_path if j >= 0]


@pytest.mark.parametrize("with_draft_probs", [True, False])
def test_sampling_rejects_disjoint_support(with_draft_probs):
    buffers = build_tree_buffers(paths_to_parents(TWO_LEVEL)[0])
    target = _random_probs(buffers.n + 1, range(0, 4), seed=2)  # [n+1, V]
    draft = _random_probs(buffers.n, range(4, V), seed=3)  # [n, V]
    tokens = [4, 5, 6, 7, 8]
    for seed in range(100):
        g = torch.Generator().manual_seed(seed)
        verdict = verify_sampling(tokens, buffers, target, draft if with_draft_probs else None, g)
        assert verdict.accepted == [] and len(verdict.tokens) == 1 and 0 <= verdict.tokens[0] < 4


def test_sampling_with_one_hot_target_is_greedy():
    buffers = build_tree_buffers(paths_to_parents(TWO_LEVEL)[0])
    logits = _logits_with_argmax([4, 5, 7, 1, 1, 2])
    target = logits_to_probs(logits, SamplingConfig())
    tokens = [3, 4, 5, 6, 7]
    for seed in range(10):
        g = torch.Generator().manual_seed(seed)
        assert verify_sampling(tokens, buffers, target, None, g) == verify_greedy(tokens, buffers, logits)


# ---------------------------------------------------------------- exact sampling, with stated power
#
# A toy Markov "target" P and "draft" Q over V = 6 tokens: the first two generated tokens (36 cells)
# of DRAWS speculative runs against P's exact law P(x1) P(x2 | x1). Each rule is run correct and as a
# subtle negative twin; the twin's own law is enumerated (tests/exactness.py), so its total variation
# from the target and the test's power against it (P(fail at p < ALPHA) with DRAWS draws) are stated
# and asserted, not hoped for. At DRAWS = 10000: twins' TV 0.05-0.28, power 1.000 each, and 0.998
# against a generic alternative at TV 0.03 (python scripts/bench/exactness/exactness_power.py writes the
# table).

TOY_V = 6
START = 0
DRAWS = 10_000
_Q_LOGITS = torch.randn(TOY_V, TOY_V, generator=torch.Generator().manual_seed(12))
P = (torch.randn(TOY_V, TOY_V, generator=torch.Generator().manual_seed(11))).softmax(-1)  # [V, V] row = prev
Q = (_Q_LOGITS / 0.7).softmax(-1)  # what the draft samples from
Q_UNWARPED = _Q_LOGITS.softmax(-1)  # twin: the verifier handed the draft's T=1 law instead of its T=0.7 one
Q_CDF = [list(itertools.accumulate(row)) for row in Q.double().tolist()]
EXACT = (P[START].unsqueeze(1) * P).double()  # [V, V]

SHAPES = {"sampled chain": ([-1, 0, 1], True), "i.i.d. sampled siblings": ([-1, -1, 0, 1], True),
          "deterministic top-2 tree": ([-1, -1, 0, 1], False)}
TWINS = {  # rule -> the subtle bugs it is tested against
    "sampled chain": ["wrong q", "bonus from p, not the residual"],
    "i.i.d. sampled siblings": ["unnormalised residual", "wrong q"],
    "deterministic top-2 tree": ["unnormalised residual", "bonus from p, not the residual"],
}
UPDATES = {"unnormalised residual": exactness.unnormalised_update,
           "bonus from p, not the residual": exactness.keep_p_update}


def _unwarped(rows: torch.Tensor) -> torch.Tensor:
    """The wrong q: for each row of Q handed to the verifier, the same draft context's unwarped law."""
    return Q_UNWARPED[[int((Q - r).abs().sum(1).argmin()) for r in rows]]


def _draw(rng: random.Random, prev: int) -> int:
    return min(bisect.bisect_right(Q_CDF[prev], rng.random() * Q_CDF[prev][-1]), TOY_V - 1)


def _draft(shape: str, rng, last):
    """(parents, tokens, q rows or None): one draft of `shape` from the state after `last`."""
    parents, sampled = SHAPES[shape]
    if not sampled:
        return (parents, *exactness.markov_drafts(Q, parents, last, sampled=False)[0][1:])
    tokens: list[int] = []
    for par in parents:
        tokens.append(_draw(rng, last if par < 0 else tokens[par]))
    return parents, tokens, Q[[last if par < 0 else tokens[par] for par in parents]]


def _verifier(twin: str | None):
    if twin == "wrong q":
        return lambda tokens, bufs, tp, dp, g: verify_sampling(tokens, bufs, tp,
                                                               None if dp is None else _unwarped(dp), g)
    if twin in UPDATES:
        return lambda tokens, bufs, tp, dp, g: verify_sampling(tokens, bufs, tp, dp, g,
                                                               residual=UPDATES[twin])
    return verify_sampling


def _speculate_first_two(shape: str, twin: str | None, seed: int) -> tuple[torch.Tensor, float]:
    """Counts [V, V] of the first two generated tokens over DRAWS speculative runs from START,
    and the mean number of accepted draft tokens per verification."""
    rng, g, verify = random.Random(seed), torch.Generator().manual_seed(seed), _verifier(twin)
    buffers_by_shape = {}
    counts = torch.zeros(TOY_V, TOY_V, dtype=torch.long)  # [V, V]
    verifications = accepted = 0
    for _ in range(DRAWS):
        generated: list[int] = []
        last = START
        while len(generated) < 2:
            parents, tokens, draft_probs = _draft(shape, rng, last)
            key = tuple(parents)
            if key not in buffers_by_shape:
                buffers_by_shape[key] = build_tree_buffers(parents)
            target_probs = P[[last] + tokens]  # [n+1, V] Markov: row j depends on tree index j's token
            verdict = verify(tokens, buffers_by_shape[key], target_probs, draft_probs, g)
            generated += verdict.tokens
            verifications += 1
            accepted += len(verdict.accepted)
            last = generated[-1]
        counts[generated[0], generated[1]] += 1
    return counts, accepted / verifications


def _enumerated_law(shape: str, twin: str | None) -> torch.Tensor:
    parents, sampled = SHAPES[shape]
    update = UPDATES.get(twin, exactness.correct_update)
    shown = _unwarped if twin == "wrong q" else None

    def step(last):
        drafts = exactness.markov_drafts(Q.double(), parents, last, sampled)
        return exactness.rule_law(parents, drafts,
                                  lambda j, toks: P[last if j == 0 else toks[j - 1]].double(), update, shown)

    return exactness.first_two(step, START, TOY_V)


def test_toy_tables_differ():
    assert (P - Q).abs().sum(-1).min() > 0.3  # the draft is genuinely wrong somewhere in every row


@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_enumeration_of_the_correct_rule_is_the_target_law(shape):
    """The enumeration the power figures rest on gives exactly P's law for the correct rule."""
    assert exactness.tv(_enumerated_law(shape, None), EXACT) < 1e-6  # float32 tables: TV ~5e-8


@pytest.mark.parametrize("shape", list(SHAPES))
def test_speculative_sampling_is_exact(shape):
    counts, mean_accepted = _speculate_first_two(shape, None, seed=123)
    assert mean_accepted > 0.2  # drafts are really used, so the test exercises acceptance
    assert chi_square_p_value(counts, EXACT) > exactness.ALPHA
    assert exactness.power(EXACT, exactness.perturbed(EXACT, 0.03), DRAWS) >= exactness.POWER


@pytest.mark.parametrize("shape,twin", [(s, t) for s, twins in TWINS.items() for t in twins])
def test_a_subtly_wrong_rule_fails(shape, twin):
    law = _enumerated_law(shape, twin)
    distance, caught = exactness.tv(law, EXACT), exactness.power(EXACT, law, DRAWS)
    assert 0.02 < distance < 0.3, distance  # subtle: a few percent of the mass moves
    assert caught >= exactness.POWER, (distance, caught)
    counts, _ = _speculate_first_two(shape, twin, seed=123)
    assert chi_square_p_value(counts, EXACT) < exactness.ALPHA, (twin, distance)
