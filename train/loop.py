"""The training loop on `accelerate`: one code path from one CPU process to N GPUs (DDP/FSDP/ZeRO).

In the flow: data (+ features, offline or online) -> drafter -> `runs/<name>/drafter/`. `train` only
wires three steps:

    prepare  accelerator, seed, resume check, target, tokenised data, the drafter (from the kind's row:
             token counts, a joint module when the kind trains the target), sources, optimizer, schedule
    fit      per step a batch from the source, the drafter's own `compute_loss`, `accelerator.backward`,
             clipping, optimizer and schedule under gradient accumulation; periodic validation with
             acceptance proxies (per-head/step top-1, expected τ), checkpoints, a JSONL metrics log,
             wandb when configured, and a hard stop on a non-finite loss that names the step
    finish   one parameter checksum per rank (replicas must be identical), the drafter folder, the summary

The learning-rate schedule is sized in optimizer steps and stepped once per optimizer step on every
rank, so N processes follow the one-process curve step for step. Checkpoints (`accelerator.save_state` +
`trainer_state.json`: model, optimizer, scheduler, RNG and data
position) let `--resume` continue exactly (train/checkpoints.py: manifest, marker, refusal of what it did not write).
A rerun into a folder with checkpoints resumes, or refuses naming the settings that differ, and never deletes them
(train/runfolder.py). SIGINT / SIGTERM stop at the next optimizer-step boundary with a checkpoint of that step
(runtime.StopSignals; the CLI says how to resume and exits 130 / 143).
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from draftsmith.heads.acceptance import serving_tau
from draftsmith.train.checkpoints import save_checkpoint, verify_checkpoint
from draftsmith.train.runfolder import Start, move_aside, plan_start, rewind_metrics
from draftsmith.train.runtime import Interrupted, StopSignals, TrainingError


@dataclass
class TrainConfig:
    """`train:` section."""

    lr: float = 1e-3
    weight_decay: float = 0.0
    epochs: float = 1.0
    max_steps: int | None = None  # optimizer steps; None: from epochs; 0: save the untrained drafter (a baseline)
    # a time budget: measure this machine's step, then train min(the step cap above, what fits in these minutes),
    # the schedule sized to it (train/budget.py); null: the step cap alone
    max_minutes: float | None = None
    batch_size: int = 8  # sequences per micro-batch per process
    grad_accum: int = 1
    max_grad_norm: float = 1.0
    warmup_steps: int = 0
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    mixed_precision: Literal["auto", "no", "bf16", "fp16"] = "auto"  # auto: bf16 where the hardware has it
    seed: int = 0
    log_every: int = 10
    eval_every: int = 200  # optimizer steps; 0 = only at the end
    save_every: int = 200  # optimizer steps; 0 = only at the end
    keep_checkpoints: int = 2
    online_top_k: int = 0  # online training: 0 = dense target logits, k > 0 = top-k only
    # on-policy data (DistillSpec; kinds that sample themselves): this fraction of sequences gets its answer
    # rewritten by the student (sampled from the prompt) before the target scores it
    onpolicy_ratio: float = 0.0
    onpolicy_max_new_tokens: int = 128
    onpolicy_temperature: float = 1.0  # 0 = greedy
    deepspeed: str | None = None  # a DeepSpeed JSON (configs/deepspeed/zero2.json) for ZeRO through accelerate
    # which drafter the run keeps: the last one, or the one whose validation expected τ was highest -- the simulated
    # τ of the recipe's serving chain or tree from rank accuracies per depth (heads/acceptance.serving_tau) where
    # the kind reports them (EAGLE, Medusa), else its chain estimate from top-1 accuracies; the other stays beside it
    select: Literal["last", "expected_tau"] = "last"

    def __post_init__(self):
        if self.batch_size < 1 or self.grad_accum < 1:
            raise ValueError("train.batch_size and train.grad_accum must be >= 1")
        if self.max_steps is not None and self.max_steps < 0:
            raise ValueError(f"train.max_steps must be >= 0 (0: the untrained drafter; null: epochs decide), "
                             f"got {self.max_steps}")
        if self.max_minutes is not None and not self.max_minutes > 0:
            raise ValueError(f"train.max_minutes must be > 0 (minutes of training on this machine; null: no time "
                             f"budget), got {self.max_minutes}")
        if self.deepspeed and not Path(self.deepspeed).is_file():
            raise ValueError(f"train.deepspeed: no file {self.deepspeed} (a DeepSpeed JSON, e.g. "
                             "configs/deepspeed/zero2.json)")
        if not 0 <= self.onpolicy_ratio <= 1 or self.onpolicy_max_new_tokens < 1:
            raise ValueError("train.onpolicy_ratio must be in [0, 1] and train.onpolicy_max_new_tokens >= 1")


class LossModule(torch.nn.Module):
    """DDP/FSDP sync gradients through `forward`, so the drafter's loss is computed in one."""

    def __init__(self, drafter: torch.nn.Module):
        super().__init__()
        self.drafter = drafter

    def forward(self, batch: dict):
        return self.drafter.compute_loss(batch)

    def save(self, folder: Path, target_name: str, tokenizer=None, signature=None) -> Path:
        return self.drafter.save_pretrained(folder, target=target_name, tokenizer=tokenizer, signature=signature)


def mixed_precision(choice: str) -> str:
    if choice != "auto":
        return choice
    if torch.cuda.is_available():
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    from draftsmith.distill.target import resolve_dtype

    return "bf16" if resolve_dtype("auto", "cpu") == "bfloat16" else "no"  # CPU autocast: the rule of dtype auto


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
    """Weighted mean of (metrics, weight) rows. With an `accelerator` of several processes the weighted sums are
    summed over every rank first (each rank saw its share), so every rank reports, and decides on, the same numbers."""
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


def training_accelerator(cfg):
    """The accelerator a run trains with (mixed precision, accumulation, DeepSpeed, wandb from the config)."""
    from draftsmith.train.runtime import build_accelerator

    t_cfg = cfg.train
    return build_accelerator(t_cfg.deepspeed, t_cfg.batch_size, t_cfg.max_grad_norm,
                             gradient_accumulation_steps=t_cfg.grad_accum,
                             mixed_precision=mixed_precision(t_cfg.mixed_precision),
                             log_with="wandb" if cfg.log.wandb else None)


@dataclass
class TrainRun:
    """What `prepare` hands `fit` and `finish`: the prepared objects and the position in the run."""

    cfg: Any
    run_dir: Path
    accelerator: Any
    target: Any
    module: torch.nn.Module
    optimizer: Any
    scheduler: Any
    train_set: Any
    val_loader: Any
    source: Any
    collate_fn: Any
    max_steps: int
    resolved: dict
    step: int = 0
    epoch: int = 0
    micro_in_epoch: int = 0
    tokens: int = 0  # assistant tokens this process trained on
    sequences: int = 0  # sequences this process trained on
    last_good: Path | None = None
    seconds: float = 0.0  # training time of every step this run kept, earlier processes' included (`elapsed`)
    seconds_before: float = 0.0  # ... spent before this process, as the checkpoint it resumed from recorded it
    seen_before: tuple[int, int] = (0, 0)  # (sequences, assistant tokens) all ranks trained on before this process
    counted_from_step: int = 0  # resumed from a checkpoint that recorded neither: the counts start at its step
    clock: float | None = None  # time.perf_counter() when this process's fit() began
    twin: torch.nn.Module | None = None  # sharded runs: the module's structure on the meta device (finish fills it)
    best: dict | None = None  # train.select=expected_tau: {"step", "expected_tau"} of drafter-best/
    budget: dict | None = None  # train.max_minutes: the step count it fixed (train/budget.py), once decided

    def elapsed(self) -> float:
        """Seconds of training behind the current step: earlier processes' (up to the checkpoint resumed from;
        the steps redone after it are counted once) plus this one's."""
        return self.seconds_before + (time.perf_counter() - self.clock if self.clock is not None else 0.0)

    def seen(self) -> tuple[int, int]:
        """(sequences, assistant tokens) trained on so far, every rank and every earlier process (collective)."""
        acc = self.accelerator
        mine = torch.tensor([self.sequences, self.tokens], dtype=torch.long, device=acc.device).reshape(1, 2)
        sequences, tokens = (int(x) for x in acc.gather(mine).sum(0).tolist())
        return sequences + self.seen_before[0], tokens + self.seen_before[1]

    def state(self) -> dict:
        """What `trainer_state.json` holds beside accelerate's state (collective: gathers the counts seen)."""
        sequences, tokens = self.seen()
        return {"step": self.step, "epoch": self.epoch, "micro_in_epoch": self.micro_in_epoch, "config": self.resolved,
                "best": self.best, "budget": self.budget, "seconds": round(self.elapsed(), 3),
                "samples_seen": sequences, "assistant_tokens_seen": tokens, "counted_from_step": self.counted_from_step}


def start_mode(resume: bool, fresh: bool) -> str:
    if resume and fresh:
        raise TrainingError("--resume continues this run and --fresh starts it over: choose one")
    return "fresh" if fresh else "resume" if resume else "auto"


def _start(cfg, run_dir: Path, start: Start, accelerator) -> dict:
    """Apply where training starts (train/runfolder.py): the checkpoint verified, outputs it supersedes moved aside,
    metrics rewound to its step, the config recorded; returns the checkpoint's trainer state ({} from step 0)."""
    from draftsmith.train.runtime import rank0_print

    ckpt = start.checkpoint
    if ckpt is not None:
        verify_checkpoint(ckpt)
    saved = json.loads((ckpt / "trainer_state.json").read_text()) if ckpt is not None else {}
    accelerator.wait_for_everyone()  # every rank has read the folder before the main process changes it
    if accelerator.is_main_process:
        moved = move_aside(run_dir, start.supersedes, start.note)
        if moved is not None:
            rank0_print(f"[train] {start.note}: the previous outputs moved to {moved}")
        rewind_metrics(run_dir / "metrics.jsonl", saved.get("step", 0))
        cfg.write_resolved(run_dir)
    accelerator.wait_for_everyone()
    return saved


def _sources(cfg, run_dir: Path, target, drafter, train_rows, val_rows, spec):
    """(train set, validation set or None, source, collate) from offline shards or for the live target."""
    from draftsmith.distill.collate import collate
    from draftsmith.train.onpolicy import build_onpolicy_source
    from draftsmith.train.runtime import rank0_print
    from draftsmith.train.sources import (
        OfflineSource,
        OnlineSource,
        RowDataset,
        ShardDataset,
        collate_shard_items,
    )

    keys = [str(k) for k in drafter.feature_layers]
    if cfg.extract.enabled:
        features = Path(cfg.extract.out) if cfg.extract.out else run_dir / "features"
        on_corrupt = cfg.extract.on_corrupt
        val_set = ShardDataset(features / "validation", target.name, keys, on_corrupt) if len(val_rows) else None
        train_set = ShardDataset(features / "train", target.name, keys, on_corrupt)
        for split in (train_set, val_set):
            for problem in (split.store.skipped if split is not None else []):
                rank0_print(f"[train] skipped (extract.on_corrupt: skip): {problem}")
        return train_set, val_set, OfflineSource(), collate_shard_items
    online = OnlineSource(target, list(drafter.feature_layers), cfg.train.online_top_k or None)
    source = build_onpolicy_source(cfg.train, online, drafter, target, spec)
    return RowDataset(train_rows), RowDataset(val_rows) if len(val_rows) else None, source, collate


def prepare(cfg, run_dir: Path, resume: bool = False, target=None, accelerator=None, fresh: bool = False) -> TrainRun:
    """Everything `fit` needs, from the config (a RunConfig); the target is loaded unless given. Where training starts
    in `run_dir` (a checkpoint of it, step 0, `fresh`: step 0 with the old outputs moved aside) is `plan_start`'s."""
    from accelerate.utils import set_seed
    from torch.utils.data import DataLoader

    from draftsmith.distill.data import build_datasets, label_counts
    from draftsmith.distill.records import resolve_source
    from draftsmith.distill.target import load_target
    from draftsmith.heads.registry import build_drafter, resolve
    from draftsmith.train.budget import make_schedule
    from draftsmith.train.runtime import rank0_print, whole_weights
    from draftsmith.train.sources import OfflineSource

    t_cfg, run_dir, spec = cfg.train, Path(run_dir), cfg.drafter.spec
    accelerator = accelerator or training_accelerator(cfg)
    set_seed(t_cfg.seed)
    now = cfg.to_dict()
    start = plan_start(run_dir, now, start_mode(resume, fresh))
    if start.finished:
        raise TrainingError(f"{start.note}")
    saved, ckpt = _start(cfg, run_dir, start, accelerator), start.checkpoint
    trains_target = cfg.drafter.settings.trains_target()
    if (trains_target or t_cfg.onpolicy_ratio > 0) and cfg.extract.enabled:
        why = (f"this {spec.name} drafter trains the target too (drafter.{spec.key} settings)" if trains_target else
               "train.onpolicy_ratio > 0 needs the live target to score the student's own answers")
        raise TrainingError(f"{why}, but extract.enabled: true trains from fixed shards: set extract.enabled: false")
    for source in cfg.data.train:  # a missing file is named now, not after the target has loaded
        resolve_source(source)
    with whole_weights(accelerator):
        target = target or load_target(cfg.model, device=str(accelerator.device))
    with accelerator.main_process_first():  # rank 0 tokenises into the shared cache, the others load it
        train_rows, val_rows, stats = build_datasets(cfg.data, target.tokenizer, set(target.eos_token_ids))
    rank0_print(f"[train] data: {stats.summary()}; {len(train_rows)} train / {len(val_rows)} validation")
    if len(train_rows) == 0:
        raise TrainingError(f"no training conversations in {cfg.data.train}: {stats.summary()}")
    counts = label_counts(train_rows, target.vocab_size) if spec.token_counts else None
    with whole_weights(accelerator):
        drafter = build_drafter(cfg.drafter, target.model, counts)
    train_set, val_set, source, collate_fn = _sources(cfg, run_dir, target, drafter, train_rows, val_rows, spec)
    steps_per_epoch = math.ceil(len(train_set) / (t_cfg.batch_size * accelerator.num_processes * t_cfg.grad_accum))
    max_steps = t_cfg.max_steps if t_cfg.max_steps is not None else max(1, math.ceil(steps_per_epoch * t_cfg.epochs))
    if saved.get("budget"):  # train.max_minutes decided before this checkpoint: the same count, the same schedule
        max_steps = saved["budget"]["max_steps"]
    if saved.get("step", 0) > max_steps:
        raise TrainingError(f"{ckpt} is at step {saved['step']}, past the {max_steps} steps asked now: rerun with "
                            "--fresh (moves this run aside) or into a new --out, or ask for at least that many steps")
    if trains_target:  # the joint module runs the (adapted) target itself
        module, source = resolve(spec.joint)(target, drafter, cfg.drafter), OfflineSource()
    else:
        module = LossModule(drafter)
    optimizer = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=t_cfg.lr,
                                  weight_decay=t_cfg.weight_decay)
    scheduler = make_schedule(optimizer, t_cfg, max_steps)
    # The schedule is stepped here once per optimizer step, not prepared: accelerate's AcceleratedScheduler
    # steps a prepared schedule num_processes times per optimizer step (DeepSpeed's wrapper too), so on N
    # processes warm-up and decay would run N times too fast. Registered, it is still saved and resumed.
    twin = meta_twin(module) if is_sharded(accelerator) else None
    module, optimizer = accelerator.prepare(module, optimizer)
    accelerator.register_for_checkpointing(scheduler)
    val_loader = accelerator.prepare(DataLoader(val_set, batch_size=t_cfg.batch_size, collate_fn=collate_fn)) if val_set else None
    if t_cfg.select == "expected_tau" and val_loader is None:
        raise TrainingError("train.select=expected_tau chooses on the validation split, and this run has none: set "
                            "data.val_fraction > 0 (or train.select=last)")
    run = TrainRun(cfg, run_dir, accelerator, target, module, optimizer, scheduler, train_set, val_loader, source,
                   collate_fn, max_steps, now, last_good=ckpt, twin=twin)
    if ckpt is not None:
        accelerator.load_state(str(ckpt))
        run.step, run.epoch, run.micro_in_epoch = saved["step"], saved["epoch"], saved["micro_in_epoch"]
        run.best, run.budget = saved.get("best"), saved.get("budget")
        if "seconds" in saved:  # the time and data behind the checkpoint: the summary counts the whole run
            run.seconds_before = float(saved["seconds"])
            run.seen_before = (int(saved["samples_seen"]), int(saved["assistant_tokens_seen"]))
            run.counted_from_step = int(saved.get("counted_from_step", 0))
        else:  # a checkpoint from before these were recorded: count from here, and say so in the summary
            run.counted_from_step = run.step
        rank0_print(f"[train] resumed from {ckpt} at step {run.step} ({start.note})")
    if cfg.log.wandb:
        accelerator.init_trackers(cfg.log.project, config=now, init_kwargs={"wandb": {"name": cfg.name, "dir": str(run_dir)}})
    return run


def fit(run: TrainRun) -> None:
    """Optimizer steps until `max_steps` (see the module doc); `run` carries the position for checkpoints. A SIGINT or
    SIGTERM meanwhile ends it at the next optimizer-step boundary, with that step's checkpoint (`Interrupted`)."""
    with StopSignals() as stop:
        _fit(run, stop)


def _fit(run: TrainRun, stop: StopSignals) -> None:
    from torch.utils.data import DataLoader, RandomSampler
    from tqdm.auto import tqdm

    from draftsmith.train.budget import TimeBudget
    from draftsmith.train.runtime import rank0_print
    from draftsmith.train.sources import ShardBlockSampler, ShardDataset, to_device

    cfg, acc, t_cfg = run.cfg, run.accelerator, run.cfg.train
    budget = (TimeBudget(t_cfg.max_minutes, t_cfg.eval_every, len(run.val_loader) if run.val_loader else 0, run.budget)
              if t_cfg.max_minutes else None)
    log = MetricsLog(acc, run.run_dir / "metrics.jsonl")
    bar = tqdm(total=run.max_steps, initial=run.step, desc=f"train {cfg.drafter.kind}", unit="step",
               disable=not (cfg.log.progress and acc.is_main_process))
    window, start = [], time.perf_counter()
    run.clock = start
    while run.step < run.max_steps:
        # the order is a function of (seed, epoch) only; shards are read one block at a time
        sampler = (ShardBlockSampler(run.train_set, t_cfg.seed, run.epoch) if isinstance(run.train_set, ShardDataset)
                   else RandomSampler(run.train_set, generator=torch.Generator().manual_seed(t_cfg.seed + run.epoch)))
        loader = acc.prepare(DataLoader(run.train_set, batch_size=t_cfg.batch_size, sampler=sampler,
                                        collate_fn=run.collate_fn))
        batches = acc.skip_first_batches(loader, run.micro_in_epoch) if run.micro_in_epoch else loader
        for batch in batches:
            with acc.accumulate(run.module):
                batch = to_device(run.source(to_device(batch, acc.device)), acc.device, torch.float32)
                loss, metrics = run.module(batch)
                if acc.gather(torch.isfinite(loss.detach()).reshape(1).float()).min() < 1:
                    raise TrainingError(f"non-finite loss ({float(loss.detach())}) at step {run.step + 1}, epoch "
                                        f"{run.epoch}; last good checkpoint kept: {run.last_good or 'none (no checkpoint yet)'}. "
                                        "Lower train.lr, check the data, or resume from that checkpoint.")
                acc.backward(loss)
                if acc.sync_gradients and t_cfg.max_grad_norm > 0:
                    acc.clip_grad_norm_(run.module.parameters(), t_cfg.max_grad_norm)
                run.optimizer.step()
                if acc.sync_gradients:  # one optimizer step done: one schedule step, whatever the world size
                    run.scheduler.step()
                run.optimizer.zero_grad()
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
                rank0_print(f"[train] train.max_minutes {d['minutes']:g}: {d['step_seconds']:.2f} s a step here -> "
                            f"{d['max_steps']} steps (cap {d['steps_cap']}; bound by {d['bound']})")
            if run.step % t_cfg.log_every == 0 or run.step == run.max_steps:
                row = average([(m, 1) for m in window])
                row.update(lr=run.scheduler.get_last_lr()[0], tokens_per_s=round(run.tokens / (time.perf_counter() - start), 1))
                log.log(run.step, "train", row)
                bar.set_postfix(loss=f"{row['loss']:.3f}", tau=f"{row.get('expected_tau', 0):.2f}")
                window = []
            if run.val_loader is not None and ((t_cfg.eval_every and run.step % t_cfg.eval_every == 0)
                                               or run.step == run.max_steps):
                scores = validate(run.module, run.val_loader, run.source, acc)
                d_cfg = cfg.drafter
                served = serving_tau(scores, d_cfg.num_speculative_tokens, d_cfg.tree_nodes, d_cfg.tree_topk,
                                     getattr(d_cfg.spec.module, "recurrent", True))
                if served is not None:  # the recipe's serving tree, simulated from the rank accuracies
                    scores["expected_tau_serving"] = round(served, 6)
                log.log(run.step, "validation", scores)
                if t_cfg.select == "expected_tau":
                    keep_if_best(run, scores)
            if (t_cfg.save_every and run.step % t_cfg.save_every == 0) or run.step == run.max_steps:
                run.last_good = save_checkpoint(acc, run.run_dir, run.step, run.state(), t_cfg.keep_checkpoints)
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


def stop_here(run: TrainRun, signum: int) -> Interrupted:
    """A stop was asked (SIGINT / SIGTERM): this step's checkpoint (a collective), unless it was just written."""
    import signal

    from draftsmith.train.runtime import rank0_print

    if run.last_good is None or run.last_good.name != f"step-{run.step}":
        rank0_print(f"\n[train] {signal.Signals(signum).name}: saving a checkpoint of step {run.step} before stopping")
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
    """train.select=expected_tau: save the drafter to drafter-best/ when its validation expected τ is the best yet:
    the simulated τ of the recipe's serving tree where the kind reports rank accuracies (`expected_tau_serving`),
    else its chain estimate."""
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


def is_sharded(accelerator) -> bool:
    """FSDP or ZeRO-3: no rank holds the whole drafter, so the final save gathers it."""
    kind = accelerator.distributed_type.name
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    return kind == "FSDP" or (kind == "DEEPSPEED" and plugin is not None and plugin.zero_stage == 3)


def meta_twin(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of `module` whose parameters and buffers are on the meta device (no memory), made before
    `prepare` shards the original; `load_state_dict(full, assign=True)` later makes it a whole module
    that the kind's own `save` writes (any kind, joint ones too, with no kind-specific code)."""
    import copy

    memo = {}
    for p in module.parameters():
        memo[id(p)] = torch.nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
    for b in module.buffers():
        memo[id(b)] = torch.empty_like(b, device="meta")
    return copy.deepcopy(module, memo)


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
        # seconds / samples_seen / assistant_tokens_seen cover every step kept, across resumes (the steps redone
        # after a checkpoint once); counted_from_step > 0: resumed from a checkpoint that did not record them
        # "config": what this drafter was trained with, the train stage's record (train/runfolder.py)
        summary = {"steps": run.step, "world_size": acc.num_processes, "seconds": round(run.seconds, 1),
                   "counted_from_step": run.counted_from_step,
                   "samples_seen": samples, "samples_per_step": round(samples / max(run.step, 1), 2),
                   "assistant_tokens_seen": tokens, "rank_param_checksums": checksums,
                   "replicas_identical": len(set(checksums)) == 1 if run.twin is None else None,
                   "sharded": run.twin is not None, "mixed_precision": acc.mixed_precision,
                   "distributed_type": str(acc.distributed_type).split(".")[-1],
                   "selected": {"by": "expected_tau", **run.best} if run.cfg.train.select == "expected_tau" and run.best
                   else {"by": "last", "step": run.step},
                   "budget": {**run.budget, "fit_minutes": round(run.seconds / 60, 2)} if run.budget else None,
                   "config": run.resolved}
        (run.run_dir / "train_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    acc.wait_for_everyone()
    acc.end_training()
    if torch.distributed.is_initialized():
        # A gloo group left to interpreter shutdown can abort a rank ("terminate called without an
        # active exception") after all the work is done; close it while everything is alive.
        torch.distributed.destroy_process_group()
    return out


def train(cfg, run_dir: Path, resume: bool = False, target=None, accelerator=None, fresh: bool = False) -> Path:
    """Train the drafter of `cfg` (a RunConfig) into `run_dir`; returns the drafter folder. A folder holding a run
    resumes it, leaves a finished one alone, or refuses naming the settings that differ (train/runfolder.py);
    `resume` also continues past a changed length, `fresh` moves the old run aside and starts over."""
    from draftsmith.train.runtime import rank0_print

    start = plan_start(run_dir, cfg.to_dict(), start_mode(resume, fresh))
    if start.finished:
        rank0_print(f"[train] {start.note}")
        return Path(run_dir) / "drafter"
    run = prepare(cfg, run_dir, resume, target, accelerator, fresh)
    fit(run)
    return finish(run)
