"""`draftsmith launch`: a shipped preset sized to the machine (processes from the visible accelerators, mixed
precision from the device), reachable by name from any folder, the run config checked once in the parent (one
message, exit 2, no launcher traceback), and a failing rank reported once with its exit code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from draftsmith.train.launch import (
    Machine,
    format_preset,
    launcher_command,
    preset_path,
    report,
    resolve_preset,
)

CPU, CPU_BF16 = Machine(0, False), Machine(0, True)


@pytest.mark.parametrize("machine,asked,procs,precision", [
    (CPU, None, 1, "no"), (CPU_BF16, None, 1, "bf16"), (CPU, 2, 2, "no"),
    (Machine(4, True), None, 4, "bf16"), (Machine(8, False), None, 8, "fp16"),
    (Machine(8, True), 2, 2, "bf16")])
def test_processes_and_precision_follow_the_machine(machine, asked, procs, precision):
    cfg = resolve_preset(preset_path("ddp"), machine, asked)
    assert (cfg["num_processes"], cfg["mixed_precision"]) == (procs, precision)


def test_multinode_counts_every_node_and_single_refuses_more_than_one():
    assert resolve_preset(preset_path("multinode-ddp"), Machine(8, True))["num_processes"] == 16
    with pytest.raises(ValueError, match="runs one process; for 2 use `draftsmith launch ddp`"):
        resolve_preset(preset_path("single"), CPU, 2)
    with pytest.raises(ValueError, match="neither a shipped preset"):
        preset_path("ddq")


def test_deepspeed_json_is_the_installed_file_and_cpu_ranks_go_through_torchrun(tmp_path):
    cfg = resolve_preset(preset_path("zero2"), CPU, 2)
    ds = Path(cfg["deepspeed_config"]["deepspeed_config_file"])
    assert ds.is_absolute() and ds.is_file() and ds.name == "zero2.json"
    cmd = launcher_command(cfg, tmp_path / "p.yaml", CPU, ["train", "-c", "r.yaml"], None, None)
    assert cmd[2] == "torch.distributed.run" and cmd[-1] == f"train.deepspeed={ds}"
    ddp = resolve_preset(preset_path("ddp"), CPU, 2)
    cmd = launcher_command(ddp, tmp_path / "p.yaml", CPU, ["train", "-c", "r.yaml"], None, None)
    assert (cmd[2] == "accelerate.commands.launch"
            and cmd[-4:] == ["draftsmith.train", "train", "-c", "r.yaml"])
    # gloo ranks, not accelerate's one-process --cpu
    assert "use_cpu: false" in format_preset(preset_path("ddp"), ddp)


def draftsmith(*args, cwd):
    return subprocess.run([sys.executable, "-m", "draftsmith.train", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def test_print_config_works_from_any_folder(tmp_path):
    out = draftsmith("launch", "--print-config", "zero3", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "configs/accelerate/zero3.yaml" in out.stdout and "distributed_type: DEEPSPEED" in out.stdout
    assert "num_processes: 1" in out.stdout  # this machine's figure, not the preset's 8


def test_a_config_error_is_reported_once_before_any_process_starts(tmp_path):
    out = draftsmith("launch", "ddp", "--num-processes", "2", "--", "train", "train.no_such_key=1",
                     cwd=tmp_path)
    assert out.returncode == 2
    lines = [x for x in out.stderr.splitlines() if x.strip() and "WARNING" not in x]
    assert (len(lines) == 1 and "unknown key 'no_such_key' in train" in lines[0]
            and "valid keys" in lines[0]), out.stderr
    assert "Traceback" not in out.stderr and "[launch]" not in out.stderr  # nothing was started


def test_a_failing_rank_is_reported_once_with_its_exit_code(capsys):
    same = [{"rank": r, "world": 2, "command": "train", "code": 2, "message": "data source 'x' not found"}
            for r in (0, 1)]
    assert report(same, 1, "noise") == 2
    err = capsys.readouterr().err
    assert err.count("data source 'x' not found") == 1 and "every rank (exit code 2)" in err
    one = [{"rank": 0, "world": 2, "command": "train", "code": 0, "message": ""},
           {"rank": 1, "world": 2, "command": "train", "code": 1, "message": "RuntimeError: boom",
            "traceback": "tb"}]
    assert report(one, 1, "") == 1
    assert "error on rank 1 (exit code 1): RuntimeError: boom" in capsys.readouterr().err
    assert report([], 137, "line\nKilled") == 137
    assert "before a rank reported why" in capsys.readouterr().err


def test_a_stopped_rank_names_the_launch_line_that_resumes_it(tmp_path, monkeypatch, capsys):
    """Under `draftsmith launch` the resume line repeats the launch prefix (LAUNCHED_ENV), not "the same
    launcher"."""
    import argparse
    import signal

    from draftsmith.train.commands import stopped
    from draftsmith.train.launch import LAUNCHED_ENV
    from draftsmith.train.runtime import Interrupted

    (tmp_path / "checkpoints" / "step-4").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step-4" / "COMPLETE").write_text("")
    args = argparse.Namespace(command="train", config="eagle3", overrides=["model.target=acme/tiny"])
    stop = Interrupted(signal.SIGINT, 4, tmp_path / "checkpoints" / "step-4")
    monkeypatch.setenv(LAUNCHED_ENV, "draftsmith launch ddp --num-processes 2 --")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert stopped(args, tmp_path, stop) == 130
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.endswith("resume with: draftsmith launch ddp --num-processes 2 -- train -c eagle3 --out "
                         f"{tmp_path} model.target=acme/tiny --resume"), line
    monkeypatch.delenv(LAUNCHED_ENV)
    monkeypatch.setenv("WORLD_SIZE", "1")
    stopped(args, tmp_path, stop)
    assert capsys.readouterr().out.strip().endswith("resume with: draftsmith train -c eagle3 --out "
                                                    f"{tmp_path} model.target=acme/tiny --resume")
