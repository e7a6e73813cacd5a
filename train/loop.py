"""Training loop on `accelerate` (the `train:` section).

The loop itself arrives with the first trainable drafter kind; the section is defined here so
run configs validate from the start.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TrainConfig:
    """`train:` section."""

    lr: float = 1e-3
    weight_decay: float = 0.0
    epochs: float = 1.0
    max_steps: int | None = None
    batch_size: int = 8
    grad_accum: int = 1
    max_grad_norm: float = 1.0
    warmup_steps: int = 0
    schedule: str = "cosine"
    mixed_precision: str = "auto"
    seed: int = 0
    eval_every: int = 200
    save_every: int = 200
    online: bool = True
