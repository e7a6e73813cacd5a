"""The one acceptance tally: τ, acceptance by depth, and the expected τ of a chain from accuracies.

Used wherever acceptance is counted: the decoder's per-sequence results, the eval summary and its
categories, bench configurations and calibrations (all through `tau` / `acceptance_by_depth` on
results), and training validation (every kind's `compute_loss` reports `chain_tau` of its per-depth
top-1 accuracies, the simulated τ of greedy chain drafting).

Conventions (the field's, see README "How figures are counted"):
- τ = tokens emitted per target verification forward, the target's bonus token included (plain
  decoding = 1.0); the prefill forward is not a step.
- n-α at depth d = P(draft token d accepted | tokens 1..d-1 accepted and the draft had a node at depth d
  below them). An uneven tree whose accepted path ends at a shallow leaf tried nothing deeper: that step
  is no trial at the next depth (counting it as a rejection would understate n-α).

A result is anything with `accept_lengths` (tokens per step), `draft_depths` (per step, the deepest draft
depth below the accepted path, 0 = none) and `accepted_drafts` (draft tokens accepted per step), e.g.
`GenerationResult`.
"""

from __future__ import annotations

from collections.abc import Iterable


def tau(results: Iterable) -> float:
    """Mean tokens per verification step over every step of `results` (1.0 when there is none)."""
    steps = [a for r in results for a in r.accept_lengths]
    return sum(steps) / len(steps) if steps else 1.0


def acceptance_by_depth(results: Iterable) -> list[float]:
    """n-α per depth 1..D over every step of `results` (rounded to 4 digits)."""
    trials: dict[int, int] = {}
    hits: dict[int, int] = {}
    for r in results:
        for depth, acc in zip(r.draft_depths, r.accepted_drafts):
            for d in range(1, min(depth, acc + 1) + 1):
                trials[d] = trials.get(d, 0) + 1
                hits[d] = hits.get(d, 0) + (acc >= d)
    return [round(hits[d] / trials[d], 4) for d in sorted(trials)]


def chain_tau(accuracies: list[float], length: int) -> float:
    """Expected τ of a `length`-token chain whose token d is right with probability `accuracies[d]`
    given the ones before it (the last accuracy repeats past the end): 1 + Σ_d Π_{i<=d} acc_i."""
    tau_, chain = 1.0, 1.0
    for d in range(length):
        chain *= accuracies[min(d, len(accuracies) - 1)] if accuracies else 0.0
        tau_ += chain
    return tau_
