"""The drafter settings: the `drafter:` config section (shared fields + one section per kind) and the factory.

The tables themselves (`KINDS`, `FORMATS`, `KindSpec`, `ExportFormat`) are heads/kind.py; this module imports
every shipped kind folder (`heads/<kind>/`, each registering its row and formats), so reading the tables
through it sees them all. Adding a kind = a folder `heads/<kind>/` (settings, module, proposer, export
formats, its extra stages, its `register_kind` row) and a recipe: `discover_kinds` imports every folder, the
parametrised tests pick it up (tests/bigram_kind/ is a test kind in one folder).
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from draftsmith import heads
from draftsmith.heads.kind import (  # noqa: F401  (the tables, read through this module)
    FORMATS,
    KINDS,
    ExportFormat,
    KindSpec,
    detect_format,
    kind_spec,
    register_format,
    register_kind,
    trainable_kinds,
)
from draftsmith.heads.losses import TOKEN_LOSSES
from draftsmith.heads.settings import KindSettings


def discover_kinds() -> None:
    """Import every kind folder (each sub-package of heads/ registers its rows and formats in heads/kind.py),
    then order both tables by the rows' `order` (the order tables, docs and format detection list them in)."""
    for info in pkgutil.iter_modules(heads.__path__):
        if info.ispkg:
            importlib.import_module(f"{heads.__name__}.{info.name}")
    rows = sorted(KINDS.values(), key=lambda spec: spec.order)
    formats = [name for spec in rows for name in spec.formats if name in FORMATS]
    formats += [name for name in FORMATS if name not in formats]
    kinds, fmts = {spec.name: spec for spec in rows}, {name: FORMATS[name] for name in formats}
    KINDS.clear(), FORMATS.clear()
    KINDS.update(kinds), FORMATS.update(fmts)


discover_kinds()  # every kind folder under heads/ registers its rows and formats (heads/kind.py)


def _sections() -> dict[str, type]:
    return {spec.key: spec.settings for spec in KINDS.values()}


def section_of(key: str) -> str | None:
    """Where a kind's own setting written straight under `drafter:` belongs (`drafter.heads` ->
    drafter.medusa.heads), or None."""
    owners = [f"drafter.{spec.key}.{key}" for spec in KINDS.values()
              if key in {f.name for f in dataclasses.fields(spec.settings)}]
    return f"'drafter.{key}' is a kind's own setting: write {' / '.join(owners)}" if owners else None


SERVING_FIELDS = ("tree", "num_speculative_tokens", "top_k", "tree_nodes", "tree_topk",
                  # what serving.json sets
                  "confidence_threshold", "adaptive_length", "lookup_branch", "lookup_matches",
                  "lookup_datastore")


@dataclass
class DrafterConfig:
    """`drafter:` section — the shared fields (what proposes, the serving tree, the divergence) plus one
    nested section per kind, `drafter.<kind key>.*` (see `KINDS`); `settings` is the active kind's."""

    kind: str = "prompt-lookup"
    path: str | None = None  # draft-lm: HF model folder; trained kinds: a drafter folder or an export
    # chain length / maximum tree depth (0 with lookup_branch: prompt lookup alone)
    num_speculative_tokens: int = 5
    tree: str | None = None  # static tree (name in configs/trees, a JSON file, chain-N) or dynamic-N
    top_k: int = 1  # draft models: branching per depth of a top-k-chains tree (1 = chain)
    # node budget of the draft tree: Medusa -> the best static tree of this size from validation accuracies
    # (a post-train stage, into the drafter folder); EAGLE -> the dynamic tree's budget
    tree_nodes: int = 0
    tree_topk: int = 4  # dynamic tree (EAGLE-2): children per expanded node and nodes expanded per depth
    loss: str = "kl"  # divergence to the target (heads/losses.py: kl = forward, rkl, jsd, tvd, ce)
    jsd_beta: float = 0.5  # loss jsd: JSD_beta (0 -> forward KL, 1 -> reverse KL, as DistillSpec)
    head_decay: float = 0.8  # weight of head/step k is head_decay**k
    distill_temperature: float = 1.0  # softmax temperature of both sides of the divergence
    # training: the loss weight of positions prompt lookup over the sequence's own prefix already drafts
    # (drafter.prompt_lookup's n-grams; heads/losses.py lookup_predicted) -- for drafters served beside a
    # lookup branch (drafter.lookup_branch); 1 = every position alike. Kinds whose KindSpec says
    # lookup_weighting.
    lookup_weight: float = 1.0
    # serving-time drafting (any model drafter; heads/<kind>/proposer.py): stop a draft where the drafter's
    # confidence (its top probability; EAGLE dynamic trees: a level's best cumulative probability) falls below
    # this (0 = off)
    confidence_threshold: float = 0.0
    # draft-lm chains: +2 tokens after a fully accepted draft, -1 otherwise (HF's schedule)
    adaptive_length: bool = False
    # hybrid: a prompt-lookup chain of up to this many tokens merged into every draft (0 = off)
    lookup_branch: int = 0
    # prompt lookup (the kind, or a lookup branch): the continuations of up to this many different earlier
    # matches, merged as a trie (1 = the latest match's chain)
    lookup_matches: int = 1
    # prompt lookup (the kind, or a lookup branch) also drafts the most frequent continuation of the context's
    # suffix in these data's answers (data sources as in data.train; assistant turns only: the target's own
    # answers to other prompts, e.g. its self-distilled data); [] = off. The path's length:
    # drafter.prompt_lookup.datastore_tokens
    lookup_datastore: list[str] = field(default_factory=list)
    # a drafter folder's serving.json (draftsmith plan) sets the serving fields above; false: ignore it
    plan: bool = True
    sections: dict[str, Any] = field(default_factory=dict, metadata={"sections": _sections})

    def __post_init__(self):
        spec = kind_spec(self.kind)
        unknown = sorted(set(self.sections) - set(_sections()))
        if unknown:
            raise ValueError(f"drafter: unknown kind sections {unknown}; valid: {', '.join(_sections())}")
        self.sections = {key: self.sections.get(key) or cls() for key, cls in _sections().items()}
        if isinstance(self.lookup_datastore, str):
            self.lookup_datastore = [self.lookup_datastore] if self.lookup_datastore else []
        self.lookup_datastore = [str(source) for source in self.lookup_datastore]
        if self.num_speculative_tokens < 1 and not (self.num_speculative_tokens == 0
                                                    and self.lookup_branch > 0):
            raise ValueError("drafter.num_speculative_tokens must be >= 1 (0 only beside "
                             "drafter.lookup_branch > 0: the model drafts nothing and prompt lookup drafts "
                             "alone)")
        if spec.trainable and self.loss not in spec.losses:
            raise ValueError(f"drafter.loss '{self.loss}' is not available for {self.kind}; valid: "
                             f"{', '.join(spec.losses)}")
        if self.loss not in TOKEN_LOSSES:
            raise ValueError(f"drafter.loss '{self.loss}' unknown; valid: {', '.join(TOKEN_LOSSES)}")
        if not 0 <= self.jsd_beta <= 1:
            raise ValueError("drafter.jsd_beta must be in [0, 1]")
        if self.tree_nodes < 0 or self.tree_topk < 1 or self.top_k < 1:
            raise ValueError("drafter.tree_nodes must be >= 0, drafter.tree_topk and drafter.top_k >= 1")
        if not 0 < self.head_decay <= 1:
            raise ValueError("drafter.head_decay must be in (0, 1]")
        if self.distill_temperature <= 0:
            raise ValueError("drafter.distill_temperature must be > 0")
        if not 0 < self.lookup_weight <= 1:
            raise ValueError(f"drafter.lookup_weight must be in (0, 1], got {self.lookup_weight}")
        if self.lookup_weight != 1 and not spec.lookup_weighting:
            able = [k.name for k in KINDS.values() if k.lookup_weighting]
            raise ValueError("drafter.lookup_weight weighs the loss by what prompt lookup predicts, which "
                             f"only drafter.kind {' / '.join(able)} train with (this run: {self.kind}); set "
                             "drafter.lookup_weight: 1")
        if not 0 <= self.confidence_threshold < 1 or self.lookup_branch < 0 or self.lookup_matches < 1:
            raise ValueError("drafter.confidence_threshold must be in [0, 1), drafter.lookup_branch >= 0 and "
                             "drafter.lookup_matches >= 1")

    def with_plan(self, plan: dict) -> DrafterConfig:
        """This config with a `serving.json` plan's chosen serving settings (eval/measure/plan.py measures
        them); the plan replaces every serving field, so a folder serves what was measured; unchanged when it
        chose plain."""
        chosen = plan.get("chosen") or {}
        if chosen.get("plain") or not chosen.get("settings"):
            return self
        unknown = set(chosen["settings"]) - set(SERVING_FIELDS)
        if unknown:
            raise ValueError(f"serving.json: unknown serving settings {sorted(unknown)}; re-run draftsmith "
                             "plan")
        reset = {k: getattr(type(self)(), k) for k in SERVING_FIELDS}
        return dataclasses.replace(self, **{**reset, **chosen["settings"]})

    @classmethod
    def for_kind(cls, kind: str, **kwargs) -> DrafterConfig:
        """Shared fields and the kind's own settings in one call: `for_kind("medusa", heads=2, path=...)`."""
        shared = {f.name for f in dataclasses.fields(cls) if f.name != "sections"}
        own = {k: kwargs.pop(k) for k in list(kwargs) if k not in shared}
        spec = kind_spec(kind)
        return cls(kind=kind, sections={spec.key: spec.settings(**own)}, **kwargs)

    @property
    def spec(self) -> KindSpec:
        return kind_spec(self.kind)

    @property
    def settings(self) -> KindSettings:
        """The active kind's section (`drafter.<kind key>`)."""
        return self.sections[self.spec.key]

    def __getattr__(self, name: str):
        # `cfg.drafter.medusa` reads a kind's section; everything else is a normal attribute miss
        sections = self.__dict__.get("sections")
        if sections is not None and name in sections:
            return sections[name]
        raise AttributeError(f"{type(self).__name__} has no attribute '{name}'")

    def sections_in_use(self) -> dict[str, KindSettings]:
        """What a resolved config records: the active kind's section only (the others are defaults)."""
        return {self.spec.key: self.settings}

    @staticmethod
    def unknown_key_hint(key: str) -> str | None:
        return section_of(key)


def build_drafter(cfg: DrafterConfig, target_model: nn.Module, token_counts=None) -> nn.Module:
    """A fresh trainable drafter for the target's HF model (sizes from its config, shared weights copied).

    `token_counts [V]` (how often each target token is a training label) feeds kinds whose row sets
    `token_counts` (EAGLE-3's reduced draft vocabulary)."""
    spec = cfg.spec
    if not spec.trainable:
        raise ValueError(f"drafter.kind '{cfg.kind}' is not trainable; trainable kinds: "
                         f"{', '.join(trainable_kinds())}")
    return spec.module.build(cfg, target_model, token_counts=token_counts if spec.token_counts else None)
