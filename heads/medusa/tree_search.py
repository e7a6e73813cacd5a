"""Static-tree optimisation: the best tree of a node budget from measured per-head rank accuracies.

Between training and eval (`draftsmith tree-opt --run DIR`): a Medusa-style tree assigns each node
at depth d the rank-r candidate of head d-1. If `acc[d-1][r]` is the measured probability that
this candidate is the correct token (given the path above it was correct; heads are treated as
independent, as Medusa does), the expected τ of a tree is 1 + Σ_nodes P(path to node accepted), and
`heads/runtime/acceptance.py optimal_tree` finds the best tree of a budget (the same model `train.select`
uses).

Shapes: `acc [K, R]` (heads x ranks) -> paths (list of rank lists), expected τ (float).

`search_medusa_tree` is Medusa's `tree_search` hook and `medusa_tree_stage` its post-train stage (its row):
with `drafter.tree_nodes > 0` the pipeline runs `search_medusa_tree` after training, which writes
`drafter/tree.json` and records it as the folder's serving tree (draftsmith.json "tree").
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from draftsmith.distill.collate import collate
from draftsmith.distill.extract import target_features
from draftsmith.heads.files import read_meta, update_meta
from draftsmith.heads.medusa.model import MedusaHeads
from draftsmith.heads.runtime.acceptance import optimal_tree, paths_tau
from draftsmith.heads.runtime.tree import load_tree


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
                               "rank_accuracy": [[round(a, 4) for a in row] for row in acc.tolist()]},
                              indent=1) + "\n")
    return out


def search_medusa_tree(folder, target, rows, nodes: int, ranks: int = 10, sequences: int = 64,
                       out: Path | None = None) -> tuple[Path, list[str]]:
    """Best static tree of `nodes` for the Medusa heads of `folder` (heads/folder.py `DrafterFolder`: a
    drafter folder or a Medusa export), from rank accuracies on the first `sequences` validation `rows`;
    writes the tree JSON and returns (its path, report lines)."""
    out = out or Path(folder.path).parent / f"tree-opt-{nodes}.json"
    return tree_for_heads(folder.load(), target, rows, nodes, ranks, sequences, out)


def tree_for_heads(heads: MedusaHeads, target, rows, nodes: int, ranks: int, sequences: int, out: Path
                   ) -> tuple[Path, list[str]]:
    """`search_medusa_tree` on loaded heads."""
    rows = [rows[i] for i in range(min(len(rows), sequences))]
    if not rows:
        raise ValueError("the run's validation split is empty: set data.val_fraction > 0")
    heads = heads.to(target.device, torch.float32)

    def batches():
        for b in range(0, len(rows), 4):
            batch = collate(rows[b: b + 4])
            feats = target_features(target, batch, ["final"], top_k=0)
            yield dict(batch, features={"final": feats["features"]["final"].float()})

    acc = rank_accuracies(heads, batches(), ranks)
    paths, tau = optimal_tree(acc.tolist(), nodes)
    out = write_tree(paths, tau, acc, out)
    lines = [f"[tree-opt] rank accuracy top-1 per head: {[round(a, 3) for a in acc[:, 0].tolist()]}"]
    if heads.num_heads >= 4:
        default = load_tree("medusa-k4-default")
        lines.append(f"[tree-opt] expected τ: medusa-k4-default ({len(default)} nodes) "
                     f"{paths_tau(default, acc.tolist()):.3f}")
    lines.append(f"[tree-opt] expected τ: optimised ({len(paths)} nodes) {tau:.3f} -> {out} (use it with "
                 f"--tree {out})")
    return out, lines


def medusa_tree_stage(cfg, run_dir: Path):
    """Medusa's post-train stage: (name, done, run(target, validation rows) -> report lines), or None when
    the recipe names its tree (`drafter.tree`) or sets no budget (`drafter.tree_nodes`)."""
    nodes, drafter = cfg.drafter.tree_nodes, Path(run_dir) / "drafter"
    if nodes <= 0 or cfg.drafter.tree:
        return None

    def run(target, rows) -> list[str]:
        heads = MedusaHeads.from_pretrained(drafter)
        out, lines = tree_for_heads(heads, target, rows, nodes, 10, 64, drafter / "tree.json")
        update_meta(drafter, tree={"file": out.name, "label": f"tree-opt-{nodes}"})
        return lines

    done = (drafter / "tree.json").is_file() and "tree" in read_meta(drafter)
    return f"tree-opt {nodes}", done, run
