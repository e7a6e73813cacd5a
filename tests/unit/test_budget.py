"""train.max_minutes (train/budget.py): the step count that fits, and a schedule re-sized mid-run.

The run-level checks (a budgeted run equals the run with that many steps, resume keeps the decision) are in
tests/integration/test_train.py.
"""

import pytest
import torch

from draftsmith.train.budget import make_schedule, resize_schedule, steps_that_fit
from draftsmith.train.config import ConfigError, load_config
from draftsmith.train.setup import TrainConfig


def test_steps_that_fit_counts_steps_and_validations_in_the_minutes_left():
    # 10 minutes, 60 s gone, 5 s a step, no validation: 540 s -> 108 more steps after the 6 done
    assert steps_that_fit(10, 60, 5.0, 0.0, 0, done=6, cap=10_000) == 114
    # a 20 s validation at the end and every 10 steps (2 s a step on average): (600-60-20) / 7 = 74 more
    assert steps_that_fit(10, 60, 5.0, 20.0, 10, done=6, cap=10_000) == 80
    assert steps_that_fit(10, 60, 5.0, 0.0, 0, done=6, cap=50) == 50  # the step cap binds
    assert steps_that_fit(1, 100, 5.0, 0.0, 0, done=6, cap=50) == 6  # already over: stop where it is


def test_max_minutes_must_be_positive():
    with pytest.raises(ValueError, match="train.max_minutes must be > 0"):
        TrainConfig(max_minutes=0)
    with pytest.raises(ConfigError, match="max_minutes"):
        load_config(None, ["train.max_minutes=-5"])
    assert load_config(None, ["train.max_minutes=90"]).train.max_minutes == 90


@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant"])
def test_a_resized_schedule_continues_as_one_built_for_the_new_total(schedule):
    """Re-sized at step 6 from a 100-step schedule to 40, a warm-up of 8 covering those steps: every rate from
    the first step on equals a schedule built for 40 steps in the first place (transformers' functions)."""
    cfg = TrainConfig(schedule=schedule, warmup_steps=8, lr=1e-3)

    def rates(total, resize_at=None, to=None):
        opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=cfg.lr)
        sched, out = make_schedule(opt, cfg, total), []
        for step in range(1, 41):
            out.append(opt.param_groups[0]["lr"])  # the rate this optimizer step uses
            opt.step()
            sched.step()
            if step == resize_at:
                resize_schedule(sched, cfg, to)
        assert sched.get_last_lr()[0] == opt.param_groups[0]["lr"]
        return out

    direct, resized = rates(40), rates(100, resize_at=6, to=40)
    assert resized == pytest.approx(direct, rel=1e-12, abs=0)
    if schedule != "constant":
        assert rates(100) != pytest.approx(direct)  # the negative twin: not re-sized, the rates differ


@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant"])
def test_every_schedule_warms_up_when_asked(schedule):
    """`train.warmup_steps` holds for every schedule: transformers' plain "constant" ignores the warm-up it is
    given, so train.schedule=constant with a warm-up builds "constant_with_warmup"; without one it stays
    flat."""
    def first_rates(warmup):
        opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=1e-3)
        sched, out = make_schedule(opt, TrainConfig(schedule=schedule, warmup_steps=warmup, lr=1e-3), 100), []
        for _ in range(6):
            out.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        return out

    assert first_rates(4)[:5] == pytest.approx([0.0, 2.5e-4, 5e-4, 7.5e-4, 1e-3])
    assert first_rates(0)[0] == pytest.approx(1e-3)  # the twin: no warm-up, the full rate from the first step


def test_the_probe_times_the_steps_the_warm_up_holds_within_bounds():
    from draftsmith.train.budget import MAX_PROBE_STEPS, PROBE_STEPS, probe_steps

    assert probe_steps(0) == probe_steps(2) == PROBE_STEPS  # no (or a short) warm-up: the shortest probe
    assert probe_steps(6) == 5 and probe_steps(21) == 20  # inside the warm-up, after its first (untimed) step
    assert probe_steps(60) == probe_steps(10_000) == MAX_PROBE_STEPS


def test_warmup_auto_is_a_share_of_the_step_cap():
    from draftsmith.train.budget import WARMUP_FRACTION, resolve_warmup

    assert resolve_warmup(40, 10) == 40 and resolve_warmup(0, 10) == 0  # a count stays what it is
    assert resolve_warmup("auto", 8) == 1  # a tiny run: one step of warm-up, not all of it
    assert resolve_warmup("auto", 2217) == round(WARMUP_FRACTION * 2217) == 67
    sched = make_schedule(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0),
                          TrainConfig(warmup_steps="auto", schedule="constant"), 100)
    assert [sched.lr_lambdas[0](s) for s in (0, 1, 2, 3, 50)] == [0.0, 1 / 3, 2 / 3, 1.0, 1.0]
    with pytest.raises(ValueError, match="warmup_steps must be an int >= 0 or auto"):
        TrainConfig(warmup_steps="some")
