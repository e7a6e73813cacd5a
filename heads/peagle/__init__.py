"""Kind `peagle` (P-EAGLE): EAGLE-3 that drafts all k tokens in one drafter forward (parallel drafting).

Its module and settings are `model.py` (an `Eagle3Drafter`, heads/eagle/eagle3.py, plus a learned mask hidden
state and mask-token embedding; chains of mask queries trained in one forward), its proposer `proposer.py`
(eval floor: a chain of k from one forward), its export `export.py` (`peagle`: the speculators layout vLLM
0.32.0 serves with method eagle3 + parallel_drafting); its row below.
"""

from __future__ import annotations

from draftsmith.heads.kind import KindSpec, register_kind
from draftsmith.heads.losses import TOKEN_LOSSES
from draftsmith.heads.peagle import export, proposer  # noqa: F401  (export registers the peagle format)
from draftsmith.heads.peagle.model import PEagleConfig, PEagleDrafter

SPEC = register_kind(KindSpec(
    "peagle", "P-EAGLE: EAGLE-3 drafting k tokens in one forward (mask tokens + a learned mask hidden state)",
    PEagleConfig, proposer.build, module=PEagleDrafter, formats=("peagle",), losses=TOKEN_LOSSES,
    token_counts=True, title="P-EAGLE", order=7))
