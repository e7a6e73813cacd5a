"""The tables: one of drafter kinds (`KINDS`) and one of export formats (`FORMATS`).

A kind is a folder, `heads/<kind>/`, whose `__init__.py` registers its row here (`register_kind`) and whose
export module registers its formats (`register_format`). This module imports no kind: the kind folders import
it, and `heads/registry.py discover_kinds` imports every kind folder, so reading the tables through the
registry (or through heads/export.py, heads/folder.py) sees them all. Generic code asks these tables and never
a kind's name. A row's hooks are plain callables of the kind's own modules (its proposer builder, its joint
module, its stages): the kind folder sits above the decoding runtime (heads/runtime/) and the target
(distill/), so it imports what it uses at import time (docs/architecture.md draws the floors;
tests/unit/test_architecture.py checks them).

    settings     its config section, `drafter.<key>` (key = name with '-' -> '_'): a `KindSettings`
                 dataclass that also answers which target features the kind reads and whether it
                 trains the target itself (Medusa-2)
    module       the trainable `nn.Module` class (None: training-free): `build(cfg, target_model,
                 token_counts)`, `compute_loss(batch)`, `save_pretrained(folder, target, tokenizer,
                 signature)`, `from_pretrained(folder, target_model)`
    proposer     (drafter cfg, target, folder) -> its proposer (heads/runtime/proposer.py's interface)
    formats      the export formats it can be written in (`FORMATS`), the first one its default
    losses       the `drafter.loss` values it trains with (heads/losses.py)
    token_counts its `build` takes training-label counts (EAGLE-3's reduced draft vocabulary)
    samples_itself  the module can sample answers itself (on-policy data, train/onpolicy.py)
    lookup_weighting  its loss weighs positions prompt lookup already predicts by `drafter.lookup_weight`
    joint        (target, drafter, drafter cfg) -> the joint module when `settings.trains_target()` (Medusa-2)
    post_train   (cfg, run_dir) -> a stage after training (Medusa's static-tree search), or None
    tree_search  (folder, target, validation rows, nodes, ranks, sequences, out) -> (tree file, report lines):
                 `draftsmith tree-opt`, the best static tree of a node budget (kinds that serve static trees)
    hf_peer      (drafter cfg, target, label, folder) -> (name, HF `generate` kwargs) for the same drafter
                 (bench)
    order        where the kind sits in tables (kinds are discovered, so their order is declared)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn

from draftsmith.heads.settings import KindSettings


@dataclass(frozen=True)
class KindSpec:
    """One row of `KINDS` (see the module doc for each field)."""

    name: str
    summary: str
    settings: type[KindSettings]
    proposer: Callable
    module: type[nn.Module] | None = None
    formats: tuple[str, ...] = ()
    losses: tuple[str, ...] = ()
    token_counts: bool = False
    samples_itself: bool = False
    lookup_weighting: bool = False
    joint: Callable | None = None
    post_train: Callable | None = None
    tree_search: Callable | None = None
    hf_peer: Callable | None = None
    title: str = ""  # how tables and plots name the kind ("EAGLE-3"); "" = its name
    order: int = 100

    @property
    def display(self) -> str:
        return self.title or self.name

    @property
    def key(self) -> str:
        """Its config section name under `drafter:` (and attribute name on a DrafterConfig)."""
        return self.name.replace("-", "_")

    @property
    def trainable(self) -> bool:
        return self.module is not None


KINDS: dict[str, KindSpec] = {}  # filled by the kind folders (heads/registry.py imports them all)


def register_kind(spec: KindSpec) -> KindSpec:
    """Add (or replace) a kind at run time; DrafterConfig and every table reader see it at once."""
    KINDS[spec.name] = spec
    return spec


def kind_spec(kind: str) -> KindSpec:
    if kind not in KINDS:
        raise ValueError(f"drafter.kind '{kind}' unknown; valid kinds: {', '.join(KINDS)}")
    return KINDS[kind]


def trainable_kinds() -> list[str]:
    return [name for name, spec in KINDS.items() if spec.trainable]



@dataclass(frozen=True)
class ExportFormat:
    """One serving layout: `write(drafter, out, base_model, dtype, drafter_folder) -> out`,
    `read(folder, config, target_model) -> drafter module`, `detect(config) -> bool` (is a config.json this
    format's?), and how engines serve it (heads/engines.py holds the conventions and the command builders
    these fields feed): `vllm_method` vLLM's speculative method (None: vLLM does not serve it) with
    `vllm_extra` beside it in the speculative config; `llamacpp_spec(kind) -> str` llama.cpp's
    `--spec-type` for the format's GGUF of a drafter of that kind (None: llama.cpp does not serve it);
    `max_chain(export folder) -> int | None` the longest chain the engine drafts from it;
    `serve(ServeContext) -> [(engine, command)]` SERVE.md's commands; `notes(drafter folder) -> [lines]`
    SERVE.md's extra lines."""

    name: str
    write: Callable
    read: Callable
    detect: Callable[[dict], bool]
    summary: str
    reads_features: bool = True  # the drafter reads the target's hidden states (so its width must match)
    needs_target: bool = False  # the layout holds target weights the drafter folder does not (an embedding)
    # `detect` matches any folder of its family (hf: any HF model): only when no other format does
    generic: bool = False
    # an engine's own file (a GGUF): our decoder does not read it back, and writing it needs that engine
    # installed (the converter), so tests that read every format back leave it out
    reads_back: bool = True
    vllm_method: str | None = None
    vllm_extra: dict = field(default_factory=dict)
    llamacpp_spec: Callable[[str], str] | None = None
    max_chain: Callable | None = None
    serve: Callable | None = None
    notes: Callable | None = None


FORMATS: dict[str, ExportFormat] = {}  # filled by the kind folders' export modules


def register_format(fmt: ExportFormat) -> ExportFormat:
    """Add (or replace) an export format (a kind folder registers its own; the tests register a dummy
    kind's)."""
    FORMATS[fmt.name] = fmt
    return fmt


def detect_format(config: dict) -> str | None:
    """The export format an exported folder's config.json was written in (None: not one of ours); a generic
    format (any HF model) only when no specific one recognises it."""
    found = [name for name, f in FORMATS.items() if f.detect(config)]
    specific = [name for name in found if not FORMATS[name].generic]
    return (specific or found or [None])[0]
