"""The bigram kind's proposer: a greedy chain read off the table."""

from __future__ import annotations

from draftsmith.heads.runtime.proposer import Draft, Proposer, trained_drafter
from draftsmith.heads.runtime.tree import chain_parents

from .model import BigramDrafter


class BigramProposer(Proposer):
    name = "bigram"

    def __init__(self, drafter: BigramDrafter, length: int):
        self.drafter, self.length = drafter.eval().requires_grad_(False), length
        self.tree = f"chain-{length}"

    def propose(self, context, sampling, generator) -> Draft:
        tokens, last = [], context[-1]
        for _ in range(self.length):
            last = int(self.drafter.table[last].argmax())
            tokens.append(last)
        return Draft(tokens=tokens, parents=chain_parents(len(tokens)))


def build_proposer(cfg, target, folder=None) -> BigramProposer:
    return BigramProposer(trained_drafter(folder, target), cfg.num_speculative_tokens)
