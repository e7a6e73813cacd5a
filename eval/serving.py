"""What serves, decided once per command: the drafter, its folder, its plan, the target it serves and the
dtype.

`decide(model, drafter, serving=..., dtype=..., engine=...) -> Serving` is built once by each command (`eval`,
`bench`, `plan`, the pipeline's eval stages, the engine eval) from the config and the flags: a `drafter.path`
is read once with the folder reader (heads/folder.py: its kind, its target, its serving tree), the plan it
serves with is read once (an explicit `--serving FILE`, else the folder's own `serving.json` unless
`drafter.plan: false`), and the target is the one the drafter serves (Medusa-2: its merged target). Everything
downstream takes the `Serving`:

    serving.settings(batch)      the drafter settings at a batch size (a plan is measured per batch size;
                                 None: the plan chose plain decoding there)
    serving.proposer(target, b)  the proposer those settings build, through the kind's row in the kinds table
                                 (`drafter.lookup_branch` merges a prompt-lookup chain in:
                                 heads/runtime/hybrid.py)
    serving.record(proposer, t)  summary.json's `serving`: what served and where that came from

`build_proposer(drafter_cfg, target)` is the same for callers with no command (tests, scripts).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from draftsmith.distill.loading import ModelConfig
from draftsmith.eval.decode.machine import machine_info, machine_key
from draftsmith.heads.folder import DrafterFolder, read_folder
from draftsmith.heads.prompt_lookup.proposer import PromptLookupProposer
from draftsmith.heads.registry import SERVING_FIELDS, DrafterConfig
from draftsmith.heads.runtime.hybrid import HybridProposer
from draftsmith.heads.runtime.proposer import Proposer

PLAN = "serving.json"


@dataclass(frozen=True)
class Plan:
    """A serving.json (written by `draftsmith plan`) and where it was read from."""

    path: Path
    data: dict

    def at(self, batch_size: int) -> dict:
        return plan_at(self.data, batch_size)


def plan_at(plan: dict, batch_size: int) -> dict:
    """The part of a plan (or a comparison of plans) that serves `batch_size`: the one measured at it, else at
    the largest measured batch size below it (else the smallest measured); `batch_size` in the result says
    which."""
    by_batch = plan["by_batch"]
    measured = sorted(int(b) for b in by_batch)
    below = [b for b in measured if b <= batch_size]
    chosen = below[-1] if below else measured[0]
    return {"batch_size": chosen, **by_batch[str(chosen)]}


def read_plan(path: Path) -> Plan:
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or not data.get("by_batch"):
        raise ValueError(f"{path} holds no plan (no settings per batch size): pass a serving.json that "
                         "draftsmith plan wrote")
    return Plan(Path(path), data)


@dataclass(frozen=True)
class Serving:
    """What a command serves (see the module doc); built by `decide`, never changed after."""

    drafter: DrafterConfig
    model: ModelConfig | None = None
    folder: DrafterFolder | None = None
    plan: Plan | None = None
    dtype: str | None = None
    engine: str | None = None

    @property
    def by_plan(self) -> bool:
        return self.plan is not None

    def settings(self, batch_size: int = 1) -> DrafterConfig | None:
        """The drafter settings at `batch_size`: the plan's choice there (None: plain decoding), else the
        config's."""
        if self.plan is None:
            return self.drafter
        chosen = self.plan.at(batch_size).get("chosen") or {}
        if chosen.get("plain"):
            return None
        return dataclasses.replace(self.drafter, plan=False).with_plan(self.plan.at(batch_size))

    def plan_batch(self, batch_size: int) -> int | None:
        """The batch size whose measured plan serves `batch_size` (None: no plan), so a caller builds one
        proposer per plan, not per batch size."""
        return self.plan.at(batch_size)["batch_size"] if self.plan else None

    def proposer(self, target, batch_size: int = 1) -> Proposer:
        """The proposer that serves `batch_size` (plain decoding's null proposer where the plan chose it)."""
        cfg = self.settings(batch_size)
        if cfg is None:
            return Proposer()
        # the model drafts nothing (a plan's candidate): prompt lookup alone
        if cfg.num_speculative_tokens == 0:
            return lookup_branch(cfg, target)
        return with_lookup_branch(cfg.spec.proposer(cfg, target, self.folder), cfg, target)

    def record(self, proposer: Proposer, target, batch_size: int = 1) -> dict:
        """summary.json's `serving`: the settings served, the tree, and where they came from."""
        if self.plan is None:
            record = {"source": self.config_source(proposer), "settings": {k: getattr(self.drafter, k)
                                                                           for k in SERVING_FIELDS},
                      "tree": proposer.tree}
            own = self.folder.path / PLAN if self.folder is not None else None
            if own is not None and not self.drafter.plan and own.is_file():
                record["ignored"] = f"serving.json at {own} (drafter.plan=false)"
            return record
        part, data = self.plan.at(batch_size), self.plan.data
        chosen = part.get("chosen") or {}
        made_on, here = data.get("machine") or {}, machine_info(target)
        # a plan names the folder it was measured for: another one of the same kind is served, and said
        other = bool(data.get("drafter") and self.folder is not None
                     and Path(data["drafter"]).resolve() != self.folder.path.resolve())
        return {"source": f"serving.json at {self.plan.path}", "path": str(self.plan.path),
                "settings": {"plain": True} if chosen.get("plain") else chosen.get("settings") or {},
                "label": chosen.get("label") or "plain decoding", "tree": proposer.tree,
                "measured_for": data.get("drafter"), "other_drafter": other,
                "measured_at_batch": part["batch_size"], "served_at_batch": batch_size,
                "measured_on": ", ".join(str(v) for v in machine_key(made_on) if v is not None),
                "same_machine": machine_key(made_on) == machine_key(here)}

    def config_source(self, proposer: Proposer) -> str:
        """'recorded tree in draftsmith.json' (or an export's serving_tree.json) when the folder's tree
        served, else 'config' (the drafter section: recipe, flags, defaults)."""
        drafter, folder = self.drafter, self.folder
        if folder is None or drafter.tree is not None or drafter.num_speculative_tokens == 0:
            return "config"
        recorded = folder.tree
        if recorded is None or not str(proposer.tree).startswith(recorded.label):
            return "config"
        return "recorded tree in " + ("draftsmith.json" if folder.format == "draftsmith"
                                      else "serving_tree.json")


def serving_line(record: dict) -> str:
    """The one console line saying what is served and where it came from."""
    if record["source"].startswith("serving.json"):
        where = f"measured on {record['measured_on']}" + ("" if record["same_machine"] else
                                                          ", not this machine: re-run draftsmith plan here")
        measured, served = record["measured_at_batch"], record.get("served_at_batch", 1)
        where += "" if measured == served else \
            f", measured at batch {measured}, served at {served}: draftsmith plan --batch-sizes {served}"
        where += f", for {record['measured_for']}" if record.get("other_drafter") else ""
        return f"[serving] {record['source']}: {record['label']} ({where})"
    defaults = DrafterConfig()  # the shared serving fields' defaults
    typed = ", ".join(f"{k}={v}" for k, v in record["settings"].items() if v != getattr(defaults, k))
    return (f"[serving] {record['source']}: tree {record['tree']}" + (f" ({typed})" if typed else "")
            + (f"; {record['ignored']} ignored" if record.get("ignored") else ""))


def decide(model: ModelConfig | None, drafter: DrafterConfig, serving: str | Path | None = None,
           dtype: str | None = None, engine: str | None = None, target_named: bool = True,
           folder_decides: bool = False) -> Serving:
    """What serves (the module doc): `drafter.path` read once, the kind taken from it (a different trainable
    `drafter.kind` is an error unless `folder_decides`: `--drafter DIR` names the drafter itself), the plan
    read once, and the target the drafter serves: its folder's `serve_target` (Medusa-2's merged target), or,
    when `target_named` is false, the target it was trained for."""
    folder = read_folder(drafter.path) if drafter.path else None
    if folder is not None and folder.kind != drafter.kind:
        if drafter.spec.trainable and not folder_decides:
            raise ValueError(f"{folder.path} holds a {folder.kind} drafter, not {drafter.kind}: fix "
                             "drafter.kind or drafter.path")
        drafter = dataclasses.replace(drafter, kind=folder.kind)
    if model is not None and folder is not None:
        if folder.serve_target:
            model = dataclasses.replace(model, target=str(folder.serve_target))
        elif folder.target and not target_named:
            model = dataclasses.replace(model, target=folder.target)
    return Serving(drafter, model, folder, chosen_plan(drafter, folder, serving), dtype, engine)


def chosen_plan(drafter: DrafterConfig, folder: DrafterFolder | None,
                serving: str | Path | None) -> Plan | None:
    """The plan served: `serving` when given (a serving.json or the folder holding one), else the drafter
    folder's own serving.json when `drafter.plan` (the default), else none; refused when made for another
    kind."""
    if serving:
        path = Path(serving) / PLAN if Path(serving).is_dir() else Path(serving)
        if not path.is_file():
            raise FileNotFoundError(f"--serving {serving}: no such file; pass a serving.json that draftsmith "
                                    "plan wrote")
    elif folder is not None and drafter.plan and (folder.path / PLAN).is_file():
        path = folder.path / PLAN
    else:
        return None
    plan = read_plan(path)
    kind = plan.data.get("kind", drafter.kind)
    if kind != drafter.kind:
        raise ValueError(f"{path} is a plan for a {kind} drafter, not this {drafter.kind} one: pass the plan "
                         f"made for it (draftsmith plan --drafter {drafter.path or drafter.kind} --out DIR)")
    return plan


def build_proposer(cfg: DrafterConfig, target, batch_size: int = 1) -> Proposer:
    """The proposer `cfg` serves at `batch_size` (`decide` then `Serving.proposer`), for callers with no
    command."""
    return decide(None, cfg).proposer(target, batch_size)


def lookup_branch(cfg: DrafterConfig, target):
    """The prompt-lookup chain of `drafter.lookup_branch` tokens (`drafter.prompt_lookup`'s n-gram sizes; a
    trie of `drafter.lookup_matches` such chains; `drafter.lookup_datastore`'s path beside them)."""
    return PromptLookupProposer.from_settings(cfg, cfg.lookup_branch, target)


def with_lookup_branch(proposer: Proposer, cfg: DrafterConfig, target) -> Proposer:
    """`drafter.lookup_branch > 0`: the proposer's drafts with a prompt-lookup chain merged in
    (heads/runtime/hybrid.py)."""
    # a lookup drafter is its own branch
    if cfg.lookup_branch and not isinstance(proposer, PromptLookupProposer):
        proposer = HybridProposer(proposer, lookup_branch(cfg, target))
    return proposer
