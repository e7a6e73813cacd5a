"""What a measurement was taken on: device, threads and library versions, recorded beside every timing."""

from __future__ import annotations

import platform
import sys
import time

import torch

from draftsmith.distill.loading import cpu_has_native


def cpu_name() -> str:
    """The CPU's model name (Linux /proc/cpuinfo), else what `platform` knows."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(target) -> dict:
    import transformers

    device = target.device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    cpu = {"cpu_capability": torch.backends.cpu.get_cpu_capability(),
           "cpu_native_bf16": cpu_has_native(torch.bfloat16)}
    return {"device": f"{device.type}: {name}", **cpu, "torch_threads": torch.get_num_threads(),
            "python": sys.version.split()[0],
            "torch": torch.__version__, "transformers": transformers.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}


def machine_key(info: dict) -> tuple:
    """What decides whether timings (a serving plan) carry over: the device, its kernels and the threads."""
    return tuple(info.get(k) for k in ("device", "cpu_capability", "torch_threads"))
