"""EAGLE's training-time test: the attention mask of an unrolled step (`ttt_mask`) and the chain acceptance it
measures on validation data without the independence assumption (`joint_metrics`).

In the flow: heads/eagle/model.py `EagleDrafter.unroll` runs step j of the unroll with `ttt_mask(n, j)`
(`[1, 1, n, (j+1)*n]` bool: step-0 keys up to t-j plus one key of every later step on the query's own path);
`compute_loss` in eval mode hands its per-step hits (`[B, n]` each) and the counted positions (`[B, n]`) to
`joint_metrics` -> `cond_acc/step{j}`, `joint_acc/step{j}`, `expected_tau_joint` in the run's metrics.
"""

from __future__ import annotations

import torch

from draftsmith.heads.runtime.acceptance import chain_tau


def ttt_mask(n: int, step: int, device) -> torch.Tensor:
    """Keys visible at training-time-test step `step`: `[1, 1, n, (step+1)*n]` bool.

    Query t sees step-0 keys s <= t - step (real features) and, of every later step i, the one key at
    s = t - (step - i) — its own drafted path. Step 0 is plain causal attention.
    """
    t = torch.arange(n, device=device)[:, None]  # [n, 1]
    s = torch.arange(n, device=device)[None, :]  # [1, n]
    blocks = [s <= t - step] + [s == t - (step - i) for i in range(1, step + 1)]
    return torch.cat(blocks, dim=1)[None, None]  # [1, 1, n, (step+1)n]


def joint_metrics(hits: list[torch.Tensor], counted: torch.Tensor, length: int) -> dict[str, float]:
    """Chain acceptance without the independence assumption (as speculators' joint counters,
    models/metrics.py).

    `hits[j] [B, n]`: unrolled step j right at position t (it drafts depth j of the chain rooted at t - j);
    `counted [B, n]`: positions trained on. `cond_acc/step{j}`: of the chains right through depth j-1 whose
    position for depth j is counted, the share right at depth j too (the n-α our decoder counts at depth j+1,
    here on the validation data; a chain running past the end of its sequence is no trial, as a tree without
    that depth is none); `joint_acc/step{j}`: their product, P(a chain right through depth j). `expected_tau`
    multiplies the marginal accuracies `acc_top1/step{j}` as if they were conditional; `expected_tau_joint`
    uses the conditional rates (the last one extrapolated past the unrolled steps)."""
    n = counted.shape[1]
    alive, metrics, conds, joint = counted, {}, [], 1.0
    for j, hit in enumerate(hits):
        if j >= n:
            break
        trials = alive[:, : n - j] & counted[:, j:]  # right through j-1 (all counted), depth j counted
        alive = trials & hit[:, j:]
        tried = int(trials.sum())
        cond = float(alive.sum()) / tried if tried else 0.0
        joint *= cond
        metrics[f"cond_acc/step{j}"], metrics[f"joint_acc/step{j}"] = cond, joint
        conds.append(cond)
    metrics["expected_tau_joint"] = chain_tau(conds, length)
    return metrics
