"""`draftsmith launch PRESET -- SUBCOMMAND ...`: a shipped accelerate preset sized to this machine, checked
once.

Sits in front of every multi-process stage (`train`, `pipeline`, `extract`, `regenerate`). The presets are
package data (`configs/accelerate/*.yaml`), so a preset is named, not found by path, and works from any
folder. Before anything is spawned the parent process

- resolves the preset for this machine (`resolve_preset`): processes = `--num-processes`, else the visible
  CUDA devices (times the nodes of a multi-node preset), else 1 on a CPU; mixed precision = the rule of
  `train.mixed_precision: auto` (bf16 on a GPU that has it, else fp16; on a CPU bf16 only with native bf16
  matmuls, else no); a DeepSpeed preset's JSON by its installed path; a free rendezvous port on one node;
- validates the subcommand's arguments and its run config (`-c` + overrides) once, so a config error is one
  message with exit code 2 and no process is started.

Then it starts the ranks: one process in this one (no launcher); N through `accelerate launch` with the
resolved preset (`--multi_gpu` gloo on a CPU: `accelerate launch --cpu --num_processes N` would start ONE
process); DeepSpeed on a CPU through `torchrun ... train.deepspeed=JSON` (train/runtime.py `build_accelerator`
explains why). Every rank writes a failure to `$DRAFTSMITH_LAUNCH_ERRORS/rank-R.json` instead of its stderr
(`record_failure`, called by train/cli.py), the launcher's own traceback is held back, and the parent prints
the failure once — the lowest failing rank's message, which ranks failed, and their exit code — and exits with
that code.

Nothing heavy is imported at module level: train/cli.py calls `record_failure` from every rank.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

ERRORS_ENV = "DRAFTSMITH_LAUNCH_ERRORS"  # the folder where each rank records why it failed
# the `draftsmith launch ... --` prefix a stopped rank's resume line repeats
LAUNCHED_ENV = "DRAFTSMITH_LAUNCHED_AS"
# what the launcher prints when a rank fails (torch's elastic agent, accelerate): held back, the parent
# reports once
LAUNCHER_NOISE = ("Traceback (most recent call last)", "ChildFailedError",
                  "torch/distributed/elastic/multiprocessing/api",
                  "torch.distributed.elastic.multiprocessing.api")
STAGES = ("cmd_train", "cmd_pipeline", "cmd_extract", "cmd_regenerate")


def presets() -> dict[str, Path]:
    """Shipped accelerate presets by name (`ddp` -> configs/accelerate/ddp.yaml, installed as package
    data)."""
    from draftsmith.configs import shipped

    return {p.stem: p for p in sorted(shipped("accelerate").glob("*.yaml"))}


def preset_path(name: str) -> Path:
    """A preset by name, or a YAML file the user wrote; an unknown name lists the shipped ones."""
    found = presets().get(name.removesuffix(".yaml"))
    if found:
        return found
    if Path(name).is_file():
        return Path(name)
    raise ValueError(f"launch preset '{name}' is neither a shipped preset ({', '.join(presets())}) nor a "
                     "YAML file")


@dataclass
class Machine:
    """What decides a preset's sizes: visible CUDA devices, and whether they (or the CPU) do bf16 natively."""

    gpus: int
    bf16: bool

    @classmethod
    def here(cls) -> Machine:
        import torch

        if torch.cuda.is_available():
            return cls(torch.cuda.device_count(), torch.cuda.is_bf16_supported())
        from draftsmith.distill.loading import cpu_has_native

        return cls(0, cpu_has_native(torch.bfloat16))


def resolve_preset(path: Path, machine: Machine, num_processes: int | None = None,
                   mixed_precision: str | None = None) -> dict:
    """The preset's settings for `machine`: process count, mixed precision, DeepSpeed JSON by installed
    path."""
    import yaml

    from draftsmith.configs import shipped

    cfg = yaml.safe_load(path.read_text()) or {}
    machines = int(cfg.get("num_machines", 1))
    if num_processes is not None and num_processes < 1:
        raise ValueError(f"--num-processes must be at least 1, got {num_processes}")
    if cfg.get("distributed_type") == "NO":
        if num_processes not in (None, 1):
            raise ValueError(f"preset {path.stem} runs one process; for {num_processes} use `draftsmith "
                             "launch ddp`")
        procs = 1
    else:
        procs = num_processes or max(machine.gpus, 1) * machines
    if mixed_precision is None:
        mixed_precision = ("bf16" if machine.bf16 else "fp16") if machine.gpus else ("bf16" if machine.bf16
                                                                                     else "no")
    cfg.update(num_processes=procs, mixed_precision=mixed_precision)
    if machine.gpus == 0:
        # gloo processes, started by the multi-GPU launcher (accelerate's --cpu starts one)
        cfg["use_cpu"] = False
    ds = cfg.get("deepspeed_config") or {}
    if ds.get("deepspeed_config_file"):
        name = Path(ds["deepspeed_config_file"]).name
        shipped_json = shipped("deepspeed", name)
        ds["deepspeed_config_file"] = str(shipped_json if shipped_json.is_file() else
                                          (path.parent / ds["deepspeed_config_file"]).resolve())
    return cfg


def format_preset(path: Path, cfg: dict) -> str:
    """`--print-config`: the resolved preset as YAML, headed by where it came from and how to use it raw."""
    import yaml

    return (f"# draftsmith launch preset {path.stem}, resolved for this machine from\n# {path}\n# raw "
            "accelerate: save this file and run\n#   accelerate launch --config_file FILE -m "
            "draftsmith.train train -c RECIPE --out runs/NAME\n" + yaml.safe_dump(cfg, sort_keys=False))


def free_port() -> int:
    with socket.socket() as sock:  # parallel runs on one host must not meet on the default rendezvous port
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def check_stage(argv: list[str], build_parser):
    """Parse the subcommand (with the CLI's own parser, handed in: this module is imported by train/cli.py)
    and validate its run config once, here: errors are reported before any rank starts."""
    from draftsmith.train.config import ConfigError, load_config

    if not argv:
        raise ValueError("nothing to launch: give the subcommand after --, e.g. draftsmith launch ddp -- "
                         "train -c RECIPE")
    args = build_parser().parse_args(argv)  # a usage error exits 2 here, printed once
    if args.fn not in STAGES:
        raise ValueError("draftsmith launch runs a stage (train, pipeline, extract, regenerate), not "
                         f"'{args.command}'")
    cfg = load_config(args.config, args.overrides)
    if cfg.train.deepspeed and not Path(cfg.train.deepspeed).is_file():
        raise ConfigError(f"train.deepspeed: {cfg.train.deepspeed} is not a file")
    if cfg.log.wandb and args.fn in ("cmd_train", "cmd_pipeline"):
        from draftsmith.train.runtime import check_wandb

        check_wandb()
    return args, cfg


def launcher_command(cfg: dict, preset_file: Path, machine: Machine, argv: list[str],
                     machine_rank: int | None, main_process_ip: str | None) -> list[str]:
    """The command that starts the ranks (accelerate launch, or torchrun for DeepSpeed on a CPU)."""
    n, multinode = cfg["num_processes"], int(cfg.get("num_machines", 1)) > 1
    if cfg.get("distributed_type") == "DEEPSPEED" and machine.gpus == 0:
        if multinode:
            raise ValueError("DeepSpeed over several nodes needs GPUs; on CPUs use multinode-ddp")
        ds = cfg["deepspeed_config"]["deepspeed_config_file"]
        return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(n), "--master_port",
                str(free_port()), "-m", "draftsmith.train", *argv, f"train.deepspeed={ds}"]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(preset_file)]
    if multinode:
        if machine_rank is None or not (main_process_ip or cfg.get("main_process_ip")):
            raise ValueError(f"preset {cfg.get('name', 'multinode')} spans {cfg['num_machines']} nodes: pass "
                             "--machine-rank R on each node and --main-process-ip NODE0")
        cmd += ["--machine_rank", str(machine_rank), "--main_process_ip",
                main_process_ip or cfg["main_process_ip"]]
    else:
        cmd += ["--main_process_port", str(free_port())]
    return [*cmd, "-m", "draftsmith.train", *argv]


def forward_stderr(pipe, keep) -> threading.Thread:
    """Copy the ranks' stderr (progress bars included) through; from the launcher's failure report on, keep it
    aside."""
    def run():
        held = False
        while chunk := os.read(pipe, 1 << 16):
            text = chunk.decode(errors="replace")
            if not held and any(marker in text for marker in LAUNCHER_NOISE):
                cut = min(text.find(m) for m in LAUNCHER_NOISE if m in text)
                line_start = text.rfind("\n", 0, cut) + 1
                sys.stderr.write(text[:line_start])
                text, held = text[line_start:], True
            (keep.write if held else sys.stderr.write)(text)
            sys.stderr.flush()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def failures(folder: Path) -> list[dict]:
    return sorted((json.loads(p.read_text()) for p in folder.glob("rank-*.json")), key=lambda r: r["rank"])


def report(records: list[dict], returncode: int, held: str) -> int:
    """One message for a failed launch: the lowest failing rank's error, the ranks that failed, the exit
    code."""
    failed = [r for r in records if r["code"] != 0]
    if not failed:
        tail = "\n".join(held.strip().splitlines()[-15:])
        print(f"draftsmith launch: the launcher exited with code {returncode} before a rank reported why "
              f"(killed? out of memory?); its last lines:\n{tail}", file=sys.stderr)
        return returncode or 1
    first = failed[0]
    same = all(r.get("message") == first.get("message") for r in failed)
    ranks = "every rank" if same and len(failed) == first.get("world", 0) else \
        f"rank{'s' if len(failed) > 1 else ''} {', '.join(str(r['rank']) for r in failed)}"
    if first.get("message"):
        where = f"{ranks}" if same else \
            f"rank {first['rank']} (ranks failing: {', '.join(str(r['rank']) for r in failed)})"
        print(f"draftsmith {first.get('command', 'launch')}: error on {where} (exit code {first['code']}): "
              f"{first['message']}", file=sys.stderr)
        if first.get("traceback"):
            print(first["traceback"].rstrip(), file=sys.stderr)
    else:  # stopped (SIGINT/SIGTERM) or a command's own non-zero status: its lines are already printed
        print(f"draftsmith launch: {ranks} exited with code {first['code']}", file=sys.stderr)
    return first["code"]


def record_failure(command: str, code: int, message: str = "", traceback: str = "") -> bool:
    """Under `draftsmith launch`: note this rank's failure for the parent (True: the parent reports it, print
    nothing). Elsewhere: False."""
    folder = os.environ.get(ERRORS_ENV)
    if not folder:
        return False
    rank = int(os.environ.get("RANK", "0"))
    record = {"rank": rank, "world": int(os.environ.get("WORLD_SIZE", "1")), "command": command, "code": code,
              "message": message, "traceback": traceback}
    (Path(folder) / f"rank-{rank}.json").write_text(json.dumps(record))
    return True


def run_launch(args) -> int:
    """`draftsmith launch`: resolve, validate once, start the ranks, report a failure once."""
    path = preset_path(args.preset)
    machine = Machine.here()
    cfg = resolve_preset(path, machine, args.num_processes, args.mixed_precision)
    if args.print_config:
        sys.stdout.write(format_preset(path, cfg))
        return 0
    argv = list(args.command_args)
    check_stage(argv, args.build_parser)
    where = (f"{cfg['num_processes']} process{'es' if cfg['num_processes'] > 1 else ''} ({machine.gpus} "
             f"GPU{'s' if machine.gpus != 1 else ''} visible"
             + (")" if machine.gpus else ", CPU gloo)")
             + f", mixed precision {cfg['mixed_precision']}")
    print(f"[launch] preset {path.stem}: {where}", file=sys.stderr, flush=True)
    again = ["draftsmith", "launch", args.preset,
             *(["--num-processes", str(args.num_processes)] if args.num_processes else []),
             *(["--mixed-precision", args.mixed_precision] if args.mixed_precision else []),
             *(["--machine-rank", str(args.machine_rank)] if args.machine_rank is not None else []),
             *(["--main-process-ip", args.main_process_ip] if args.main_process_ip else []), "--"]
    launched = {LAUNCHED_ENV: shlex.join(again)}
    # one process: no launcher
    if cfg["num_processes"] == 1 and cfg.get("distributed_type") in ("NO", "MULTI_GPU"):
        return subprocess.call([sys.executable, "-m", "draftsmith.train", *argv],
                               env=dict(os.environ, **launched))
    with tempfile.TemporaryDirectory(prefix="draftsmith-launch-") as tmp:
        resolved = Path(tmp) / f"{path.stem}.yaml"
        resolved.write_text(format_preset(path, cfg))
        (Path(tmp) / "errors").mkdir()
        cmd = launcher_command(cfg, resolved, machine, argv, args.machine_rank, args.main_process_ip)
        if os.environ.get("DRAFTSMITH_DEBUG"):
            print(f"[launch] {shlex.join(cmd)}", file=sys.stderr)
        env = dict(os.environ, **{ERRORS_ENV: str(Path(tmp) / "errors")}, **launched)
        read, write = os.pipe()
        import signal

        # Ctrl-C reaches the ranks: they save and stop
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            proc = subprocess.Popen(cmd, env=env, stderr=write)
            os.close(write)
            with open(Path(tmp) / "launcher.log", "w") as held:
                thread = forward_stderr(read, held)
                returncode = proc.wait()
                thread.join()
        finally:
            signal.signal(signal.SIGINT, previous)
            os.close(read)
        if returncode == 0:
            return 0
        return report(failures(Path(tmp) / "errors"), returncode, (Path(tmp) / "launcher.log").read_text())
