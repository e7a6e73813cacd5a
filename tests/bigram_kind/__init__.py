"""A drafter kind that lives only in the tests, in one folder: proof that a kind is one unit.

`bigram` drafts with a table `[V, V]` of next-token logits given the current token (no target features),
trained with the run's divergence against the target's next-token distribution. It is laid out as a shipped
kind is (heads/<kind>/): settings and module (`model.py`), proposer (`proposer.py`), its export format
(`export.py`) and its row below, registered on import. Its imports are relative, so the folder works both here
(tests/conftest.py imports it) and copied into heads/ (tests/integration/test_wheel.py drops it into a built
wheel as draftsmith/heads/bigram/, where heads/registry.py discovers it); every test parametrised over `KINDS`
(greedy equivalence, export round trips, the pipeline) runs it too.
"""

from __future__ import annotations

from draftsmith.heads.kind import KindSpec, register_kind
from draftsmith.heads.losses import TOKEN_LOSSES

from . import export, proposer
from .model import BigramConfig, BigramDrafter

export.register()
SPEC = register_kind(KindSpec("bigram", "a next-token table (registered by the tests)", BigramConfig,
                              proposer.build_proposer, module=BigramDrafter, formats=("bigram-table",),
                              losses=TOKEN_LOSSES))
