"""Training never loses or misreports work: Ctrl-C / SIGTERM save a checkpoint, a rerun into a folder resumes
it (or refuses, naming the settings that differ) and never deletes it, metrics stay one step sequence, and a
pipeline stage made with other settings is redone or refused, never silently skipped (train/runfolder.py).

Integration tier (CPU, tens of seconds): the real `train` / `pipeline` code on test_train's tiny Medusa run;
one test signals a real `draftsmith train` subprocess.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_train import Killed, losses, make_cfg, tiny_overrides, train_until_killed

from draftsmith.train.cli import main
from draftsmith.train.loop import train
from draftsmith.train.pipeline import run_pipeline
from draftsmith.train.runfolder import train_settings
from draftsmith.train.runtime import Interrupted, TrainingError

ROOT = Path(__file__).resolve().parents[2]


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def train_steps(run_dir: Path) -> list[int]:
    return [r["step"] for r in rows(run_dir) if r["split"] == "train"]


def resumes(run_dir: Path) -> list[dict]:
    return [r for r in rows(run_dir) if r.get("event") == "resume"]


def checkpoint_steps(run_dir: Path) -> list[int]:
    return sorted(int(p.parent.name.split("-")[1]) for p in (run_dir / "checkpoints").glob("step-*/COMPLETE"))


def weights(run_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "drafter" / "model.safetensors"))


# ------------------------------------------------------------------------------------------------ signals


def signal_when_logged(cmd: list[str], out: Path, step: int, signum: int) -> subprocess.CompletedProcess:
    """Run `cmd`, send `signum` once metrics.jsonl shows `step`, wait for the process to end."""
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="offline")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        path = out / "metrics.jsonl"
        logged = [json.loads(x)["step"] for x in path.read_text().splitlines()
                  if x.endswith("}")] if path.is_file() else []
        if logged and max(logged) >= step:
            proc.send_signal(signum)
            break
        time.sleep(0.01)
    stdout, stderr = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


DS = [sys.executable, "-m", "draftsmith.train"]


def test_ctrl_c_saves_a_checkpoint_and_prints_the_command_that_resumes(workspace, tmp_path):
    """SIGINT to a running `draftsmith train`: a checkpoint of the step it stopped at, one line naming it and
    the resume command, exit 130, no traceback; that command, run as printed, finishes the run as one step
    sequence."""
    out = tmp_path / "run"
    args = tiny_overrides(workspace, "train.max_steps=60", "train.save_every=50")
    done = signal_when_logged([*DS, "train", "--out", str(out), *args], out, 3, signal.SIGINT)
    assert done.returncode == 130, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr, done.stderr[-2000:]
    line = next(x for x in done.stdout.splitlines() if "stopped by SIGINT" in x)
    step = int(line.split(" at step ")[1].split(":")[0])
    assert step >= 3 and checkpoint_steps(out) == [step]  # saved where it stopped, not at save_every
    assert f"checkpoint saved to {out / 'checkpoints' / f'step-{step}'}" in line
    command = shlex.split(line.split("resume with: ")[1])
    assert command[:2] == ["draftsmith", "train"] and command[-1] == "--resume"
    again = subprocess.run([*DS, *command[1:]], capture_output=True, text=True, cwd=ROOT,
                           env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert train_steps(out) == list(range(1, 61)) and [r["from_step"] for r in resumes(out)] == [step]
    assert json.loads((out / "train_summary.json").read_text())["steps"] == 60


def test_sigterm_exits_143_with_a_checkpoint(workspace, tmp_path):
    out = tmp_path / "run"
    args = tiny_overrides(workspace, "train.max_steps=400", "train.save_every=0")
    done = signal_when_logged([*DS, "train", "--out", str(out), *args], out, 2, signal.SIGTERM)
    assert done.returncode == 143 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "stopped by SIGTERM" in done.stdout and len(checkpoint_steps(out)) == 1


def test_a_signal_mid_step_stops_at_that_steps_end_and_resumes_exactly(workspace, tmp_path, monkeypatch):
    """SIGINT in the middle of an optimizer step (the first of its two micro-batches): the step completes, its
    checkpoint is saved, the previous handler comes back, and a plain rerun resumes to the uninterrupted run's
    losses and weights."""
    from draftsmith.heads import medusa

    args = ("train.max_steps=8", "train.grad_accum=2", "train.save_every=0")
    train(make_cfg(workspace, *args), tmp_path / "full")
    real, calls = medusa.MedusaHeads.compute_loss, {"n": 0}
    before = signal.getsignal(signal.SIGINT)

    def signalled(self, batch):
        calls["n"] += 1
        if calls["n"] == 9:  # micro-batch 1 of optimizer step 5
            # without the training loop's handler this SIGINT would end the test session: fail instead
            assert signal.getsignal(signal.SIGINT) is not before, "no SIGINT handler during training"
            signal.raise_signal(signal.SIGINT)
        return real(self, batch)

    monkeypatch.setattr(medusa.MedusaHeads, "compute_loss", signalled)
    with pytest.raises(Interrupted) as stop:
        train(make_cfg(workspace, *args), tmp_path / "part")
    assert (stop.value.signum, stop.value.step, stop.value.exit_code) == (signal.SIGINT, 5, 130)
    assert (stop.value.checkpoint == tmp_path / "part" / "checkpoints" / "step-5"
            and checkpoint_steps(tmp_path / "part") == [5])
    assert signal.getsignal(signal.SIGINT) is before  # restored
    monkeypatch.setattr(medusa.MedusaHeads, "compute_loss", real)
    # no --resume: the folder's checkpoint, same settings
    train(make_cfg(workspace, *args), tmp_path / "part")
    a, b = losses(tmp_path / "full"), losses(tmp_path / "part")
    assert sorted(b) == list(range(1, 9)) and [r["from_step"] for r in resumes(tmp_path / "part")] == [5]
    for step in (6, 7, 8):
        assert b[step] == pytest.approx(a[step], rel=1e-5), step
    mine, ref = weights(tmp_path / "part"), weights(tmp_path / "full")
    assert all(torch.allclose(mine[k], ref[k], rtol=1e-5, atol=1e-7) for k in ref)


def test_training_without_a_signal_leaves_the_handlers_as_they_were(workspace, tmp_path):
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    train(make_cfg(workspace, "train.max_steps=2"), tmp_path)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    assert not (tmp_path / "checkpoints" / "step-1").exists()  # no stop asked: no extra checkpoint


# ------------------------------------------------------------------------------------------------ reruns


def killed_at_6(workspace, run_dir: Path, *extra) -> None:
    train_until_killed(make_cfg(workspace, "train.max_steps=12", *extra), run_dir, at_step=6)
    assert checkpoint_steps(run_dir) == [3, 6]


def test_a_rerun_without_resume_continues_the_checkpoint_and_deletes_none(workspace, tmp_path, capsys):
    """Before: a plain rerun started at step 0 and its checkpoint rotation deleted the killed run's step-6.
    Now it resumes there (saying so), and ends as the uninterrupted run ends."""
    killed_at_6(workspace, tmp_path / "part")
    train(make_cfg(workspace, "train.max_steps=12"), tmp_path / "full")
    train(make_cfg(workspace, "train.max_steps=12"), tmp_path / "part")
    assert "step-6 at step 6 (its settings match; --fresh would start over" in capsys.readouterr().out
    assert [r["from_step"] for r in resumes(tmp_path / "part")] == [6]
    assert train_steps(tmp_path / "part") == list(range(1, 13))
    a, b = losses(tmp_path / "full"), losses(tmp_path / "part")
    assert all(b[s] == pytest.approx(a[s], rel=1e-5) for s in range(7, 13))


def test_settings_that_do_not_shape_training_do_not_block_the_resume(workspace, tmp_path):
    killed_at_6(workspace, tmp_path)
    train(make_cfg(workspace, "train.max_steps=12", "train.log_every=2", "train.keep_checkpoints=3",
                   "eval.limit=5", "log.progress=true"), tmp_path)
    assert [r["from_step"] for r in resumes(tmp_path)] == [6] and checkpoint_steps(tmp_path) == [6, 9, 12]


def test_a_rerun_with_other_settings_refuses_naming_them_and_keeps_everything(workspace, tmp_path):
    killed_at_6(workspace, tmp_path)
    before = {p: p.read_bytes()
              for p in [tmp_path / "metrics.jsonl", *tmp_path.glob("checkpoints/step-*/manifest.json")]}
    with pytest.raises(TrainingError,
                       match=r"(?s)train\.lr: checkpoint 0\.003, now 0\.01.*--fresh.*new --out"):
        train(make_cfg(workspace, "train.max_steps=12", "train.lr=0.01"), tmp_path)
    # a longer run is not refused silently either: --resume is named, as is --fresh
    with pytest.raises(TrainingError,
                       match=r"(?s)train\.max_steps: checkpoint 12, now 20.*--resume continues.*--fresh"):
        train(make_cfg(workspace, "train.max_steps=20"), tmp_path)
    assert checkpoint_steps(tmp_path) == [3, 6]
    assert {p: p.read_bytes() for p in before} == before


def test_fresh_moves_the_old_run_aside_and_starts_at_step_0(workspace, tmp_path):
    killed_at_6(workspace, tmp_path)
    train(make_cfg(workspace, "train.max_steps=4", "train.lr=0.01"), tmp_path, fresh=True)
    [old] = list((tmp_path / "superseded").iterdir())
    assert sorted(int(p.parent.name.split("-")[1]) for p in old.glob("checkpoints/step-*/COMPLETE")) == [3, 6]
    assert ([json.loads(x)["step"]
             for x in (old / "metrics.jsonl").read_text().splitlines()] == list(range(1, 7)))
    assert "--fresh" in json.loads((old / "superseded.json").read_text())["why"]
    assert (train_steps(tmp_path) == [1, 2, 3, 4] and not resumes(tmp_path)
            and checkpoint_steps(tmp_path) == [3, 4])
    with pytest.raises(TrainingError, match="choose one"):
        train(make_cfg(workspace, "train.max_steps=4"), tmp_path, resume=True, fresh=True)


def test_metrics_after_a_resume_are_one_step_sequence(workspace, tmp_path):
    """Killed after step 8 was logged, the last checkpoint at 6: the resumed run drops the rows of steps 7-8
    it redoes and records the resume, so each step appears once, in order."""
    from draftsmith.train import loop

    real = loop.MetricsLog.log

    def log_then_die(self, step, split, metrics):
        real(self, step, split, metrics)
        if step == 8 and split == "train":
            raise Killed(step)

    with pytest.MonkeyPatch.context() as patch, pytest.raises(Killed):
        patch.setattr(loop.MetricsLog, "log", log_then_die)
        train(make_cfg(workspace, "train.max_steps=12"), tmp_path)
    assert train_steps(tmp_path) == list(range(1, 9)) and checkpoint_steps(tmp_path) == [3, 6]
    train(make_cfg(workspace, "train.max_steps=12"), tmp_path)
    assert train_steps(tmp_path) == list(range(1, 13))
    steps = [r["step"] for r in rows(tmp_path)]
    assert steps == sorted(steps)  # validation and event rows too: one monotone sequence
    [event] = resumes(tmp_path)
    assert event["from_step"] == 6 and event["dropped_rows"] == 2 and event["split"] == "event"


def test_a_resume_from_the_last_logged_step_drops_nothing(workspace, tmp_path):
    killed_at_6(workspace, tmp_path)
    train(make_cfg(workspace, "train.max_steps=12"), tmp_path)
    [event] = resumes(tmp_path)
    assert event["from_step"] == 6 and event["dropped_rows"] == 0


def test_train_settings_leave_out_what_does_not_shape_the_drafter():
    from draftsmith.train.config import load_config

    flat = train_settings(load_config(None, ["drafter.kind=medusa"]).to_dict())
    for key in ("eval.limit", "export.formats", "plan.margin", "log.progress", "train.log_every",
                "train.save_every", "train.keep_checkpoints", "train.eval_every", "model.device"):
        assert key not in flat, key
    for key in ("train.lr", "train.max_steps", "data.train", "drafter.medusa.heads", "model.target",
                "train.seed"):
        assert key in flat, key
    chosen = train_settings(load_config(None, ["drafter.kind=medusa", "train.select=expected_tau"]).to_dict())
    assert "train.eval_every" in chosen  # it decides which drafter is kept


# ------------------------------------------------------------------------------------------------ pipeline


PIPELINE = ("train.max_steps=3", "export.formats=[medusa]", "eval.dtype=float32")


@pytest.fixture(scope="module")
def finished_pipeline(workspace, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pipeline") / "run"
    run_pipeline(make_cfg(workspace, *PIPELINE), out)
    return out


@pytest.fixture
def finished(finished_pipeline, tmp_path) -> Path:
    """A copy of one finished pipeline run (train, export, eval), each test its own."""
    return Path(shutil.copytree(finished_pipeline, tmp_path / "run"))


def test_pipeline_rerun_with_changed_train_settings_refuses_naming_them(workspace, finished, capsys):
    """Before: `train: complete, skipped` (export and eval too) and config.resolved.yaml rewritten to values
    no stage used, while train_summary.json still said 3 steps."""
    resolved, summary = (
        finished / "config.resolved.yaml").read_bytes(), (finished / "train_summary.json").read_bytes()
    code = main(["pipeline", "--out", str(finished),
                 *tiny_overrides(workspace, *PIPELINE, "train.max_steps=5",
                                                                     "train.lr=0.01")])
    err = capsys.readouterr().err
    assert code == 2 and "complete, skipped" not in err
    assert ("train.lr: finished with 0.003, now 0.01" in err
            and "train.max_steps: finished with 3, now 5" in err), err
    assert "--fresh" in err and "new --out" in err
    assert (finished / "config.resolved.yaml").read_bytes() == resolved
    assert (finished / "train_summary.json").read_bytes() == summary


def test_pipeline_rerun_with_only_eval_settings_changed_skips_train_and_redoes_eval(workspace, finished,
                                                                                    capsys):
    summary = run_pipeline(make_cfg(workspace, *PIPELINE, "eval.max_new_tokens=6", "log.progress=true"),
                           finished)
    out = capsys.readouterr().out
    assert ("[pipeline] train: complete, skipped" in out
            and "[pipeline] export medusa: complete, skipped" in out)
    assert "[pipeline] eval: made with other settings (eval.max_new_tokens: then 8, now 6)" in out, out
    assert summary["max_new_tokens"] == 6
    [old] = list((finished / "superseded").iterdir())
    assert json.loads((old / "eval" / "summary.json").read_text())["max_new_tokens"] == 8  # kept, not deleted
    run_pipeline(make_cfg(workspace, *PIPELINE, "eval.max_new_tokens=6"), finished)
    assert capsys.readouterr().out.count("complete, skipped") == 3  # train, export, eval: now current


def test_pipeline_resume_continues_a_finished_run_and_redoes_what_was_made_from_it(workspace, finished,
                                                                                   capsys):
    run_pipeline(make_cfg(workspace, *PIPELINE, "train.max_steps=5"), finished, resume=True)
    out = capsys.readouterr().out
    assert json.loads((finished / "train_summary.json").read_text())["steps"] == 5
    assert train_steps(finished) == [1, 2, 3, 4, 5] and [r["from_step"] for r in resumes(finished)] == [3]
    # the new drafter's, not skipped
    assert "[pipeline] export medusa ..." in out and "[pipeline] eval ..." in out
    assert "train: complete, skipped" not in out


def test_pipeline_fresh_moves_the_run_aside_and_trains_again(workspace, finished):
    run_pipeline(make_cfg(workspace, *PIPELINE, "train.lr=0.01"), finished, fresh=True)
    [old] = list((finished / "superseded").iterdir())
    for name in ("checkpoints", "drafter", "export", "eval", "metrics.jsonl", "train_summary.json"):
        assert (old / name).exists(), name
    assert train_steps(finished) == [1, 2, 3] and not resumes(finished)
    assert json.loads((finished / "train_summary.json").read_text())["config"]["train"]["lr"] == 0.01
