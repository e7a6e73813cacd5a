"""Process-level helpers: seeding, rank-0 printing, and the `log:` section.

Used by every stage entry point in `train/`; nothing below `train/` prints through here.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

import torch


@dataclass
class LogConfig:
    """`log:` section — where metrics go (a JSONL log is always written)."""

    wandb: bool = False
    project: str = "draftsmith"
    run_dir: str = "runs"  # stages write to <run_dir>/<name>/ unless --out is given
    progress: bool = True


def is_rank_zero() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def rank0_print(*args, **kwargs) -> None:
    if is_rank_zero():
        print(*args, **kwargs, flush=True)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def build_accelerator(**kwargs):
    """`Accelerator` that also runs data-parallel on CPU-only machines.

    Under `accelerate launch --multi_gpu --num_processes N` (or torchrun) on a machine without
    GPUs, accelerate 1.x only picks its gloo MULTI_CPU mode when told `cpu=True`; otherwise every
    process silently believes it is alone (world size 1, no gradient sync). So ask for the CPU
    whenever no accelerator is present. (`accelerate launch --cpu --num_processes N` is worse: it
    starts ONE process.)
    """
    from accelerate import Accelerator

    return Accelerator(cpu=not torch.cuda.is_available(), **kwargs)
