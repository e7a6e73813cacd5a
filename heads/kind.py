"""The registry: one table of drafter kinds (`KINDS`) and one of export formats (`FORMATS`).

A kind is a folder, `heads/<kind>/`, whose `__init__.py` registers its row here (`register_kind`) and its export
formats (`register_format`); `heads/registry.py` imports every shipped kind folder, so reading the tables through
it (or through heads/export.py, heads/folder.py) sees them all. Generic code asks these tables and never a kind's
name. A row's hooks are callables: a kind's `__init__.py` defines them as small functions that import the kind's
higher-floor modules (its proposer, its post-train stage, its joint training module) when called, so importing
heads never imports eval/ or train/, and the import checks see every such edge (tests/unit/test_architecture.py).

    settings     its config section, `drafter.<key>` (key = name with '-' -> '_'): a `KindSettings`
                 dataclass that also answers which target features the kind reads and whether it
                 trains the target itself (Medusa-2)
    module       the trainable `nn.Module` class (None: training-free): `build(cfg, target_model,
                 token_counts)`, `compute_loss(batch)`, `save_pretrained(folder, target, tokenizer,
                 signature)`, `from_pretrained(folder, target_model)`
    proposer     (drafter cfg, target, folder) -> its proposer (eval/decode/proposers/base.py's interface)
    formats      the export formats it can be written in (`FORMATS`), the first one its default
    losses       the `drafter.loss` values it trains with (heads/losses.py)
    token_counts its `build` takes training-label counts (EAGLE-3's reduced draft vocabulary)
    samples_itself  the module can sample answers itself (on-policy data, train/onpolicy.py)
    lookup_weighting  its loss weighs positions prompt lookup already predicts by `drafter.lookup_weight`
    joint        (target, drafter, drafter cfg) -> the joint module when `settings.trains_target()` (Medusa-2)
    post_train   (cfg, run_dir, target) -> a stage after training (Medusa's static-tree search)
    hf_peer      (drafter cfg, target, label) -> HF `generate` kwargs for the same drafter (bench peers)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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
    hf_peer: Callable | None = None
    title: str = ""  # how tables and plots name the kind ("EAGLE-3"); "" = its name

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
    """One serving layout: `write(drafter, out, base_model, dtype, drafter_folder) -> out`, `read(folder, config,
    target_model) -> drafter module`, `detect(config) -> bool` (is a config.json this format's?)."""

    name: str
    write: Callable
    read: Callable
    detect: Callable[[dict], bool]
    summary: str
    reads_features: bool = True  # the drafter reads the target's hidden states (so its width must match)
    needs_target: bool = False  # the layout holds target weights the drafter folder does not (an embedding)
    generic: bool = False  # `detect` matches any folder of its family (hf: any HF model): only when no other format does


FORMATS: dict[str, ExportFormat] = {}  # filled by the kind folders' export modules


def register_format(fmt: ExportFormat) -> ExportFormat:
    """Add (or replace) an export format (a kind folder registers its own; the tests register a dummy kind's)."""
    FORMATS[fmt.name] = fmt
    return fmt


def detect_format(config: dict) -> str | None:
    """The export format an exported folder's config.json was written in (None: not one of ours); a generic
    format (any HF model) only when no specific one recognises it."""
    found = [name for name, f in FORMATS.items() if f.detect(config)]
    specific = [name for name in found if not FORMATS[name].generic]
    return (specific or found or [None])[0]
