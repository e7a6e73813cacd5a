"""Interrupt campaign: Ctrl-C at a random step of `train` and `pipeline`, then a rerun; what survived (JSON).

    python scripts/bench/interrupts/interrupt_trials.py OUT.json [--trials 20] [--seed 0] [--work DIR]

On a tiny target (tests/helpers.py: a 2-layer, 32-wide Llama and 48 learnable conversations; Medusa, 20 steps,
a checkpoint every 5, the newest 2 kept), `--trials` trials for each of {train, pipeline} x {rerun, rerun
--resume}. A trial runs the command in this process (`draftsmith.train.cli.main`: no interpreter start-up per
run), a watcher thread sends this process a real SIGINT once metrics.jsonl shows the trial's random step, and
the same command is rerun to the end, plain or with --resume. Per trial:

    stop_rc            the interrupted command's exit status (130: stopped with a checkpoint)
    logged_before      the last train step metrics.jsonl held when the interrupted command returned
    checkpoints_before complete checkpoints on disk then; resumed_from: the rerun's resume event
    lost_steps         logged_before - resumed_from (steps done but not kept; 0 when the stop saved its step)
    checkpoints_kept   the rerun resumed from the newest checkpoint it found and ends holding exactly what
                       the rotation (newest 2) of that one run leaves: the checkpoints found plus the ones it
                       saved
    metrics_continuous train steps 1..20 each once, in order, every row's step non-decreasing, one resume
                       event
    weights_equal      the final drafter equals the uninterrupted reference run's, tensor for tensor
    eval_written       pipeline: eval/summary.json exists after the rerun

and per cell the count of trials where each holds. Not a test: its figures are the point; minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import shutil
import signal
import threading
import time
from pathlib import Path

from draftsmith.eval.measure.campaign import command_line, host_block, load_file

ROOT = Path(__file__).resolve().parents[3]

STEPS, SAVE_EVERY, KEEP = 20, 5, 2
CHECKS = ("stopped_with_checkpoint", "lost_nothing", "checkpoints_kept", "metrics_continuous",
          "weights_equal", "eval_written")


def workspace(root: Path) -> list[str]:
    """The tiny target and conversations; returns the overrides every run shares."""
    helpers = load_file(ROOT / "tests" / "helpers.py")  # the tests' tiny target: test code, not package code
    root.mkdir(parents=True, exist_ok=True)
    target = helpers.build_tiny_model_dir(root, "llama", layers=2)
    data = helpers.write_pattern_conversations(root / "conversations.jsonl", 48)
    return [f"model.target={target}", "model.dtype=float32", f"data.train=[{data}]", "data.max_length=160",
            "data.val_fraction=0.1", "drafter.kind=medusa", "drafter.medusa.heads=2", "train.batch_size=4",
            "train.lr=3e-3", f"train.max_steps={STEPS}", f"train.save_every={SAVE_EVERY}",
            f"train.keep_checkpoints={KEEP}", "train.log_every=1", "train.eval_every=0", "train.seed=1",
            "train.mixed_precision=no", "log.progress=false", "export.formats=[medusa]",
            "eval.prompts=mt-bench", "eval.limit=2", "eval.max_new_tokens=8", "eval.warmup=0",
            "eval.baselines=false", "eval.dtype=float32"]


def logged_steps(out: Path) -> list[int]:
    path = out / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.endswith("}")]
    return [r["step"] for r in rows if r.get("split") == "train"]


def checkpoints(out: Path) -> list[int]:
    return sorted(int(p.parent.name.split("-")[1]) for p in (out / "checkpoints").glob("step-*/COMPLETE"))


def run(argv: list[str], interrupt_at: int | None = None) -> tuple[int, str]:
    """`draftsmith ARGV` in this process -> (exit status, its output); with `interrupt_at`, a real SIGINT to
    this process once metrics.jsonl shows that train step."""
    from draftsmith.train.cli import main

    out, fired, done = Path(argv[argv.index("--out") + 1]), threading.Event(), threading.Event()

    def watch():
        while not done.is_set():
            steps = logged_steps(out) if (out / "metrics.jsonl").is_file() else []
            if steps and max(steps) >= interrupt_at:
                fired.set()
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.002)

    watcher = threading.Thread(target=watch, daemon=True) if interrupt_at is not None else None
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
        if watcher is not None:
            watcher.start()
        try:
            code = main(argv)
        # the signal landed after the command returned: nothing of ours ran under it
        except KeyboardInterrupt:
            code = -2
        finally:
            done.set()
            if watcher is not None:
                watcher.join()
    return code, buffer.getvalue()


def same_weights(a: Path, b: Path) -> bool:
    import torch
    from safetensors.torch import load_file

    if not (
        a / "drafter" / "model.safetensors").is_file() or not (b / "drafter" / "model.safetensors").is_file():
        return False
    x, y = (load_file(str(d / "drafter" / "model.safetensors")) for d in (a, b))
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def trial(command: str, resume: bool, at: int, common: list[str], out: Path, ref: Path) -> dict:
    argv = [command, "--out", str(out), *common]
    stop_rc, said = run(argv, interrupt_at=at)
    before, ckpts = max(logged_steps(out), default=0), checkpoints(out)
    rerun_rc, rerun_said = run([*argv, "--resume"] if resume else argv)
    events = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"event"' in x] \
        if (out / "metrics.jsonl").is_file() else []
    resumed = [e["from_step"] for e in events if e.get("event") == "resume"]
    steps = logged_steps(out)
    every = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] if steps else []
    row = {"interrupt_at": at, "stop_rc": stop_rc, "logged_before": before, "checkpoints_before": ckpts,
           "stop_line": next((x for x in said.splitlines() if "stopped by" in x or "interrupted" in x), None),
           "traceback": "Traceback" in said, "rerun_rc": rerun_rc,
           "resumed_from": resumed[0] if resumed else None, "checkpoints_after": checkpoints(out)}
    row["lost_steps"] = before - (row["resumed_from"] or 0) if stop_rc != 0 else 0
    row["stopped_with_checkpoint"] = stop_rc == 130 and not row["traceback"] and bool(
        ckpts) and max(ckpts) == before
    row["lost_nothing"] = row["lost_steps"] == 0
    start = row["resumed_from"] or 0
    saved = {s for s in range(start + 1, STEPS + 1) if s % SAVE_EVERY == 0 or s == STEPS}
    row["checkpoints_kept"] = (rerun_rc == 0 and (not ckpts or start == max(ckpts))
                               and row["checkpoints_after"] == sorted(set(ckpts) | saved)[-KEEP:])
    row["metrics_continuous"] = (steps == list(range(1, STEPS + 1)) and every == sorted(every)
                                 and len(resumed) == (1 if stop_rc != 0 else 0))
    row["weights_equal"] = rerun_rc == 0 and same_weights(out, ref)
    row["eval_written"] = (out / "eval" / "summary.json").is_file() if command == "pipeline" else None
    if rerun_rc != 0:
        row["rerun_output"] = rerun_said[-1500:]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", help="the JSON to write")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", help="scratch folder (default: a temporary one beside OUT, removed after)")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)  # tiny models: threads cost more than they give, and the machine is shared
    work = Path(args.work) if args.work else Path(args.out).with_suffix(".work")
    os.environ.setdefault("DRAFTSMITH_TOKENIZED", str(work / "tokenized"))
    os.environ.setdefault("WANDB_MODE", "offline")
    common = workspace(work / "workspace")
    rng, cells, began = random.Random(args.seed), {}, time.perf_counter()
    for command in ("train", "pipeline"):
        ref = work / f"{command}-reference"
        shutil.rmtree(ref, ignore_errors=True)
        code, said = run([command, "--out", str(ref), *common])
        assert code == 0, said[-3000:]
        for resume in (False, True):
            name = f"{command} / rerun{' --resume' if resume else ''}"
            rows, start = [], time.perf_counter()
            for t in range(args.trials):
                out = work / "trial"
                shutil.rmtree(out, ignore_errors=True)
                rows.append({"trial": t,
                             **trial(command, resume, rng.randint(1, STEPS - 1), common, out, ref)})
                print(f"[interrupt] {name} {t}: " + json.dumps({k: rows[-1][k] for k in (
                    "interrupt_at", "stop_rc", "logged_before", "resumed_from", "lost_steps", *CHECKS)}),
                      flush=True)
            cells[name] = {"trials": len(rows), **{c: sum(bool(r[c]) for r in rows) for c in CHECKS
                                                   if any(r[c] is not None for r in rows)},
                           "lost_steps_max": max(r["lost_steps"] for r in rows),
                           "seconds": round(time.perf_counter() - start, 1), "details": rows}
    result = {"steps": STEPS, "save_every": SAVE_EVERY, "keep_checkpoints": KEEP, "seed": args.seed,
              "seconds": round(time.perf_counter() - began, 1), "command": command_line(),
              "host": host_block(), "cells": cells}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'cell':<28}" + "".join(f"{c:>24}" for c in ("trials", *CHECKS, "lost_steps_max")))
    for name, cell in cells.items():
        print(f"{name:<28}"
              + "".join(f"{cell.get(c, '-')!s:>24}" for c in ("trials", *CHECKS, "lost_steps_max")))
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
