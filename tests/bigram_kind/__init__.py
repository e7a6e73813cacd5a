"""A fifth drafter kind that lives only in the tests, in one folder: proof that a kind is one unit.

`bigram` drafts with a table `[V, V]` of next-token logits given the current token (no target features), trained
with the run's divergence against the target's next-token distribution. It is laid out as a shipped kind is
(heads/<kind>/): settings and module (`model.py`), proposer (`proposer.py`, eval floor, imported only by its hook),
its export format (`export.py`) and its row below. Adding it touches this folder and the one line that imports it
(tests/conftest.py, as heads/registry.py does for shipped kinds); every test parametrised over `KINDS` (greedy
equivalence, export round trips, the pipeline) then runs it too.
"""

from __future__ import annotations

from draftsmith.heads.losses import TOKEN_LOSSES
from draftsmith.heads.registry import KindSpec, register_kind

from . import export
from .model import BigramConfig, BigramDrafter


def build_proposer(cfg, target, folder=None):
    from .proposer import build_proposer as build

    return build(cfg, target, folder)


def register() -> None:
    export.register()
    register_kind(KindSpec("bigram", "a next-token table (registered by the tests)", BigramConfig, build_proposer,
                           module=BigramDrafter, formats=("bigram-table",), losses=TOKEN_LOSSES))
