"""Kind `medusa`: K heads on the target's last hidden state (Medusa-1; Medusa-2 with drafter.medusa.lora_rank > 0).

This folder is the whole kind: the heads and their settings (`model.py`), the proposer (`proposer.py`, eval
floor), the export formats `medusa` and `medusa-vllm` (`export.py`), the post-train static-tree search
(`tree_search.py`, eval floor) and Medusa-2's joint training module (`joint.py`, train floor), and its row in
the kind table (heads/kind.py). The hooks below import those floors only when called.
"""

from __future__ import annotations

from draftsmith.heads.kind import KindSpec, register_kind
from draftsmith.heads.losses import TOKEN_LOSSES
from draftsmith.heads.medusa import export  # noqa: F401  (registers the medusa formats)
from draftsmith.heads.medusa.model import MedusaConfig, MedusaHeads


def build_proposer(cfg, target, folder=None):
    from draftsmith.heads.medusa.proposer import build

    return build(cfg, target, folder)


def joint_module(target, drafter, cfg):
    from draftsmith.heads.medusa.joint import JointMedusa

    return JointMedusa(target, drafter, cfg)


def tree_stage(cfg, run_dir):
    from draftsmith.heads.medusa.tree_search import medusa_tree_stage

    return medusa_tree_stage(cfg, run_dir)


SPEC = register_kind(KindSpec(
    "medusa", "K heads on the target's last hidden state (Medusa-1; Medusa-2 with drafter.medusa.lora_rank > 0)",
    MedusaConfig, build_proposer, module=MedusaHeads, formats=("medusa", "medusa-vllm"), losses=TOKEN_LOSSES,
    joint=joint_module, post_train=tree_stage, title="Medusa"))
