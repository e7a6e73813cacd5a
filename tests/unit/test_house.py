"""House rules the code keeps: sizes, and the repository paths its prose cites.

Sizes: every package module (heads/, distill/, eval/, train/, configs/, setup.py) is at most 400 lines, and
every function in the package and scripts/ at most 80 (from its first decorator to its last line, nested
functions counted in the function that holds them). A module or function past that is split along a seam of
its own.

Cited paths: every repository path named in the Markdown (docs/ but its data, README.md, any other *.md), in
the shell scripts and the YAML/TOML files, and in the comments and docstrings of the Python files exists. A
citation is a path starting at a top folder (`heads/runtime/tree.py`, `scripts/bench/...`), checked when it
names a file by its suffix (.py .md .sh .yaml .yml .toml), a folder (a trailing slash) or a module's attribute
(`heads/runtime/acceptance.serving_tau`: heads/runtime/acceptance.py defines or imports serving_tau). Left
alone: placeholders (a part in capitals such as NAME, X, KIND, or holding `<`, `>`, `*`, `{`, `...`), and
every other suffix or none (a run folder's `eval/summary.json`, metric names such as `train/loss`).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ("heads", "distill", "eval", "train", "configs")
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 80
SKIP_DIRS = {".venv", "venv", ".git", "__pycache__", "node_modules"}
SKIP_TOP = {"build", "dist", "runs", "wandb"}  # outputs, at the top only (configs/runs/ holds the recipes)


def _files(roots, suffixes) -> list[Path]:
    out = []
    for root in roots:
        paths = [root] if root.is_file() else root.rglob("*")
        for path in paths:
            rel = path.relative_to(ROOT).parts
            if (path.is_file() and path.suffix in suffixes
                    and not any(p in SKIP_DIRS or p.startswith(".") or p.endswith(".egg-info")
                                for p in rel[:-1])
                    and rel[0] not in SKIP_TOP):
                out.append(path)
    return sorted(out)


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


PACKAGE_MODULES = _files([ROOT / f for f in PACKAGE] + [ROOT / "setup.py"], {".py"})
FUNCTION_FILES = PACKAGE_MODULES + _files([ROOT / "scripts"], {".py"})


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int]]:
    """(name, lines) of every function in `source` longer than `limit` lines, decorators included."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            if node.end_lineno - first + 1 > limit:
                out.append((node.name, node.end_lineno - first + 1))
    return out


def test_package_modules_are_at_most_400_lines():
    over = {_rel(p): n for p in PACKAGE_MODULES if (n := len(p.read_text(encoding="utf-8").splitlines()))
            > MAX_MODULE_LINES}
    assert not over, f"package modules over {MAX_MODULE_LINES} lines (split each along a seam): {over}"


def test_functions_are_at_most_80_lines():
    over = {_rel(p): found for p in FUNCTION_FILES
            if (found := long_functions(p.read_text(encoding="utf-8")))}
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines (split each into named steps): {over}"


def test_the_function_rule_has_teeth():
    """Negative twin: an 81-line function (a decorator and a nested function counted) is found, an 80-line one
    not."""
    body = "\n".join(f"    x{i} = {i}" for i in range(77))
    source = f"@staticmethod\ndef f():\n    def g():\n        pass\n{body}\n"
    assert long_functions(source) == [("f", 81)]
    assert long_functions(source.replace("@staticmethod\n", "")) == []


# a path from a top folder, not inside another path (`runs/x/eval/summary.json`) or a URL
CITATION = re.compile(
    r"(?<![\w./-])((?:heads|distill|eval|train|configs|scripts|tests|docs)/[\w./<>*{}-]*[\w/>*}])")
FILE_SUFFIXES = {".py", ".md", ".sh", ".sbatch", ".yaml", ".yml", ".toml"}
DATA_SUFFIXES = {".json", ".jsonl", ".safetensors", ".png", ".svg", ".txt", ".csv", ".gz", ".pt", ".bin",
                 ".log", ".html", ".lock", ".cfg", ".ini", ".tmp", ".stage", ".zip", ".tar", ".whl"}


def placeholder(part: str) -> bool:
    """NAME, X, KIND, shard-NNNNN, <kind>, *.py, {a,b}, ...: a stand-in for a path, not a path."""
    return bool(re.search(r"[<>*{}]|\.\.\.", part) or re.fullmatch(r"[A-Z][A-Z0-9_]*", part.split(".")[0])
                or re.search(r"-[A-Z]{2,}\b", part))


def _defined(module: Path) -> set[str]:
    """Top-level names a module defines or imports."""
    names = set()
    for node in ast.parse(module.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def stale(citation: str, root: Path = ROOT) -> str | None:
    """Why `citation` names nothing in the repository (None when it does, or when it is not checked)."""
    citation = citation.rstrip(".")
    parts = citation.rstrip("/").split("/")
    if any(placeholder(p) for p in parts):
        return None
    if citation.endswith("/"):
        return None if (root / citation).is_dir() else "no such folder"
    last = parts[-1]
    stem, dot, attr = last.partition(".")
    suffix = "." + last.rsplit(".", 1)[-1] if dot else ""
    if suffix in FILE_SUFFIXES:
        return None if (root / citation).is_file() else "no such file"
    if not dot or suffix in DATA_SUFFIXES:
        return None
    module = root.joinpath(*parts[:-1], stem + ".py")  # dir/module.attr[.attr]
    if not module.is_file():
        return f"no module {module.relative_to(root)}"
    name = attr.split(".")[0]
    return None if name in _defined(module) else f"{module.relative_to(root)} has no {name}"


def _python_prose(text: str) -> str:
    """The comments and docstrings (and other bare string statements) of a Python file."""
    out = [tok.string for tok in tokenize.generate_tokens(io.StringIO(text).readline)
           if tok.type == tokenize.COMMENT]
    out += [node.value.value for node in ast.walk(ast.parse(text))
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)]
    return "\n".join(out)


PROSE_FILES = [p for p in _files([ROOT], FILE_SUFFIXES)
               if not _rel(p).startswith("docs/results/data/")]


@pytest.mark.parametrize("path", PROSE_FILES, ids=_rel)
def test_cited_paths_exist(path):
    text = path.read_text(encoding="utf-8")
    prose = _python_prose(text) if path.suffix == ".py" else text
    bad = {c: why for c in CITATION.findall(prose) if (why := stale(c))}
    assert not bad, f"{_rel(path)} cites paths that are not in the repository: {bad}"


def test_the_citation_check_has_teeth():
    """Negative twin: a moved module, a missing file and a vanished function are found; placeholders,
    run-folder files and metric names are not checked."""
    found = {c: stale(c) for c in CITATION.findall(
        "see heads/acceptance.serving_tau, heads/runtime/acceptance.serving_tau, "
        "heads/runtime/acceptance.nothing, scripts/bench/step_cost.py, scripts/bench/NAME/run.sh, "
        "configs/runs/X.yaml, heads/<kind>/model.py, a run's eval/summary.json, train/loss, heads/runtime/, "
        "heads/nowhere/ and runs/x/eval/plan.py")}
    assert found == {"heads/acceptance.serving_tau": "no module heads/acceptance.py",
                     "heads/runtime/acceptance.serving_tau": None,
                     "heads/runtime/acceptance.nothing": "heads/runtime/acceptance.py has no nothing",
                     "scripts/bench/step_cost.py": "no such file", "scripts/bench/NAME/run.sh": None,
                     "configs/runs/X.yaml": None, "heads/<kind>/model.py": None, "eval/summary.json": None,
                     "train/loss": None, "heads/runtime/": None, "heads/nowhere/": "no such folder"}
