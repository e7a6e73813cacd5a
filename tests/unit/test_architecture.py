"""Guards for the package structure (docs/architecture.md draws the floors these check).

Floors, bottom up, each importing only floors below it: configs (data) <- distill (the target, data, features)
<- heads (base modules <- the decoding runtime heads/runtime/ <- the kind folders heads/<kind>/ <- the tables'
readers heads/registry.py, folder.py, export.py) <- eval (eval/decode, the decoder loop <- eval/serving.py <-
eval/measure) <- train. The import graph of the whole package has no cycle, imports inside functions counted,
and `heads/registry.py discover_kinds` counted as an import of every kind folder (it imports them at run
time). No bare `import train|eval|heads|distill` anywhere (the folders are importable only as `draftsmith.*`);
generic code names no drafter kind; every package folder ships (setup.py lists them); runtime files ship as
package data; every module has a docstring.
"""

import ast
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("heads", "distill", "eval", "train", "configs")
# what each folder may import of ours (besides itself)
ALLOWED = {"configs": set(), "distill": {"configs"}, "heads": {"distill", "configs"},
           "eval": {"heads", "distill", "configs"}, "train": {"heads", "distill", "eval", "configs"}}
# the floors inside heads/ and eval/, bottom up: a module may import its own floor and those below
HEADS_FLOORS = ("base", "runtime", "kind", "tables")
TABLES = {"registry.py", "folder.py", "export.py"}
EVAL_FLOORS = ("decode", "serving", "measure")
SKIP_DIRS = {".venv", "venv", ".git", "build", "dist", "runs", "wandb", "__pycache__", "node_modules"}


def _py_files(folders=None) -> list[Path]:
    roots = [ROOT / f for f in folders] if folders else [ROOT]
    files = []
    for root in roots:
        for path in root.rglob("*.py"):
            rel = path.relative_to(ROOT).parts
            if not any(p in SKIP_DIRS or p.startswith(".") or p.endswith(".egg-info") for p in rel[:-1]):
                files.append(path)
    return sorted(files)


def _imports(path: Path) -> list[tuple[str, int]]:
    """(module name, level) of every import in the file, including those inside functions; `from a import b`
    also yields `a.b` (b may be a module)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, 0) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((node.module or "", node.level))
            out += [(f"{node.module}.{alias.name}", node.level) for alias in node.names if node.module]
    return out


PACKAGE_FILES = _py_files(FOLDERS)
ALL_FILES = _py_files()


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(["draftsmith", *(parts[:-1] if parts[-1] == "__init__" else parts)])


MODULE_FILES = {_module_name(p): p for p in PACKAGE_FILES}
KIND_FOLDERS = sorted(p.parent.name for p in (ROOT / "heads").glob("*/__init__.py")
                      if p.parent.name != "runtime")


def _resolve(module: str) -> str | None:
    """The package module an imported name lives in (`draftsmith.heads.files.META` ->
    draftsmith.heads.files)."""
    while module and module not in MODULE_FILES:
        module = module.rpartition(".")[0]
    return module or None


def _edges() -> dict[str, set[str]]:
    edges = {name: set() for name in MODULE_FILES}
    for name, path in MODULE_FILES.items():
        for module, _ in _imports(path):
            target = _resolve(module) if module.startswith("draftsmith.") else None
            if target and target != name and not name.startswith(target + "."):  # a package's own __init__
                edges[name].add(target)
    # discover_kinds
    edges["draftsmith.heads.registry"] |= {f"draftsmith.heads.{kind}" for kind in KIND_FOLDERS}
    return edges


def _heads_floor(parts: tuple[str, ...]) -> str:
    if len(parts) == 2:
        return "tables" if parts[1] in TABLES else "base"
    return "runtime" if parts[1] == "runtime" else "kind"


def _eval_floor(parts: tuple[str, ...]) -> str:
    return {"decode": "decode", "serving.py": "serving", "measure": "measure"}.get(parts[1], "decode")


@pytest.mark.parametrize("path", PACKAGE_FILES, ids=_rel)
def test_import_direction(path):
    own = path.relative_to(ROOT).parts
    for module, level in _imports(path):
        assert level == 0, f"{_rel(path)}: relative import (use absolute draftsmith.* imports)"
        target = _resolve(module) if module.startswith("draftsmith.") else None
        if target is None:
            continue
        theirs = MODULE_FILES[target].relative_to(ROOT).parts
        assert theirs[0] in ALLOWED[own[0]] | {own[0]}, \
            f"{_rel(path)} ({own[0]}) imports {module} ({theirs[0]}): {own[0]} may import only " \
            f"{sorted(ALLOWED[own[0]]) or 'nothing of ours'}"
        if own[0] == theirs[0] == "heads":
            mine, their = _heads_floor(own), _heads_floor(theirs)
            assert HEADS_FLOORS.index(their) <= HEADS_FLOORS.index(mine), \
                f"{_rel(path)} (heads {mine} floor) imports {module} (heads {their} floor)"
        if own[0] == theirs[0] == "eval":
            mine, their = _eval_floor(own), _eval_floor(theirs)
            assert EVAL_FLOORS.index(their) <= EVAL_FLOORS.index(mine), \
                f"{_rel(path)} (eval {mine} floor) imports {module} (eval {their} floor)"


@pytest.mark.parametrize("path", ALL_FILES, ids=_rel)
def test_no_bare_folder_imports(path):
    for module, level in _imports(path):
        if level == 0:
            assert module.split(".")[0] not in FOLDERS, \
                f"{_rel(path)}: `import {module}` — use draftsmith.{module} (the folders are not top-level " \
                "modules)"


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}

    def visit(node, stack):
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt, stack + [nxt])
                if found:
                    return found
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            found = visit(node, [node])
            if found:
                return found
    return None


def test_the_import_graph_has_no_cycle():
    """Every import counts, wherever it sits (a function-level import that closes a circle only hides it)."""
    cycle = _cycle(_edges())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_check_has_teeth():
    """Negative twin: a kind module importing the registry (which discovers that kind) is a cycle."""
    edges = _edges()
    edges["draftsmith.heads.eagle.proposer"].add("draftsmith.heads.registry")
    assert _cycle(edges) is not None


# heads/export.py is not here: its format names (medusa, eagle3, ...) are the engines' vocabulary and
# coincide with kind names; which kind writes which format is the kind's row
GENERIC = ["train/loop.py", "train/pipeline.py", "train/cli.py", "train/onpolicy.py", "train/sources.py",
           "train/config.py", "distill/data.py", "distill/extract.py", "heads/folder.py",
           "eval/decode/decoder.py", "eval/measure/bench.py", "eval/measure/evaluate.py", "eval/serving.py"]


@pytest.mark.parametrize("rel", GENERIC)
def test_generic_code_names_no_kind(rel):
    """Generic stages ask the kind's row in heads/registry.py; a kind's name in a string there is a special
    case."""
    from draftsmith.heads.registry import KINDS

    tree = ast.parse((ROOT / rel).read_text(encoding="utf-8"))
    strings = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
               and isinstance(node.value, str)}
    named = sorted(strings & set(KINDS))
    assert not named, f"{rel} names drafter kinds {named}: ask heads.registry.KINDS instead"


def test_packages_are_discovered_not_listed():
    """setup.py lists every package folder itself, so a new kind folder needs no edit outside it."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "packages" not in setuptools and "package-dir" not in setuptools
    namespace: dict = {"__file__": str(ROOT / "setup.py")}
    source = (ROOT / "setup.py").read_text().replace("setup(packages", "dict(packages")
    exec(compile(source, "setup.py", "exec"), namespace)
    found = {"draftsmith." + ".".join(init.parent.relative_to(ROOT).parts)
             for folder in FOLDERS for init in (ROOT / folder).rglob("__init__.py")
             if "__pycache__" not in init.parts}
    assert set(namespace["PACKAGES"]) == found


def test_vendored_corpora_ship_in_the_wheel():
    from fnmatch import fnmatch

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = setuptools.get("package-data", {}).get("draftsmith.distill", [])
    corpora = [p.relative_to(ROOT / "distill").as_posix() for p in (ROOT / "distill" / "corpora").iterdir()]
    unshipped = [c for c in corpora if not any(fnmatch(c, pattern) for pattern in patterns)]
    assert corpora and not unshipped, f"distill/ package-data {patterns} does not cover {unshipped}"


def test_shipped_configs_are_package_data():
    from fnmatch import fnmatch

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = setuptools.get("package-data", {}).get("draftsmith.configs", [])
    files = [p.relative_to(ROOT / "configs").as_posix() for p in (ROOT / "configs").rglob("*")
             if p.is_file() and p.suffix != ".py" and "__pycache__" not in p.parts]
    unshipped = [f for f in files if not any(fnmatch(f, pattern) for pattern in patterns)]
    assert files and not unshipped, f"configs/ package-data {patterns} does not cover {unshipped}"


MODULES = PACKAGE_FILES


@pytest.mark.parametrize("path", MODULES, ids=_rel)
def test_every_module_has_a_docstring(path):
    assert ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))), (f"{_rel(path)} has no module "
                                                                            "docstring")


def test_kinds_are_discovered():
    """Every folder under heads/ but the runtime registers at least one kind, and the registry finds them
    all."""
    from draftsmith.heads.registry import KINDS

    modules = {spec.proposer.__module__.split(".")[2] for spec in KINDS.values()
               if spec.proposer.__module__.startswith("draftsmith.heads.")}
    assert set(KIND_FOLDERS) <= modules, ("kind folders no kind comes from: "
                                          f"{sorted(set(KIND_FOLDERS) - modules)}")
