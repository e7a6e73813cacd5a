"""Kinds `eagle` (EAGLE-1) and `eagle3` (EAGLE-3): one family, one folder.

EAGLE-1: one decoder layer on the target's last hidden state + the next token's embedding (`model.py`, with
the pieces both share; their settings and layer config `config.py`, the training-time test's mask `ttt.py`);
EAGLE-3: low/mid/high target features fused, training-time test, a reduced draft vocabulary (`eagle3.py`).
Both draft with `proposer.py` (eval floor: static and dynamic trees) and export through `export.py` (eagle,
eagle-sglang, eagle3, speculators); their rows in the kind table (heads/kind.py) are below.
"""

from __future__ import annotations

from draftsmith.heads.eagle import export, proposer  # noqa: F401  (export registers the EAGLE formats)
from draftsmith.heads.eagle.config import EagleConfig
from draftsmith.heads.eagle.eagle3 import Eagle3Config, Eagle3Drafter
from draftsmith.heads.eagle.model import Eagle1Drafter
from draftsmith.heads.kind import KindSpec, register_kind
from draftsmith.heads.losses import TOKEN_LOSSES

SPEC = register_kind(KindSpec(
    "eagle", "EAGLE-1: one decoder layer on the target's last hidden state + the next token's embedding",
    EagleConfig, proposer.build, module=Eagle1Drafter, formats=("eagle", "eagle-sglang"), losses=TOKEN_LOSSES,
    lookup_weighting=True, title="EAGLE-1", order=4))
SPEC3 = register_kind(KindSpec(
    "eagle3", "EAGLE-3: low/mid/high target features fused, training-time test, reduced draft vocabulary",
    Eagle3Config, proposer.build, module=Eagle3Drafter, formats=("eagle3", "speculators", "gguf"),
    losses=TOKEN_LOSSES, token_counts=True, lookup_weighting=True, title="EAGLE-3", order=5))
