"""Kinds `draft-lm` (a small causal LM on the target's tokenizer, distilled, or any HF folder as drafter.path)
and `layer-skip` (the target's first N layers + final norm + lm_head, sharing its weights, untrained): the
draft model family, one folder.

The draft LM module and its settings (`model.py`), the proposer both kinds draft with (`proposer.py`, eval
floor: chains, static trees, HF assisted generation as a bench peer), the export format `hf` (`export.py`),
and the two rows of the kind table (heads/kind.py) below.
"""

from __future__ import annotations

from dataclasses import dataclass

from draftsmith.heads.draft_lm import export, proposer  # noqa: F401  (export registers the `hf` format)
from draftsmith.heads.draft_lm.model import DraftLM, DraftLMConfig
from draftsmith.heads.kind import KindSpec, register_kind
from draftsmith.heads.losses import TOKEN_LOSSES
from draftsmith.heads.settings import KindSettings


@dataclass
class LayerSkipConfig(KindSettings):
    """`drafter.layer_skip`: the target's first `layers` layers + final norm + lm_head draft (untrained)."""

    layers: int = 8


LAYER_SKIP = register_kind(KindSpec("layer-skip",
                                    "the target's first N layers + final norm + lm_head, training-free",
                                    LayerSkipConfig, proposer.build_layer_skip, title="layer skip", order=1))
SPEC = register_kind(KindSpec(
    "draft-lm", "a small causal LM on the target's tokenizer, distilled (or any HF folder as drafter.path)",
    DraftLMConfig, proposer.build_draft_lm, module=DraftLM, formats=("hf", "gguf", "gguf-q8_0"),
    losses=TOKEN_LOSSES, samples_itself=True, hf_peer=proposer.hf_peer, title="draft LM", order=2))
