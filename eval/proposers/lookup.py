"""Prompt lookup (kind `prompt-lookup`): copy the continuation of the latest earlier match of the
context's suffix n-gram. Training-free; its drafts cost nothing but a scan of the context.

Settings: `drafter.prompt_lookup.{ngram_max, ngram_min}`, chain length `drafter.num_speculative_tokens`.
HF `generate` has the same idea built in (`prompt_lookup_num_tokens`): `hf_peer` gives bench its kwargs.
"""

from __future__ import annotations

from draftsmith.eval.proposers.base import EMPTY_DRAFT, Draft, Proposer
from draftsmith.eval.tree import chain_parents


class PromptLookupProposer(Proposer):
    """Copy the continuation of the most recent earlier occurrence of the context's suffix n-gram."""

    name = "prompt-lookup"

    def __init__(self, num_tokens: int = 5, ngram_max: int = 3, ngram_min: int = 1):
        self.num_tokens, self.ngram_max, self.ngram_min = num_tokens, ngram_max, ngram_min
        self.tree = f"chain-{num_tokens}"

    def propose(self, context, sampling, generator) -> Draft:
        T = len(context)
        for n in range(min(self.ngram_max, T - 1), self.ngram_min - 1, -1):
            suffix = context[T - n:]
            for start in range(T - n - 1, -1, -1):  # most recent match first, never the suffix itself
                if context[start: start + n] == suffix:
                    cont = context[start + n: start + n + self.num_tokens]
                    if cont:
                        return Draft(tokens=list(cont), parents=chain_parents(len(cont)))
        return EMPTY_DRAFT


def build(cfg, target, folder=None) -> PromptLookupProposer:
    own = cfg.settings
    return PromptLookupProposer(cfg.num_speculative_tokens, own.ngram_max, own.ngram_min)


def hf_peer(cfg, target, label: str) -> tuple[str, dict]:
    """HF's own prompt lookup with the same draft length and n-gram size."""
    return "hf-prompt-lookup", dict(prompt_lookup_num_tokens=cfg.num_speculative_tokens,
                                    max_matching_ngram_size=cfg.settings.ngram_max)
