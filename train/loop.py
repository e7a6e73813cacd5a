"""The training loop on `accelerate`: one code path from one CPU process to N GPUs (DDP/FSDP/ZeRO).

In the flow: data (+ features, offline or online) -> drafter -> `runs/<name>/drafter/`. `train` only
wires three steps:

    prepare  (train/setup.py) accelerator, seed, resume check, target, tokenised data, the drafter (from the
             kind's row: token counts, a joint module when the kind trains the target), sources, optimizer,
             schedule
    fit      per step a batch from the source, the drafter's own `compute_loss`, `accelerator.backward`,
             clipping, optimizer and schedule under gradient accumulation; periodic validation with
             acceptance proxies (per-head/step top-1, expected τ), checkpoints, a JSONL metrics log,
             wandb when configured, and a hard stop on a non-finite loss that names the step
    finish   one parameter checksum per rank (replicas must be identical), the drafter folder, the summary

The learning-rate schedule is sized in optimizer steps and stepped once per optimizer step on every
rank, so N processes follow the one-process curve step for step. Checkpoints (`accelerator.save_state` +
`trainer_state.json`: model, optimizer, scheduler, RNG and data
position) let `--resume` continue exactly (train/checkpoints.py: manifest, marker, refusal of what it did not
write). A rerun into a folder with checkpoints resumes, or refuses naming the settings that differ, and never
deletes them (train/runfolder.py). SIGINT / SIGTERM stop at the next optimizer-step boundary with a checkpoint
of that step (runtime.StopSignals; the CLI says how to resume and exits 130 / 143).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import torch

from draftsmith.heads.runtime.acceptance import serving_tau
from draftsmith.train.checkpoints import save_checkpoint
from draftsmith.train.runfolder import plan_start
from draftsmith.train.runtime import Interrupted, StopSignals, TrainingError
from draftsmith.train.setup import TrainRun, prepare, start_mode


class MetricsLog:
    """Rank-0 JSONL log (always) plus the accelerate trackers (wandb) when configured."""

    def __init__(self, accelerator, path: Path):
        self.accelerator, self.path = accelerator, path

    def log(self, step: int, split: str, metrics: dict) -> None:
        if not self.accelerator.is_main_process:
            return
        row = {"step": step, "split": split, "time": round(time.time(), 3), **metrics}
        with open(self.path, "a") as fh:
            fh.write(json.dumps(row) + "\n")
        self.accelerator.log({f"{split}/{k}": v for k, v in metrics.items()}, step=step)


def average(metric_rows: list[tuple[dict, int]], accelerator=None) -> dict:
    """Weighted mean of (metrics, weight) rows. With an `accelerator` of several processes the weighted sums
    are summed over every rank first (each rank saw its share), so every rank reports, and decides on, the
    same numbers."""
    keys = list(metric_rows[0][0]) if metric_rows else []
    sums = [sum(m[k] * n for m, n in metric_rows) for k in keys] + [sum(n for _, n in metric_rows)]
    if accelerator is not None and accelerator.num_processes > 1:
        sums = accelerator.reduce(torch.tensor(sums, dtype=torch.float64, device=accelerator.device),
                                  reduction="sum").tolist()
    total = sums[-1] or 1
    return {k: round(sums[i] / total, 6) for i, k in enumerate(keys)}


@torch.no_grad()
def validate(module, loader, source, accelerator) -> dict:
    from draftsmith.train.sources import to_device

    module.eval()
    rows = []
    for batch in loader:
        batch = to_device(source(to_device(batch, accelerator.device)), accelerator.device, torch.float32)
        _, metrics = module(batch)
        rows.append((metrics, int(batch["loss_mask"].sum())))
    module.train()
    return average(rows, accelerator)


def validation_scores(module, loader, source, accelerator, d_cfg) -> dict:
    """`validate`, plus `expected_tau_serving`: the serving tree of `d_cfg` (a DrafterConfig) simulated from
    the rank accuracies, where the kind reports them -- what `train.select: expected_tau` ranks checkpoints
    by."""
    scores = validate(module, loader, source, accelerator)
    served = serving_tau(scores, d_cfg.num_speculative_tokens, d_cfg.tree_nodes, d_cfg.tree_topk,
                         getattr(d_cfg.spec.module, "recurrent", True))
    if served is not None:
        scores["expected_tau_serving"] = round(served, 6)
    return scores


def fit(run: TrainRun) -> None:
    """Optimizer steps until `max_steps` (see the module doc); `run` carries the position for checkpoints. A
    SIGINT or SIGTERM meanwhile ends it at the next optimizer-step boundary, with that step's checkpoint
    (`Interrupted`)."""
    with StopSignals() as stop:
        _fit(run, stop)


def _fit(run: TrainRun, stop: StopSignals) -> None:
    from torch.utils.data import DataLoader
    from tqdm.auto import tqdm

    from draftsmith.train.budget import TimeBudget
    from draftsmith.train.runtime import rank0_print

    cfg, acc, t_cfg = run.cfg, run.accelerator, run.cfg.train
    budget = (TimeBudget(t_cfg.max_minutes, t_cfg.eval_every, len(run.val_loader) if run.val_loader else 0,
                         run.budget)
              if t_cfg.max_minutes else None)
    log = MetricsLog(acc, run.run_dir / "metrics.jsonl")
    bar = tqdm(total=run.max_steps, initial=run.step, desc=f"train {cfg.drafter.kind}", unit="step",
               disable=not (cfg.log.progress and acc.is_main_process))
    window, start = [], time.perf_counter()
    run.clock = start
    while run.step < run.max_steps:
        loader = acc.prepare(DataLoader(run.train_set, batch_size=t_cfg.batch_size, sampler=_sampler(run),
                                        collate_fn=run.collate_fn))
        batches = acc.skip_first_batches(loader, run.micro_in_epoch) if run.micro_in_epoch else loader
        for batch in batches:
            batch, metrics = _micro_step(run, batch)
            run.micro_in_epoch += 1
            run.tokens += int(batch["loss_mask"].sum())
            run.sequences += int(batch["input_ids"].shape[0])
            window.append(metrics)
            if not acc.sync_gradients:
                continue
            run.step += 1
            bar.update(1)
            if budget is not None and budget.observe(run):
                run.budget = budget.decided
                bar.total = run.max_steps
                bar.refresh()
                d = run.budget
                rank0_print(f"[train] train.max_minutes {d['minutes']:g}: {d['step_seconds']:.2f} s a step "
                            f"here -> {d['max_steps']} steps (cap {d['steps_cap']}; bound by {d['bound']})")
            if run.step % t_cfg.log_every == 0 or run.step == run.max_steps:
                row = average([(m, 1) for m in window])
                rates = run.scheduler.get_last_lr()  # Muon's groups first (train/optim.py), then AdamW's
                row.update(lr=rates[-1], tokens_per_s=round(run.tokens / (time.perf_counter() - start), 1))
                if rates[0] != rates[-1]:  # train.muon_lr: the Muon group's own rate too
                    row["lr_muon"] = rates[0]
                log.log(run.step, "train", row)
                bar.set_postfix(loss=f"{row['loss']:.3f}", tau=f"{row.get('expected_tau', 0):.2f}")
                window = []
            if run.val_loader is not None and ((t_cfg.eval_every and run.step % t_cfg.eval_every == 0)
                                               or run.step == run.max_steps):
                scores = validation_scores(run.module, run.val_loader, run.source, acc, cfg.drafter)
                log.log(run.step, "validation", scores)
                if t_cfg.select == "expected_tau":
                    keep_if_best(run, scores)
            if (t_cfg.save_every and run.step % t_cfg.save_every == 0) or run.step == run.max_steps:
                run.last_good = save_checkpoint(acc, run.run_dir, run.step, run.state(),
                                                t_cfg.keep_checkpoints)
            signum = stop.requested(acc)  # every rank, every step: they stop at the same one
            if signum:
                bar.close()
                raise stop_here(run, signum)
            if run.step >= run.max_steps:
                break
        else:
            run.epoch, run.micro_in_epoch = run.epoch + 1, 0
    bar.close()
    run.seconds = run.elapsed()


def _sampler(run: TrainRun):
    """This epoch's order: a function of (seed, epoch) only (and of the micro-batch size with
    train.group_by_length); shards are read one block at a time."""
    from torch.utils.data import RandomSampler

    from draftsmith.train.sources import LengthGroupedSampler, ShardBlockSampler, ShardDataset

    seed, t_cfg = run.cfg.train.seed, run.cfg.train
    group = t_cfg.batch_size if t_cfg.group_by_length else 0
    if isinstance(run.train_set, ShardDataset):
        return ShardBlockSampler(run.train_set, seed, run.epoch, group)
    if group:
        return LengthGroupedSampler(run.train_set.lengths(), group, seed, run.epoch)
    return RandomSampler(run.train_set, generator=torch.Generator().manual_seed(seed + run.epoch))


def _micro_step(run: TrainRun, batch: dict) -> tuple[dict, dict]:
    """One micro-batch under gradient accumulation: the source's signal, forward, backward, clipping, the
    optimizer (and, on a synchronising step, the schedule); a non-finite loss on any rank stops training
    naming the step and the last good checkpoint. Returns the batch as trained on and its metrics."""
    from draftsmith.train.sources import to_device

    acc, t_cfg = run.accelerator, run.cfg.train
    with acc.accumulate(run.module):
        batch = to_device(run.source(to_device(batch, acc.device)), acc.device, torch.float32)
        loss, metrics = run.module(batch)
        if acc.gather(torch.isfinite(loss.detach()).reshape(1).float()).min() < 1:
            raise TrainingError(f"non-finite loss ({float(loss.detach())}) at step {run.step + 1}, "
                                f"epoch {run.epoch}; last good checkpoint kept: "
                                f"{run.last_good or 'none (no checkpoint yet)'}. Lower train.lr, "
                                "check the data, or resume from that checkpoint.")
        acc.backward(loss)
        if acc.sync_gradients and t_cfg.max_grad_norm > 0:
            acc.clip_grad_norm_(run.module.parameters(), t_cfg.max_grad_norm)
        run.optimizer.step()
        if acc.sync_gradients:  # one optimizer step done: one schedule step, whatever the world size
            run.scheduler.step()
        run.optimizer.zero_grad()
    return batch, metrics


def stop_here(run: TrainRun, signum: int) -> Interrupted:
    """A stop was asked (SIGINT / SIGTERM): this step's checkpoint (a collective), unless it was just
    written."""
    import signal

    from draftsmith.train.runtime import rank0_print

    if run.last_good is None or run.last_good.name != f"step-{run.step}":
        rank0_print(f"\n[train] {signal.Signals(signum).name}: saving a checkpoint of step {run.step} before "
                    "stopping")
        run.last_good = save_checkpoint(run.accelerator, run.run_dir, run.step, run.state(),
                                        run.cfg.train.keep_checkpoints)
    return Interrupted(signum, run.step, run.last_good)


def save_drafter(run: TrainRun, out: Path) -> torch.nn.Module:
    """The trained module, whole, saved as a drafter folder by the main process (collective); returns it."""
    from draftsmith.heads.files import target_signature

    trained = whole_module(run)
    if run.accelerator.is_main_process:
        signature = target_signature(run.target.model, run.target.tokenizer)
        trained.save(out, run.cfg.model.target, tokenizer=run.target.tokenizer, signature=signature)
    run.accelerator.wait_for_everyone()
    return trained


def keep_if_best(run: TrainRun, scores: dict) -> None:
    """train.select=expected_tau: save the drafter to drafter-best/ when its validation expected τ is the best
    yet: the simulated τ of the recipe's serving tree where the kind reports rank accuracies
    (`expected_tau_serving`), else its chain estimate."""
    from draftsmith.train.runtime import rank0_print

    metric = "expected_tau_serving" if "expected_tau_serving" in scores else "expected_tau"
    value = scores.get(metric)
    if value is None:
        raise TrainingError("train.select=expected_tau: this kind's validation reports no expected_tau; use "
                            "train.select=last")
    if run.best is None or value > run.best["expected_tau"]:
        save_drafter(run, run.run_dir / "drafter-best")
        # the same number on every rank (validate)
        run.best = {"step": run.step, "expected_tau": float(value), "metric": metric}
        rank0_print(f"[train] step {run.step}: best validation {metric} {value:.4f} so far -> drafter-best/")


def whole_module(run: TrainRun) -> torch.nn.Module:
    """The trained module, whole, on the main process (collective: every rank calls it).

    Replicated runs (DDP, ZeRO-1/2) unwrap; sharded ones gather through `accelerator.get_state_dict`
    (ZeRO-3's consolidated state, FSDP's full state dict) into the meta twin.
    """
    acc = run.accelerator
    if run.twin is None:
        return acc.unwrap_model(run.module)
    state = acc.get_state_dict(run.module)
    if acc.is_main_process:
        run.twin.load_state_dict({k: v.detach().cpu() for k, v in state.items()}, strict=True, assign=True)
    return run.twin


def finish(run: TrainRun) -> Path:
    """Replica check, the drafter folder and `train_summary.json`; returns the drafter folder. With
    train.select=expected_tau the best validation drafter becomes `drafter/`, the last one `drafter-last/`."""
    acc, out = run.accelerator, run.run_dir / "drafter"
    select = run.cfg.train.select == "expected_tau" and run.best is not None and run.best["step"] != run.step
    trained = save_drafter(run, run.run_dir / "drafter-last" if select else out)
    # One number per rank: data-parallel replicas must end bit-identical; a difference means desync.
    # (Sharded runs hold no replicas: the number is the gathered module's, on the main process.)
    digest = torch.tensor([sum(p.detach().double().sum().item() for p in trained.parameters()
                               if p.requires_grad and p.device.type != "meta")],
                          dtype=torch.float64, device=acc.device)
    checksums = acc.gather(digest).tolist()
    samples, tokens = run.seen()
    if acc.is_main_process:
        if select:
            shutil.rmtree(out, ignore_errors=True)
            shutil.copytree(run.run_dir / "drafter-best", out)
        # seconds / samples_seen / assistant_tokens_seen cover every step kept, across resumes (the steps
        # redone after a checkpoint once); counted_from_step > 0: resumed from a checkpoint that did not
        # record them "config": what this drafter was trained with, the train stage's record
        # (train/runfolder.py)
        # torch_threads: each process's, as the run ends (core-hours = seconds x world_size x torch_threads)
        summary = {"steps": run.step, "world_size": acc.num_processes,
                   "torch_threads": torch.get_num_threads(), "seconds": round(run.seconds, 3),
                   "counted_from_step": run.counted_from_step,
                   "samples_seen": samples, "samples_per_step": round(samples / max(run.step, 1), 2),
                   "assistant_tokens_seen": tokens, "rank_param_checksums": checksums,
                   "replicas_identical": len(set(checksums)) == 1 if run.twin is None else None,
                   "sharded": run.twin is not None, "mixed_precision": acc.mixed_precision,
                   "distributed_type": str(acc.distributed_type).split(".")[-1],
                   "selected": {"by": "expected_tau",
                                **run.best} if run.cfg.train.select == "expected_tau" and run.best
                   else {"by": "last", "step": run.step},
                   "budget": {**run.budget,
                              "fit_minutes": round(run.seconds / 60, 2)} if run.budget else None,
                   "config": run.resolved}
        (run.run_dir / "train_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    acc.wait_for_everyone()
    acc.end_training()
    if torch.distributed.is_initialized():
        # A gloo group left to interpreter shutdown can abort a rank ("terminate called without an
        # active exception") after all the work is done; close it while everything is alive.
        torch.distributed.destroy_process_group()
    return out


def train(cfg, run_dir: Path, resume: bool = False, target=None, accelerator=None,
          fresh: bool = False) -> Path:
    """Train the drafter of `cfg` (a RunConfig) into `run_dir`; returns the drafter folder. A folder holding a
    run resumes it, leaves a finished one alone, or refuses naming the settings that differ
    (train/runfolder.py); `resume` also continues past a changed length, `fresh` moves the old run aside and
    starts over."""
    from draftsmith.train.runtime import rank0_print

    start = plan_start(run_dir, cfg.to_dict(), start_mode(resume, fresh))
    if start.finished:
        rank0_print(f"[train] {start.note}")
        return Path(run_dir) / "drafter"
    run = prepare(cfg, run_dir, resume, target, accelerator, fresh)
    fit(run)
    return finish(run)
