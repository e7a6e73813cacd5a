"""Hybrid drafts: a prompt-lookup chain merged into a model drafter's tree, verified in one forward.

`drafter.lookup_branch: N` wraps any model drafter (draft LM, Medusa, EAGLE): each step the model
drafts its tree and prompt lookup (heads/prompt_lookup/proposer.py) its chain of up to N copied tokens; the
chain is merged into the tree as a trie along the model's deterministic nodes (a copied token that the
model also proposed at that place shares its node; the rest hangs below as a new branch). Lookup drafts
cost a scan of the context, and they are strong where the model is weak (translation, summarisation,
RAG copy spans); the verification forward pays for the extra nodes.

With `drafter.lookup_matches: M > 1` the lookup side is a trie of the continuations of up to M different
earlier matches (heads/prompt_lookup/proposer.py), merged the same way.

Exactness: every lookup node is a deterministic proposal (q = point mass). A model draft with sampled
tokens (a draft LM chain at T > 0, with its q) is never merged into: the lookup chain becomes a separate
root branch after it, its rows of q one-hot, which recursive rejection sampling treats exactly as a
deterministic sibling (tests/unit/test_hybrid.py: greedy equality and the verifier's laws).
"""

from __future__ import annotations

import copy

import torch

from draftsmith.heads.runtime.proposer import Draft, Proposer


def merge(model: Draft, lookup: Draft) -> Draft:
    """`model`'s tree with `lookup`'s deterministic tree (a chain, or a lookup trie of several matches) merged
    in (see the module doc); node order stays parents-first."""
    if not lookup.n:
        return model
    tokens, parents = list(model.tokens), list(model.parents)
    children: dict[int, dict[int, int]] = {}
    # deterministic tree: a lookup node shares the model's node of its token at its place
    if model.probs is None:
        for i, p in enumerate(parents):
            children.setdefault(p, {}).setdefault(tokens[i], i)
    where: list[int] = []  # lookup node -> merged node
    for tok, p in zip(lookup.tokens, lookup.parents):
        parent = -1 if p < 0 else where[p]
        node = children.get(parent, {}).get(tok)
        if node is None:
            parents.append(parent)
            tokens.append(tok)
            node = len(tokens) - 1
        where.append(node)
    probs = model.probs
    if probs is not None:
        extra = torch.zeros(len(tokens) - model.n, probs.shape[1], dtype=probs.dtype, device=probs.device)
        extra[torch.arange(extra.shape[0]), torch.tensor(tokens[model.n:])] = 1.0  # point masses
        probs = torch.cat([probs, extra])
    return Draft(tokens=tokens, parents=parents, probs=probs)


class HybridProposer(Proposer):
    """`inner`'s drafts with `lookup`'s chain merged in; state (caches, features) is the inner proposer's."""

    def __init__(self, inner: Proposer, lookup: Proposer):
        self.inner, self.lookup = inner, lookup
        self.name = f"{inner.name}+lookup"
        self.tree = f"{inner.tree}+{lookup.branch_label}"
        self.feature_layers = inner.feature_layers

    def __copy__(self) -> HybridProposer:  # the decoder copies one proposer per batch row: the state too
        return HybridProposer(copy.copy(self.inner), self.lookup)

    def begin(self, prompt_ids, features) -> None:
        self.inner.begin(prompt_ids, features)

    def propose(self, context, sampling, generator) -> Draft:
        return merge(self.inner.propose(context, sampling, generator),
                     self.lookup.propose(context, sampling, generator))

    def commit(self, new_tokens, features) -> None:
        self.inner.commit(new_tokens, features)
