"""Kind `dspark`: DFlash's block drafter plus a rank-r Markov head (the token drafted before each slot biases
its logits) and a confidence head (each slot's acceptance, which ends a chain early).

Its module and settings are `model.py` (DFlash's, heads/dflash/model.py, with the two heads), its proposer
`proposer.py` (one block forward, the slots drafted left to right), its export `export.py` (`dspark`: the
speculators layout vLLM 0.32.0 serves with method dspark; and `gguf`, the same layout as llama.cpp b11434's
converter reads it, served as draft-dspark); its row below.
"""

from __future__ import annotations

from draftsmith.heads.dspark import export, proposer  # noqa: F401  (export registers the dspark format)
from draftsmith.heads.dspark.model import DSparkConfig, DSparkDrafter
from draftsmith.heads.kind import KindSpec, register_kind
from draftsmith.heads.losses import TOKEN_LOSSES

SPEC = register_kind(KindSpec(
    "dspark", "DSpark: DFlash's block plus a Markov head on the token drafted before each slot and a "
    "confidence head that ends the chain", DSparkConfig, proposer.build, module=DSparkDrafter,
    formats=("dspark", "gguf"), losses=TOKEN_LOSSES, token_counts=True, title="DSpark", order=8))
