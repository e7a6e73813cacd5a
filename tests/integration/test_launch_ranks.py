"""`draftsmith launch ddp --num-processes 2` on CPU: two real gloo ranks train a tiny Medusa run from a recipe
whose data path is relative to the recipe; a failure on every rank is reported once, with the ranks' exit
code."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def launch(tmp_path, *args):
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="offline")
    return subprocess.run([sys.executable, "-m", "draftsmith.train", "launch", "ddp", "--num-processes", "2",
                           "--", *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)


def test_two_cpu_ranks_train_and_a_rank_failure_is_reported_once(workspace, tmp_path):
    root, target, data = workspace
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "chats.jsonl").write_text(data.read_text())
    recipe = tmp_path / "recipes" / "tiny.yaml"
    recipe.write_text(f"model: {{target: {target}, dtype: float32}}\ndata: {{train: [chats.jsonl], "
                      "max_length: 160}\ndrafter: {kind: medusa, medusa: {heads: 2}}\ntrain: {batch_size: 2, "
                      "max_steps: 3, save_every: 0, eval_every: 0, mixed_precision: 'no'}\nlog: {progress: "
                      "false}\n")
    out = launch(tmp_path, "train", "-c", str(recipe), "--out", str(tmp_path / "run"))
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "train_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["replicas_identical"] is True
    bad = launch(tmp_path, "train", "-c", str(recipe), "--out", str(tmp_path / "bad"),
                 "data.train=[/no/such.jsonl]")
    assert bad.returncode == 2
    assert bad.stderr.count("data source '/no/such.jsonl'") == 1, bad.stderr
    assert "error on every rank (exit code 2)" in bad.stderr
    assert "Traceback" not in bad.stderr and "ChildFailedError" not in bad.stderr
