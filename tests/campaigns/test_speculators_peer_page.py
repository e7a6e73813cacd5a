"""scripts/bench/speculators_peer/: the full head-to-head (every prompt set and tree) on its page, the shell
script's guard, and collect.py's peer.json from an output folder."""

import copy
import json
import subprocess
from pathlib import Path

from helpers import load_script

ROOT = Path(__file__).resolve().parents[2]


def test_every_prompt_set_and_tree_is_a_row_with_its_paired_delta():
    data = json.loads((ROOT / "docs/results/data/speculators-peer.json").read_text())
    render = load_script("speculators_peer/page").render_speculators_peer
    assert "τ on every prompt set and tree" not in "\n".join(render(data))  # stage 1: the two trees only
    full = copy.deepcopy(data)
    for who, tau in (("ours", 1.5), ("peer", 1.4)):
        full[who]["evals"] = {s: {t: {"tau": tau, "acceptance_by_depth": [0.3], "n_prompts": 80,
                                      "max_new_tokens": 128, "dtype": "bfloat16"}
                                  for t in ("dynamic-16", "chain-1")}
                              for s in ("spec-bench", "mt-bench")}
    full["paired_by_set"] = {"mt-bench chain-1": {"delta_tau": 0.1, "ci95": [0.05, 0.15]}}
    page = "\n".join(render(full))
    assert "| mt-bench (80 x 128) | chain-1 | 1.500 | 1.400 | 0.100 [0.050, 0.150] |" in page
    assert "| spec-bench (80 x 128) | dynamic-16 | 1.500 | 1.400 | – |" in page


def test_trees_without_the_pages_columns_are_refused_before_any_work(tmp_path):
    run = subprocess.run(["bash", "scripts/bench/speculators_peer/speculators_peer.sh",
                          str(tmp_path / "out")], cwd=ROOT,
                         env={"PATH": "/usr/bin:/bin", "TREES": "chain-1 chain-2"}, capture_output=True,
                         text=True)
    assert run.returncode == 2 and "TREES must hold dynamic-16 and chain-5" in run.stderr
    assert not (tmp_path / "out").exists()


def test_the_default_trees_and_the_stage_2_trees_pass_the_guard(tmp_path):
    # past the guard the script checks its venvs and makes OUT: OUT is a file here, so it stops at
    # `mkdir -p OUT`
    venv = tmp_path / "spec-venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "speculators").write_text("#!/bin/sh\n")
    (venv / "bin" / "speculators").chmod(0o755)
    (tmp_path / "out").write_text("")
    for trees in (None, "dynamic-16 chain-1 chain-2 chain-3 chain-4 chain-5", "chain-5 dynamic-16"):
        env = {"PATH": "/usr/bin:/bin", "SPEC_VENV": str(venv), **({"TREES": trees} if trees else {})}
        run = subprocess.run(["bash", "scripts/bench/speculators_peer/speculators_peer.sh",
                              str(tmp_path / "out")], cwd=ROOT, env=env,
                             capture_output=True, text=True)
        assert "TREES must hold" not in run.stderr and "mkdir" in run.stderr, (trees, run.stderr)


def test_the_one_epoch_page_names_both_prompt_sets_and_the_peers_resumed_runs():
    data = json.loads((ROOT / "docs/results/data/speculators-peer.json").read_text())
    render = load_script("speculators_peer/page").render_speculators_peer
    assert "40 Spec-Bench prompts x 128" in "\n".join(render(data))  # stage 1 reads as it did
    full = copy.deepcopy(data)
    del full["ours_wall"]
    full["paired"] = {}
    for who in ("ours", "peer"):
        full[who]["evals"] = {s: {t: {"tau": 1.5, "acceptance_by_depth": [0.3], "n_prompts": 80,
                                      "max_new_tokens": 128, "dtype": "bfloat16"}
                                  for t in ("dynamic-16", "chain-1", "chain-2", "chain-5")}
                              for s in ("spec-bench", "mt-bench")}
    full["peer"]["train_sittings"] = 3
    assert "median s / step" not in "\n".join(render(full))  # stage 1's JSON has no per-step timer: no column
    full["ours"]["median_step_seconds"], full["peer"]["median_step_seconds"] = 1.08, 2.0
    page = "\n".join(render(full))
    assert ("| s / step | median s / step |" in page and "| 1.08 | 1.474 |" in page
            and "| 2.00 | 1.470 |" in page)
    assert ("prompts of each of Spec-Bench and MT-bench" in page
            and "(and chain-1, chain-2 in the table" in page)
    assert "summed over the 3 runs it took" in page
    assert "equal wall-clock row" not in page and "The third row" not in page  # no such row without WALL=1


def test_the_page_says_all_answers_only_when_the_limit_covers_every_extracted_answer():
    used = load_script("speculators_peer/page").answers_used
    assert (used({"command": "ANSWERS=2000 bash x",
                  "peer_info": {"sequences": 2000}}) == "the first 2000 answers")
    assert used({"command": "ANSWERS=100000 bash x", "peer_info": {"sequences": 12792}}) == "all the answers"
    assert used({"command": "bash x"}) == "the answers"


def test_served_rows_name_their_prompt_set_once_more_sets_than_spec_bench_were_served():
    data = json.loads((ROOT / "docs/results/data/speculators-peer-epoch.json").read_text())
    for who in ("ours", "peer"):  # served on Spec-Bench only
        data[who].pop("engine_by_set", None)
    render = load_script("speculators_peer/page").render_speculators_peer
    assert "| draftsmith | " in "\n".join(render(data)) and ", Spec-Bench |" not in "\n".join(render(data))
    more = copy.deepcopy(data)
    for who in ("ours", "peer"):
        more[who]["engine_by_set"] = {"mt-bench": copy.deepcopy(data[who]["engine"])}
    page = "\n".join(render(more))
    assert "| trainer, prompts | served α by position |" in page
    for row in ("draftsmith, Spec-Bench", "speculators 0.9.0, Spec-Bench", "draftsmith, MT-bench",
                "speculators 0.9.0, MT-bench"):
        assert f"| {row} | " in page


def fake_peer_output(out: Path, trees=("dynamic-16", "chain-5")) -> None:
    """A finished speculators_peer.sh output folder with only the files collect.py reads (stage 1: Spec-Bench,
    the two trees, one engine eval each, no equal wall-clock row)."""
    for who, lengths in (("ours", [2, 1, 2]), ("peer", [1, 1, 2])):
        for tree in trees:
            (out / f"eval-{who}-{tree}").mkdir(parents=True)
            (out / f"eval-{who}-{tree}" / "summary.json").write_text(json.dumps(
                {"tau": sum(lengths) / 3, "acceptance_by_depth": [0.5, 0.2], "n_prompts": 4,
                 "max_new_tokens": 128, "dtype": "bfloat16"}))
            (out / f"eval-{who}-{tree}" / "samples.jsonl").write_text(
                "".join(json.dumps({"id": f"p{i}", "accept_lengths": lengths}) + "\n" for i in range(4)))
        (out / f"engine-{who}").mkdir()
        (out / f"engine-{who}" / "summary.json").write_text(json.dumps(
            {"engine_version": "0.32.0", "num_speculative_tokens": 3, "n_prompts": 4, "tau": 1.5,
             "alpha_by_position": [0.4, 0.1, 0.05], "tokens_per_s": 9.0, "baseline_tokens_per_s": 8.0,
             "speedup": 1.1, "greedy_equal": True, "greedy_equal_count": 4, "comparison": {"agree": True},
             "ours": {"tau": 1.5, "alpha_by_position": [0.4, 0.1, 0.05], "dtype": "float32"}}))
    (out / "ours").mkdir()
    (out / "ours" / "train_summary.json").write_text(json.dumps({"seconds": 300.0, "steps": 300}))
    (out / "ours" / "metrics.jsonl").write_text("".join(
        json.dumps({"step": 10 * i, "split": "train", "time": 10.0 * i}) + "\n" for i in range(1, 5)))
    (out / "peer" / "ckpt" / "0").mkdir(parents=True)
    (out / "peer" / "ckpt" / "0" / "training_state.json").write_text(json.dumps({"global_step": 299}))
    (out / "peer" / "train_seconds").write_text("600\n")
    (out / "peer" / "peer.json").write_text(json.dumps({"sequences": 2000, "train_sequences": 1977}))
    (out / "peer" / "train.log").write_text("[10:00:00] start\n[10:05:00] train/loss=1 "
                                            "profile/step_ms=1900.0\n[10:06:40] train/loss=1 "
                                            "profile/step_ms=2100.0\n")


def test_collect_writes_the_peer_json_its_page_renders(tmp_path, monkeypatch):
    """collect.py (speculators_peer.sh's last step): both trainers' rows, the peer's steps taken, ours − peer
    paired, the peer's log span and median step; the page renders it, and wall-steps is the peer's seconds at
    ours's pace."""
    collect = load_script("speculators_peer/collect")
    monkeypatch.setattr(collect, "host_block", lambda: {"device": "cpu: test"})
    fake_peer_output(tmp_path)
    data = collect.peer_json(tmp_path, 300, "STEPS=300 ANSWERS=2000 bash x.sh OUT", ["spec-bench"],
                             ["dynamic-16", "chain-5"])
    assert data["peer"]["train_steps"] == 299 and data["ours"]["median_step_seconds"] == 1.0
    assert data["peer"]["train_steps_span_seconds"] == 400.0 and data["peer"]["median_step_seconds"] == 2.1
    assert data["paired"]["chain-5"]["delta_tau"] == 0.3333 and "evals" not in data["ours"]
    assert data["ours"]["engine"]["agree"] is True and data["command"].startswith("STEPS=300")
    page = "\n".join(load_script("speculators_peer/page").render_speculators_peer(data))
    assert "the first 2000 answers" in page and "| speculators 0.9.0 | 299 |" in page
    assert collect.wall_steps(tmp_path) == 600


def test_a_dflash_run_renders_its_own_columns_block_anchors_and_kept_differences(tmp_path, monkeypatch):
    """ARM=dflash: the columns come from the data (chains of 4 and 3), the arm, each trainer's settings
    (ours's resolved config, the peer's argv as speculators records it) and the blocks per step are kept; the
    page names the block, the anchor caps and the differences kept, and no EAGLE-3 tree."""
    collect = load_script("speculators_peer/collect")
    monkeypatch.setattr(collect, "host_block", lambda: {"device": "cpu: test"})
    fake_peer_output(tmp_path, ("chain-4", "chain-3"))
    (tmp_path / "ours" / "config.resolved.yaml").write_text(
        "drafter:\n  kind: dflash\n  loss: kl\n  num_speculative_tokens: 4\n  dflash:\n    block_size: 0\n"
        "    anchors: 128\n    slot_weights: acceptance\ntrain:\n  optimizer: muon\n  lr: 0.0005\n"
        "  muon_lr: 0.005\n")
    (tmp_path / "peer" / "ckpt" / "train_command.txt").write_text(
        "# Timestamp: 2026-12-07\n# speculators: 0.9.0\nspeculators_peer.py --speculator-type dflash "
        "--num-layers 2 --block-size 5 --no-sample-from-anchor --max-anchors 512 --mask-token-id 49151 "
        "--loss-fn ce --per-position-loss-weight dpace --optimizer muon --lr 5.0e-4 --muon-lr 5e-3\n")
    (tmp_path / "peer" / "anchors.json").write_text(json.dumps(
        {"peer_blocks_per_step": 498.2, "ours_blocks_per_step": 505.0}))
    data = collect.peer_json(tmp_path, 300, "ARM=dflash STEPS=300 ANSWERS=2000 bash x.sh OUT", ["spec-bench"],
                             ["chain-4", "chain-3"], "dflash", ["chain-4", "chain-3"])
    assert data["columns"] == ["chain-4", "chain-3"] and "evals" not in data["ours"]
    info = data["peer_info"]
    assert info["arm"] == "dflash" and info["blocks_per_step"]["ours_blocks_per_step"] == 505
    assert data["settings"]["peer"] == {
        "speculator_type": "dflash", "num_layers": 2, "block_size": 5, "sample_from_anchor": False,
        "max_anchors": 512, "mask_token_id": 49151, "loss_fn": "ce", "per_position_loss_weight": "dpace",
        "optimizer": "muon", "lr": 5e-4, "muon_lr": 5e-3}
    assert data["settings"]["ours"]["block_size"] == 4 and data["settings"]["ours"]["anchors"] == 128
    assert set(data["paired"]) == {"chain-4", "chain-3"}
    page = "\n".join(load_script("speculators_peer/page").render_speculators_peer(data))
    assert "DFlash on the reference target" in page and "with chains of 4 and 3." in page
    assert "| τ chain-4 | τ chain-3 | acceptance by depth, chain-4 |" in page and "16-node" not in page
    assert ("a non-causal block of 4 mask slots after the anchor (speculators' --block-size 5 counts the "
            "anchor" in page)
    assert "at most 512 blocks per packed row (speculators) and 128 per sequence" in page
    assert "498.2 and 505.0 blocks per step" in page
    assert ("Optimiser, both trainers: Muon at 0.005 on the draft layers' matrices, AdamW at 0.0005 on the "
            "rest; no weight decay" in page)
    for kept in ("- loss: speculators' cross-entropy on the target's argmax with D-PACE position weights; "
                 "draftsmith's KL", "- mask embedding:", "- anchors off by one:",
                 "- anchor cap: per packed row"):
        assert kept in page


def test_the_dflash_arm_is_refused_without_its_eagle3_run_a_chain_of_4_or_a_short_engine_chain(tmp_path):
    def run(**env):
        return subprocess.run(["bash", "scripts/bench/speculators_peer/speculators_peer.sh",
                               str(tmp_path / "out")], cwd=ROOT,
                              env={"PATH": "/usr/bin:/bin", "ARM": "dflash", **env}, capture_output=True,
                              text=True)

    got = run()
    assert got.returncode == 2 and "ARM=dflash needs FROM, an EAGLE-3 arm's OUT" in got.stderr
    eagle3 = tmp_path / "e3"
    (eagle3 / "ours" / "features" / "train").mkdir(parents=True)
    (eagle3 / "ours" / "features" / "train" / "index.json").write_text("{}")
    (eagle3 / "peer").mkdir()
    (eagle3 / "peer" / "peer.json").write_text("{}")
    got = run(FROM=str(eagle3), TREES="chain-3 chain-2")
    assert got.returncode == 2 and "TREES must hold chain-4 (the page's columns)" in got.stderr
    got = run(FROM=str(eagle3), ENGINE_CHAIN="5")
    assert got.returncode == 2 and "ENGINE_CHAIN 5 > 4" in got.stderr
    got = run(FROM=str(eagle3), OPTIMIZER="sgd")
    assert got.returncode == 2 and "OPTIMIZER must be adamw or muon" in got.stderr
    assert not (tmp_path / "out").exists()
