"""Guards for the package structure (see DESIGN.md: the data flow is the package structure).

Import direction heads <- distill <- eval <- train (configs: data every layer may read). A kind is a folder,
heads/<kind>/, holding its code at every floor: its proposer (and the eval-side modules in KIND_FLOORS) sit on
eval's floor, the rest on heads'; the kind's `__init__.py` reaches those higher floors only from inside its hook
functions (the row's callables), never at import time. No bare
`import train|eval|heads|distill` anywhere (the folders are importable only as `draftsmith.*`); no
import circle inside a folder, counting imports placed inside functions (a function-level import
that closes a circle only hides it); generic code names no drafter kind; every package folder is
listed in pyproject and vice versa; runtime files ship as package data; every module has a docstring.
"""

import ast
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("heads", "distill", "eval", "train", "configs")
# what each folder may import of ours (besides itself)
ALLOWED = {"heads": set(), "distill": {"heads"}, "eval": {"heads", "distill", "configs"},
           "train": {"heads", "distill", "eval", "configs"}, "configs": set()}
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
    """(module name, level) of every import in the file, including those inside functions."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, 0) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((node.module or "", node.level))
    return out


# the modules of a kind folder that sit on a higher floor than heads/ (they may import what that floor may)
KIND_FLOORS = {"proposer.py": "eval", "tree_search.py": "eval", "datastore.py": "eval"}


def _floor(parts: tuple[str, ...] | list[str]) -> str:
    """The floor of a file or module path under the repository root, e.g. ("heads", "medusa", "proposer.py")."""
    if parts[0] == "heads" and len(parts) >= 3:
        return KIND_FLOORS.get(parts[2] if parts[2].endswith(".py") else parts[2] + ".py", "heads")
    return parts[0]


def _hook_imports(path: Path) -> set[str]:
    """Modules imported inside the functions of a kind folder's `__init__.py` (its row's hooks)."""
    parts = path.relative_to(ROOT).parts
    if not (parts[0] == "heads" and len(parts) == 3 and parts[2] == "__init__.py"):
        return set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.module for fn in tree.body if isinstance(fn, ast.FunctionDef)
            for node in ast.walk(fn) if isinstance(node, ast.ImportFrom) and node.module}


PACKAGE_FILES = _py_files(FOLDERS)
ALL_FILES = _py_files()


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("path", PACKAGE_FILES, ids=_rel)
def test_import_direction(path):
    floor, own = _floor(path.relative_to(ROOT).parts), path.relative_to(ROOT).parts[:2]
    hooks = _hook_imports(path)
    for module, level in _imports(path):
        assert level == 0, f"{_rel(path)}: relative import (use absolute draftsmith.* imports)"
        parts = module.split(".")
        if parts[0] != "draftsmith" or len(parts) < 2:
            continue
        if module in hooks:  # a kind's hook reaches its own folder's higher floors, and nothing else
            assert tuple(parts[1:3]) == own, f"{_rel(path)}: a hook imports {module}, outside its kind folder"
            continue
        target = _floor(parts[1:])
        assert target in ALLOWED[floor] | {floor}, \
            f"{_rel(path)} ({floor} floor) imports {module} ({target} floor): {floor} may import only " \
            f"{sorted(ALLOWED[floor]) or 'nothing of ours'}"


@pytest.mark.parametrize("path", ALL_FILES, ids=_rel)
def test_no_bare_folder_imports(path):
    for module, level in _imports(path):
        if level == 0:
            assert module.split(".")[0] not in FOLDERS, \
                f"{_rel(path)}: `import {module}` — use draftsmith.{module} (the folders are not top-level modules)"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(["draftsmith", *(parts[:-1] if parts[-1] == "__init__" else parts)])


@pytest.mark.parametrize("folder", FOLDERS)
def test_no_import_circle_inside_a_folder(folder):
    """The modules of one folder import each other along a DAG (every import counts, wherever it sits, except a
    kind's hooks: the declared edges up to its own higher-floor modules, checked by test_import_direction)."""
    files = [p for p in PACKAGE_FILES if p.relative_to(ROOT).parts[0] == folder]
    names = {_module_name(p): p for p in files}
    edges = {name: set() for name in names}
    for name, path in names.items():
        hooks = _hook_imports(path)
        for module, _ in _imports(path):
            if module in hooks:
                continue
            # `from draftsmith.eval.decode.proposers import x` depends on the package; a submodule import on that file
            targets = [m for m in names if module == m or module.startswith(m + ".")]
            edges[name] |= {max(targets, key=len)} - {name} if targets else set()
    state: dict[str, int] = {}

    def visit(node, stack):
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                raise AssertionError(f"import circle inside {folder}/: {' -> '.join(cycle)}")
            if nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])


# heads/export.py is not here: its format names (medusa, eagle3, ...) are the engines' vocabulary and
# coincide with kind names; which kind writes which format is the kind's row
GENERIC = ["train/loop.py", "train/pipeline.py", "train/cli.py", "train/onpolicy.py", "train/sources.py",
           "train/config.py", "distill/data.py", "distill/extract.py", "heads/folder.py",
           "eval/decode/decoder.py", "eval/measure/bench.py", "eval/measure/evaluate.py", "eval/decode/proposers/__init__.py"]


@pytest.mark.parametrize("rel", GENERIC)
def test_generic_code_names_no_kind(rel):
    """Generic stages ask the kind's row in heads/registry.py; a kind's name in a string there is a special case."""
    from draftsmith.heads.registry import KINDS

    tree = ast.parse((ROOT / rel).read_text(encoding="utf-8"))
    strings = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    named = sorted(strings & set(KINDS))
    assert not named, f"{rel} names drafter kinds {named}: ask heads.registry.KINDS instead"


def test_package_folders_match_pyproject():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed, package_dir = set(setuptools["packages"]), setuptools["package-dir"]
    assert package_dir == {f"draftsmith.{f}": f for f in FOLDERS}
    found = {"draftsmith." + ".".join(init.parent.relative_to(ROOT).parts)
             for folder in FOLDERS for init in (ROOT / folder).rglob("__init__.py")
             if "__pycache__" not in init.parts}
    assert found - listed == set(), "package folders missing from [tool.setuptools] packages"
    assert listed - found == set(), "packages listed in pyproject without a folder holding __init__.py"


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
    assert ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))), f"{_rel(path)} has no module docstring"


def test_the_decoding_runtime_imports_no_measurement():
    """eval/decode/ is what a server would ship; eval/measure/ (eval, bench, plan, engines) sits on top of it."""
    bad = []
    for path in _py_files(["eval/decode"]) + _py_files(["heads"]):
        rel = path.relative_to(ROOT)
        if rel.parts[0] == "heads" and _floor(rel.parts) != "eval":
            continue
        bad += [f"{rel}: {mod}" for mod, _ in _imports(path) if mod.startswith("draftsmith.eval.measure")]
    assert not bad, "the decoding runtime reaches into measurement:\n" + "\n".join(bad)
