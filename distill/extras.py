"""Optional dependencies: a feature that needs one names the pip extra that installs it.

`draftsmith[gguf]` (GGUF targets and the presets, which ship as GGUF files), `draftsmith[deepspeed]`
(ZeRO through `train.deepspeed`), `draftsmith[wandb]` (`log.wandb: true`), `draftsmith[all]` for all three.
"""

from __future__ import annotations

import importlib.util


class MissingExtra(ImportError):
    """A feature's optional dependency is not installed; the message names the pip extra."""


def require(module: str, extra: str, feature: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise MissingExtra(f"{feature} needs the Python package '{module}', which is not installed: "
                           f"pip install 'draftsmith[{extra}]' (or draftsmith[all])")
