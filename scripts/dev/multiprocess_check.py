"""Two processes vs one, for every distributed mode: the learning rate at every step and the saved drafter's
τ.

    python scripts/dev/multiprocess_check.py OUT.json [--warmup 8] [--steps 20] [--prompts 8]

On a tiny random Llama (CPU, gloo): one run in one process, then the same recipe on two processes under
`accelerate launch --multi_gpu` (DDP), `torchrun ... train.deepspeed=zero2.json` (ZeRO-2), the same with
zero3.json and every parameter partitioned (ZeRO-3), and `accelerate launch --use_fsdp --fsdp_version 2`
(FSDP2). Each run's `metrics.jsonl` gives the lr per optimizer step (a warm-up + cosine schedule); its
summary the samples it saw (a 2-process run sees twice the samples per step, same steps); each saved
drafter is evaluated (fp32, greedy) on the same prompts, its τ and weights compared with the DDP drafter's
(the one-process run trains on half the samples per step: its row is there for the lr, not the weights).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from draftsmith.eval.measure.campaign import load_file

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


def lr_of(run: Path) -> list[float]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["lr"] for r in rows if r["split"] == "train"]


def main() -> None:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("out")
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--prompts", type=int, default=8)
    a = ap.parse_args()
    helpers = load_file(ROOT / "tests" / "helpers.py")  # the tests' tiny target: test code, not package code
    work = Path(tempfile.mkdtemp(prefix="lr-columns-"))
    target = helpers.build_tiny_model_dir(work, "llama", layers=2)
    data = helpers.write_pattern_conversations(work / "conversations.jsonl", 64)
    args = [f"model.target={target}", "model.dtype=float32", f"data.train=[{data}]", "data.max_length=512",
            "drafter.kind=medusa", "drafter.medusa.heads=2", "train.batch_size=2",
            f"train.max_steps={a.steps}", f"train.warmup_steps={a.warmup}", "train.schedule=cosine",
            "train.lr=3e-3", "train.log_every=1", "train.save_every=0", "train.eval_every=0",
            "train.mixed_precision=no", "log.progress=false"]
    columns, seen, runs = train_every_mode(work, args)
    tau_vs_ddp = judge(runs, target, data, a.prompts)
    one = columns["one process"]
    worst = {name: max(abs(x - y) / max(abs(y), 1e-30) for x, y in zip(col, one, strict=True))
             for name, col in columns.items() if name != "one process"}
    report = {"warmup_steps": a.warmup, "steps": a.steps, "schedule": "cosine", "lr": columns,
              "max_relative_difference": worst, "runs": seen, "eval_prompts": a.prompts,
              "tau_vs_ddp": tau_vs_ddp}
    Path(a.out).write_text(json.dumps(report, indent=2) + "\n")
    print("step | " + " | ".join(columns))
    for i in range(len(one)):
        print(f"{i + 1:4d} | " + " | ".join(f"{col[i]:.6e}" for col in columns.values()))
    print("max relative difference vs one process:", worst)
    print("samples:", seen)
    print("tau vs the DDP drafter:", {k: (v["tau"], v["same_accept_lengths"], v["max_abs_weight_diff_vs_ddp"])
                                      for k, v in tau_vs_ddp.items()})


def train_every_mode(work: Path, args: list[str]) -> tuple[dict, dict, dict]:
    """The same recipe in one process and under every two-process launcher: per mode the lr at every step,
    what its train summary says it saw, and its run folder."""
    launchers = {
        "one process": [],
        "DDP, 2 processes": ["accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                             "--main_process_port", free_port(), "--num_machines", "1", "--mixed_precision",
                             "no", "--dynamo_backend", "no"],
        "ZeRO-2, 2 processes": ["torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                                free_port()],
        "ZeRO-3, 2 processes": ["torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                                free_port()],
        "FSDP2, 2 processes": ["accelerate.commands.launch", "--use_fsdp", "--fsdp_version", "2",
                               "--num_processes", "2", "--main_process_port", free_port(), "--num_machines",
                               "1", "--mixed_precision", "no", "--dynamo_backend", "no"],
        # validation every 5 steps choosing the drafter (train.select): the ranks must agree on every choice
        "ZeRO-3 + select, 2 processes": ["torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                                         free_port()],
    }
    zero3 = json.loads((ROOT / "configs/deepspeed/zero3.json").read_text())
    zero3["zero_optimization"]["stage3_param_persistence_threshold"] = 0  # even tiny tensors are partitioned
    (work / "zero3.json").write_text(json.dumps(zero3))
    extra = {"ZeRO-2, 2 processes": [f"train.deepspeed={ROOT / 'configs/deepspeed/zero2.json'}"],
             "ZeRO-3, 2 processes": [f"train.deepspeed={work / 'zero3.json'}"],
             "ZeRO-3 + select, 2 processes": [f"train.deepspeed={work / 'zero3.json'}", "train.eval_every=5",
                                              "train.select=expected_tau", "data.val_fraction=0.1"]}
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="offline")
    columns, seen, runs = {}, {}, {}
    for name, launcher in launchers.items():
        run = work / name.split(",")[0].replace(" ", "-")
        cmd = [sys.executable, "-m", *launcher, "-m", "draftsmith.train", "train", "--out", str(run), *args,
               *extra.get(name, [])]
        if not launcher:
            cmd = [sys.executable, "-m", "draftsmith.train", "train", "--out", str(run), *args]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=1200)
        if done.returncode:
            raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
        columns[name], runs[name] = lr_of(run), run
        summary = json.loads((run / "train_summary.json").read_text())
        seen[name] = {k: summary.get(k)
                      for k in ("world_size", "distributed_type", "samples_seen", "samples_per_step",
                                                  "selected")}
    return columns, seen, runs


def judge(runs: dict[str, Path], target: Path, data: Path, prompts: int) -> dict:
    """Each mode's drafter in our decoder on the same prompts, against the DDP drafter: τ, accept lengths,
    weights."""
    from draftsmith.distill.loading import load_target
    from draftsmith.eval.measure.evaluate import EvalConfig, run_eval
    from draftsmith.eval.serving import decide
    from draftsmith.heads.registry import DrafterConfig
    from draftsmith.train.config import load_config

    model = load_config(None, [f"model.target={target}", "model.dtype=float32"]).model
    tiny = load_target(model, dtype="float32")
    evals = {}
    for name, run in runs.items():
        summary = run_eval(decide(model, DrafterConfig(kind="medusa", path=str(run / "drafter"))),
                           EvalConfig(prompts=str(data), limit=prompts, max_new_tokens=32, dtype="float32",
                                      baselines=False, warmup=0), run / "eval", progress=False, target=tiny)
        evals[name] = {"tau": summary["tau"], "accept_lengths": [json.loads(x)["accept_lengths"] for x in
                                                                 (run / "eval" / "samples.jsonl").read_text(
                                                                     ).splitlines()]}
    from safetensors.torch import load_file as load_weights

    weights = {name: load_weights(str(run / "drafter" / "model.safetensors")) for name, run in runs.items()}
    ddp_w = weights["DDP, 2 processes"]
    for name, w in weights.items():
        evals[name]["max_abs_weight_diff_vs_ddp"] = max(float((w[k] - ddp_w[k]).abs().max()) for k in ddp_w) \
            if w.keys() == ddp_w.keys() else None
    ddp = evals["DDP, 2 processes"]
    return {name: {"tau": e["tau"], "tau_ddp": ddp["tau"],
                   "same_accept_lengths": e["accept_lengths"] == ddp["accept_lengths"],
                   "max_abs_weight_diff_vs_ddp": e["max_abs_weight_diff_vs_ddp"]}
            for name, e in evals.items()}


if __name__ == "__main__":
    main()
