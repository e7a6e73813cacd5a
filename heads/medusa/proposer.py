"""The Medusa proposer: K heads on the target's final-normed hidden state at the last verified position.

Head k's top-r token fills every tree node at depth k+1 with rank r (Medusa's cartesian tree: a
node's token does not depend on its parent's). The tree is `drafter.tree`, else the one the heads'
folder recorded (the post-train tree search, `heads/medusa/tree_search.py`), else `medusa-k4-default`
(4+ heads) or a chain over the heads; it may not be deeper than the heads.
"""

from __future__ import annotations

import torch

from draftsmith.heads.runtime.proposer import Draft, Proposer, trained_drafter
from draftsmith.heads.runtime.tree import build_tree_buffers, paths_to_parents, serving_tree


class MedusaProposer(Proposer):
    """Medusa heads drafting a static tree of ranks (see the module doc)."""

    name = "medusa"
    feature_layers = ("final",)

    def __init__(self, heads: torch.nn.Module, paths: list[list[int]]):
        self.heads = heads.eval().requires_grad_(False)
        self.parents, self.ranks = paths_to_parents(paths)
        depth = build_tree_buffers(self.parents).depth[1:].tolist()
        if max(depth) > heads.num_heads:
            raise ValueError(f"tree depth {max(depth)} exceeds the {heads.num_heads} Medusa heads; pick a "
                             "shallower drafter.tree or train more heads (drafter.medusa.heads)")
        self.head_of = [d - 1 for d in depth]
        self.max_rank = max(self.ranks) + 1
        self.last: torch.Tensor | None = None  # [H] final hidden state of the last verified position

    def begin(self, prompt_ids, features) -> None:
        self.last = features["final"][-1]

    def commit(self, new_tokens, features) -> None:
        self.last = features["final"][-1]

    def propose(self, context, sampling, generator) -> Draft:
        x = self.last.to(self.heads_dtype)  # [H]
        # only the heads the tree reaches: each costs a V-wide matmul per step
        logits = torch.stack([head(x) for head in self.heads.heads[: max(self.head_of) + 1]])  # [depth, V]
        top = logits.topk(self.max_rank, dim=-1).indices.tolist()  # [depth][r]
        return Draft(tokens=[top[h][r] for h, r in zip(self.head_of, self.ranks)], parents=self.parents)

    @property
    def heads_dtype(self) -> torch.dtype:
        return next(self.heads.parameters()).dtype


def build(cfg, target, folder=None) -> MedusaProposer:
    heads = trained_drafter(folder, target)
    default = "medusa-k4-default" if heads.num_heads >= 4 else f"chain-{heads.num_heads}"
    tree = serving_tree(cfg, folder.tree, default=default)
    proposer = MedusaProposer(heads, tree.paths)
    proposer.tree = tree.label
    return proposer
