"""A normal (non-editable) install works: the built wheel carries every runtime file.

Builds the wheel from a copy of the tracked tree (offline, no build isolation), installs it with
`--no-deps` into a fresh venv that sees this environment's packages but not its editable finder, and
runs from outside the repository: the imported `draftsmith` files are the venv's, a shipped tree
loads by name, every shipped recipe loads by name, the launch presets are there, the console script
resolves a recipe by name, `draftsmith eval --tree NAME` runs, and the shipped Medusa quick recipe runs
as a pipeline (train -> tree search -> exports -> eval) on a tiny target.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECK = """
import sys
from pathlib import Path
import draftsmith.heads.runtime.tree as tree, draftsmith.heads.registry as registry
import draftsmith.train.cli as cli
from draftsmith.configs import shipped
from draftsmith.train.config import load_config
venv = Path(sys.prefix).resolve()
for module in (tree, registry, cli):
    assert venv in Path(module.__file__).resolve().parents, (module.__file__, venv)
assert len(tree.load_tree("medusa-k4-default")) == 54
recipes = sorted(p.stem for p in shipped("runs").glob("*.yaml"))
assert len(recipes) >= 8, recipes
for name in recipes:  # the model-neutral recipes (eagle3, medusa, ...) need the user's target: name one
    load_config(name, ["model.target=acme/tiny"])
assert (shipped("accelerate") / "ddp.yaml").is_file() and (shipped("deepspeed") / "zero2.json").is_file()
print("ok", len(recipes))
"""


def tracked_copy(dest: Path) -> Path:
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    for rel in files:
        if (ROOT / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dest / rel)
    return dest


def files_of(tree: Path) -> dict[str, bytes]:
    return {str(p.relative_to(tree)): p.read_bytes() for p in sorted(tree.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git to list the tracked files")
def test_wheel_install_runs_outside_the_repo(tmp_path, workspace):
    src = tracked_copy(tmp_path / "src")
    # adding a kind is one folder: the tests' bigram kind dropped into heads/ and nothing else changed
    before = files_of(src)
    shutil.copytree(ROOT / "tests" / "bigram_kind", src / "heads" / "bigram",
                    ignore=shutil.ignore_patterns("__pycache__"))
    after = files_of(src)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    assert changed == sorted(f"heads/bigram/{p.name}" for p in (ROOT / "tests" / "bigram_kind").glob("*.py"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                    "-q", "-w", str(tmp_path / "dist"), str(src)], check=True, capture_output=True, text=True)
    (wheel,) = (tmp_path / "dist").glob("draftsmith-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    site = Path(subprocess.run([venv / "bin" / "python", "-c",
                                "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # this environment's packages as a plain path entry: its .pth files (the editable finder) do not run
    (site / "outer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([venv / "bin" / "python", "-m", "pip", "install", "--no-deps", "--no-index", "-q",
                    str(wheel)],
                   check=True, capture_output=True, text=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = subprocess.run([venv / "bin" / "python", "-c", CHECK], cwd=elsewhere, capture_output=True,
                         text=True)
    assert run.returncode == 0 and run.stdout.startswith("ok"), run.stderr[-2000:]
    cli = subprocess.run([venv / "bin" / "draftsmith", "config", "-c", "smollm2-eagle3-quick",
                          "drafter.eagle3.ttt_steps=2"],
                         cwd=elsewhere, capture_output=True, text=True)
    assert cli.returncode == 0 and "ttt_steps: 2" in cli.stdout, cli.stderr[-2000:]

    _, target, data = workspace
    tiny = [f"model.target={target}", "model.dtype=float32", "eval.prompts=mt-bench", "eval.limit=1",
            "eval.max_new_tokens=6", "eval.warmup=0", "eval.dtype=float32", "log.progress=false"]
    ds = str(venv / "bin" / "draftsmith")
    run = subprocess.run([ds, "eval", "--drafter", "layer-skip", "--tree", "medusa-k4-default", "--out",
                          str(elsewhere / "eval"), "drafter.layer_skip.layers=1", *tiny],
                         cwd=elsewhere, capture_output=True, text=True)
    assert run.returncode == 0 and (elsewhere / "eval" / "summary.json").is_file(), run.stderr[-2000:]
    run = subprocess.run([ds, "pipeline", "-c", "smollm2-medusa-quick", "--out", str(elsewhere / "medusa"),
                          *tiny, f"data.train=[{data}]", "data.max_length=160", "data.val_fraction=0.2",
                          "train.max_steps=2", "drafter.medusa.heads=2", "drafter.tree_nodes=3",
                          "export.dtype=float32"],
                         cwd=elsewhere, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((elsewhere / "medusa" / "eval" / "summary.json").read_text())
    assert summary["greedy_equal"] is True and summary["tree"] == "tree-opt-3"
    assert (elsewhere / "medusa" / "export" / "medusa-vllm" / "SERVE.md").is_file()
    # the kind added as a folder: listed, trained, exported in its own format and evaluated, from the wheel
    kinds = subprocess.run([ds, "kinds"], cwd=elsewhere, capture_output=True, text=True)
    assert kinds.returncode == 0 and "bigram: " in kinds.stdout and "bigram-table (" in kinds.stdout, (
        kinds.stderr)
    run = subprocess.run([ds, "pipeline", "-c", "smollm2-medusa-quick", "--out", str(elsewhere / "bigram"),
                          *tiny, f"data.train=[{data}]", "data.max_length=160", "data.val_fraction=0.2",
                          "train.max_steps=2", "drafter.kind=bigram", "drafter.tree_nodes=0",
                          "drafter.num_speculative_tokens=2", "export.formats=[bigram-table]",
                          "export.dtype=float32"],
                         cwd=elsewhere, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((elsewhere / "bigram" / "eval" / "summary.json").read_text())
    assert (summary["greedy_equal"] is True
            and (elsewhere / "bigram" / "export" / "bigram-table" / "bigram.safetensors").is_file())
