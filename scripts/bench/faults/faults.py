"""Fault campaign: kill -9 at random moments, full disks, corrupt shards; resume and compare (JSON).

    python scripts/bench/faults/faults.py OUT_DIR [--trials 20] [--seed 0] [--stages regenerate,extract,...]

On a tiny model (so each trial takes seconds), for every stage: one uninterrupted reference run, then
`--trials` runs killed with SIGKILL (the whole process group: DDP kills every rank) at a moment drawn
uniformly over the reference's wall time (the work is sized so that most of that is work, not start-up), each
rerun with the same command until it finishes (`--resume` when a complete checkpoint exists), and compared
with the reference:

    regenerate     (fp32, batch 1) every id exactly once; the same text as the reference
    extract        `extract --verify` passes; every row in exactly one shard; tensors equal the reference
    train-online   resumed at most one checkpoint interval behind the kill; final weights equal
    train-offline  the same, from pre-extracted shards
    train-ddp      the same, two gloo processes under accelerate launch

and the other faults, each once per stage it concerns:

    disk-full      a file-size limit (RLIMIT_FSIZE: writes fail with EFBIG, not ENOSPC: no tmpfs mount
                   is allowed here) during extract and during a checkpoint write: a clear error, the
                   previous checkpoint still resumes, no half-written file is read as complete
    corrupt-shard  one shard truncated / one byte flipped: training names it (extract.on_corrupt:
                   error), or skips it and trains on the rest (skip)

Writes OUT_DIR/faults.json: per stage and fault kind, trials / survived / lost / duplicated (+ details).
Not a test: it takes minutes and its figures are the point (README "Faults").
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from draftsmith.eval.measure.campaign import load_file

ROOT = Path(__file__).resolve().parents[3]
PY = sys.executable
COMMON = ["model.dtype=float32", "log.progress=false", "train.mixed_precision=no"]


def tests_helpers():
    """tests/helpers.py (the tiny target and conversations the tests build), loaded from its file: test code,
    not package code."""
    return load_file(ROOT / "tests" / "helpers.py")


def workspace(root: Path) -> dict:
    helpers = tests_helpers()
    root.mkdir(parents=True, exist_ok=True)
    target = helpers.build_tiny_model_dir(root, "llama", layers=2)
    prompts, convs = root / "prompts.jsonl", root / "conversations.jsonl"
    with open(prompts, "w") as fh:
        for i in range(120):
            fh.write(json.dumps({"id": f"p{i}", "prompt": f"question {i}: " + "tell me more " * (i % 4)})
                     + "\n")
    helpers.write_pattern_conversations(convs, 240)
    return {"target": str(target), "prompts": str(prompts), "convs": str(convs)}


def stage_command(stage: str, ws: dict, out: Path, feats: Path | None = None) -> list[str]:
    base = [f"model.target={ws['target']}", *COMMON]
    ds = [PY, "-m", "draftsmith.train"]
    train_args = [f"data.train=[{ws['convs']}]", "data.max_length=160", "drafter.kind=medusa",
                  "drafter.medusa.heads=2", "train.batch_size=2", "train.max_steps=400",
                  "train.save_every=25", "train.eval_every=0", "train.log_every=1", "train.lr=3e-3",
                  "train.keep_checkpoints=2"]
    if stage == "regenerate":
        return [*ds, "regenerate", "--out", str(out), *base, f"data.regenerate.prompts=[{ws['prompts']}]",
                "data.regenerate.batch_size=1", "data.regenerate.max_new_tokens=24"]
    if stage == "extract":
        return [*ds, "extract", "--out", str(out), *base, f"data.train=[{ws['convs']}]",
                "data.max_length=160", "drafter.kind=medusa", "extract.enabled=true", "extract.shard_size=4",
                "extract.top_k_logits=8"]
    if stage == "train-online":
        return [*ds, "train", "--out", str(out), *base, *train_args]
    if stage == "train-offline":
        return [*ds, "train", "--out", str(out), *base, *train_args, "extract.enabled=true",
                f"extract.out={feats}", "extract.shard_size=4", "extract.top_k_logits=8"]
    if stage == "train-ddp":
        return [PY, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                "--num_machines", "1", "--main_process_port", "0", "--mixed_precision", "no",
                "--dynamo_backend", "no", "-m", "draftsmith.train", "train", "--out", str(out), *base,
                *train_args]
    raise ValueError(stage)


def run(cmd: list[str], kill_after: float | None = None, fsize: int | None = None) -> tuple[int, str, float]:
    """(returncode, output (stdout + stderr), seconds); SIGKILL to the process tree after `kill_after`
    seconds."""
    def limits():
        os.setsid()
        if fsize is not None:
            import resource

            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    if "--main_process_port" in cmd:  # a fresh port each start: a killed group's port may still be held
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            cmd = list(cmd)
            cmd[cmd.index("--main_process_port") + 1] = str(sock.getsockname()[1])
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="offline")
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            cwd=ROOT, preexec_fn=limits)
    try:
        output, _ = proc.communicate(timeout=kill_after)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        output, _ = proc.communicate()
        return -9, output, time.perf_counter() - start
    return proc.returncode, output, time.perf_counter() - start


def kill_tree(pid: int) -> None:
    """SIGKILL a process and every descendant, at once: torch's elastic agent starts the ranks in sessions
    of their own, so killing the launcher's process group would leave them running."""
    import psutil  # accelerate's own dependency

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=10)


def checkpoints(out: Path) -> list[int]:
    return sorted(int(p.parent.name.split("-")[1]) for p in (out / "checkpoints").glob("step-*/COMPLETE"))


def finish(stage: str, cmd: list[str], out: Path) -> tuple[int, str, int]:
    """Rerun `cmd` until it succeeds (at most 3 times): (returncode, stderr, reruns)."""
    for attempt in range(3):
        again = list(cmd)
        if stage.startswith("train") and checkpoints(out):
            again.append("--resume")
        rc, err, _ = run(again)
        if rc == 0:
            return rc, err, attempt + 1
    return rc, err, 3


# ---------------------------------------------------------------------------------------------- compare


def compare_regenerate(ref: Path, out: Path) -> dict:
    lines = [json.loads(x) for x in (out / "regenerated.jsonl").read_text().splitlines()]
    want = {r["id"]: r for r in map(json.loads, (ref / "regenerated.jsonl").read_text().splitlines())}
    counts = Counter(r["id"] for r in lines)
    got = {r["id"]: r for r in lines}
    differ = sum(1 for i in want if i in got and got[i]["conversation"] != want[i]["conversation"])
    return {"lost": len(set(want) - set(got)), "duplicated": sum(c - 1 for c in counts.values()),
            "text_differs": differ}


def shard_rows(folder: Path) -> dict:
    from safetensors.torch import load_file

    rows = {}
    for shard in sorted(folder.glob("shard-*.safetensors")):
        t = load_file(str(shard))
        rows[shard.name] = (t["row_ids"].tolist(), {k: v for k, v in t.items()})
    return rows


def compare_extract(ref: Path, out: Path, cmd: list[str]) -> dict:
    import torch

    verify = [*cmd[:3], "extract", "--verify", *cmd[4:]]
    rc, err, _ = run(verify)
    result = {"verify_ok": rc == 0, "lost": 0, "duplicated": 0, "differs": 0}
    for split in ("train", "validation"):
        a, b = shard_rows(ref / "features" / split), shard_rows(out / "features" / split)
        want = Counter(i for ids, _ in a.values() for i in ids)
        got = Counter(i for ids, _ in b.values() for i in ids)
        result["lost"] += sum((want - got).values())
        result["duplicated"] += sum((got - want).values())
        for name, (_, tensors) in a.items():
            if name in b and any(not torch.equal(v, b[name][1][k]) for k, v in tensors.items()):
                result["differs"] += 1
        result["stray_files"] = sorted(p.name for p in (out / "features" / split).iterdir()
                                       if p.suffix not in (".safetensors", ".json"))
    return result


def compare_train(ref: Path, out: Path, killed_at_step: int | None, resumed_from: int | None,
                  save_every: int = 25) -> dict:
    import torch
    from safetensors.torch import load_file

    a, b = (load_file(str(d / "drafter" / "model.safetensors")) for d in (ref, out))
    equal = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    close = a.keys() == b.keys() and all(torch.allclose(a[k], b[k], rtol=1e-5, atol=1e-6) for k in a)
    lost_steps = None if killed_at_step is None else killed_at_step - (resumed_from or 0)
    return {"weights_equal": equal, "weights_close": close, "lost_steps": lost_steps,
            "within_one_interval": lost_steps is None or lost_steps <= save_every, "lost": 0 if close else 1,
            "duplicated": 0}


def steps_logged(out: Path) -> int:
    path = out / "metrics.jsonl"
    if not path.is_file():
        return 0
    steps = [json.loads(x).get("step", 0) for x in path.read_text().splitlines() if x.strip().endswith("}")]
    return max(steps, default=0)


# ---------------------------------------------------------------------------------------------- campaign


def kill_trials(stage: str, ws: dict, base: Path, trials: int, rng: random.Random,
                feats: Path | None) -> dict:
    ref = base / stage / "reference"
    shutil.rmtree(ref, ignore_errors=True)
    rc, err, seconds = run(stage_command(stage, ws, ref, feats))
    assert rc == 0, err
    rows = []
    for t in range(trials):
        out = base / stage / f"trial-{t:02d}"
        shutil.rmtree(out, ignore_errors=True)
        cmd = stage_command(stage, ws, out, feats)
        moment = rng.uniform(0.0, seconds)
        rc, _, _ = run(cmd, kill_after=moment)
        row = {"trial": t, "kill_at_s": round(moment, 2), "finished_before_kill": rc == 0}
        killed_step, resumed = steps_logged(out), (checkpoints(out) or [None])[-1]
        rc, err, reruns = finish(stage, cmd, out)
        row.update(rerun_rc=rc, reruns=reruns)
        if rc != 0:
            row.update(survived=False, error=err[-600:])
            rows.append(row)
            continue
        if stage == "regenerate":
            row.update(compare_regenerate(ref, out))
            row["survived"] = row["lost"] == 0 and row["duplicated"] == 0 and row["text_differs"] == 0
        elif stage == "extract":
            row.update(compare_extract(ref, out, cmd))
            row["survived"] = row["verify_ok"] and row["lost"] == row["duplicated"] == row["differs"] == 0
        else:
            row.update(compare_train(ref, out, killed_step if rc == 0 else None, resumed))
            row["survived"] = row["weights_close"] and row["within_one_interval"]
        rows.append(row)
        print(f"[faults] {stage} trial {t}: {json.dumps(row)[:200]}", flush=True)
        shutil.rmtree(out, ignore_errors=True)
    return summarise(rows, reference_s=round(seconds, 1))


def summarise(rows: list[dict], **extra) -> dict:
    return {"trials": len(rows), "survived": sum(bool(r.get("survived")) for r in rows),
            "lost": sum(r.get("lost", 0) for r in rows),
            "duplicated": sum(r.get("duplicated", 0) for r in rows), **extra, "details": rows}


def disk_full(ws: dict, base: Path, feats_ref: Path) -> dict:
    rows = []
    # extract: the limit lets a few shards through, then a write fails
    out = base / "disk-full" / "extract"
    shutil.rmtree(out, ignore_errors=True)
    cmd = stage_command("extract", ws, out)
    shard = max(p.stat().st_size for p in (feats_ref / "train").glob("shard-*.safetensors"))
    rc, err, _ = run(cmd, fsize=int(shard * 0.5))
    named = "error:" in err and "writing" in err and "free space" in err
    leftovers = [p.name for p in (out / "features" / "train").glob("*")
                 if p.suffix == ".tmp"] if (out / "features").exists() else []
    rc2, err2, _ = run(cmd)
    verified = run([*cmd[:3], "extract", "--verify", *cmd[4:]])[0] == 0
    rows.append({"where": "extract shard write", "limit": "RLIMIT_FSIZE (EFBIG)", "first_rc": rc,
                 "clear_error": named,
                 "error": next((x for x in err.splitlines() if "error:" in x), "")[:400],
                 "tmp_files_left": leftovers, "rerun_rc": rc2, "verified_after_rerun": verified,
                 "survived": rc != 0 and named and rc2 == 0 and verified})
    # train: a checkpoint write fails after the first checkpoints: resume from the previous one
    out = base / "disk-full" / "train"
    shutil.rmtree(out, ignore_errors=True)
    cmd = stage_command("train-online", ws, out)
    rc, _, _ = run([*cmd, "train.max_steps=10"])  # two complete checkpoints, then a limit below a checkpoint
    size = max(p.stat().st_size for p in (out / "checkpoints").rglob("*") if p.is_file())
    rc, err, _ = run([*cmd, "train.max_steps=20", "--resume"], fsize=int(size * 0.5))
    named = "error:" in err and "writing" in err and "free space" in err
    before = checkpoints(out)
    rc2, err2, _ = run([*cmd, "train.max_steps=20", "--resume"])
    rows.append({"where": "checkpoint write", "limit": "RLIMIT_FSIZE (EFBIG)", "first_rc": rc,
                 "clear_error": named,
                 "error": next((x for x in err.splitlines() if "error:" in x), "")[:400],
                 "complete_checkpoints_after_failure": before, "resume_rc": rc2,
                 "survived": rc != 0 and named and rc2 == 0 and before and before[-1] == 10})
    return summarise(rows)


def corrupt_shard(ws: dict, base: Path, feats: Path) -> dict:
    rows = []
    for damage in ("truncated", "bit-flipped"):
        for policy in ("error", "skip"):
            copy = base / "corrupt" / f"{damage}-{policy}" / "features"
            shutil.rmtree(copy.parent, ignore_errors=True)
            shutil.copytree(feats, copy)
            victim = sorted((copy / "train").glob("shard-*.safetensors"))[1]
            data = bytearray(victim.read_bytes())
            if damage == "truncated":
                data = data[: len(data) // 2]
            else:
                data[len(data) // 2] ^= 0x01
            victim.write_bytes(bytes(data))
            out = copy.parent / "run"
            # one whole epoch, so the damaged shard is opened (checksums are verified on a shard's first open)
            cmd = stage_command("train-offline", ws, out, copy) + [f"extract.on_corrupt={policy}",
                                                                   "train.max_steps=null", "train.epochs=1"]
            rc, err, _ = run(cmd)
            named = victim.name in err
            ok = rc != 0 and named if policy == "error" else rc == 0 and named and (out / "drafter").is_dir()
            said = [line for line in err.splitlines() if victim.name in line]
            rows.append({"damage": damage, "policy": policy, "rc": rc, "named": named,
                         "message": (said or [""])[0][:300], "survived": ok})
    return summarise(rows)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stages",
                        default="regenerate,extract,train-online,train-offline,train-ddp,disk-full,corrupt")
    args = parser.parse_args()
    base = Path(args.out)
    rng = random.Random(args.seed)
    os.environ.setdefault("DRAFTSMITH_TOKENIZED", str(base / "tokenized"))
    ws = workspace(base / "workspace")
    feats_run = base / "features-ref"
    if not (feats_run / "features" / "train" / "index.json").is_file():
        rc, err, _ = run(stage_command("extract", ws, feats_run))
        assert rc == 0, err
    feats = feats_run / "features"
    result_path = base / "faults.json"
    result = json.loads(result_path.read_text()) if result_path.is_file() else {}
    result["seed"], result["trials_per_stage"] = args.seed, args.trials
    for stage in args.stages.split(","):
        start = time.perf_counter()
        if stage == "disk-full":
            result[stage] = disk_full(ws, base, feats)
        elif stage == "corrupt":
            result["corrupt-shard"] = corrupt_shard(ws, base, feats)
        else:
            result[f"{stage} kill -9"] = kill_trials(stage, ws, base, args.trials, rng, feats)
        key = {"disk-full": "disk-full", "corrupt": "corrupt-shard"}.get(stage, f"{stage} kill -9")
        result[key]["seconds"] = round(time.perf_counter() - start, 1)
        result_path.write_text(json.dumps(result, indent=2) + "\n")
        r = result[key]
        print(f"[faults] {key}: {r['survived']}/{r['trials']} survived, {r['lost']} lost, {r['duplicated']} "
              "duplicated", flush=True)


if __name__ == "__main__":
    main()
