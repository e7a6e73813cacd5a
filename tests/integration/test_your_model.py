"""README's "Your model in five commands", run as written, from an empty folder, on a tiny model in an HF
cache.

The commands are parsed from README.md (its first bash block under "## Your model"), the Hub id it names
swapped for `acme/tiny`: a 4-layer tiny Llama laid out as the Hugging Face cache lays out a download
(`HF_HOME/hub/models--acme--tiny/snapshots/<sha>/` with `refs/main`, `HF_HUB_OFFLINE=1`), and `my_chats.json`
is 30 ShareGPT records. Nothing else is given: no shipped path, no override the README does not show. And the
model-neutral recipes carry nothing of the reference targets:
`draftsmith config -c eagle3 model.target=acme/tiny` names no SmolLM2 or Gemma and no datastore. Not
slow-marked: ~45 s on a 2-core CPU.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import build_tiny_model_dir

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
NEUTRAL = ("eagle3", "eagle1", "medusa", "draft")
SHA = "0123456789abcdef0123456789abcdef01234567"


def readme_commands() -> tuple[str, str]:
    """(the bash block of README's "Your model" section, the Hub id its first command names)."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Your model"):]
    block = re.search(r"^```bash\n(.*?)^```", section, re.S | re.M).group(1)
    target = re.search(r"draftsmith target --target (\S+)", block).group(1)
    return block, target


def sharegpt(n: int) -> list[dict]:
    """`n` ShareGPT records whose answers run from a few to ~900 bytes (the tiny tokenizer is byte-level)."""
    return [{"id": f"chat{i}", "conversations": [
        {"from": "human", "value": f"question {i}: tell me"},
        {"from": "gpt", "value": " ".join(["the answer is abc def"] * (2 + (i * 7) % 40)) + f" {i}"}]}
        for i in range(n)]


@pytest.fixture
def user(tmp_path, tiny_models_root):
    """An empty working folder, and the environment of a user whose HF cache holds acme/tiny (offline)."""
    snapshot = tmp_path / "hf" / "hub" / "models--acme--tiny" / "snapshots" / SHA
    # EAGLE-3 fuses 3 of >= 4
    shutil.copytree(build_tiny_model_dir(tiny_models_root, "llama", layers=4), snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text(SHA)
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}", HF_HOME=str(tmp_path / "hf"),
               HF_HUB_OFFLINE="1", DRAFTSMITH_HOME=str(tmp_path / "home"), TQDM_DISABLE="1")
    env.pop("HF_HUB_CACHE", None)
    return work, env


def test_the_readme_commands_run_as_written(user):  # ~45 s: the eval stage's 40 prompts
    work, env = user
    block, target = readme_commands()
    (work / "my_chats.json").write_text(json.dumps(sharegpt(30), indent=1))
    script = "set -euo pipefail\n" + block.replace(target, "acme/tiny")
    done = subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout + done.stderr
    # the data line says what `auto` chose; the split exists for 30 conversations
    assert "max_length 1024 (p99 of 30 conversations); 0 of 30 truncated" in out, out[-3000:]
    run = work / "runs" / "mine"
    data = json.loads((run / "data.json").read_text())
    assert (data["max_length"], data["truncated"], data["train"], data["validation"]) == (1024, 0, 26, 4)
    assert "vllm serve acme/tiny" in done.stdout  # step 5 printed SERVE.md
    summary = json.loads((run / "eval" / "summary.json").read_text())
    assert summary and (run / "export" / "speculators").is_dir()
    resolved = (run / "config.resolved.yaml").read_text()
    assert not re.search(r"smollm|gemma", resolved,
                         re.I), ("a reference target's setting reached the user's run")


@pytest.mark.parametrize("name", NEUTRAL)
def test_a_neutral_recipe_names_no_reference_model_and_no_datastore(name):
    done = subprocess.run([str(BIN / "draftsmith"), "config", "-c", name, "model.target=acme/tiny"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert not re.search(r"smollm|gemma", done.stdout, re.I), done.stdout
    assert "lookup_datastore: []" in done.stdout and "max_minutes: null" in done.stdout
    assert "max_length: auto" in done.stdout and "val_fraction: auto" in done.stdout
    # without a target it fails, naming the fix
    missing = subprocess.run([str(BIN / "draftsmith"), "config", "-c", name], capture_output=True, text=True,
                             timeout=120)
    assert missing.returncode != 0 and "model.target=ORG/NAME" in missing.stderr
