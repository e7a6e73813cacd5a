"""Static-tree optimisation: the greedy tree is the best tree for the expected-τ model."""

import itertools

import pytest

from draftsmith.heads.runtime.acceptance import optimal_tree, paths_tau
from draftsmith.heads.runtime.tree import paths_to_parents

ACC = [[0.6, 0.2, 0.1], [0.5, 0.2, 0.05], [0.4, 0.1, 0.05]]


def test_chain_when_rank_zero_dominates():
    paths, tau = optimal_tree([[0.9, 0.01], [0.9, 0.01], [0.9, 0.01]], budget=3)
    assert paths == [[0], [0, 0], [0, 0, 0]]
    assert tau == pytest.approx(1 + 0.9 + 0.81 + 0.729)


def test_greedy_tree_is_optimal_among_all_small_trees():
    budget = 4
    paths, tau = optimal_tree(ACC, budget)
    paths_to_parents(paths)  # a valid tree: every prefix present
    assert tau == pytest.approx(paths_tau(paths, ACC))
    every_node = [list(p) for d in range(1, 4) for p in itertools.product(range(3), repeat=d)]
    best = 0.0
    for subset in itertools.combinations(every_node, budget):
        subset = [list(p) for p in subset]
        if all(p[:-1] in subset or len(p) == 1 for p in subset):
            best = max(best, paths_tau(subset, ACC))
    assert tau == pytest.approx(best)


def test_budget_and_depth_limits():
    paths, _ = optimal_tree(ACC, budget=100)
    assert len(paths) == 3 + 9 + 27 and max(len(p) for p in paths) == 3
