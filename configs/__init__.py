"""Shipped configuration files, installed as package data: `runs/` (recipes for `-c NAME`), `trees/`
(draft trees for `--tree NAME`), `accelerate/` and `deepspeed/` (launch presets).

Code reads them through `shipped(...)` so a wheel install (not only an editable checkout) finds them.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def shipped(*parts: str) -> Path:
    """The installed path of a shipped config file or folder, e.g. `shipped("trees")`."""
    return Path(str(files(__name__).joinpath(*parts)))
