"""Drafter kinds and the `drafter:` config section.

Sits under everything else (heads imports nothing of ours). A drafter kind is named once here;
`eval/proposers.py` maps each name to the proposer that runs it and, for trainable kinds, later
issues add the module that builds it (Medusa heads, EAGLE-1/3, draft LM).
"""

from __future__ import annotations

from dataclasses import dataclass

# kind -> one-line description (shown by `draftsmith eval --help` and in config errors)
KINDS = {
    "prompt-lookup": "n-gram lookup in the context, training-free",
    "layer-skip": "the target's first N layers + final norm + lm_head, training-free",
    "draft-lm": "a small causal LM on the target's tokenizer (drafter.path = HF folder)",
}


@dataclass
class DrafterConfig:
    """`drafter:` section — what proposes tokens, and the shape of its proposals."""

    kind: str = "prompt-lookup"
    path: str | None = None  # draft-lm: HF model folder; trained kinds: exported drafter folder
    num_speculative_tokens: int = 5  # chain length / maximum tree depth
    tree: str | None = None  # static tree (name in configs/trees or a JSON file); None = chain
    top_k: int = 1  # draft-lm: branching per depth for a top-k tree (1 = chain)
    layer_skip_layers: int = 8  # layer-skip: how many of the target's first layers draft
    ngram_max: int = 3  # prompt lookup: longest suffix n-gram matched
    ngram_min: int = 1

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"drafter.kind '{self.kind}' unknown; valid kinds: {', '.join(KINDS)}")
        if self.num_speculative_tokens < 1:
            raise ValueError("drafter.num_speculative_tokens must be >= 1")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError("drafter.ngram_min must be >= 1 and <= drafter.ngram_max")
