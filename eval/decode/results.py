"""What the decoder returns and how it is timed: one sequence's `GenerationResult`, a batch's `BatchResult`,
the ms-per-step split of where a step's time went, and the one timer every benchmarked method shares.

Where it sits: eval/decode/decoder.py fills these; eval/measure/ (eval, bench, plan) reads them. τ and
acceptance by depth come from heads/runtime/acceptance.py over `GenerationResult`s.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from draftsmith.heads.runtime import acceptance


@dataclass
class GenerationResult:
    output_ids: list[int]  # new tokens only (EOS included when it ended the answer)
    accept_lengths: list[int] = field(default_factory=list)  # tokens emitted per verification forward
    # per step: deepest draft depth below the accepted path (0 = none)
    draft_depths: list[int] = field(default_factory=list)
    # draft tokens accepted per step (before EOS/length cut)
    accepted_drafts: list[int] = field(default_factory=list)
    wall_time: float = 0.0  # seconds, prefill included (a batch's: the whole batch)
    # one sequence decoded alone: BatchResult's split
    phase_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def new_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def tau(self) -> float:
        """Mean tokens per target forward after prefill, bonus counted (plain decoding = 1.0)."""
        return acceptance.tau([self])

    def record(self, tokens: list[int], depth: int, accepted: int, eos: set[int], max_new: int) -> list[int]:
        """Append one verification step's tokens, cut after EOS and at `max_new` exactly where plain
        decoding stops; returns the tokens kept."""
        room = tokens[: max_new - self.new_tokens]
        end = next((j + 1 for j, tok in enumerate(room) if tok in eos), len(room))
        self.output_ids += room[:end]
        self.accept_lengths.append(end)
        self.draft_depths.append(depth)
        self.accepted_drafts.append(accepted)
        return room[:end]


@dataclass
class BatchResult:
    results: list[GenerationResult]  # one per sequence, in prompt order
    wall_time: float  # seconds for the whole batch, prefill included
    steps: int  # target forwards after prefill
    # where the steps' time went (seconds, summed over steps): "draft" (every live row's propose), "verify"
    # (the target's forward of roots + drafts), "accept" (the acceptance rule, commits, cache upkeep); the
    # prefill is the rest of wall_time. A drafter's measured cost per step is phase_seconds["draft"] / steps.
    phase_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def new_tokens(self) -> int:
        return sum(r.new_tokens for r in self.results)

    @property
    def tau(self) -> float:
        """Tokens per (sequence, verification forward) while the sequence was live; plain decoding = 1.0."""
        return acceptance.tau(self.results)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_time if self.wall_time > 0 else 0.0


def ms_per_step(phase_seconds: dict[str, float], steps: int) -> dict[str, float] | None:
    """Summed `phase_seconds` -> ms per step drafting / verifying / accepting (None without steps or a
    split)."""
    return {k: round(1000 * v / steps,
                     3) for k, v in phase_seconds.items()} if steps and phase_seconds else None


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device):
    """(result, seconds) — the one timer used for every method compared in a benchmark."""
    sync(device)
    start = time.perf_counter()
    result = fn()
    sync(device)
    return result, time.perf_counter() - start
