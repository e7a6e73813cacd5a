"""vLLM's speculators library loads our speculators export and agrees with our logits; `speculators convert`
accepts our eagle3 export (scripts/dev/engine_check.sh, in a venv of its own: slow, builds it once)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_speculators_library_loads_our_export(tmp_path):
    env = dict(os.environ, SPEC_VENV=os.environ.get("SPEC_VENV", str(ROOT / ".engine-venv")))
    run = subprocess.run(["bash", str(ROOT / "scripts" / "dev" / "engine_check.sh"), str(tmp_path)], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=3600)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    result = json.loads((tmp_path / "speculators-check.json").read_text())
    assert result["missing"] == [] and result["unexpected"] == [] and result["loaded_equal"]
    assert (result["max_abs_logit_diff"] < 1e-4 and result["convert_returncode"] == 0
            and result["convert_tensors_equal"])
