"""The one reader of drafter folders and exports: `read_folder(dir) -> DrafterFolder`.

Everything that opens a trained drafter goes through here — `draftsmith eval/bench --drafter DIR`,
the proposers, export, the pipeline's eval stage, Medusa-2's merged target — so the kind is decided
once, from one file:

    drafter folder  `draftsmith.json` (kind, target, target_signature, feature_layers, tree, ...)
                    written by the kind's `save_pretrained` (heads/files.py)
    export          a config.json one of `heads/export.py`'s FORMATS recognises (medusa, eagle3, a
                    plain HF model folder = a draft LM, ...); its kind is the row listing that format

A `DrafterFolder` answers what was trained for which target (`target`, `check_target`: vocabulary,
tokenizer and, for feature readers, hidden size, architecture and layer count must match, before any work),
what it is served with (`serve_target`: Medusa-2's LoRA-merged target; `tree`: the serving tree the recipe or
a post-train search chose) and loads the module (`load`). The serving tree is defined here and nowhere else:
draftsmith.json `"tree"` — `{"topk", "depth", "budget"}` (an EAGLE-2 dynamic tree), `{"paths": [...]}` or
`{"file": "tree.json"}` (a static tree; a draft LM records its chain). `ServingTree` itself is
heads/runtime/tree.py. An export keeps its folder's tree in `serving_tree.json` (engines ignore the file;
SERVE.md carries it as engine flags). A measured plan (`serving.json`, written by `draftsmith plan`, read as
`plan`) takes precedence at serving time: `DrafterConfig.with_plan` turns it into serving settings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from torch import nn

from draftsmith.distill.cache import tokenizer_fingerprint
from draftsmith.heads.files import FORMAT_VERSION, META, SERVING_TREE, special_ids, text_config
from draftsmith.heads.registry import FORMATS, KINDS, KindSpec, detect_format
from draftsmith.heads.runtime.tree import ServingTree


def read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc}); the folder is damaged: re-export or retrain "
                         "it") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


META_TYPES = {"kind": str, "target": str, "feature_layers": list, "format_version": int,
              "target_signature": dict, "tree": dict, "serve_target": str, "base_target": str}


def check_meta(meta: dict, where: Path) -> None:
    """The fields draftsmith reads from a draftsmith.json have the types it wrote."""
    wrong = [f"{k}: {type(meta[k]).__name__}, expected {t.__name__}" for k, t in META_TYPES.items()
             if meta.get(k) is not None and not isinstance(meta[k], t)]
    if wrong:
        raise ValueError(f"{where}: {'; '.join(wrong)}; the folder is damaged: re-export or retrain it")


def inside(folder: Path, name: str, what: str) -> Path:
    """`folder / name`, refused when `name` (read from a file in the folder) points outside the folder."""
    path = (folder / name).resolve()
    if folder.resolve() not in (path, *path.parents):
        raise ValueError(f"{folder / META}: {what} '{name}' points outside the drafter folder; refusing to "
                         "follow it")
    return path


@dataclass
class DrafterFolder:
    """A drafter folder or an export, read once (see the module doc)."""

    path: Path
    kind: str
    format: str  # "draftsmith" (a drafter folder) or the export format that wrote it
    meta: dict = field(default_factory=dict)  # draftsmith.json ({} for an export)
    config: dict = field(default_factory=dict)  # config.json ({} if absent)

    @property
    def spec(self) -> KindSpec:
        return KINDS[self.kind]

    @property
    def formats(self) -> tuple[str, ...]:
        """The export formats this drafter can be written in."""
        return self.spec.formats if self.format == "draftsmith" else ()

    @property
    def target(self) -> str | None:
        """What it was trained for, as the run named it (or an export's base_model_name_or_path)."""
        return self.meta.get("target") or self.config.get("base_model_name_or_path")

    @property
    def serve_target(self) -> Path | None:
        """The target it must be served with when that is not the original (Medusa-2: the merged target)."""
        name = self.meta.get("serve_target")
        return inside(self.path, name, "serve_target") if name else None

    @property
    def tree(self) -> ServingTree | None:
        entry = self.meta.get("tree")
        # an export's tree
        if not entry and self.format != "draftsmith" and (self.path / SERVING_TREE).is_file():
            entry = read_json(self.path / SERVING_TREE).get("tree")
        if not isinstance(entry, dict) or not entry:
            return None
        if "file" in entry:  # a static tree kept beside the folder (Medusa's tree.json)
            data = read_json(inside(self.path, entry["file"], "tree file"))
            entry = {"paths": data["paths"], **({"label": entry["label"]} if entry.get("label") else {})}
        return ServingTree.from_entry(entry)

    @property
    def plan(self) -> dict | None:
        """`serving.json` (draftsmith plan: the serving settings measured fastest on a machine), if any."""
        path = self.path / "serving.json"
        return read_json(path) if path.is_file() else None

    def sizes(self) -> tuple[int | None, int | None]:
        """(vocab size, hidden size) it was built for: the signature, else what its config.json says."""
        sig = self.meta.get("target_signature") or {}
        config = self.config.get("target_config") or self.config
        return sig.get("vocab_size", config.get("vocab_size")), sig.get("hidden_size",
                                                                        config.get("hidden_size"))

    def tokenizer_fingerprint(self) -> str | None:
        """The fingerprint of a tokenizer saved in the folder (an HF model folder's own), if any."""
        if not (self.path / "tokenizer_config.json").is_file():
            return None
        from transformers import AutoTokenizer

        return tokenizer_fingerprint(AutoTokenizer.from_pretrained(self.path))

    def check_target(self, vocab_size: int, hidden_size: int, tokenizer=None, name: str = "the target",
                     model: nn.Module | None = None) -> None:
        """Refuse, before any work, a drafter made for another target, naming what it was trained for and what
        this target is: vocabulary size, tokenizer (token map, bos/eos ids) for every kind; for kinds that
        read the target's features also hidden size, architecture and layer count (and the feature layers must
        exist). A folder written before a field was recorded is not judged on it."""
        vocab, hidden = self.sizes()
        sig = self.meta.get("target_signature") or {}
        reads_features = (bool(self.meta.get("feature_layers")) if self.format == "draftsmith"
                          else FORMATS[self.format].reads_features)
        problems = []
        if vocab is not None and vocab != vocab_size:
            problems.append(f"vocabulary size {vocab} differs from the target's {vocab_size}")
        if reads_features and hidden is not None and hidden != hidden_size:
            problems.append(f"hidden size {hidden} differs from the target's {hidden_size}")
        theirs = sig.get("tokenizer") or self.tokenizer_fingerprint()
        if theirs and tokenizer is not None and theirs != tokenizer_fingerprint(tokenizer):
            problems.append("tokenizer differs from the target's (same size, different tokens)")
        ours = special_ids(tokenizer)
        if sig.get("special_ids") and ours and sig["special_ids"] != ours:
            problems.append(f"special token ids {sig['special_ids']} differ from the target's {ours}")
        if reads_features and model is not None:
            archs = list(getattr(model.config, "architectures", None) or [])
            if sig.get("architectures") and archs and sig["architectures"] != archs:
                problems.append(f"architecture {', '.join(sig['architectures'])} differs from the target's "
                                f"{', '.join(archs)}")
            layers = getattr(text_config(model), "num_hidden_layers", None)
            if sig.get("num_layers") and layers and sig["num_layers"] != layers:
                problems.append(f"layer count {sig['num_layers']} differs from the target's {layers}")
            elif layers:
                out = [x for x in self.meta.get("feature_layers") or []
                       if isinstance(x, int) and not -layers <= x < layers]
                if out:
                    problems.append(f"it reads target layer{'s' if len(out) > 1 else ''} "
                                    f"{', '.join(map(str, out))}, out of range for the target's {layers} "
                                    f"layers (0 to {layers - 1}): it was trained for a deeper target")
        if problems:
            raise ValueError(f"drafter {self.path} ({self.kind}) was trained for '{self.target}' and cannot "
                             f"serve {name}: " + "; ".join(problems)
                             + ". A drafter serves the target it was trained for (or one with the same "
                               "architecture, layers and tokenizer): pass that target (--target / "
                               "model.target), or train a drafter for this one")

    def load(self, target_model: nn.Module | None = None) -> nn.Module:
        """The drafter module (fp32, on the CPU); kinds that share target weights copy them from
        `target_model`."""
        try:
            if self.format == "draftsmith":
                return self.spec.module.from_pretrained(self.path, target_model=target_model, meta=self.meta)
            return FORMATS[self.format].read(self.path, self.config, target_model)
        # a config.json of another kind or layout: keys missing or unknown
        except (TypeError, KeyError) as exc:
            what = f"a {self.kind} drafter" if self.format == "draftsmith" else f"a {self.format} export"
            raise ValueError(f"{self.path / 'config.json'} does not describe {what} ({type(exc).__name__}: "
                             f"{exc}); the folder is damaged, or its "
                             f"{META if self.format == 'draftsmith' else 'layout'} names the wrong kind: "
                             "re-export or retrain it") from None


def read_folder(path: str | Path) -> DrafterFolder:
    """Open a drafter folder or an export; the error names what the folder lacks."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"drafter '{path}' is not a folder (a drafter folder, an export, or an HF "
                                "model folder)")
    config = read_json(path / "config.json") if (path / "config.json").is_file() else {}
    if (path / META).is_file():
        meta = read_json(path / META)
        kind = meta.get("kind")
        if kind not in KINDS or not KINDS[kind].trainable:
            trainable = [k for k, s in KINDS.items() if s.trainable]
            raise ValueError(f"{path / META}: kind '{kind}' cannot be loaded; trainable kinds: "
                             f"{', '.join(trainable)}")
        check_meta(meta, path / META)
        if meta.get("format_version", 0) > FORMAT_VERSION:
            raise ValueError(f"{path / META}: format_version {meta['format_version']} is newer than this "
                             f"draftsmith reads ({FORMAT_VERSION}); upgrade draftsmith")
        return DrafterFolder(path, kind, "draftsmith", meta, config)
    fmt = detect_format(config)
    if fmt is None:
        raise FileNotFoundError(f"{path}: neither a drafter folder ({META}) nor an export draftsmith reads "
                                f"({', '.join(FORMATS)}): no config.json of a known layout")
    kind = next(name for name, spec in KINDS.items() if fmt in spec.formats)
    return DrafterFolder(path, kind, fmt, {}, config)
