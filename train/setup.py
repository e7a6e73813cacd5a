"""The training setup: everything `fit` needs, built once (`prepare`), and the `train:` section it reads.

In the flow: the run config + the run folder -> a `TrainRun` for train/loop.py's `fit`. `prepare` wires the
accelerator and seed, decides how this run starts in its folder (fresh, resumed, refused: train/runfolder.py),
loads the target and the tokenised data, builds the drafter from the kind's row (token counts, a joint module
when the kind trains the target), its sources (offline shards or the online target), the optimizer and the
learning-rate schedule sized in optimizer steps, and restores a checkpoint when resuming.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from draftsmith.train.checkpoints import verify_checkpoint
from draftsmith.train.optim import make_optimizer
from draftsmith.train.runfolder import Start, move_aside, plan_start, rewind_metrics
from draftsmith.train.runtime import TrainingError


@dataclass
class TrainConfig:
    """`train:` section."""

    lr: float = 1e-3
    weight_decay: float = 0.0
    # adamw, or muon: Muon on the hidden weight matrices, AdamW on the rest (train/optim.py)
    optimizer: Literal["adamw", "muon"] = "adamw"
    # muon: the Muon group's rate (null: lr; speculators' trainer takes 10 x lr); adamw ignores it
    muon_lr: float | None = None
    epochs: float = 1.0
    # optimizer steps; None: from epochs; 0: save the untrained drafter (a baseline)
    max_steps: int | None = None
    # a time budget: measure this machine's step, then train min(the step cap above, what fits in these
    # minutes), the schedule sized to it (train/budget.py); null: the step cap alone
    max_minutes: float | None = None
    batch_size: int = 8  # sequences per micro-batch per process
    # micro-batches of sequences of about one length (less padding: a cheaper step), each batch still drawn
    # from a random stretch of the epoch's order (train/sources.py group_by_length); what HF Trainer's
    # group_by_length does
    group_by_length: bool = False
    grad_accum: int = 1
    max_grad_norm: float = 1.0
    # learning-rate warm-up in optimizer steps; auto: WARMUP_FRACTION of the run's step cap (at least 1), so a
    # small dataset's few steps are not all warm-up (train/budget.py resolve_warmup)
    warmup_steps: int | str = 0
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
    # a DeepSpeed JSON (configs/deepspeed/zero2.json) for ZeRO through accelerate
    deepspeed: str | None = None
    # which drafter the run keeps: the last one, or the one whose validation expected τ was highest -- the
    # simulated τ of the recipe's serving chain or tree from rank accuracies per depth
    # (heads/runtime/acceptance.serving_tau) where the kind reports them (EAGLE, Medusa), else its chain
    # estimate from top-1 accuracies; the other stays beside it
    select: Literal["last", "expected_tau"] = "last"

    def __post_init__(self):
        if self.batch_size < 1 or self.grad_accum < 1:
            raise ValueError("train.batch_size and train.grad_accum must be >= 1")
        if self.max_steps is not None and self.max_steps < 0:
            raise ValueError(f"train.max_steps must be >= 0 (0: the untrained drafter; null: epochs decide), "
                             f"got {self.max_steps}")
        if self.max_minutes is not None and not self.max_minutes > 0:
            raise ValueError("train.max_minutes must be > 0 (minutes of training on this machine; null: no "
                             f"time budget), got {self.max_minutes}")
        if self.deepspeed and not Path(self.deepspeed).is_file():
            raise ValueError(f"train.deepspeed: no file {self.deepspeed} (a DeepSpeed JSON, e.g. "
                             "configs/deepspeed/zero2.json)")
        if isinstance(self.warmup_steps, str) and self.warmup_steps != "auto" or (
                isinstance(self.warmup_steps, int) and self.warmup_steps < 0):
            raise ValueError(f"train.warmup_steps must be an int >= 0 or auto, got {self.warmup_steps!r}")
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
        return self.drafter.save_pretrained(folder, target=target_name, tokenizer=tokenizer,
                                            signature=signature)


def mixed_precision(choice: str) -> str:
    if choice != "auto":
        return choice
    if torch.cuda.is_available():
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    from draftsmith.distill.loading import resolve_dtype

    # CPU autocast: the rule of dtype auto
    return "bf16" if resolve_dtype("auto", "cpu") == "bfloat16" else "no"


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
    # ... spent before this process, as the checkpoint it resumed from recorded it
    seconds_before: float = 0.0
    # (sequences, assistant tokens) all ranks trained on before this process
    seen_before: tuple[int, int] = (0, 0)
    # resumed from a checkpoint that recorded neither: the counts start at its step
    counted_from_step: int = 0
    clock: float | None = None  # time.perf_counter() when this process's fit() began
    # sharded runs: the module's structure on the meta device (finish fills it)
    twin: torch.nn.Module | None = None
    best: dict | None = None  # train.select=expected_tau: {"step", "expected_tau"} of drafter-best/
    budget: dict | None = None  # train.max_minutes: the step count it fixed (train/budget.py), once decided
    warmup: int = 0  # train.warmup_steps resolved against the step cap (auto: a fraction of it)

    def elapsed(self) -> float:
        """Seconds of training behind the current step: earlier processes' (up to the checkpoint resumed from;
        the steps redone after it are counted once) plus this one's."""
        return self.seconds_before + (time.perf_counter() - self.clock if self.clock is not None else 0.0)

    def seen(self) -> tuple[int, int]:
        """(sequences, assistant tokens) trained on so far, every rank and every earlier process
        (collective)."""
        acc = self.accelerator
        mine = torch.tensor([self.sequences, self.tokens], dtype=torch.long, device=acc.device).reshape(1, 2)
        sequences, tokens = (int(x) for x in acc.gather(mine).sum(0).tolist())
        return sequences + self.seen_before[0], tokens + self.seen_before[1]

    def state(self) -> dict:
        """What `trainer_state.json` holds beside accelerate's state (collective: gathers the counts seen)."""
        sequences, tokens = self.seen()
        return {"step": self.step, "epoch": self.epoch, "micro_in_epoch": self.micro_in_epoch,
                "config": self.resolved, "best": self.best, "budget": self.budget,
                "seconds": round(self.elapsed(), 3), "samples_seen": sequences,
                "assistant_tokens_seen": tokens, "counted_from_step": self.counted_from_step}


def start_mode(resume: bool, fresh: bool) -> str:
    if resume and fresh:
        raise TrainingError("--resume continues this run and --fresh starts it over: choose one")
    return "fresh" if fresh else "resume" if resume else "auto"


def _start(cfg, run_dir: Path, start: Start, accelerator) -> dict:
    """Apply where training starts (train/runfolder.py): the checkpoint verified, outputs it supersedes moved
    aside, metrics rewound to its step, the config recorded; returns the checkpoint's trainer state ({} from
    step 0)."""
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


def prepare(cfg, run_dir: Path, resume: bool = False, target=None, accelerator=None,
            fresh: bool = False) -> TrainRun:
    """Everything `fit` needs, from the config (a RunConfig); the target is loaded unless given. Where
    training starts in `run_dir` (a checkpoint of it, step 0, `fresh`: step 0 with the old outputs moved
    aside) is `plan_start`'s."""
    from accelerate.utils import set_seed
    from torch.utils.data import DataLoader

    from draftsmith.distill.data import label_counts
    from draftsmith.distill.loading import load_target
    from draftsmith.heads.registry import build_drafter
    from draftsmith.train.budget import make_schedule
    from draftsmith.train.runtime import whole_weights
    from draftsmith.train.sources import OfflineSource, build_sources

    t_cfg, run_dir, spec = cfg.train, Path(run_dir), cfg.drafter.spec
    accelerator = accelerator or training_accelerator(cfg)
    set_seed(t_cfg.seed)
    now = cfg.to_dict()
    start = plan_start(run_dir, now, start_mode(resume, fresh))
    if start.finished:
        raise TrainingError(f"{start.note}")
    saved, ckpt = _start(cfg, run_dir, start, accelerator), start.checkpoint
    trains_target = cfg.drafter.settings.trains_target()
    _check_recipe(cfg, spec, trains_target)
    with whole_weights(accelerator):
        target = target or load_target(cfg.model, device=str(accelerator.device))
    train_rows, val_rows = _load_data(cfg, run_dir, target, accelerator)
    counts = label_counts(train_rows, target.vocab_size) if spec.token_counts else None
    with whole_weights(accelerator):
        drafter = build_drafter(cfg.drafter, target.model, counts)
    train_set, val_set, source, collate_fn = build_sources(cfg, run_dir, target, drafter, train_rows,
                                                           val_rows, spec)
    max_steps, warmup = _step_count(t_cfg, len(train_set), accelerator, saved, ckpt)
    if trains_target:  # the joint module runs the (adapted) target itself
        module, source = spec.joint(target, drafter, cfg.drafter), OfflineSource()
    else:
        module = LossModule(drafter)
    optimizer = make_optimizer(module, t_cfg, {target.vocab_size, getattr(drafter, "draft_vocab_size", 0)},
                               sharded=is_sharded(accelerator) or bool(t_cfg.deepspeed))
    scheduler = make_schedule(optimizer, t_cfg, max_steps, warmup)
    # The schedule is stepped here once per optimizer step, not prepared: accelerate's AcceleratedScheduler
    # steps a prepared schedule num_processes times per optimizer step (DeepSpeed's wrapper too), so on N
    # processes warm-up and decay would run N times too fast. Registered, it is still saved and resumed.
    twin = meta_twin(module) if is_sharded(accelerator) else None
    module, optimizer = accelerator.prepare(module, optimizer)
    accelerator.register_for_checkpointing(scheduler)
    val_loader = accelerator.prepare(DataLoader(val_set, batch_size=t_cfg.batch_size,
                                                collate_fn=collate_fn)) if val_set else None
    if t_cfg.select == "expected_tau" and val_loader is None:
        raise TrainingError("train.select=expected_tau chooses on the validation split, and this run has "
                            "none: set data.val_fraction > 0 or data.validation (or train.select=last)")
    run = TrainRun(cfg, run_dir, accelerator, target, module, optimizer, scheduler, train_set, val_loader,
                   source, collate_fn, max_steps, now, last_good=ckpt, twin=twin, warmup=warmup)
    if ckpt is not None:
        _restore(run, ckpt, saved, start.note)
    if cfg.log.wandb:
        _start_trackers(cfg, accelerator, now, run_dir)
    return run


def _check_recipe(cfg, spec, trains_target: bool) -> None:
    """Refuse, before the target loads, a recipe that cannot train: fixed shards where the live target is
    needed, no training data, a missing data file (named now, not after the target has loaded)."""
    from draftsmith.distill.records import resolve_source

    t_cfg = cfg.train
    if (trains_target or t_cfg.onpolicy_ratio > 0) and cfg.extract.enabled:
        why = (f"this {spec.name} drafter trains the target too (drafter.{spec.key} settings)"
               if trains_target else
               "train.onpolicy_ratio > 0 needs the live target to score the student's own answers")
        raise TrainingError(f"{why}, but extract.enabled: true trains from fixed shards: set "
                            "extract.enabled: false")
    if not cfg.data.train:
        raise TrainingError("data.train names no conversations: add yours to the recipe (data: {train: "
                            "[my_chats.json]}) or as an override (data.train=[my_chats.json])")
    for source in cfg.data.train:  # a missing file is named now, not after the target has loaded
        resolve_source(source)


def _load_data(cfg, run_dir: Path, target, accelerator) -> tuple[list, list]:
    """The tokenised train and validation rows (rank 0 tokenises into the shared cache, the others load it),
    what the data became said and written to `run_dir/data.json` (the length it was cut to and why, the
    split)."""
    from draftsmith.distill.data import target_datasets
    from draftsmith.train.runtime import rank0_print

    with accelerator.main_process_first():  # rank 0 tokenises into the shared cache, the others load it
        train_rows, val_rows, stats = target_datasets(cfg.data, target)
    rank0_print(f"[train] data: {stats.summary()}; {len(train_rows)} train / {len(val_rows)} validation")
    if len(train_rows) == 0:
        raise TrainingError(f"no training conversations in {cfg.data.train}: {stats.summary()}")
    if stats.truncated and not isinstance(cfg.data.max_length, str):
        rank0_print(f"[train] warning: {stats.truncated} of {stats.measured} conversations are longer than "
                    f"data.max_length {cfg.data.max_length} and were cut (their later tokens are not trained "
                    "on); data.max_length: auto sizes it from your data")
    if accelerator.is_main_process:  # what the data became: the length it was cut to and why, the split
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "data.json").write_text(json.dumps(dict(stats.to_dict(), train=len(train_rows),
                                                           validation=len(val_rows)), indent=1) + "\n")
    return train_rows, val_rows


def _step_count(t_cfg, sequences: int, accelerator, saved: dict, ckpt) -> tuple[int, int]:
    """(optimizer steps, warm-up steps) of the run: the step cap or the epochs over `sequences`, a time
    budget's count when the checkpoint resumed from decided one; refused when that checkpoint is already past
    it."""
    from draftsmith.train.budget import resolve_warmup
    from draftsmith.train.runtime import rank0_print

    steps_per_epoch = math.ceil(sequences / (t_cfg.batch_size * accelerator.num_processes * t_cfg.grad_accum))
    max_steps = (t_cfg.max_steps if t_cfg.max_steps is not None else
                 max(1, math.ceil(steps_per_epoch * t_cfg.epochs)))
    warmup = resolve_warmup(t_cfg.warmup_steps, max_steps)  # from the cap: a time budget's resize keeps it
    if t_cfg.warmup_steps == "auto":
        rank0_print(f"[train] train.warmup_steps auto: {warmup} of {max_steps} steps")
    # train.max_minutes decided before this checkpoint: the same count, the same schedule
    if saved.get("budget"):
        max_steps = saved["budget"]["max_steps"]
    if saved.get("step", 0) > max_steps:
        raise TrainingError(f"{ckpt} is at step {saved['step']}, past the {max_steps} steps asked now: rerun "
                            "with --fresh (moves this run aside) or into a new --out, or ask for at least "
                            "that many steps")
    return max_steps, warmup


def _restore(run: TrainRun, ckpt: Path, saved: dict, note: str) -> None:
    """Load the checkpoint's state into the prepared objects and the run's position and counts from its
    trainer state (a checkpoint from before the counts were recorded counts from its step, and the summary
    says so)."""
    from draftsmith.train.runtime import rank0_print

    run.accelerator.load_state(str(ckpt))
    run.step, run.epoch, run.micro_in_epoch = saved["step"], saved["epoch"], saved["micro_in_epoch"]
    run.best, run.budget = saved.get("best"), saved.get("budget")
    if "seconds" in saved:  # the time and data behind the checkpoint: the summary counts the whole run
        run.seconds_before = float(saved["seconds"])
        run.seen_before = (int(saved["samples_seen"]), int(saved["assistant_tokens_seen"]))
        run.counted_from_step = int(saved.get("counted_from_step", 0))
    else:  # a checkpoint from before these were recorded: count from here, and say so in the summary
        run.counted_from_step = run.step
    rank0_print(f"[train] resumed from {ckpt} at step {run.step} ({note})")


def _start_trackers(cfg, accelerator, now: dict, run_dir: Path) -> None:
    """log.wandb: the wandb run; a login or network problem is a TrainingError saying what to do, not a
    crash."""
    try:
        accelerator.init_trackers(cfg.log.project, config=now,
                                  init_kwargs={"wandb": {"name": cfg.name, "dir": str(run_dir)}})
    except Exception as exc:  # wandb's UsageError / CommError: a login or network problem, not a crash
        if type(exc).__module__.split(".")[0] != "wandb":
            raise
        raise TrainingError(f"log.wandb: wandb could not start a run ({type(exc).__name__}: "
                            f"{str(exc).strip().splitlines()[0]}): check `wandb login` and the network, log "
                            "locally with WANDB_MODE=offline, or set log.wandb=false") from None


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
