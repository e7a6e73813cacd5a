"""Proposers: everything that drafts tokens for the tree-verification decoder, one module per kind.

`build_proposer(drafter_cfg, target)` is the one entry: a `drafter.path` is opened once with the
folder reader (`heads/folder.py`: its kind, its target check, its serving tree), and the kind's row
in `heads/registry.py` names the builder (`base.py` holds the interface; `lookup.py`,
`draft_model.py`, `medusa.py`, `eagle.py` the kinds shipped).
"""

from __future__ import annotations

import dataclasses

from draftsmith.eval.decode.machine import machine_info, machine_key
from draftsmith.eval.decode.proposers.base import Proposer
from draftsmith.heads.folder import read_folder
from draftsmith.heads.registry import DrafterConfig


def plan_at(plan: dict, batch_size: int) -> dict:
    """The part of a plan that serves `batch_size`: the one measured at it, else at the largest measured batch size
    below it (else the smallest measured); `batch_size` in the result says which was measured."""
    by_batch = plan.get("by_batch") or {str(plan.get("batch_size", 1)): plan}  # plans before by_batch: batch 1 only
    measured = sorted(int(b) for b in by_batch)
    below = [b for b in measured if b <= batch_size]
    return {"batch_size": below[-1] if below else measured[0], **by_batch[str(below[-1] if below else measured[0])]}


def planned(cfg: DrafterConfig, plan: dict, folder, target, batch_size: int = 1) -> DrafterConfig | None:
    """`cfg` with the folder's plan for `batch_size` applied (None: the plan chose plain decoding there); says
    where and at which batch size the plan was measured."""
    made_on, here = plan.get("machine") or {}, machine_info(target)
    part = plan_at(plan, batch_size)
    chosen = part.get("chosen") or {}
    where = ", ".join(str(v) for v in machine_key(made_on) if v is not None)
    other = "" if machine_key(made_on) == machine_key(here) else \
        f", not this machine ({', '.join(map(str, machine_key(here)))}): re-run draftsmith plan here"
    other += "" if part["batch_size"] == batch_size else \
        f"; measured at batch {part['batch_size']}, served at {batch_size}: draftsmith plan --batch-sizes {batch_size}"
    print(f"[plan] {folder.path / 'serving.json'}: {chosen.get('label') or 'plain decoding'} (measured on {where}"
          + other + ")", flush=True)
    return None if chosen.get("plain") else cfg.with_plan(part)


def build_proposer(cfg: DrafterConfig, target, batch_size: int = 1) -> Proposer:
    """The proposer of `cfg` (at `batch_size`: a folder's plan is per batch size); with `drafter.path` the folder
    decides the kind (an explicitly different trainable `drafter.kind` is an error)."""
    folder = read_folder(cfg.path) if cfg.path else None
    if folder is not None and folder.kind != cfg.kind:
        if cfg.spec.trainable:
            raise ValueError(f"{folder.path} holds a {folder.kind} drafter, not {cfg.kind}: fix drafter.kind or "
                             "drafter.path")
        cfg = dataclasses.replace(cfg, kind=folder.kind)
    plan = folder.plan if folder is not None and cfg.plan else None
    if plan is not None:
        cfg = planned(cfg, plan, folder, target, batch_size)
        if cfg is None:
            proposer = Proposer()  # the plan measured that speculation does not pay here: plain decoding
            proposer.served_by_plan = True
            return proposer
    if cfg.num_speculative_tokens == 0:  # the model drafts nothing (a plan's candidate): prompt lookup alone, unloaded
        proposer = lookup_branch(cfg, target)
    else:
        proposer = with_lookup_branch(cfg.spec.proposer(cfg, target, folder), cfg, target)
    proposer.served_by_plan = plan is not None
    return proposer


def served_plan_batch(cfg: DrafterConfig, batch_size: int) -> int | None:
    """The batch size whose measured plan `build_proposer(cfg, target, batch_size)` serves (None: no plan is served),
    so a caller builds one proposer per plan, not per batch size."""
    plan = read_folder(cfg.path).plan if cfg.path and cfg.plan else None
    return plan_at(plan, batch_size)["batch_size"] if plan else None


def lookup_branch(cfg: DrafterConfig, target):
    """The prompt-lookup chain of `drafter.lookup_branch` tokens (`drafter.prompt_lookup`'s n-gram sizes; a trie of
    `drafter.lookup_matches` such chains; `drafter.lookup_datastore`'s path beside them)."""
    from draftsmith.heads.prompt_lookup.proposer import PromptLookupProposer

    return PromptLookupProposer.from_settings(cfg, cfg.lookup_branch, target)


def with_lookup_branch(proposer: Proposer, cfg: DrafterConfig, target) -> Proposer:
    """`drafter.lookup_branch > 0`: the proposer's drafts with a prompt-lookup chain merged in (eval/decode/proposers/hybrid.py)."""
    from draftsmith.heads.prompt_lookup.proposer import PromptLookupProposer

    if cfg.lookup_branch and not isinstance(proposer, PromptLookupProposer):  # a lookup drafter is its own branch
        from draftsmith.eval.decode.proposers.hybrid import HybridProposer

        proposer = HybridProposer(proposer, lookup_branch(cfg, target))
    return proposer
