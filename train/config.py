"""Run configuration: one YAML file per run, strict, with dotted overrides.

Sits at the front door of the flow: `draftsmith <stage> -c run.yaml a.b=c` builds a `RunConfig`
here and hands each stage its own section. A section's dataclass is defined next to the code that
uses it (the model section in `distill/target.py`, the eval section in `eval/measure/evaluate.py`, ...);
this module only assembles them and enforces the rules that make configs safe to share:

- an unknown key fails, naming the key and listing the valid keys of its section (and, for a kind's own
  setting written straight under `drafter:`, where it belongs: `drafter.heads` -> `drafter.medusa.heads`);
- a value of the wrong type fails, naming the field and the expected type;
- overrides `a.b=c` are parsed as YAML scalars/lists (`train.lr=3e-4`, `eval.categories=[qa,rag]`);
- `-c NAME` names a shipped recipe (`configs/runs/NAME.yaml`, package data) when NAME is not a file;
- a recipe may start from others (`base: smollm2-eagle3`, or a list) and override a few keys.

A section may hold nested sub-sections keyed by name (a field whose metadata has `"sections"`: a
callable giving {key: dataclass}); their keys sit at the section's level in YAML (`drafter.medusa.heads`)
— that is how each drafter kind's settings live under `drafter.<kind>` without the loader naming a kind.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml

from draftsmith.configs import shipped
from draftsmith.distill.data import DataConfig
from draftsmith.distill.extract import ExtractConfig
from draftsmith.distill.loading import ModelConfig
from draftsmith.eval.measure.evaluate import EvalConfig
from draftsmith.eval.measure.plan import PlanConfig
from draftsmith.heads.export import ExportConfig
from draftsmith.heads.registry import DrafterConfig
from draftsmith.train.runtime import LogConfig
from draftsmith.train.setup import TrainConfig


class StrictBoolLoader(yaml.SafeLoader):
    """YAML with YAML 1.2 booleans: only true/false. YAML 1.1 would read `no` (accelerate's
    mixed-precision value), `off` or `y` as booleans."""


StrictBoolLoader.yaml_implicit_resolvers = {
    first: [(tag, regex) for tag, regex in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
StrictBoolLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


class ConfigError(ValueError):
    """A config file or override that cannot be used; the message names the key and the fix."""


@dataclass
class RunConfig:
    """The whole run: one section per stage of the flow."""

    name: str = "run"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    drafter: DrafterConfig = field(default_factory=DrafterConfig)
    extract: ExtractConfig = field(default_factory=ExtractConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def to_dict(self) -> dict:
        """Plain nested dict (what config.resolved.yaml and checkpoints hold)."""
        return config_to_dict(self)

    def write_resolved(self, run_dir: str | Path) -> Path:
        """Every stage records the exact config it ran with in its run folder."""
        return write_resolved(self, run_dir)


def _type_name(tp: Any) -> str:
    if get_origin(tp) is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if get_origin(tp) in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in get_args(tp))
    if get_origin(tp) in (list, tuple):
        return f"list[{_type_name(get_args(tp)[0])}]"
    if get_origin(tp) is dict:
        return "mapping"
    return "null" if tp is type(None) else getattr(tp, "__name__", str(tp))


def _takes_mapping(tp: Any) -> bool:
    if get_origin(tp) in (Union, types.UnionType):
        return any(_takes_mapping(a) for a in get_args(tp))
    return tp is Any or tp is dict or get_origin(tp) is dict or dataclasses.is_dataclass(tp)


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check `value` against the annotation `tp`; return it (ints widen to float, lists to tuples)."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if isinstance(value, dict) and not _takes_mapping(tp):  # e.g. the override `train.lr.x=1`
        raise ConfigError(f"{where}: expected {_type_name(tp)}, got a mapping {value!r} "
                          f"('{where}' is a value, not a section)")
    if origin is Literal:
        # compare types too: `True == 1` would let a bool pass as Literal[1]
        if any(value == arg and type(value) is type(arg) for arg in get_args(tp)):
            return value
        raise ConfigError(f"{where}: {value!r} is not one of {_type_name(tp)}")
    if origin in (Union, types.UnionType):
        for arg in get_args(tp):
            try:
                return _coerce(value, arg, where)
            except ConfigError:
                continue
        raise ConfigError(f"{where}: expected {_type_name(tp)}, got {type(value).__name__} {value!r}")
    if tp is type(None):
        if value is None:
            return None
    elif dataclasses.is_dataclass(tp):
        if value is None:  # a YAML section whose keys are all commented out: its defaults
            value = {}
        if isinstance(value, dict):
            return build_section(tp, value, where)
    elif origin in (list, tuple):
        if isinstance(value, (list, tuple)):
            inner = get_args(tp)[0] if get_args(tp) else Any
            items = [_coerce(v, inner, f"{where}[{i}]") for i, v in enumerate(value)]
            return tuple(items) if origin is tuple else items
    elif origin is dict:
        if isinstance(value, dict):
            return dict(value)
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads `3e-4` (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is str:
        if isinstance(value, str):
            return value
    elif isinstance(value, tp):
        return value
    raise ConfigError(f"{where}: expected {_type_name(tp)}, got {type(value).__name__} {value!r}")


def _nested(fields: dict) -> dict[str, dict[str, type]]:
    """Fields that hold named sub-sections -> {field: {sub-section key: its dataclass}}."""
    return {name: f.metadata["sections"]() for name, f in fields.items() if "sections" in f.metadata}


def build_section(cls: type, data: dict, where: str = "") -> Any:
    """Build dataclass `cls` from a mapping, refusing unknown keys and wrong types."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping of keys, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    nested = _nested(fields)
    owner = {key: (name, tp) for name, table in nested.items() for key, tp in table.items()}
    kwargs: dict = {name: {} for name in nested}
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        if key in owner:
            name, tp = owner[key]
            kwargs[name][key] = _coerce(value, tp, path)
            continue
        if key not in fields or key in nested:
            valid = ", ".join(sorted([k for k in fields if k not in nested] + list(owner)))
            hint = getattr(cls, "unknown_key_hint", lambda k: None)(key)
            raise ConfigError(f"unknown key '{key}' in {where or 'the top level'} ({path})"
                              + (f": {hint}" if hint else "") + f"; valid keys: {valid}")
        kwargs[key] = _coerce(value, hints[key], path)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:  # __post_init__ validation of a section
        raise ConfigError(f"{where or 'config'}: {exc}") from exc


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {dotted}: '{key}' is a value, not a section")
        node = child
    node[keys[-1]] = value


def parse_overrides(overrides: list[str]) -> dict:
    """`["train.lr=3e-4", "eval.limit=8"]` -> nested dict; values are parsed as YAML."""
    tree: dict = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' must look like section.key=value")
        key, raw = item.split("=", 1)
        value = yaml.load(raw, Loader=StrictBoolLoader) if raw != "" else ""
        _set_dotted(tree, key.strip(), value)
    return tree


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def recipe_path(name: str | Path) -> Path:
    """A run YAML by path, else a shipped recipe by name (`smollm2-eagle3` ->
    configs/runs/smollm2-eagle3.yaml)."""
    path = Path(name)
    if path.is_file():
        return path
    runs = shipped("runs")
    for candidate in (runs / str(name), runs / f"{name}.yaml"):
        if "/" not in str(name) and candidate.is_file():
            return candidate
    names = ", ".join(sorted(p.stem for p in runs.glob("*.yaml")))
    raise ConfigError(f"config file not found: {path} (neither a file nor a shipped recipe: {names})")


# recipe keys that name data files: a relative path there is read against the recipe's folder
DATA_KEYS = (("data", "train"), ("data", "validation"), ("data", "regenerate", "prompts"),
             ("data", "regenerate", "validation_prompts"), ("eval", "prompts"),
             ("drafter", "lookup_datastore"))


def beside_recipe(value: Any, folder: Path, key: str) -> Any:
    """A relative data path written in a recipe, found beside the recipe (an absolute path then) or else in
    the working folder (kept as written); one that is in neither and looks like a file is refused naming both
    places. Vendored names, dataset ids and `regenerated` pass through."""
    from draftsmith.distill.records import FILE_TYPES, NAMED_SOURCES

    if isinstance(value, list):
        return [beside_recipe(v, folder, f"{key}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict) and isinstance(value.get("path"), str):
        return {**value, "path": beside_recipe(value["path"], folder, f"{key}.path")}
    if not isinstance(value,
                      str) or not value or value in NAMED_SOURCES or Path(value).expanduser().is_absolute():
        return value
    pattern = any(ch in value for ch in "*?[")
    here = Path(os.path.normpath(folder.resolve() / value))

    def found(p: Path) -> bool:
        return bool(glob.glob(str(p), recursive=True)) if pattern else p.exists()

    if found(here):
        return str(here)
    if found(Path(value)):
        return value
    if pattern or value.lower().endswith(FILE_TYPES) or value.startswith(("./", "../")):
        raise ConfigError(f"{key}: '{value}' not found; looked beside the recipe ({here}) and in the working "
                          f"folder ({Path.cwd() / value}). A relative path in a recipe is read from the "
                          "recipe's folder: fix the path or give an absolute one")
    return value


def read_recipe(path: Path, chain: tuple[Path, ...] = ()) -> dict:
    """A run YAML with its `base:` recipes merged underneath (a name, a path relative to this file, or a list;
    later bases and then the file itself win); a cycle is an error naming the chain."""
    if path.resolve() in chain:
        raise ConfigError("recipe bases form a cycle: "
                          f"{' -> '.join(p.name for p in (*chain, path.resolve()))}")
    loaded = yaml.load(path.read_text(), Loader=StrictBoolLoader)
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    data = dict(loaded or {})
    for keys in DATA_KEYS:  # relative data paths: read against this file's folder (each base against its own)
        node = data
        for k in keys[:-1]:
            node = node.get(k) if isinstance(node, dict) else None
        if isinstance(node, dict) and keys[-1] in node:
            node[keys[-1]] = beside_recipe(node[keys[-1]], path.parent, ".".join(keys))
    bases = data.pop("base", None)
    merged: dict = {}
    for base in [bases] if isinstance(bases, str) else (bases or []):
        beside = path.parent / str(base)
        base_path = beside if beside.is_file() else (path.parent / f"{base}.yaml"
                                                     if (path.parent / f"{base}.yaml").is_file()
                                                     else recipe_path(base))
        layer = read_recipe(base_path, (*chain, path.resolve()))
        layer.pop("name", None)  # a run is named by its own file
        merged = _merge(merged, layer)
    return _merge(merged, data)


def load_config(path: str | Path | None, overrides: list[str] | None = None,
                flags: dict | None = None) -> RunConfig:
    """Read a run YAML (a path or a shipped recipe's name, with its `base:` recipes; defaults when `path` is
    None), apply the dotted overrides, then `flags` (a nested dict of typed values: a command's flags, which
    win), validate strictly."""
    data: dict = {}
    if path is not None:
        path = recipe_path(path)
        data = read_recipe(path)
        data.setdefault("name", path.stem)
    data = _merge(_merge(data, parse_overrides(overrides or [])), flags or {})
    check_kind_overrides(overrides or [], data)
    return build_section(RunConfig, data)


def check_kind_overrides(overrides: list[str], data: dict) -> None:
    """An override of another kind's own section (`drafter.dflash.x=...` on a dspark run) would be read by
    nobody: refused, naming the section the run's kind reads. (A recipe's `base:` may carry another kind's
    section along; only what the command line says is checked.)"""
    from draftsmith.heads.kind import KINDS

    drafter = data.get("drafter") if isinstance(data.get("drafter"), dict) else {}
    kind = drafter.get("kind", DrafterConfig.kind)
    if kind not in KINDS or drafter.get("path"):
        return  # DrafterConfig names the valid kinds; a drafter folder's kind is its own (eval/serving.py)
    active = KINDS[kind]
    keys = {spec.key for spec in KINDS.values()}
    for item in overrides:
        parts = item.split("=", 1)[0].strip().split(".")
        if len(parts) > 2 and parts[0] == "drafter" and parts[1] in keys and parts[1] != active.key:
            own = {f.name for f in dataclasses.fields(active.settings)}
            fix = (f"write drafter.{active.key}.{'.'.join(parts[2:])}" if parts[2] in own
                   else "drop it")
            key = item.split("=", 1)[0].strip()
            raise ConfigError(f"override '{key}': this run's drafter.kind is {kind}, "
                              f"which reads drafter.{active.key}.*, not drafter.{parts[1]}.* (the setting "
                              f"would be ignored); {fix}")


def config_to_dict(cfg: Any) -> dict:
    """Plain nested dict (tuples as lists) for YAML/JSON output."""

    def plain(v: Any) -> Any:
        if dataclasses.is_dataclass(v):
            out = {}
            for f in dataclasses.fields(v):  # named sub-sections sit at their section's level
                value = plain(getattr(v, f.name))
                if "sections" in f.metadata:  # only the ones in use, when the section says which
                    out.update(plain(v.sections_in_use()) if hasattr(v, "sections_in_use") else value)
                else:
                    out[f.name] = value
            return out
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v

    return plain(cfg)


def dump_config(cfg: RunConfig) -> str:
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False)


def write_resolved(cfg: RunConfig, run_dir: str | Path) -> Path:
    """Every stage records the exact config it ran with in its run folder."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    out = run_dir / "config.resolved.yaml"
    out.write_text(dump_config(cfg))
    return out
