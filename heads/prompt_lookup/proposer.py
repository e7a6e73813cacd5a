"""Prompt lookup (kind `prompt-lookup`): copy the continuation of the latest earlier match of the
context's suffix n-gram. Training-free; its drafts cost nothing but a scan of the context.

With `drafter.lookup_matches: M > 1` it drafts a tree instead of a chain: the continuations of up to M
different earlier matches (longest n-gram first, then the most recent), merged as a trie, so where the
context repeats a phrase with different endings each ending is verified in the same forward (the idea of
suffix decoding's candidate trees, Arctic Inference, in its simplest form: no frequency scores). Every node
is a deterministic proposal, so exact sampling treats siblings as point masses (heads/runtime/verify.py).

With `drafter.lookup_datastore` (data sources holding the target's own answers to other prompts) the most
frequent continuation of the context's suffix there is one more path of the trie
(heads/prompt_lookup/datastore.py): a draft where the context has none.

Settings: `drafter.prompt_lookup.{ngram_max, ngram_min, datastore_tokens, datastore_ngram_max}`, chain length
`drafter.num_speculative_tokens` (or `drafter.lookup_branch` for a branch merged into a model drafter's tree),
`drafter.lookup_matches`, `drafter.lookup_datastore`.
HF `generate` has the same idea built in (`prompt_lookup_num_tokens`): `hf_peer` gives bench its kwargs.
"""

from __future__ import annotations

from draftsmith.heads.prompt_lookup.datastore import Datastore, load_datastore
from draftsmith.heads.runtime.hybrid import merge
from draftsmith.heads.runtime.proposer import EMPTY_DRAFT, Draft, Proposer
from draftsmith.heads.runtime.tree import chain_parents


class PromptLookupProposer(Proposer):
    """Copy the continuation of the most recent earlier occurrence of the context's suffix n-gram
    (`matches > 1`: of that many different occurrences, as a trie)."""

    name = "prompt-lookup"

    def __init__(self, num_tokens: int = 5, ngram_max: int = 3, ngram_min: int = 1, matches: int = 1,
                 datastore: Datastore | None = None, datastore_tokens: int = 3):
        if matches < 1:
            raise ValueError("drafter.lookup_matches must be >= 1")
        self.num_tokens, self.matches = num_tokens, matches
        self.ngram_max, self.ngram_min = ngram_max, ngram_min
        self.datastore, self.datastore_tokens = datastore, datastore_tokens
        self.tree = (f"chain-{num_tokens}" if matches == 1 else
                     f"lookup trie, {matches} matches x {num_tokens}")
        self.branch_label = f"lookup-{num_tokens}" + (f"x{matches}" if matches > 1 else "")
        if datastore is not None:
            self.tree += f" + datastore {datastore_tokens}"
            self.branch_label += f"+datastore-{datastore_tokens}"

    @classmethod
    def from_settings(cls, cfg, num_tokens: int, target) -> PromptLookupProposer:
        """From a drafter config: a chain of `num_tokens` (`drafter.prompt_lookup`'s n-gram sizes), a trie of
        `drafter.lookup_matches` such chains, the datastore of `drafter.lookup_datastore` if any (its answers
        in the target's tokens)."""
        own, sources = cfg.sections["prompt_lookup"], cfg.lookup_datastore
        store = load_datastore(sources, target.tokenizer, own.datastore_ngram_max) if sources else None
        return cls(num_tokens, own.ngram_max, own.ngram_min, cfg.lookup_matches, store, own.datastore_tokens)

    def continuations(self, context: list[int]) -> list[list[int]]:
        """Up to `matches` continuations, longest suffix n-gram first, then the most recent occurrence; one
        that is a prefix of a continuation already found (it would add no node) does not count."""
        T, found = len(context), []
        for n in range(min(self.ngram_max, T - 1), self.ngram_min - 1, -1):
            suffix, last = context[T - n:], context[-1]
            for start in range(T - n - 1, -1, -1):  # most recent match first, never the suffix itself
                if context[start + n - 1] == last and context[start: start + n] == suffix:
                    cont = list(context[start + n: start + n + self.num_tokens])
                    if cont and not any(c[:len(cont)] == cont for c in found):
                        found.append(cont)
                        if len(found) == self.matches:
                            return self.with_datastore(context, found)
        return self.with_datastore(context, found)

    def with_datastore(self, context: list[int], found: list[list[int]]) -> list[list[int]]:
        """`found` and, with a datastore, its path where that adds a node."""
        if self.datastore is not None:
            path = self.datastore.continuation(context, self.datastore_tokens)
            if path and not any(c[:len(path)] == path for c in found):
                found = [*found, path]
        return found

    def propose(self, context, sampling, generator) -> Draft:
        draft = EMPTY_DRAFT
        for cont in self.continuations(context):
            draft = merge(draft, Draft(tokens=cont, parents=chain_parents(len(cont))))
        return draft


def build(cfg, target, folder=None) -> PromptLookupProposer:
    return PromptLookupProposer.from_settings(cfg, cfg.num_speculative_tokens, target)


def hf_peer(cfg, target, label: str, folder=None) -> tuple[str, dict]:
    """HF's own prompt lookup with the same draft length and n-gram size."""
    return "hf-prompt-lookup", dict(prompt_lookup_num_tokens=cfg.num_speculative_tokens,
                                    max_matching_ngram_size=cfg.settings.ngram_max)
