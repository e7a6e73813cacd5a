"""scripts/bench/chat_table/: a finished recipe run's chat evals and served rows collected into one JSON (no
model loaded), and the page that renders it: budget, τ by set / shape / temperature, Spec-Bench by category,
the engines."""

import json
import sys
from pathlib import Path

import yaml
from helpers import load_script


def summary(prompts: str, tree: str, tau: float, temperature: float = 0.0) -> dict:
    return {"prompts": prompts, "n_prompts": 80, "max_new_tokens": 128, "dtype": "bfloat16", "tree": tree,
            "temperature": temperature, "tau": tau, "acceptance_by_depth": [0.5, 0.4],
            "by_category": {"coding": {"tau": tau + 0.1, "n": 40}, "math": {"tau": tau - 0.1, "n": 40}}}


def served(engine: str) -> dict:
    rec = {"engine_version": "0.32.0" if engine == "vllm" else "b11434", "num_speculative_tokens": 3,
           "n_prompts": 20, "tau": 1.8, "alpha_by_position": [0.5, 0.2, 0.1], "tokens_per_s": 30.0,
           "baseline_tokens_per_s": 25.0, "speedup": 1.2, "greedy_equal": True, "greedy_equal_count": 20,
           "ours": {"tau": 1.8, "alpha_by_position": [0.5, 0.2, 0.1], "dtype": "float32"},
           "comparison": {"agree": True}}
    if engine == "llamacpp":
        ngram = {"tau": 9.0, "speedup": 1.08, "tokens_per_s": 27.0, "alpha_by_position": [0.9]}
        rec.update(engine="llamacpp", ngram={"ngram-simple": ngram})
    return rec


def recipe_run(run: Path) -> None:
    run.mkdir(parents=True)
    (run / "config.resolved.yaml").write_text(yaml.safe_dump(
        {"drafter": {"kind": "eagle3", "loss": "kl", "eagle3": {"ttt_steps": 3}}, "train": {"lr": 5e-4}}))
    (run / "train_summary.json").write_text(json.dumps({"steps": 9594, "seconds": 36000.0,
                                                        "samples_seen": 38376}))
    (run / "data.json").write_text(json.dumps({"train": 12792}))
    (run / "pipeline.json").write_text(json.dumps({"stage_seconds": {"regenerate": 324.0, "extract": 4300.0,
                                                                     "train": 36100.0, "eval": 900.0}}))
    evals = {"sb-chain-5": summary("spec-bench", "chain-5", 1.9),
             "sb-tree": summary("spec-bench", "dyn", 2.4),
             "mt-chain-5": summary("mt-bench", "chain-5", 1.8), "mt-tree": summary("mt-bench", "dyn", 2.3),
             "sb-chain-5-t07": summary("spec-bench", "chain-5", 1.7, 0.7)}
    for name, s in {**evals, "vllm": served("vllm"), "llamacpp": served("llamacpp")}.items():
        (run / f"chat-{name}").mkdir()
        (run / f"chat-{name}" / "summary.json").write_text(json.dumps(s))
    (run / "chat-mt-chain-5-t07").mkdir()  # a stopped eval: no summary, left out


def test_a_recipe_run_becomes_its_rows_and_page(tmp_path, monkeypatch):
    recipe_run(tmp_path / "run")
    out = tmp_path / "chat.json"
    monkeypatch.setattr(sys, "argv", ["chat_table.py", str(out), f"smollm2-eagle3={tmp_path / 'run'}"])
    load_script("chat_table/chat_table").main()
    data = json.loads(out.read_text())
    row = data["rows"][0]
    assert sorted(row["evals"]) == ["mt-chain-5", "mt-tree", "sb-chain-5", "sb-chain-5-t07", "sb-tree"]
    assert row["epochs"] == 3.0 and sorted(row["served"]) == ["llamacpp", "vllm"]
    threads = data["host"]["torch_threads"]
    # the eval is not budget
    # train: train_summary.json
    assert row["budget"]["core_hours"] == round((324.0 + 4300.0 + 36000.0) * threads / 3600, 2)
    assert row["budget"]["wall_hours"] == round((324.0 + 4300.0 + 36000.0) / 3600, 2)
    assert row["budget"]["extract"] == "stage"
    page = "\n".join(load_script("chat_table/page").render_chat_table(data))
    assert "| smollm2-eagle3 | Spec-Bench | 0 | 1.900 | 2.400 | 0.50 / 0.40 |" in page
    assert "| smollm2-eagle3 | MT-bench | 0.7 |" not in page  # stopped: not a row
    assert "| smollm2-eagle3 | Spec-Bench | 0.7 | 1.700 | – |" in page
    assert "| smollm2-eagle3 | tree | 2.500 | 2.300 |" in page  # by category: coding, math
    assert "llamacpp b11434" in page and "ngram-simple 1.08" in page


def test_the_budget_sums_extraction_over_its_shards_and_counts_the_runs_threads(tmp_path, monkeypatch):
    """Extraction resumed over three invocations: the last one's stage seconds (4300) miss the others; the
    shards' own records sum all of it (two processes side by side: half their seconds is wall time, their
    threads make the core time). Training's core-hours take the run's processes and threads, not the
    host's."""
    recipe_run(tmp_path / "run")
    features = tmp_path / "features"
    for split, times in (("train", {"shard-00000.safetensors": 3000.0, "shard-00001.safetensors": 2000.0}),
                         ("validation", {"shard-00000.safetensors": 100.0})):
        (features / split).mkdir(parents=True)
        costs = {name: {"seconds": s, "processes": 2, "threads": 4} for name, s in times.items()}
        (features / split / "index.json").write_text(json.dumps({"shards": dict.fromkeys(times, "sha"),
                                                                 "shard_cost": costs}))
    (tmp_path / "run" / "config.resolved.yaml").write_text(yaml.safe_dump(
        {"drafter": {"kind": "eagle3", "eagle3": {}}, "train": {"lr": 5e-4},
         "extract": {"enabled": True, "out": str(features)}}))
    summary = json.loads((tmp_path / "run" / "train_summary.json").read_text())
    summary.update(world_size=2, torch_threads=3)
    (tmp_path / "run" / "train_summary.json").write_text(json.dumps(summary))
    out = tmp_path / "chat.json"
    monkeypatch.setattr(sys, "argv", ["chat_table.py", str(out), f"smollm2-eagle3={tmp_path / 'run'}"])
    load_script("chat_table/chat_table").main()
    row = json.loads(out.read_text())["rows"][0]
    wall = (324.0 + 2550.0 + 36000.0) / 3600
    core = ((324.0 + 36000.0) * 2 * 3 + 5100.0 * 4) / 3600
    assert row["extract_cost"] == {"wall_seconds": 2550.0, "core_seconds": 20400.0}
    assert row["budget"] == {"prepare_hours": round((324.0 + 2550.0) / 3600, 2), "wall_hours": round(wall, 2),
                             "core_hours": round(core, 2), "extract": "shards"}
    # a shard without its time: the sum would undercount, so extraction falls back to the stage seconds
    index = json.loads((features / "train" / "index.json").read_text())
    index["shards"]["shard-00002.safetensors"] = "sha"  # not in shard_cost
    (features / "train" / "index.json").write_text(json.dumps(index))
    load_script("chat_table/chat_table").main()
    row = json.loads(out.read_text())["rows"][0]
    assert row["extract_cost"] is None and row["budget"]["prepare_hours"] == round(4624.0 / 3600, 2)
    assert row["budget"]["extract"] == "stage"


def trained_run(run: Path) -> Path:
    """A finished recipe run with its drafter and no chat eval yet."""
    import shutil

    recipe_run(run)
    for folder in run.glob("chat-*"):
        shutil.rmtree(folder)
    (run / "drafter").mkdir()
    return run


def test_the_script_runs_every_eval_once_then_collects(tmp_path):
    """chat_table.sh end to end with a stand-in `draftsmith` that writes each eval's summary: every chat
    folder the collector reads is asked for once (T=0 and 0.7 chains, the trees, both engines), a rerun asks
    for none."""
    import os
    import subprocess

    root = Path(__file__).resolve().parents[2]
    run = trained_run(tmp_path / "run")
    log, stub = tmp_path / "calls.log", tmp_path / "draftsmith"
    stub.write_text(f"""#!{sys.executable}
import json, sys
from pathlib import Path
args = sys.argv[1:]
out = Path(args[args.index("--out") + 1]); out.mkdir(parents=True)
prompts = args[args.index("--prompts") + 1]; tree = args[args.index("--tree") + 1]
temp = float(next((a.split("=")[1] for a in args if a.startswith("eval.temperature=")), 0))
with open({str(log)!r}, "a") as fh:
    fh.write(out.name + "\\n")
if "--engine" in args:
    s = json.loads({json.dumps(json.dumps(served("vllm")))})
else:
    s = {{"prompts": prompts, "n_prompts": 80, "max_new_tokens": 128, "dtype": "bfloat16", "tree": tree,
         "temperature": temp, "tau": 1.5, "acceptance_by_depth": [0.4], "by_category": {{}}}}
(out / "summary.json").write_text(json.dumps(s))
""")
    stub.chmod(0o755)
    env = dict(os.environ, DS=str(stub), PY=sys.executable, OUT=str(tmp_path / "chat.json"))
    script = root / "scripts" / "bench" / "chat_table" / "chat_table.sh"
    for _ in range(2):
        done = subprocess.run(["bash", str(script), "smollm2-eagle3", str(run)], env=env, cwd=root,
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    calls = log.read_text().split()
    assert sorted(calls) == sorted(["chat-sb-chain-5", "chat-sb-chain-5-t07", "chat-sb-tree",
                                    "chat-mt-chain-5", "chat-mt-chain-5-t07", "chat-mt-tree", "chat-vllm",
                                    "chat-llamacpp"])
    data = json.loads((tmp_path / "chat.json").read_text())
    assert sorted(data["rows"][0]["evals"]) == ["mt-chain-5", "mt-chain-5-t07", "mt-tree", "sb-chain-5",
                                                "sb-chain-5-t07", "sb-tree"]
    assert "chat_table.sh smollm2-eagle3" in data["command"]
    # a block drafter: its block's chain, no tree (TREE=none), its engines at that chain
    block = trained_run(tmp_path / "block")
    log.unlink()
    done = subprocess.run(["bash", str(script), "smollm2-dflash", str(block)], cwd=root, capture_output=True,
                          text=True, env=dict(env, K="4", TREE="none", ENGINE_CHAIN="4", ENGINES="vllm"))
    assert done.returncode == 0, done.stderr
    assert sorted(log.read_text().split()) == ["chat-mt-chain-4", "chat-mt-chain-4-t07", "chat-sb-chain-4",
                                               "chat-sb-chain-4-t07", "chat-vllm"]
