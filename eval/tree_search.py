"""Static-tree optimisation: the best tree of a node budget from measured per-head rank accuracies.

Between training and eval (`draftsmith tree-opt --run DIR`): a Medusa-style tree assigns each node
at depth d the rank-r candidate of head d-1. If `acc[d-1][r]` is the measured probability that
this candidate is the correct token (given the path above it was correct; heads are treated as
independent, as Medusa does), a path's probability of being fully accepted is the product of its
nodes' accuracies, and the expected τ of a tree is 1 + Σ_nodes P(path to node accepted). The
greedy choice below (always add the frontier node of highest path probability) is optimal for
this objective because a node's probability never exceeds its parent's.

Shapes: `acc [K, R]` (heads x ranks) -> paths (list of rank lists), expected τ (float).
"""

from __future__ import annotations

import heapq
import json
from pathlib import Path

import torch


def optimal_tree(acc: list[list[float]], budget: int) -> tuple[list[list[int]], float]:
    """The `budget`-node tree maximising expected τ for rank accuracies `acc[head][rank]`."""
    heads, ranks = len(acc), len(acc[0])
    frontier = [(-acc[0][r], (r,)) for r in range(ranks)]  # max-heap on path probability
    heapq.heapify(frontier)
    chosen: list[tuple[int, ...]] = []
    expected = 1.0
    while frontier and len(chosen) < budget:
        neg_p, path = heapq.heappop(frontier)
        chosen.append(path)
        expected += -neg_p
        if len(path) < heads:
            for r in range(ranks):
                heapq.heappush(frontier, (neg_p * acc[len(path)][r], (*path, r)))
    return sorted((list(p) for p in chosen), key=lambda p: (len(p), p)), expected


def expected_tau(paths: list[list[int]], acc: list[list[float]]) -> float:
    """1 + Σ over nodes of the product of accuracies along the node's path (same model as above)."""
    total = 1.0
    for path in paths:
        p = 1.0
        for depth, rank in enumerate(path):
            p *= acc[depth][rank] if depth < len(acc) and rank < len(acc[depth]) else 0.0
        total += p
    return total


@torch.no_grad()
def rank_accuracies(heads: torch.nn.Module, batches, ranks: int) -> torch.Tensor:
    """acc [K, R]: how often head k's rank-r candidate is the token at t+k+2 (assistant positions).

    `batches` yield dicts with `input_ids`, `loss_mask` [B, T] and `features["final"]` [B, T, H].
    """
    hits = torch.zeros(heads.num_heads, ranks, dtype=torch.float64)
    counts = torch.zeros(heads.num_heads, dtype=torch.float64)
    for batch in batches:
        ids, mask, hidden = batch["input_ids"], batch["loss_mask"], batch["features"]["final"]
        T = ids.shape[1]
        for k in range(heads.num_heads):
            shift = k + 2
            if T <= shift:
                continue
            keep = mask[:, shift:].bool()  # [B, T-shift]: the label is an assistant token
            h = hidden[:, :T - shift][keep]  # [M, H]
            if h.numel() == 0:
                continue
            logits = heads.heads[k](h.to(next(heads.parameters()).dtype))  # [M, V]
            top = logits.topk(ranks, dim=-1).indices  # [M, R]
            labels = ids[:, shift:][keep]  # [M]
            hits[k] += (top == labels[:, None]).double().sum(0)
            counts[k] += labels.numel()
    return hits / counts.clamp_min(1)[:, None]


def write_tree(paths: list[list[int]], expected_tau: float, acc: torch.Tensor, out: str | Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"paths": paths, "expected_tau": round(expected_tau, 4), "nodes": len(paths),
                               "rank_accuracy": [[round(a, 4) for a in row] for row in acc.tolist()]}, indent=1) + "\n")
    return out
