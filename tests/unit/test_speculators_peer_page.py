"""scripts/bench/speculators_peer.sh's full head-to-head (every prompt set and tree) on its page, and its guard."""

import copy
import json
import subprocess
from pathlib import Path

from helpers import load_script

ROOT = Path(__file__).resolve().parents[2]


def test_every_prompt_set_and_tree_is_a_row_with_its_paired_delta():
    data = json.loads((ROOT / "docs/results/data/speculators-peer.json").read_text())
    render = load_script("results_pages").render_speculators_peer
    assert "τ on every prompt set and tree" not in "\n".join(render(data))  # stage 1: the two trees only
    full = copy.deepcopy(data)
    for who, tau in (("ours", 1.5), ("peer", 1.4)):
        full[who]["evals"] = {s: {t: {"tau": tau, "acceptance_by_depth": [0.3], "n_prompts": 80, "max_new_tokens": 128,
                                      "dtype": "bfloat16"} for t in ("dynamic-16", "chain-1")}
                              for s in ("spec-bench", "mt-bench")}
    full["paired_by_set"] = {"mt-bench chain-1": {"delta_tau": 0.1, "ci95": [0.05, 0.15]}}
    page = "\n".join(render(full))
    assert "| mt-bench (80 x 128) | chain-1 | 1.500 | 1.400 | 0.100 [0.050, 0.150] |" in page
    assert "| spec-bench (80 x 128) | dynamic-16 | 1.500 | 1.400 | – |" in page


def test_trees_without_the_pages_columns_are_refused_before_any_work(tmp_path):
    run = subprocess.run(["bash", "scripts/bench/speculators_peer.sh", str(tmp_path / "out")], cwd=ROOT,
                         env={"PATH": "/usr/bin:/bin", "TREES": "chain-1 chain-2"}, capture_output=True, text=True)
    assert run.returncode == 2 and "TREES must hold dynamic-16 and chain-5" in run.stderr
    assert not (tmp_path / "out").exists()


def test_the_default_trees_and_the_stage_2_trees_pass_the_guard(tmp_path):
    # past the guard the script checks its venvs and makes OUT: OUT is a file here, so it stops at `mkdir -p OUT`
    venv = tmp_path / "spec-venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "speculators").write_text("#!/bin/sh\n")
    (venv / "bin" / "speculators").chmod(0o755)
    (tmp_path / "out").write_text("")
    for trees in (None, "dynamic-16 chain-1 chain-2 chain-3 chain-4 chain-5", "chain-5 dynamic-16"):
        env = {"PATH": "/usr/bin:/bin", "SPEC_VENV": str(venv), **({"TREES": trees} if trees else {})}
        run = subprocess.run(["bash", "scripts/bench/speculators_peer.sh", str(tmp_path / "out")], cwd=ROOT, env=env,
                             capture_output=True, text=True)
        assert "TREES must hold" not in run.stderr and "mkdir" in run.stderr, (trees, run.stderr)


def test_the_one_epoch_page_names_both_prompt_sets_and_the_peers_resumed_runs():
    data = json.loads((ROOT / "docs/results/data/speculators-peer.json").read_text())
    render = load_script("results_pages").render_speculators_peer
    assert "40 Spec-Bench prompts x 128" in "\n".join(render(data))  # stage 1 reads as it did
    full = copy.deepcopy(data)
    del full["ours_wall"]
    full["paired"] = {}
    for who in ("ours", "peer"):
        full[who]["evals"] = {s: {t: {"tau": 1.5, "acceptance_by_depth": [0.3], "n_prompts": 80, "max_new_tokens": 128,
                                      "dtype": "bfloat16"} for t in ("dynamic-16", "chain-1", "chain-2", "chain-5")}
                              for s in ("spec-bench", "mt-bench")}
    full["peer"]["train_sittings"] = 3
    assert "median s / step" not in "\n".join(render(full))  # stage 1's JSON has no per-step timer: no column
    full["ours"]["median_step_seconds"], full["peer"]["median_step_seconds"] = 1.08, 2.0
    page = "\n".join(render(full))
    assert "| s / step | median s / step |" in page and "| 1.08 | 1.474 |" in page and "| 2.00 | 1.470 |" in page
    assert "prompts of each of Spec-Bench and MT-bench" in page and "(and chain-1, chain-2 in the table" in page
    assert "summed over the 3 runs it took" in page
    assert "equal wall-clock row" not in page and "The third row" not in page  # no such row without WALL=1


def test_the_page_says_all_answers_only_when_the_limit_covers_every_extracted_answer():
    used = load_script("results_pages").answers_used
    assert used({"command": "ANSWERS=2000 bash x", "peer_info": {"sequences": 2000}}) == "the first 2000 answers"
    assert used({"command": "ANSWERS=100000 bash x", "peer_info": {"sequences": 12792}}) == "all the answers"
    assert used({"command": "bash x"}) == "the answers"


def test_served_rows_name_their_prompt_set_once_more_sets_than_spec_bench_were_served():
    data = json.loads((ROOT / "docs/results/data/speculators-peer-epoch.json").read_text())
    for who in ("ours", "peer"):  # served on Spec-Bench only
        data[who].pop("engine_by_set", None)
    render = load_script("results_pages").render_speculators_peer
    assert "| draftsmith | " in "\n".join(render(data)) and ", Spec-Bench |" not in "\n".join(render(data))
    more = copy.deepcopy(data)
    for who in ("ours", "peer"):
        more[who]["engine_by_set"] = {"mt-bench": copy.deepcopy(data[who]["engine"])}
    page = "\n".join(render(more))
    assert "| trainer, prompts | served α by position |" in page
    for row in ("draftsmith, Spec-Bench", "speculators 0.9.0, Spec-Bench", "draftsmith, MT-bench",
                "speculators 0.9.0, MT-bench"):
        assert f"| {row} | " in page
