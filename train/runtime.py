"""Process-level helpers: the accelerator, rank-0 printing, the `log:` section, the training error, and
stopping cleanly on SIGINT / SIGTERM.

Used by every stage entry point in `train/`; nothing below `train/` prints through here.
"""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import dataclass
from pathlib import Path

import torch


class TrainingError(RuntimeError):
    """Training cannot go on; the message names the step (or setting) and what was kept."""


class Interrupted(Exception):
    """Training stopped on SIGINT / SIGTERM at an optimizer-step boundary, after saving `checkpoint` (the CLI
    prints where and how to resume, and exits 128 + the signal number, as a shell reports a process killed by
    it)."""

    def __init__(self, signum: int, step: int, checkpoint: Path):
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        super().__init__(f"{signal.Signals(signum).name} at step {step}: checkpoint {checkpoint}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class StopSignals:
    """While entered, SIGINT and SIGTERM only note a stop request; the training loop asks `requested` at each
    optimizer-step boundary, so a stop never lands mid-step (half-accumulated gradients, a half-written
    checkpoint).

    In one process a second SIGINT aborts at once (KeyboardInterrupt), as a user pressing Ctrl-C twice
    expects. Under a launcher (WORLD_SIZE > 1) repeats change nothing: torch's elastic agent forwards the
    terminal's Ctrl-C to every rank a moment after the rank got it itself, and the agent's own timeout (then
    SIGKILL) is the hard stop there. The handlers print nothing (print is not reentrant: the main thread may
    be inside one). The previous handlers come back on exit. Only the main thread may install handlers;
    elsewhere this notes nothing and training runs as before.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.signum, self.previous = 0, {}
        self.abort_on_repeat = int(os.environ.get("WORLD_SIZE", "1")) == 1

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            self.previous = {sig: signal.signal(sig, self._note) for sig in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> bool:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous = {}
        return False

    def _note(self, signum, frame) -> None:
        if signum == signal.SIGINT and self.signum == signal.SIGINT and self.abort_on_repeat:
            raise KeyboardInterrupt
        self.signum = self.signum or signum

    def requested(self, accelerator) -> int:
        """The signal to stop on (0: go on), the same on every rank: a checkpoint save is a collective, so all
        ranks must stop at the same step. With several processes this is itself a collective, asked at every
        step."""
        if accelerator.num_processes == 1:
            return self.signum
        mine = torch.tensor([self.signum], dtype=torch.long, device=accelerator.device)
        return int(accelerator.gather(mine).max())


@dataclass
class LogConfig:
    """`log:` section — where metrics go (a JSONL log is always written)."""

    wandb: bool = False
    project: str = "draftsmith"
    run_dir: str = "runs"  # stages write to <run_dir>/<name>/ unless --out is given
    progress: bool = True


def check_wandb() -> None:
    """`log.wandb: true` needs wandb installed and a way to log: an API key (WANDB_API_KEY, `wandb login`'s
    netrc entry) or a local mode (WANDB_MODE=offline / disabled). Checked before the target loads, so a
    missing login is one message naming the fixes instead of wandb's own UsageError minutes later."""
    import netrc
    from urllib.parse import urlparse

    from draftsmith.distill.extras import require

    require("wandb", "wandb", "log.wandb: true")
    if os.environ.get("WANDB_MODE", "").lower() in ("offline", "disabled",
                                                    "dryrun") or os.environ.get("WANDB_API_KEY") \
            or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    path = Path(os.environ.get("NETRC", Path.home() / ".netrc")).expanduser()
    try:
        if path.is_file() and netrc.netrc(path).authenticators(host):
            return
    except (netrc.NetrcParseError, OSError):
        pass
    raise ConfigurationError(
        f"log.wandb: true, but wandb has no login for {host} (no WANDB_API_KEY, no entry in {path}): run "
        "`wandb login` (or set WANDB_API_KEY), log locally with WANDB_MODE=offline, or turn it off with "
        "log.wandb=false (metrics.jsonl is written either way)")


class ConfigurationError(ValueError):
    """The run's settings cannot work on this machine (e.g. wandb without a login); the message names the
    fix."""


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
                            "use configs/accelerate/fsdp.yaml or accelerate launch --use_fsdp --fsdp_version "
                            "2")
    state = AcceleratorState()
    state.distributed_type, state.fsdp_plugin = DistributedType.FSDP, plugin
    PartialState().distributed_type = DistributedType.FSDP  # a later AcceleratorState() copies it from here


def build_accelerator(deepspeed_config: str | None = None, micro_batch_size: int = 1,
                      max_grad_norm: float = 1.0, **kwargs):
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
        check_wandb()
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
