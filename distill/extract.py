"""Feature extraction stage (data -> target logits/hidden states as shards): the `extract:` section.

Between data and training: offline training reads what this stage writes. The shard writer
arrives with the training engine; the section is defined here so every run config validates now.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ExtractConfig:
    """`extract:` section — offline features (empty `layers` and top_k_logits 0 = online only)."""

    enabled: bool = False  # False: train online, the target runs inside the step
    layers: list[int] = field(default_factory=list)  # target layers whose hidden states are stored
    top_k_logits: int = 0  # 0 = store no logits; k > 0 = sparse top-k logits
    dtype: str = "bfloat16"
    shard_size: int = 256  # sequences per shard
