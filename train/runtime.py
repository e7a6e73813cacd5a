"""Process-level helpers: the accelerator, rank-0 printing, the `log:` section, the training error.

Used by every stage entry point in `train/`; nothing below `train/` prints through here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch


class TrainingError(RuntimeError):
    """Training cannot go on; the message names the step (or setting) and what was kept."""


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


def whole_weights(accelerator):
    """A context in which models load whole: the frozen target (and the drafter before `prepare`).

    Under ZeRO-3 accelerate has transformers build every model inside `deepspeed.zero.Init`, which
    partitions its weights on creation; the target is only ever run for features and logits, never
    handed to the engine, so partitioned it would be unusable (weights of shape [0]). The drafter is
    partitioned by `accelerator.prepare` instead.
    """
    import contextlib

    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if plugin is None or plugin.zero_stage != 3:
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def unset():  # accelerate's zero3_init_context_manager(enable=False) leaves transformers' flag set
        from transformers.integrations import unset_hf_deepspeed_config

        unset_hf_deepspeed_config()
        try:
            yield
        finally:
            plugin.set_deepspeed_weakref()

    return unset()


def _fsdp_on_cpu(accelerator) -> None:
    """`accelerate launch --use_fsdp` (configs/accelerate/fsdp.yaml) on a machine without GPUs.

    accelerate 1.15 picks FSDP only inside its GPU-family branch (accelerate/state.py: the
    `ACCELERATE_USE_FSDP` check sits under MULTI_GPU/MLU/NPU/XPU...), so on CPU the launcher's FSDP
    request silently became plain DDP. torch's FSDP2 (`fully_shard`) runs on gloo, so switch the
    shared state to FSDP with the plugin the launcher's environment describes; `prepare` then shards.
    """
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin()  # reads the FSDP_* variables accelerate launch set
    if plugin.fsdp_version != 2:
        raise TrainingError("FSDP on CPU needs fsdp_version: 2 (torch's fully_shard; FSDP1 has no CPU path): "
                            "use configs/accelerate/fsdp.yaml or accelerate launch --use_fsdp --fsdp_version 2")
    state = AcceleratorState()
    state.distributed_type, state.fsdp_plugin = DistributedType.FSDP, plugin
    PartialState().distributed_type = DistributedType.FSDP  # a later AcceleratorState() copies it from here


def build_accelerator(deepspeed_config: str | None = None, micro_batch_size: int = 1, max_grad_norm: float = 1.0,
                      **kwargs):
    """`Accelerator` that also runs data-parallel (and DeepSpeed ZeRO) on CPU-only machines.

    Under `accelerate launch --multi_gpu --num_processes N` (or torchrun) on a machine without
    GPUs, accelerate 1.x only picks its gloo MULTI_CPU mode when told `cpu=True`; otherwise every
    process silently believes it is alone (world size 1, no gradient sync). So ask for the CPU
    whenever no accelerator is present. (`accelerate launch --cpu --num_processes N` is worse: it
    starts ONE process.)

    DeepSpeed (`train.deepspeed: configs/deepspeed/zero2.json`): on GPUs accelerate handles it.
    On CPU its DeepSpeed path never initialises a process group (no CUDA -> "no backend"), so
    every rank runs alone, and `cpu=True` would silently swap DeepSpeed for DDP. Route around it:
    start the gloo group ourselves and tell accelerate's shared state the real world size, then
    hand the DeepSpeed plugin over; the engine itself sees the group and shards across ranks.
    Launch with `torchrun --nproc_per_node N -m draftsmith.train train ... train.deepspeed=...`.
    """
    from accelerate import Accelerator

    from draftsmith.distill.extras import require

    if kwargs.get("log_with") == "wandb":
        require("wandb", "wandb", "log.wandb: true")
    if deepspeed_config is None:
        fsdp = os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
        accelerator = Accelerator(cpu=not torch.cuda.is_available(), **kwargs)
        if fsdp and accelerator.distributed_type.name == "MULTI_CPU":
            _fsdp_on_cpu(accelerator)
        return accelerator
    require("deepspeed", "deepspeed", f"train.deepspeed: {deepspeed_config}")
    import torch.distributed as dist
    from accelerate.state import PartialState
    from accelerate.utils import DeepSpeedPlugin

    plugin = DeepSpeedPlugin(hf_ds_config=deepspeed_config)
    plugin.deepspeed_config.update(train_micro_batch_size_per_gpu=micro_batch_size,
                                   gradient_clipping=max_grad_norm)
    if not torch.cuda.is_available() and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        if not dist.is_initialized():
            dist.init_process_group("gloo")
        state = PartialState()
        state.num_processes, state.process_index = dist.get_world_size(), dist.get_rank()
    return Accelerator(deepspeed_plugin=plugin, **kwargs)
