"""Acceptance rules (eval/verify.py): exact stub outcomes and exact-sampling chi-square tests.

The chi-square tests run a tiny speculative loop over a toy Markov "target" P and "draft" Q on
V = 8 tokens and compare the empirical law of the first two generated tokens with P's exact law.
"""

import bisect
import itertools
import random

import pytest
import torch
from helpers import chi_square_p_value, leaf_paths

from draftsmith.eval.tree import build_tree_buffers, chain_parents, paths_to_parents
from draftsmith.eval.verify import (
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


# ---------------------------------------------------------------- exact sampling, chi-square

TOY_V = 8
START = 0
DRAWS = 20_000


def _markov_table(seed: int, temperature: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(TOY_V, TOY_V, generator=g) / temperature).softmax(-1)  # [V, V] row = prev token


P = _markov_table(seed=11, temperature=1.0)
Q = _markov_table(seed=12, temperature=0.7)
Q_CDF = [list(itertools.accumulate(row)) for row in Q.double().tolist()]


def _draw(rng: random.Random, prev: int) -> int:
    return min(bisect.bisect_right(Q_CDF[prev], rng.random() * Q_CDF[prev][-1]), TOY_V - 1)


def _draft_chain(rng, last):
    tokens = [_draw(rng, last)]
    for _ in range(2):
        tokens.append(_draw(rng, tokens[-1]))
    return chain_parents(3), tokens, Q[[last] + tokens[:-1]]


def _draft_iid_tree(rng, last):
    first = [_draw(rng, last), _draw(rng, last)]  # i.i.d., with replacement
    tokens = first + [_draw(rng, x) for x in first]
    return [-1, -1, 0, 1], tokens, Q[[last, last] + first]


def _draft_top2_tree(rng, last):
    first = Q[last].topk(2).indices.tolist()
    tokens = first + [int(Q[x].argmax()) for x in first]
    return [-1, -1, 0, 1], tokens, None


def _speculate_first_two(draft_fn, verify_fn, seed: int) -> tuple[torch.Tensor, float]:
    """Counts [V, V] of the first two generated tokens over DRAWS speculative runs from START,
    and the mean number of accepted draft tokens per verification."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    buffers_by_shape = {}
    counts = torch.zeros(TOY_V, TOY_V, dtype=torch.long)  # [V, V]
    verifications = accepted = 0
    for _ in range(DRAWS):
        generated: list[int] = []
        last = START
        while len(generated) < 2:
            parents, tokens, draft_probs = draft_fn(rng, last)
            key = tuple(parents)
            if key not in buffers_by_shape:
                buffers_by_shape[key] = build_tree_buffers(parents)
            target_probs = P[[last] + tokens]  # [n+1, V] Markov: row j depends on tree index j's token
            verdict = verify_fn(tokens, buffers_by_shape[key], target_probs, draft_probs, g)
            generated += verdict.tokens
            verifications += 1
            accepted += len(verdict.accepted)
            last = generated[-1]
        counts[generated[0], generated[1]] += 1
    return counts, accepted / verifications


def _chi_square_p_value(counts: torch.Tensor) -> float:
    return chi_square_p_value(counts, P[START].unsqueeze(1) * P)  # P(x1) P(x2 | x1) over [V, V]


def _verify_chain_wrongly(tokens, buffers, target_probs, draft_probs, generator):
    """A plausible bug: the acceptance ratio inverted to min(1, q/p). Not exact."""
    accepted: list[int] = []
    for i, x in enumerate(tokens):
        p, q = target_probs[i], draft_probs[i]
        if float(torch.rand((), generator=generator)) * float(p[x]) < float(q[x]):
            accepted.append(i + 1)
            continue
        residual = (p - q).clamp_min(0.0)
        bonus = int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
        return Verdict(accepted, tokens[: len(accepted)] + [bonus])
    bonus = int(torch.multinomial(target_probs[len(tokens)], 1, generator=generator))
    return Verdict(accepted, tokens + [bonus])


def test_toy_tables_differ():
    assert (P - Q).abs().sum(-1).min() > 0.3  # the draft is genuinely wrong somewhere in every row


@pytest.mark.parametrize("draft_fn", [_draft_chain, _draft_iid_tree, _draft_top2_tree])
def test_speculative_sampling_is_exact(draft_fn):
    counts, mean_accepted = _speculate_first_two(draft_fn, verify_sampling, seed=123)
    assert mean_accepted > 0.2  # drafts are really used, so the test exercises acceptance
    assert _chi_square_p_value(counts) > 1e-3


def test_chi_square_catches_a_wrong_rule():
    counts, _ = _speculate_first_two(_draft_chain, _verify_chain_wrongly, seed=123)
    assert _chi_square_p_value(counts) < 1e-6
