"""The EAGLE proposer: an EAGLE-1/3 drafter expands a static tree or an EAGLE-2 dynamic tree.

In the flow: the decoder hands the proposer the target's features of every verified position
(`begin` / `commit`); at `propose` the drafter first runs over those new positions with their real
features (its KV cache then covers the whole verified context), then drafts level by level, each
level one forward of the drafter's single layer over the nodes being expanded:

    level 1: out_{p} (last verified position p, token = root) -> top-k children of the root
    level d: node i at depth d-1 is fed (out of its parent, embed(token_i)) at position p+d-1,
             attending to the verified context plus its own ancestors; its logits give its children

Dynamic tree (EAGLE-2): each level expands the `topk` nodes of highest cumulative log-probability;
every child is a candidate; at the end the `budget` candidates with the highest cumulative
log-probability are kept (a node is taken only after its parent) and ordered parents-first. Static
tree: `paths` fix which ranks are expanded. Draft tokens are deterministic (top-k), so exact
sampling verifies them as point masses (q = None).

Shapes: features `[k, H]` per key; drafter queries `[1, q, H]`; mask `[1, 1, q, cached + q]` bool.
"""

from __future__ import annotations

import torch

from draftsmith.eval import kv_cache
from draftsmith.eval.proposers import Draft, Proposer
from draftsmith.eval.tree import paths_to_parents


class EagleProposer(Proposer):
    """Drafts with an `EagleDrafter` (heads/eagle.py); `paths` = static tree, else dynamic (topk, depth, budget)."""

    def __init__(self, drafter: torch.nn.Module, paths: list[list[int]] | None = None, topk: int = 4,
                 depth: int = 5, budget: int = 16):
        self.drafter = drafter.eval().requires_grad_(False)
        self.name = drafter.kind
        self.feature_layers = tuple(drafter.feature_layers)
        self.static = paths_to_parents(paths) if paths else None
        if self.static:
            parents, ranks = self.static
            depths: list[int] = []
            for p in parents:
                depths.append(1 if p < 0 else depths[p] + 1)
            self.static_depth = depths
            self.depth, self.topk = max(depths), max(ranks) + 1
        else:
            if topk < 1 or depth < 1 or budget < 1:
                raise ValueError(f"dynamic tree needs topk, depth and budget >= 1 (got {topk}, {depth}, {budget})")
            self.depth, self.topk, self.budget = depth, topk, budget
        self.tree = f"static-{len(paths)}" if paths else f"dynamic-k{topk}-d{depth}-n{budget}"

    @property
    def device(self) -> torch.device:
        return self.drafter.fc.weight.device

    def begin(self, prompt_ids, features) -> None:
        self.cache = self.drafter.new_cache()
        self.verified = 0  # positions the drafter has run with real features
        self.pending = self.drafter.fuse({k: v[None].to(self.device) for k, v in features.items()})[0]  # [k, H]

    def commit(self, new_tokens, features) -> None:
        self.pending = self.drafter.fuse({k: v[None].to(self.device) for k, v in features.items()})[0]  # [k, H]

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

    @torch.no_grad()
    def propose(self, context, sampling, generator) -> Draft:
        d = self.drafter
        k = self.pending.shape[0]
        start = self.verified
        if start + k != len(context) - 1:
            raise RuntimeError(f"eagle proposer out of sync: {start} + {k} verified positions, context {len(context)}")
        kv_cache.crop_cache(self.cache, start)
        causal = torch.ones(k, k, dtype=torch.bool, device=self.device).tril()
        out = self._run(self.pending.to(d.fc.weight.dtype), context[start + 1:], list(range(start, start + k)), causal)
        self.verified = start + k
        last = out[-1]  # [H]: predicts the token after the root
        logp = torch.log_softmax(d.logits(last).float(), -1)  # [Vd]
        tokens, parents, scores, depths = [], [], [], []  # candidate pool (draft-vocabulary ids)
        slot: dict[int, int] = {}  # candidate -> its query's index among the drafted cache entries
        hidden_of: dict[int, torch.Tensor] = {}  # candidate -> the output that predicts its children

        def add_children(parent: int, logp_row: torch.Tensor, base: float, depth: int, ranks=None) -> list[int]:
            top = logp_row.topk(self.topk)
            picked = range(self.topk) if ranks is None else ranks
            new = []
            for r in picked:
                tokens.append(int(top.indices[r]))
                parents.append(parent)
                scores.append(base + float(top.values[r]))
                depths.append(depth)
                new.append(len(tokens) - 1)
            return new

        if self.static:
            s_parents, s_ranks = self.static
            level = add_children(-1, logp, 0.0, 1, [s_ranks[i] for i, p in enumerate(s_parents) if p < 0])
            static_of = {c: i for c, i in zip(level, [i for i, p in enumerate(s_parents) if p < 0])}
        else:
            level = add_children(-1, logp, 0.0, 1)
        for depth in range(2, self.depth + 1):
            if self.static:
                expand = [c for c in level if any(p == static_of[c] for p in s_parents)]
            else:
                expand = sorted(level, key=lambda c: -scores[c])[: self.topk]
            if not expand:
                break
            drafted = len(slot)
            for i, c in enumerate(expand):
                slot[c] = drafted + i
            visible = torch.zeros(len(expand), drafted + len(expand), dtype=torch.bool, device=self.device)
            for i, c in enumerate(expand):
                node = c
                while node >= 0:  # the query sees its ancestors' queries (when they were fed) and itself
                    if node in slot:
                        visible[i, slot[node]] = True
                    node = parents[node]
            hid = torch.stack([hidden_of.get(parents[c], last) if parents[c] >= 0 else last for c in expand])  # [q, H]
            ids = d.draft_to_target(torch.tensor([tokens[c] for c in expand], device=self.device)).tolist()  # one map per level
            pos = [self.verified + depth - 2] * len(expand)
            q_out = self._run(hid, ids, pos, visible)  # [q, H]
            rows = torch.log_softmax(d.logits(q_out).float(), -1)  # [q, Vd]
            level = []
            for i, c in enumerate(expand):
                hidden_of[c] = q_out[i]
                if self.static:
                    kids = [j for j, p in enumerate(s_parents) if p == static_of[c]]
                    new = add_children(c, rows[i], scores[c], depth, [s_ranks[j] for j in kids])
                    static_of.update(zip(new, kids))
                else:
                    new = add_children(c, rows[i], scores[c], depth)
                level += new
            if not self.static:
                level = sorted(level, key=lambda c: -scores[c])[: self.topk]
        kv_cache.crop_cache(self.cache, self.verified)
        keep = list(range(len(tokens))) if self.static else self._rerank(parents, scores)
        return self._draft(keep, tokens, parents, depths)

    def _rerank(self, parents: list[int], scores: list[float]) -> list[int]:
        """The `budget` best candidates by cumulative log-probability, each only after its parent."""
        chosen: set[int] = set()
        for c in sorted(range(len(scores)), key=lambda c: (-scores[c], c)):
            if len(chosen) == self.budget:
                break
            if parents[c] < 0 or parents[c] in chosen:
                chosen.add(c)
        return sorted(chosen)

    def _draft(self, keep: list[int], tokens, parents, depths) -> Draft:
        order = sorted(keep, key=lambda c: (depths[c], c))  # parents before children
        index = {c: i for i, c in enumerate(order)}
        ids = self.drafter.draft_to_target(torch.tensor([tokens[c] for c in order], device=self.device))
        return Draft(tokens=ids.tolist(), parents=[index[parents[c]] if parents[c] >= 0 else -1 for c in order])
