"""Kind `prompt-lookup`: training-free drafts copied from the context (and a datastore of the target's
answers).

This folder is the whole kind: its settings (`drafter.prompt_lookup`), its proposer (`proposer.py`, eval
floor), the datastore index (`datastore.py`, eval floor) and its row in the kind table (heads/kind.py). The
proposer also serves as the lookup branch any model drafter can carry (`drafter.lookup_branch`,
heads/runtime/hybrid.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from draftsmith.heads.kind import KindSpec, register_kind
from draftsmith.heads.prompt_lookup import proposer
from draftsmith.heads.settings import KindSettings


@dataclass
class PromptLookupConfig(KindSettings):
    """`drafter.prompt_lookup`: copy the continuation of the latest earlier match of the context's suffix."""

    ngram_max: int = 3  # longest suffix n-gram matched
    ngram_min: int = 1
    # with drafter.lookup_datastore (the target's own answers): the length of the datastore's path and the
    # longest suffix looked up there (heads/prompt_lookup/datastore.py)
    datastore_tokens: int = 3
    datastore_ngram_max: int = 4

    def __post_init__(self):
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError("drafter.prompt_lookup.ngram_min must be >= 1 and <= ngram_max")
        if self.datastore_tokens < 1 or self.datastore_ngram_max < 1:
            raise ValueError("drafter.prompt_lookup.datastore_tokens and datastore_ngram_max must be >= 1")

    def serving_candidates(self, folder_config: dict) -> list[dict]:
        return [{"num_speculative_tokens": n} for n in (2, 3, 4, 5, 7)]


SPEC = register_kind(KindSpec("prompt-lookup", "n-gram lookup in the context, training-free",
                              PromptLookupConfig, proposer.build, hf_peer=proposer.hf_peer,
                              title="prompt lookup", order=0))
