"""Kind `medusa`: K heads on the target's last hidden state (Medusa-1; Medusa-2 with drafter.medusa.lora_rank
> 0).

This folder is the whole kind: the heads and their settings (`model.py`), the proposer (`proposer.py`, eval
floor), the export formats `medusa` and `medusa-vllm` (`export.py`), the post-train static-tree search
(`tree_search.py`, eval floor) and Medusa-2's joint training module (`joint.py`, train floor), and its row in
the kind table (heads/kind.py). The hooks below import those floors only when called.
"""

from __future__ import annotations

from draftsmith.heads.kind import KindSpec, register_kind
from draftsmith.heads.losses import TOKEN_LOSSES
from draftsmith.heads.medusa import export, proposer, tree_search  # noqa: F401  (export registers the formats)
from draftsmith.heads.medusa.joint import JointMedusa
from draftsmith.heads.medusa.model import MedusaConfig, MedusaHeads

SPEC = register_kind(KindSpec(
    "medusa", "K heads on the target's last hidden state (Medusa-1; Medusa-2 with drafter.medusa.lora_rank > "
              "0)",
    MedusaConfig, proposer.build, module=MedusaHeads, formats=("medusa", "medusa-vllm"), losses=TOKEN_LOSSES,
    joint=JointMedusa, post_train=tree_search.medusa_tree_stage, tree_search=tree_search.search_medusa_tree,
    title="Medusa", order=3))
