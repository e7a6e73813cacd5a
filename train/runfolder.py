"""A run folder across reruns: where training starts, what each stage ran with, and nothing deleted.

In the flow: `draftsmith train` and `draftsmith pipeline` write under runs/<name>/ (checkpoints/,
metrics.jsonl, drafter/, train_summary.json, export/<fmt>/, eval/). A rerun into the same folder must neither
lose that work nor misreport it:

- `plan_start` decides where training starts. A complete checkpoint is resumed when the settings that shape
  training (`train_settings`) are the ones it was trained with; a finished run is left alone when they are the
  ones it finished with; any other difference is refused, naming the keys, with `--fresh` or a new `--out` as
  the way out. Only how far training goes (`CONTINUABLE`) may change, and only when asked with `--resume`.
- `move_aside` is how `--fresh` (and a later stage rerun with other settings) clears the folder: outputs move
  into `superseded/<time>/` of the run folder, never deleted; a checkpoint rotation therefore only ever
  removes checkpoints of the run it is training.
- `rewind_metrics` keeps `metrics.jsonl` one monotone step sequence: a resume from step N drops the rows past
  N (steps about to be redone) and appends `{"split": "event", "event": "resume", "from_step": N, ...}`.
- Stage records: export, plan and eval write `stage.json` beside their output with the settings that shape it
  (`STAGE_KEYS`) and checksums of the earlier outputs they read (the train summary: which training made the
  drafter); a rerun whose record differs redoes the stage. The train stage's record is the `config` in
  `train_summary.json` (and in every checkpoint's `trainer_state.json`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftsmith.distill.cache import sha256_of
from draftsmith.train.checkpoints import latest_checkpoint
from draftsmith.train.runtime import TrainingError

# Settings that do not change what training produces (the drafter's weights), so a difference never makes the
# train stage rerun or refuse: the later stages' sections, logging, where the target is placed, tokenisation
# parallelism, how often metrics and checkpoints are written, how a regeneration server is reached. A key
# covers all below it.
NOT_TRAINING = ("name", "export", "eval", "plan", "log", "model.device", "model.device_map",
                "model.max_memory", "data.num_proc", "data.cache", "drafter.plan", "train.log_every",
                "train.save_every", "train.keep_checkpoints", "data.regenerate.concurrency",
                "data.regenerate.timeout", "data.regenerate.retries", "data.regenerate.backoff",
                "data.regenerate.api_key_env")
# How far training goes. A checkpoint may continue under a new value (the schedule is re-sized to the new step
# count), but only with --resume: the result is not the run the new value would have trained from the start.
CONTINUABLE = ("train.max_steps", "train.epochs", "train.max_minutes")
# What a fresh start moves aside: training's outputs and everything made from the drafter. The regenerated
# answers and features stay (inputs, resumable, and the costliest to redo).
TRAIN_OUTPUTS = ("checkpoints", "metrics.jsonl", "train_summary.json", "drafter-best", "config.resolved.yaml")
DRAFTER_OUTPUTS = ("drafter", "drafter-last", "export", "eval", "eval-plan", "pipeline.json")
SUPERSEDED = "superseded"

FIX = ("rerun with --fresh (moves this run's checkpoints, metrics and outputs into {dir}, nothing is "
       "deleted), or into a new --out, or restore these settings")


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    """{"train": {"lr": 1e-3}} -> {"train.lr": 1e-3}."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _under(key: str, prefixes) -> bool:
    return any(key == p or key.startswith(p + ".") for p in prefixes)


def train_settings(config: dict) -> dict[str, Any]:
    """The settings of a resolved config (`RunConfig.to_dict()`) that shape what training produces, flat."""
    flat = flatten(config)
    # validation only reports, unless it chooses the drafter kept
    ignored = NOT_TRAINING + (("train.eval_every",) if flat.get("train.select", "last") == "last" else ())
    return {k: v for k, v in flat.items() if not _under(k, ignored)}


def differences(then: dict, now: dict, label: str) -> dict[str, str]:
    """{key: "key: <label> a, now b"} for the flat settings that differ. A key `then` lacks (recorded by an
    older draftsmith) is no difference; one `now` lacks (the section of another drafter kind) is."""
    out = {}
    for key in sorted(then):
        if key not in now:
            out[key] = f"{key}: {label} {then[key]!r}, now unset"
        elif then[key] != now[key]:
            out[key] = f"{key}: {label} {then[key]!r}, now {now[key]!r}"
    return out


@dataclass
class Start:
    """Where training starts in a run folder (`plan_start`)."""

    checkpoint: Path | None = None  # resume from it; None: from step 0
    finished: bool = False  # the run finished with these settings: nothing to train
    # outputs to move aside before training (a fresh start, a finished run continued)
    supersedes: tuple[str, ...] = ()
    note: str = ""  # what happens, in words


def finished_config(run_dir: Path) -> dict | None:
    """The resolved config a finished run trained with (from `train_summary.json`, else its last checkpoint;
    {} when neither recorded it); None when the run has not finished."""
    summary = run_dir / "train_summary.json"
    if not ((run_dir / "drafter" / "draftsmith.json").is_file() and summary.is_file()):
        return None
    recorded = json.loads(summary.read_text()).get("config")
    if recorded is not None:
        return recorded
    ckpt = latest_checkpoint(run_dir)
    return checkpoint_config(ckpt) if ckpt is not None else {}


def checkpoint_config(ckpt: Path) -> dict:
    """The config a checkpoint was trained with ({} if unreadable: `verify_checkpoint` then names what is
    wrong)."""
    try:
        return json.loads((ckpt / "trainer_state.json").read_text())["config"]
    except (OSError, ValueError, KeyError):
        return {}


def plan_start(run_dir: Path, now: dict, mode: str = "auto") -> Start:
    """Where training of the resolved config `now` starts in `run_dir`. `mode`: "auto" (a plain rerun),
    "resume" (--resume: also continue past a changed length) or "fresh" (--fresh). Reads only; refuses with a
    TrainingError that names the differing settings and the way out."""
    run_dir = Path(run_dir)
    fix = FIX.format(dir=run_dir / SUPERSEDED)
    if mode == "fresh":
        return Start(supersedes=TRAIN_OUTPUTS + DRAFTER_OUTPUTS,
                     note="--fresh: training starts over at step 0")
    ckpt, finished = latest_checkpoint(run_dir), finished_config(run_dir)
    if finished is not None:
        return _after_finish(run_dir, ckpt, finished, now, mode, fix)
    if ckpt is None:
        if mode == "resume":
            raise TrainingError(f"--resume: no complete checkpoint under {run_dir / 'checkpoints'}")
        return Start()
    diffs = differences(train_settings(checkpoint_config(ckpt)), train_settings(now), "checkpoint")
    listed = "\n  " + "\n  ".join(diffs.values()) if diffs else ""
    if set(diffs) - set(CONTINUABLE):
        raise TrainingError(f"refusing to resume {ckpt}: it was trained with other settings:{listed}\n{fix}")
    if diffs and mode != "resume":
        raise TrainingError(f"{ckpt} was trained toward another length:{listed}\n--resume continues it to "
                            f"the new length (the learning-rate schedule is re-sized to it); or {fix}")
    how = "--resume" if mode == "resume" else "its settings match; --fresh would start over instead"
    return Start(checkpoint=ckpt, note=how)


def _after_finish(run_dir: Path, ckpt: Path | None, then: dict, now: dict, mode: str, fix: str) -> Start:
    summary = json.loads((run_dir / "train_summary.json").read_text())
    steps = summary.get("steps")
    diffs = differences(train_settings(then), train_settings(now), "finished with")
    if not diffs:
        unrecorded = "" if then else " (its settings were not recorded)"
        return Start(finished=True,
                     note=f"already finished in {run_dir} ({steps} steps){unrecorded}: nothing to train "
                          "(--fresh trains again, moving this run aside)")
    listed = "\n  " + "\n  ".join(diffs.values())
    head = f"train already finished in {run_dir} ({steps} steps) with other settings:{listed}\n"
    new_steps = now.get("train", {}).get("max_steps")
    if set(diffs) - set(CONTINUABLE) or (isinstance(new_steps,
                                                    int) and isinstance(steps, int) and new_steps < steps):
        raise TrainingError(head + fix)
    if ckpt is None:
        raise TrainingError(head + f"no complete checkpoint is left to continue from; {fix}")
    length = (f"{new_steps} steps" if "train.max_steps" in diffs and new_steps is not None else
              "the new length")
    if mode != "resume":
        raise TrainingError(head + f"--resume continues it from {ckpt.name} to {length} (the learning-rate "
                                   f"schedule is re-sized to it); or {fix}")
    return Start(checkpoint=ckpt, supersedes=DRAFTER_OUTPUTS + ("train_summary.json",),
                 note=f"--resume: continuing the finished run to {length}")


def move_aside(run_dir: Path, paths, why: str) -> Path | None:
    """Move the `paths` that exist (relative to the run folder, or absolute) into `superseded/<time>/` of the
    run folder: a rename, nothing copied or deleted. Returns that folder (None: nothing to move); a
    `superseded.json` there says why and what."""
    run_dir = Path(run_dir)
    present = [run_dir / p for p in paths if (run_dir / p).exists()]
    if not present:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    dest, n = run_dir / SUPERSEDED / stamp, 1
    while dest.exists():
        dest, n = run_dir / SUPERSEDED / f"{stamp}-{n}", n + 1
    moved = []
    for path in present:
        if not path.exists():  # inside one moved already (a stage's record in its output folder)
            continue
        rel = path.relative_to(run_dir) if path.is_relative_to(run_dir) else Path(path.name)
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        path.rename(dest / rel)
        moved.append(str(rel))
    (dest / "superseded.json").write_text(json.dumps({"why": why, "moved": moved}, indent=1) + "\n")
    return dest


def rewind_metrics(path: Path, step: int) -> None:
    """One monotone step sequence in `metrics.jsonl` across resumes: rows past `step` (logged after the
    checkpoint resumed from, so about to be redone) and lines cut by a kill are dropped, and the resume is
    appended as an event row. Written beside and renamed: a kill here leaves the old file or the new one."""
    if not path.is_file():
        return
    kept, dropped = [], 0
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line) if line.strip() else None
        except ValueError:
            row = {"step": step + 1}  # a half-written line: drop it
        if row is None:
            continue
        if isinstance(row.get("step"), int) and row["step"] > step:
            dropped += 1
            continue
        kept.append(line)
    event = {"step": step, "split": "event", "event": "resume", "from_step": step, "dropped_rows": dropped,
             "time": round(time.time(), 3)}
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("\n".join([*kept, json.dumps(event)]) + "\n")
    tmp.replace(path)


# What shapes each later stage's output besides the files it reads (dotted prefixes of the resolved config).
STAGE_KEYS = {
    "export": ("model.target", "model.revision", "export.dtype"),
    "plan": ("model", "drafter", "eval.dtype", "plan"),
    "eval": ("model", "drafter", "eval"),
}
RECORD = "stage.json"


@dataclass
class StageRecord:
    """A later stage's output (a file or folder), where its record goes, and the record it would write now."""

    output: Path
    file: Path
    record: dict

    @classmethod
    def build(cls, output: Path, config: dict, stage: str, inputs: list[Path], file: Path | None = None):
        """`stage`: a STAGE_KEYS key; `inputs`: earlier outputs it reads (their checksums go in the
        record)."""
        flat = flatten(config)
        record = {"stage": stage, "settings": {k: v for k, v in flat.items() if _under(k, STAGE_KEYS[stage])},
                  "inputs": {p.name: sha256_of(p) for p in inputs if p.is_file()}}
        return cls(output, file or output / RECORD, record)

    def changes(self) -> list[str]:
        """How the recorded run differs from the one asked now ([] = none); an output with no record (a stage
        stopped between writing it and recording it) is of unknown settings, so it counts as changed."""
        if not self.file.is_file():
            return [f"no record of the settings it was made with ({self.file.name})"]
        then = json.loads(self.file.read_text())
        changed = list(differences(then.get("settings", {}), self.record["settings"], "then").values())
        inputs = then.get("inputs", {})
        changed += [f"{name}: another one than it read" for name, digest in self.record["inputs"].items()
                    if inputs.get(name) != digest]
        return changed

    def write(self) -> None:
        self.file.parent.mkdir(parents=True, exist_ok=True)
        self.file.write_text(json.dumps(self.record, indent=1) + "\n")
