"""The base of every kind's config section (`drafter.<kind>`): settings plus what generic code asks.

Each `heads/<kind>.py` defines its section as a dataclass subclass of `KindSettings` beside its
module; `heads/registry.py` lists it in the kind's row. Generic stages ask the section, never the
kind's name: which target features it reads (`feature_layers`: extract and the online source),
and whether it trains the target itself (`trains_target`: Medusa-2's joint LoRA).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class KindSettings:
    """A kind's own settings; the defaults here are a kind that reads no features and trains no target."""

    def feature_layers(self, target_config) -> list:
        """Target features the kind reads: decoder-layer outputs (int) and/or "final" (after the final
        norm)."""
        return []

    def trains_target(self) -> bool:
        """True when training this kind updates the target too (it then needs the live target)."""
        return False

    def serving_candidates(self, folder_config: dict) -> list[dict]:
        """What `draftsmith plan` tries for this kind: overrides of the DrafterConfig serving fields. The
        default suits a drafter that proposes one chain (draft LMs, layer skip): chain lengths, an adaptive
        length, a confidence stop and a prompt-lookup branch; `folder_config` is the folder's config.json."""
        chains = [{"tree": f"chain-{n}", "num_speculative_tokens": n} for n in (1, 2, 3, 4, 6)]
        return chains + [{"tree": "chain-6", "num_speculative_tokens": 6, "adaptive_length": True},
                         {"tree": "chain-6", "num_speculative_tokens": 6, "confidence_threshold": 0.4},
                         {"tree": "chain-3", "num_speculative_tokens": 3, "lookup_branch": 4}]
