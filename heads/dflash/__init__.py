"""Kind `dflash`: a block drafter (DFlash) that predicts the next k tokens in one forward from mask-token
inputs.

Its module and settings are `model.py` (fused target features as context keys and values, Qwen3-style draft
layers in `layers.py`, the target's embedding and lm_head), its proposer `proposer.py` (eval floor: a chain
from one forward), its export `export.py` (`dflash`: the speculators layout vLLM 0.32.0 serves with method
dflash; and `gguf`, the same layout as llama.cpp b11434's converter reads it, served as draft-dflash); its
row below.
"""

from __future__ import annotations

from draftsmith.heads.dflash import export, proposer  # noqa: F401  (export registers the dflash format)
from draftsmith.heads.dflash.model import DFlashConfig, DFlashDrafter
from draftsmith.heads.kind import KindSpec, register_kind
from draftsmith.heads.losses import TOKEN_LOSSES

SPEC = register_kind(KindSpec(
    "dflash", "DFlash: a block of k mask tokens drafted in one forward, conditioned on fused target features",
    DFlashConfig, proposer.build, module=DFlashDrafter, formats=("dflash", "gguf"), losses=TOKEN_LOSSES,
    token_counts=True, title="DFlash", order=6))
