"""The campaign area's shape: every folder of scripts/bench/ is listed in the results index
(docs/results/README.md) and every page it lists exists; scripts/ itself holds only what a user runs, each
entry named in scripts/README.md; no script edits sys.path or hides Python in a shell heredoc; no script is
over 400 lines, no function over 80."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
INDEX = ROOT / "docs" / "results" / "README.md"
USER_ENTRIES = {"README.md", "quickstart.sh", "test.sh", "setup_venv.sh", "gpu_check.py", "gpu_check.sh",
                "slurm", "bench", "dev"}
FILES = sorted(p for p in SCRIPTS.rglob("*") if p.is_file() and p.suffix in (".py", ".sh", ".sbatch")
               and "__pycache__" not in p.parts)
HEREDOC = re.compile(r"<<-?\s*['\"]?[A-Za-z_]")  # `<<'PY'`, `<< EOF` (a here-string `<<<` is not one)
MULTILINE_C = re.compile(r"python3?\"?\s+-c\s+\"[^\"]*\n")  # `python -c "...` running on to another line


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_every_campaign_folder_is_in_the_index_and_every_listed_page_exists():
    index = INDEX.read_text()
    folders = sorted(p.name for p in (SCRIPTS / "bench").iterdir() if p.is_dir() and p.name != "__pycache__")
    assert folders, "scripts/bench/ has no campaign folder"
    unlisted = [f for f in folders if f"](../../scripts/bench/{f}/)" not in index]
    assert not unlisted, f"campaign folders missing from docs/results/README.md: {unlisted}"
    listed = set(re.findall(r"\]\(([\w-]+\.md)\)", index))
    assert listed and all((INDEX.parent / page).is_file() for page in listed), listed
    pages = {p.name for p in INDEX.parent.glob("*.md")} - {"README.md"}
    assert pages <= listed, f"pages the index does not list: {sorted(pages - listed)}"


def test_scripts_holds_what_a_user_runs_and_its_readme_names_every_entry():
    entries = {p.name for p in SCRIPTS.iterdir() if p.name != "__pycache__"}
    assert entries <= USER_ENTRIES, f"scripts/ holds more than a user runs: {sorted(entries - USER_ENTRIES)}"
    readme = (SCRIPTS / "README.md").read_text()
    dev = {p.name for p in (SCRIPTS / "dev").iterdir() if p.name != "__pycache__"}
    missing = sorted(e for e in (entries | dev) - {"README.md"} if f"`{e}" not in readme)
    assert not missing, f"scripts/README.md does not name {missing}"


@pytest.mark.parametrize("path", FILES, ids=_rel)
def test_a_script_imports_normally_and_keeps_its_python_in_python_files(path):
    text = path.read_text()
    assert "sys.path" not in text, (f"{_rel(path)} edits sys.path: import draftsmith.eval.measure.campaign "
                                    "instead")
    if path.suffix in (".sh", ".sbatch"):
        assert not HEREDOC.search(text), (f"{_rel(path)}: Python in a heredoc; put it in a .py file beside "
                                          "the script")
        assert not MULTILINE_C.search(text), f"{_rel(path)}: a multi-line `python -c`; put it in a .py file"


@pytest.mark.parametrize("path", FILES, ids=_rel)
def test_a_script_fits_400_lines_and_its_functions_80(path):
    lines = path.read_text().count("\n")
    assert lines <= 400, f"{_rel(path)}: {lines} lines (split it)"
    if path.suffix == ".py":
        long = [(node.name, node.end_lineno - node.lineno + 1)
                for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                and node.end_lineno - node.lineno >= 80]
        assert not long, f"{_rel(path)}: functions over 80 lines {long}"


def test_the_checks_catch_what_they_claim():
    """Negative twins: a heredoc, a multi-line `python -c`, but not a here-string."""
    assert HEREDOC.search('"$py" - "$out" <<\'PY\'\nprint(1)\nPY\n')
    assert HEREDOC.search("python - <<EOF\n")
    assert not HEREDOC.search('read -r -a extra <<< "${EXTRA:-}"')
    assert MULTILINE_C.search('x=$(.venv/bin/python -c "import json\nprint(1)")')
    assert not MULTILINE_C.search('.venv/bin/python -c "import torch" && echo ok')
