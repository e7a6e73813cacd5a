"""What a measurement was taken on: device, threads and library versions, recorded beside every timing."""

from __future__ import annotations

import platform
import sys
import time

import torch


def machine_info(target) -> dict:
    import transformers

    device = target.device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    return {"device": f"{device.type}: {name}", "torch_threads": torch.get_num_threads(), "python": sys.version.split()[0],
            "torch": torch.__version__, "transformers": transformers.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}
