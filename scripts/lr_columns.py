"""The learning rate at every step, one process vs two (DDP and ZeRO-2), for a warm-up + cosine run.

    python scripts/lr_columns.py OUT.json [--warmup 8] [--steps 20]

On a tiny random Llama (the schedule does not depend on the model): one in-process run, then the same
recipe under `accelerate launch --multi_gpu --num_processes 2` (DDP over gloo) and under `torchrun
--nproc_per_node 2 ... train.deepspeed=configs/deepspeed/zero2.json`. Each run's `metrics.jsonl` gives the
lr per optimizer step; the JSON holds the columns, the largest relative difference and the samples each
run saw (a 2-process run sees twice the samples per step, with the same number of steps).
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def free_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


def lr_of(run: Path) -> list[float]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["lr"] for r in rows if r["split"] == "train"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args()
    from helpers import build_tiny_model_dir

    work = Path(tempfile.mkdtemp(prefix="lr-columns-"))
    target = build_tiny_model_dir(work, "llama", layers=2)
    data = work / "conversations.jsonl"
    data.write_text("".join(json.dumps({"id": f"c{i}", "conversation": [
        {"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": "abc def " * (3 + i % 4)}]}) + "\n"
        for i in range(64)))
    args = [f"model.target={target}", "model.dtype=float32", f"data.train=[{data}]", "data.max_length=128",
            "drafter.kind=medusa", "drafter.medusa.heads=2", "train.batch_size=2", f"train.max_steps={a.steps}",
            f"train.warmup_steps={a.warmup}", "train.schedule=cosine", "train.lr=3e-3", "train.log_every=1",
            "train.save_every=0", "train.eval_every=0", "train.mixed_precision=no", "log.progress=false"]
    launchers = {
        "one process": [],
        "DDP, 2 processes": ["accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--main_process_port",
                             free_port(), "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"],
        "ZeRO-2, 2 processes": ["torch.distributed.run", "--nproc_per_node", "2", "--master_port", free_port()],
    }
    extra = {"ZeRO-2, 2 processes": [f"train.deepspeed={ROOT / 'configs/deepspeed/zero2.json'}"]}
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="offline")
    columns, seen = {}, {}
    for name, launcher in launchers.items():
        run = work / name.split(",")[0].replace(" ", "-")
        cmd = [sys.executable, "-m", *launcher, "-m", "draftsmith.train", "train", "--out", str(run), *args,
               *extra.get(name, [])]
        if not launcher:
            cmd = [sys.executable, "-m", "draftsmith.train", "train", "--out", str(run), *args]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=1200)
        if done.returncode:
            raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
        columns[name] = lr_of(run)
        summary = json.loads((run / "train_summary.json").read_text())
        seen[name] = {k: summary.get(k) for k in ("world_size", "distributed_type", "samples_seen", "samples_per_step")}
    one = columns["one process"]
    worst = {name: max(abs(x - y) / max(abs(y), 1e-30) for x, y in zip(col, one, strict=True))
             for name, col in columns.items() if name != "one process"}
    report = {"warmup_steps": a.warmup, "steps": a.steps, "schedule": "cosine", "lr": columns,
              "max_relative_difference": worst, "runs": seen}
    Path(a.out).write_text(json.dumps(report, indent=2) + "\n")
    print("step | " + " | ".join(columns))
    for i in range(len(one)):
        print(f"{i + 1:4d} | " + " | ".join(f"{col[i]:.6e}" for col in columns.values()))
    print("max relative difference vs one process:", worst)
    print("samples:", seen)


if __name__ == "__main__":
    main()
