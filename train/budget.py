"""A training run sized in minutes: `train.max_minutes` measures this machine's step, then fixes the step
count.

Hosts differ tenfold for the same recipe (an avx512_bf16 CPU against an AVX2 one, docs/counting.md "dtype and
the machine"), so a recipe sized in steps cannot promise it fits a session. With `train.max_minutes: M` the
run:

1. trains `probe + 1` optimizer steps (the first is a warm-up: allocation, first-call kernels) on the
   schedule sized for the step cap (`train.max_steps`, else `train.epochs`); `probe` is as many steps as the
   learning-rate warm-up holds after that first one, at least `PROBE_STEPS` and at most `MAX_PROBE_STEPS`
   (`probe_steps`): batches of different lengths make a step's cost vary by a third, so five steps misjudge a
   long run's step (docs/training-at-scale.md "Time"), while steps inside the warm-up keep the run equal to
   one sized in steps (below);
2. times the last `probe` of them, the slowest rank's figure on N processes, so every rank decides alike;
3. fixes `max_steps = min(cap, what fits)`: the steps whose cost, plus the validations the run will do on the
   way (`train.eval_every`) and at the end, fit in the minutes left; a validation sequence is costed as a
   training sequence (conservative: it runs no backward), so no extra validation runs and no RNG is touched;
4. re-sizes the learning-rate schedule to that count (transformers' own schedule functions, built for the new
   total; the current step's rate is recomputed from it) and records the decision in every later checkpoint,
   so `--resume` continues to the same step count with the same schedule, on whatever machine it resumes.

The minutes count training steps and validation from the start of `fit` (not the target's loading,
tokenising or the pipeline's eval stages); `train_summary.json` records the decision and the minutes it took.
A run with `train.max_steps` set to the decided count follows the same curve step for step when the warm-up
covers the probe (`train.warmup_steps >= probe + 1`, or a constant schedule): the probe's steps run in the
warm-up, whose rates do not depend on the total. Without a warm-up the probe's few steps take the
cosine/linear rate of the cap's schedule, a relative difference below (probe / steps)^2.
"""

from __future__ import annotations

import math
import time

# train.warmup_steps auto: this share of the step cap (transformers' warmup_ratio, as a step count)
WARMUP_FRACTION = 0.03
PROBE_STEPS = 5  # optimizer steps timed at least, after one warm-up step
MAX_PROBE_STEPS = 30  # ... and at most: the mean of 30 varied batches is within a few percent
clock = time.perf_counter  # a seam for tests


def resolve_warmup(warmup_steps, cap: int) -> int:
    """train.warmup_steps as a step count: an int as it is, auto as WARMUP_FRACTION of the step cap (at least
    1)."""
    if warmup_steps == "auto":
        return max(1, round(WARMUP_FRACTION * cap))
    return int(warmup_steps)


def probe_steps(warmup_steps: int) -> int:
    """Steps timed before the decision: those the warm-up holds after the first step, within the bounds."""
    return min(MAX_PROBE_STEPS, max(PROBE_STEPS, warmup_steps - 1))


def steps_that_fit(minutes: float, elapsed_s: float, step_s: float, validation_s: float, eval_every: int,
                   done: int, cap: int) -> int:
    """The step count in [done, cap] whose remaining steps and validations fit in `minutes` after `elapsed_s`.

    Steps after `done` cost `step_s` each, plus `validation_s` at every multiple of `eval_every` (0: none on
    the way) and once at the end (the run always validates its last step when it has a validation split)."""
    left = minutes * 60 - elapsed_s - validation_s
    per_step = step_s + (validation_s / eval_every if eval_every else 0.0)
    more = math.floor(left / per_step) if per_step > 0 and left > 0 else 0
    return max(done, min(cap, done + more))


class TimeBudget:
    """The probe and the decision of one `fit` (see the module doc); `decided` is what checkpoints carry."""

    def __init__(self, minutes: float, eval_every: int, validation_batches: int, decided: dict | None = None):
        self.minutes, self.eval_every, self.validation_batches = minutes, eval_every, validation_batches
        self.decided = decided
        self.t0 = clock()
        self.start_step: int | None = None
        self.warm: float | None = None

    def observe(self, run) -> bool:
        """Called after every optimizer step; True when it has just fixed `run.max_steps` (and the
        schedule)."""
        if self.decided is not None:
            return False
        if self.start_step is None:
            self.start_step = run.step - 1
        measured = run.step - self.start_step
        if measured == 1:
            self.warm = clock()
            return False
        probe = probe_steps(run.warmup)
        if measured < probe + 1 or run.step >= run.max_steps:
            return False
        now = clock()
        step_s, elapsed = slowest(run.accelerator, [(now - self.warm) / probe, now - self.t0])
        grad_accum = run.cfg.train.grad_accum
        # one micro-batch costed as a training one
        validation_s = step_s * self.validation_batches / grad_accum
        cap = run.max_steps
        steps = steps_that_fit(self.minutes, elapsed, step_s, validation_s, self.eval_every, run.step, cap)
        self.decided = {"minutes": self.minutes, "step_seconds": round(step_s, 4),
                        "validation_seconds_estimate": round(validation_s, 2), "probe_steps": probe,
                        "decided_at_step": run.step, "elapsed_seconds_at_decision": round(elapsed, 2),
                        "steps_cap": cap, "max_steps": steps, "bound": "minutes" if steps < cap else "steps"}
        if steps != cap:
            resize_schedule(run.scheduler, run.cfg.train, steps, run.warmup)
            run.max_steps = steps
        return True


def slowest(accelerator, seconds: list[float]) -> list[float]:
    """Each figure's largest value over the ranks (one rank: its own), so all ranks fix the same step
    count."""
    if accelerator.num_processes == 1:
        return seconds
    import torch

    mine = torch.tensor([seconds], dtype=torch.float64, device=accelerator.device)
    return accelerator.gather(mine).max(0).values.tolist()


def make_schedule(optimizer, t_cfg, total: int, warmup: int | None = None):
    """transformers' schedule `t_cfg.schedule` with `warmup` steps (default: `t_cfg.warmup_steps` resolved
    against `total`), sized to `total` optimizer steps.

    transformers' "constant" drops the warm-up it is given; ours warms up first ("constant_with_warmup")."""
    from transformers import get_scheduler

    warmup = resolve_warmup(t_cfg.warmup_steps, total) if warmup is None else warmup
    name = "constant_with_warmup" if t_cfg.schedule == "constant" and warmup else t_cfg.schedule
    return get_scheduler(name, optimizer, num_warmup_steps=warmup, num_training_steps=total)


def resize_schedule(scheduler, t_cfg, total: int, warmup: int | None = None) -> None:
    """Make a running LambdaLR follow the schedule sized to `total` steps from its current step on: its rate
    functions are replaced by those transformers builds for the new total, and the current rate recomputed."""
    import torch

    probe = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)  # only to build the function
    rate = make_schedule(probe, t_cfg, total, warmup).lr_lambdas[0]
    groups = scheduler.optimizer.param_groups
    scheduler.lr_lambdas = [rate] * len(groups)
    for group, base in zip(groups, scheduler.base_lrs, strict=True):
        group["lr"] = base * rate(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in groups]
