"""The one acceptance tally: τ, acceptance by depth, and the expected τ of a chain or a tree from accuracies.

Used wherever acceptance is counted: the decoder's per-sequence results, the eval summary and its
categories, bench configurations and calibrations (all through `tau` / `acceptance_by_depth` on
results), and training validation (every kind's `compute_loss` reports `chain_tau` of its per-depth
top-1 accuracies, the simulated τ of greedy chain drafting; in eval mode the drafters that draft trees
also report rank accuracies per depth, `rank_metrics`, from which `serving_tau` simulates the recipe's
serving tree and `train.select` chooses). Static-tree search (`optimal_tree`, Medusa's tree-opt) uses
the same model.

Tree model (Medusa's): a node at depth d holding the drafter's rank-r candidate is right with probability
`acc[d][r]` given its path was right (siblings are exclusive: at most one is the target's token); a path's
probability is the product along it, and a tree's expected τ is 1 + Σ_nodes P(path to the node accepted).

Conventions (the field's, see docs/counting.md):
- τ = tokens emitted per target verification forward, the target's bonus token included (plain
  decoding = 1.0); the prefill forward is not a step.
- n-α at depth d = P(draft token d accepted | tokens 1..d-1 accepted and the draft had a node at depth d
  below them). An uneven tree whose accepted path ends at a shallow leaf tried nothing deeper: that step
  is no trial at the next depth (counting it as a rejection would understate n-α).

A result is anything with `accept_lengths` (tokens per step), `draft_depths` (per step, the deepest draft
depth below the accepted path, 0 = none) and `accepted_drafts` (draft tokens accepted per step), e.g.
`GenerationResult`.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

RANKS = 8  # sibling ranks whose accuracies validation reports (a serving tree's top-k beyond this counts 0)
RANK_KEY = "rank_acc/{depth}/{rank}"


def tau(results: Iterable) -> float:
    """Mean tokens per verification step over every step of `results` (1.0 when there is none)."""
    steps = [a for r in results for a in r.accept_lengths]
    return sum(steps) / len(steps) if steps else 1.0


def acceptance_by_depth(results: Iterable) -> list[float]:
    """n-α per depth 1..D over every step of `results` (rounded to 4 digits)."""
    trials: dict[int, int] = {}
    hits: dict[int, int] = {}
    for r in results:
        for depth, acc in zip(r.draft_depths, r.accepted_drafts):
            for d in range(1, min(depth, acc + 1) + 1):
                trials[d] = trials.get(d, 0) + 1
                hits[d] = hits.get(d, 0) + (acc >= d)
    return [round(hits[d] / trials[d], 4) for d in sorted(trials)]


def chain_tau(accuracies: list[float], length: int) -> float:
    """Expected τ of a `length`-token chain whose token d is right with probability `accuracies[d]`
    given the ones before it (the last accuracy repeats past the end): 1 + Σ_d Π_{i<=d} acc_i."""
    tau_, chain = 1.0, 1.0
    for d in range(length):
        chain *= accuracies[min(d, len(accuracies) - 1)] if accuracies else 0.0
        tau_ += chain
    return tau_


def optimal_tree(acc: list[list[float]], budget: int) -> tuple[list[list[int]], float]:
    """The `budget`-node tree maximising expected τ for rank accuracies `acc[depth][rank]` (module doc): the
    greedy choice (always add the frontier node of highest path probability) is optimal because a node's
    probability never exceeds its parent's."""
    depths, ranks = len(acc), len(acc[0])
    frontier = [(-acc[0][r], (r,)) for r in range(ranks)]  # max-heap on path probability
    heapq.heapify(frontier)
    chosen: list[tuple[int, ...]] = []
    expected = 1.0
    while frontier and len(chosen) < budget:
        neg_p, path = heapq.heappop(frontier)
        chosen.append(path)
        expected += -neg_p
        if len(path) < depths:
            for r in range(ranks):
                heapq.heappush(frontier, (neg_p * acc[len(path)][r], (*path, r)))
    return sorted((list(p) for p in chosen), key=lambda p: (len(p), p)), expected


def paths_tau(paths: list[list[int]], acc: list[list[float]]) -> float:
    """Expected τ of the tree `paths` (each node as its rank path from the root) under `acc[depth][rank]`."""
    total = 1.0
    for path in paths:
        p = 1.0
        for depth, rank in enumerate(path):
            p *= acc[depth][rank] if depth < len(acc) and rank < len(acc[depth]) else 0.0
        total += p
    return total


def rank_metrics(depth: int, candidates, labels) -> dict[str, float]:
    """Validation metrics of one drafting depth: how often the drafter's rank-r candidate is the label.
    candidates `[N, R]` token ids (best first), labels `[N]`; no position gives zeros."""
    ranks = candidates.shape[-1]
    if labels.numel() == 0:
        return {RANK_KEY.format(depth=depth, rank=r): 0.0 for r in range(ranks)}
    hits = (candidates == labels[:, None]).float().mean(0).tolist()
    return {RANK_KEY.format(depth=depth, rank=r): hits[r] for r in range(ranks)}


def rank_matrix(metrics: dict) -> list[list[float]]:
    """`acc[depth][rank]` from `rank_metrics` keys (averaged by validation); [] when there are none."""
    cells = {}
    for key, value in metrics.items():
        parts = key.split("/")
        if len(parts) == 3 and parts[0] == "rank_acc":
            cells[int(parts[1]), int(parts[2])] = value
    if not cells:
        return []
    depths, ranks = max(d for d, _ in cells) + 1, max(r for _, r in cells) + 1
    return [[cells.get((d, r), 0.0) for r in range(ranks)] for d in range(depths)]


def serving_tau(metrics: dict, depth: int, nodes: int, topk: int, recurrent: bool = True) -> float | None:
    """Simulated τ of the serving tree a drafter config asks for (`drafter.num_speculative_tokens` deep,
    `drafter.tree_nodes` nodes of at most `drafter.tree_topk` children; 0 nodes = a chain of `depth`) from
    validation rank accuracies; None without them. A recurrent drafter (it feeds itself: EAGLE, draft LMs)
    drafts past its measured depths, the last one standing in for deeper ones, and its dynamic tree takes at
    most `topk` children a node; fixed heads (Medusa) stop at theirs and their tree-opt tree takes any
    measured rank.
    A dynamic tree (EAGLE-2) picks its nodes by the drafter's own confidence, the static optimum here by the
    measured accuracies: the simulation is the tree that budget could buy at best."""
    acc = rank_matrix(metrics)
    if not acc:
        return None
    depth, ranks = (depth, max(1, topk)) if recurrent else (min(depth, len(acc)), len(acc[0]))
    acc = [acc[min(d, len(acc) - 1)][:ranks] for d in range(depth)]
    if nodes <= 0:
        return chain_tau([row[0] for row in acc], depth)
    return optimal_tree(acc, nodes)[1]
