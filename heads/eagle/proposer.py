"""The EAGLE proposer: an EAGLE-1/3 drafter expands a static tree or an EAGLE-2 dynamic tree.

In the flow: the decoder hands the proposer the target's features of every verified position
(`begin` / `commit`); at `propose` the drafter first runs over those new positions with their real
features (its KV cache then covers the whole verified context), then drafts level by level, each
level one forward of the drafter's single layer over the nodes being expanded (`_expand`):

    level 1: out_{p} (last verified position p, token = root) -> top-k children of the root
    level d: node i at depth d-1 is fed (out of its parent, embed(token_i)) at position p+d-1,
             attending to the verified context plus its own ancestors; its logits give its children

Two small paths choose what to expand. Static tree (`_grow_static`): the tree's rank paths fix which
ranks are expanded. Dynamic tree (EAGLE-2, `_grow_dynamic`): each level expands the `topk` nodes of
highest cumulative log-probability; every child is a candidate; at the end the `budget` candidates
with the highest cumulative log-probability are kept (a node is taken only after its parent) and
ordered parents-first. Draft tokens are deterministic (top-k), so exact sampling verifies them as
point masses (q = None).

Shapes: features `[k, H]` per key; drafter queries `[1, q, H]`; mask `[1, 1, q, cached + q]` bool.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from draftsmith.heads.runtime import kv_cache
from draftsmith.heads.runtime.proposer import Draft, Proposer, trained_drafter
from draftsmith.heads.runtime.tree import ServingTree, paths_to_parents, serving_tree


@dataclass
class Pool:
    """The candidate nodes of one draft (draft-vocabulary ids) and what expanding them needs."""

    last: torch.Tensor  # [H]: the drafter's output at the last verified position (predicts the root's child)
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)  # cumulative log-probability
    depths: list[int] = field(default_factory=list)
    # candidate -> its query's index among the drafted entries
    slot: dict[int, int] = field(default_factory=dict)
    # candidate -> output predicting its children
    hidden_of: dict[int, torch.Tensor] = field(default_factory=dict)

    def add(self, parent: int, logp_row: torch.Tensor, depth: int, topk: int, ranks=None) -> list[int]:
        """The parent's top-`topk` children (or only `ranks` of them) as new candidates."""
        top = logp_row.topk(topk)
        base = self.scores[parent] if parent >= 0 else 0.0
        new = []
        for r in range(topk) if ranks is None else ranks:
            self.tokens.append(int(top.indices[r]))
            self.parents.append(parent)
            self.scores.append(base + float(top.values[r]))
            self.depths.append(depth)
            new.append(len(self.tokens) - 1)
        return new


class EagleProposer(Proposer):
    """Drafts with an EAGLE drafter (heads/eagle/model.py) along a `ServingTree` (static paths or dynamic)."""

    def __init__(self, drafter: torch.nn.Module, tree: ServingTree, confidence_threshold: float = 0.0):
        self.drafter = drafter.eval().requires_grad_(False)
        # dynamic trees: a level whose best cumulative probability is below this is not expanded
        self.floor = math.log(confidence_threshold) if confidence_threshold > 0 else None
        self.name = drafter.kind
        self.feature_layers = tuple(drafter.feature_layers)
        self.tree = tree.label
        self.static = None if tree.dynamic else paths_to_parents(tree.paths)
        if self.static:
            parents, ranks = self.static
            self.kids = {i: [j for j, p in enumerate(parents) if p == i] for i in range(-1, len(parents))}
            depths: list[int] = []
            for p in parents:
                depths.append(1 if p < 0 else depths[p] + 1)
            self.depth, self.topk = max(depths), max(ranks) + 1
        else:
            if min(tree.topk, tree.depth, tree.budget) < 1:
                raise ValueError(f"dynamic tree needs topk, depth and budget >= 1 (got {tree.topk}, "
                                 f"{tree.depth}, {tree.budget})")
            self.depth, self.topk, self.budget = tree.depth, tree.topk, tree.budget

    @property
    def device(self) -> torch.device:
        return self.drafter.fc.weight.device

    def begin(self, prompt_ids, features) -> None:
        self.cache = self.drafter.new_cache()
        self.verified = 0  # positions the drafter has run with real features
        # [k, H]
        self.pending = self.drafter.fuse({k: v[None].to(self.device) for k, v in features.items()})[0]

    def commit(self, new_tokens, features) -> None:
        # [k, H]
        self.pending = self.drafter.fuse({k: v[None].to(self.device) for k, v in features.items()})[0]

    def _run(self, hidden, tokens: list[int], positions: list[int], own: torch.Tensor) -> torch.Tensor:
        """Drafter over q queries: each sees every verified position, and `own [q, drafted + q]` of the
        entries after them (earlier tree queries, then these q) -> outputs `[q, H]`."""
        q, cached = len(tokens), kv_cache.cache_length(self.cache)
        mask = torch.zeros(1, 1, q, cached + q, dtype=torch.bool, device=self.device)
        mask[0, 0, :, : self.verified] = True
        mask[0, 0, :, self.verified:] = own
        out = self.drafter.step(hidden[None], torch.tensor([tokens], device=self.device),
                                torch.tensor([positions], device=self.device), mask, self.cache)
        return out[0]

    def _catch_up(self, context: list[int]) -> Pool:
        """Run the drafter over the newly verified positions with their real features."""
        k, start = self.pending.shape[0], self.verified
        if start + k != len(context) - 1:
            raise RuntimeError(f"eagle proposer out of sync: {start} + {k} verified positions, context "
                               f"{len(context)}")
        kv_cache.crop_cache(self.cache, start)
        causal = torch.ones(k, k, dtype=torch.bool, device=self.device).tril()
        out = self._run(self.pending.to(self.drafter.fc.weight.dtype), context[start + 1:],
                        list(range(start, start + k)), causal)
        self.verified = start + k
        return Pool(last=out[-1])

    def _expand(self, pool: Pool, expand: list[int], depth: int) -> torch.Tensor:
        """One drafter forward over the nodes being expanded (at depth-1) -> their children's log-probs
        `[q, Vd]`."""
        d = self.drafter
        drafted = len(pool.slot)
        for i, c in enumerate(expand):
            pool.slot[c] = drafted + i
        visible = torch.zeros(len(expand), drafted + len(expand), dtype=torch.bool, device=self.device)
        for i, c in enumerate(expand):
            node = c
            while node >= 0:  # the query sees its ancestors' queries (when they were fed) and itself
                if node in pool.slot:
                    visible[i, pool.slot[node]] = True
                node = pool.parents[node]
        hid = torch.stack([pool.hidden_of.get(pool.parents[c],
                                              pool.last) if pool.parents[c] >= 0 else pool.last
                           for c in expand])  # [q, H]
        ids = d.draft_to_target(torch.tensor([pool.tokens[c] for c in expand], device=self.device)).tolist()
        q_out = self._run(hid, ids, [self.verified + depth - 2] * len(expand), visible)  # [q, H]
        for i, c in enumerate(expand):
            pool.hidden_of[c] = q_out[i]
        return torch.log_softmax(d.logits(q_out).float(), -1)  # [q, Vd]

    def _grow_static(self, pool: Pool, logp: torch.Tensor) -> list[int]:
        """Expand exactly the tree's rank paths; every candidate is kept."""
        _, ranks = self.static
        node_of = dict(zip(pool.add(-1, logp, 1, self.topk, [ranks[j] for j in self.kids[-1]]),
                           self.kids[-1]))
        level = list(node_of)
        for depth in range(2, self.depth + 1):
            expand = [c for c in level if self.kids[node_of[c]]]
            if not expand:
                break
            rows = self._expand(pool, expand, depth)
            level = []
            for i, c in enumerate(expand):
                kids = self.kids[node_of[c]]
                new = pool.add(c, rows[i], depth, self.topk, [ranks[j] for j in kids])
                node_of.update(zip(new, kids))
                level += new
        return list(range(len(pool.tokens)))

    def _grow_dynamic(self, pool: Pool, logp: torch.Tensor) -> list[int]:
        """EAGLE-2: expand the `topk` best nodes per level, keep the `budget` best candidates."""
        level = pool.add(-1, logp, 1, self.topk)
        for depth in range(2, self.depth + 1):
            expand = sorted(level, key=lambda c: -pool.scores[c])[: self.topk]
            if not expand or (self.floor is not None and pool.scores[expand[0]] < self.floor):
                break
            rows = self._expand(pool, expand, depth)
            level = []
            for i, c in enumerate(expand):
                level += pool.add(c, rows[i], depth, self.topk)
            level = sorted(level, key=lambda c: -pool.scores[c])[: self.topk]
        chosen: set[int] = set()  # the budget best by cumulative log-probability, each only after its parent
        for c in sorted(range(len(pool.scores)), key=lambda c: (-pool.scores[c], c)):
            if len(chosen) == self.budget:
                break
            if pool.parents[c] < 0 or pool.parents[c] in chosen:
                chosen.add(c)
        return sorted(chosen)

    @torch.no_grad()
    def propose(self, context, sampling, generator) -> Draft:
        pool = self._catch_up(context)
        logp = torch.log_softmax(self.drafter.logits(pool.last).float(), -1)  # [Vd]
        keep = self._grow_static(pool, logp) if self.static else self._grow_dynamic(pool, logp)
        kv_cache.crop_cache(self.cache, self.verified)
        order = sorted(keep, key=lambda c: (pool.depths[c], c))  # parents before children
        index = {c: i for i, c in enumerate(order)}
        ids = self.drafter.draft_to_target(torch.tensor([pool.tokens[c] for c in order], device=self.device))
        return Draft(tokens=ids.tolist(),
                     parents=[index[pool.parents[c]] if pool.parents[c] >= 0 else -1 for c in order])


def build(cfg, target, folder=None) -> EagleProposer:
    drafter = trained_drafter(folder, target)
    chain = ServingTree(topk=1, depth=cfg.num_speculative_tokens, budget=cfg.num_speculative_tokens,
                        label=f"dynamic-k1-d{cfg.num_speculative_tokens}-n{cfg.num_speculative_tokens}")
    proposer = EagleProposer(drafter, serving_tree(cfg, folder.tree, default=chain, dynamic=True),
                             cfg.confidence_threshold)
    if cfg.confidence_threshold and not proposer.static:
        proposer.tree += f"-floor{cfg.confidence_threshold:g}"
    return proposer
