"""Checkpoints of a training run: what `--resume` may continue from, and how it is written.

`save_checkpoint` writes `accelerator.save_state` (every rank its part) + `trainer_state.json`, then a
manifest of every file's sha256, then the marker `COMPLETE` (last, so a partial save never counts), and
keeps the newest `keep`; a failed write is a `WriteError` naming the file. `verify_checkpoint` refuses a
checkpoint whose files are not exactly the recorded ones before anything is unpickled. Whether a checkpoint
may be resumed under the settings asked now is train/runfolder.py's `plan_start`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from draftsmith.distill.cache import sha256_of, write_failure
from draftsmith.train.runtime import TrainingError

CHECKPOINT_MARKER = "COMPLETE"
MANIFEST = "manifest.json"


def write_manifest(ckpt: Path) -> None:
    """sha256 of every file of a checkpoint (all ranks' parts), written before the marker."""
    files = sorted(p for p in ckpt.rglob("*") if p.is_file() and p.name not in (MANIFEST, CHECKPOINT_MARKER))
    manifest = {"written_by": "draftsmith", "files": {str(p.relative_to(ckpt)): sha256_of(p) for p in files}}
    tmp = ckpt / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    tmp.rename(ckpt / MANIFEST)


def verify_checkpoint(ckpt: Path) -> None:
    """Resume only from what draftsmith wrote: the manifest lists every file with its sha256.

    Loading a checkpoint unpickles its optimizer and RNG states (DeepSpeed's engine uses
    `weights_only=False`), so a file draftsmith did not record, or one that changed since, is refused
    before anything is loaded."""
    path = ckpt / MANIFEST
    if not path.is_file():
        raise TrainingError(f"refusing to resume {ckpt}: no {MANIFEST} (not a checkpoint draftsmith wrote "
                            "and recorded); its state files would be unpickled: start a new run folder")
    listed = json.loads(path.read_text())["files"]
    present = {str(p.relative_to(ckpt)) for p in ckpt.rglob("*") if p.is_file()} - {MANIFEST,
                                                                                    CHECKPOINT_MARKER}
    problems = [f"{name}: not in the manifest" for name in sorted(present - set(listed))]
    problems += [f"{name}: missing" for name in sorted(set(listed) - present)]
    problems += [f"{name}: checksum differs" for name in sorted(set(listed) & present)
                 if sha256_of(ckpt / name) != listed[name]]
    if problems:
        raise TrainingError(f"refusing to resume {ckpt}: it is not the checkpoint draftsmith recorded:\n  "
                            + "\n  ".join(problems)
                            + "\nremove it (an older complete checkpoint is used) or start a new run folder")


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """The run's checkpoints that carry the marker, oldest step first."""
    done = [p for p in (run_dir / "checkpoints").glob("step-*") if (p / CHECKPOINT_MARKER).is_file()]
    return sorted(done, key=lambda p: int(p.name.split("-")[1]))


def latest_checkpoint(run_dir: Path) -> Path | None:
    done = complete_checkpoints(run_dir)
    return done[-1] if done else None


def save_checkpoint(accelerator, run_dir: Path, step: int, state: dict, keep: int) -> Path:
    """Full state (accelerate) + trainer state; the marker is written last, so partial saves never count."""
    ckpt = run_dir / "checkpoints" / f"step-{step}"
    try:
        accelerator.save_state(str(ckpt))
        accelerator.wait_for_everyone()  # every rank's part is on disk before rank 0 records them
        if accelerator.is_main_process:
            (ckpt / "trainer_state.json").write_text(json.dumps(state, indent=2))
            write_manifest(ckpt)
    except Exception as exc:  # torch.save reports a full disk as "unexpected pos ..."
        last = latest_checkpoint(run_dir)
        if accelerator.is_main_process:
            shutil.rmtree(ckpt, ignore_errors=True)  # never complete: no marker; removed so nothing reads it
        raise write_failure(ckpt, exc,
                            f"the last complete checkpoint ({last or 'none yet'}) is kept: rerun with "
                            "--resume") from exc
    if accelerator.is_main_process:
        (ckpt / CHECKPOINT_MARKER).write_text("ok\n")
        done = complete_checkpoints(run_dir)
        for old in done[: max(0, len(done) - keep)]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return ckpt
