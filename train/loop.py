"""The training loop on `accelerate`: one code path from one CPU process to N GPUs (DDP/FSDP/ZeRO).

In the flow: data (+ features, offline or online) -> drafter -> `runs/<name>/drafter/`. Per step:
a batch from the source, the drafter's own `compute_loss` (every trainable kind implements it),
`accelerator.backward`, clipping, optimizer and schedule under gradient accumulation. Around it:
periodic validation with acceptance proxies (per-head top-1/top-5 accuracy, expected τ),
checkpoints (`accelerator.save_state` + `trainer_state.json`: model, optimizer, scheduler, RNG and
data position) that `--resume` continues exactly, a JSONL metrics log, wandb when configured,
and a hard stop on a non-finite loss that names the step and keeps the last good checkpoint.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

CHECKPOINT_MARKER = "COMPLETE"


@dataclass
class TrainConfig:
    """`train:` section."""

    lr: float = 1e-3
    weight_decay: float = 0.0
    epochs: float = 1.0
    max_steps: int | None = None  # optimizer steps; None: from epochs; 0: save the untrained drafter (a baseline)
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
    # on-policy data (DistillSpec; draft-lm): this fraction of sequences gets its answer rewritten by the
    # student (sampled from the prompt) before the target scores it
    onpolicy_ratio: float = 0.0
    onpolicy_max_new_tokens: int = 128
    onpolicy_temperature: float = 1.0  # 0 = greedy
    deepspeed: str | None = None  # a DeepSpeed JSON (configs/deepspeed/zero2.json) for ZeRO through accelerate

    def __post_init__(self):
        if self.batch_size < 1 or self.grad_accum < 1:
            raise ValueError("train.batch_size and train.grad_accum must be >= 1")
        if not 0 <= self.onpolicy_ratio <= 1 or self.onpolicy_max_new_tokens < 1:
            raise ValueError("train.onpolicy_ratio must be in [0, 1] and train.onpolicy_max_new_tokens >= 1")


class TrainingError(RuntimeError):
    """Training cannot go on; the message names the step and what was kept."""


class LossModule(torch.nn.Module):
    """DDP/FSDP sync gradients through `forward`, so the drafter's loss is computed in one."""

    def __init__(self, drafter: torch.nn.Module):
        super().__init__()
        self.drafter = drafter

    def forward(self, batch: dict):
        return self.drafter.compute_loss(batch)

    def save(self, folder: Path, target_name: str, tokenizer=None) -> Path:
        return self.drafter.save_pretrained(folder, target=target_name, tokenizer=tokenizer)


# Settings that change what a checkpoint means; a resume with any of them different is refused.
RESUME_KEYS = ("model.target", "drafter", "data.train", "data.max_length", "data.val_fraction", "data.limit",
               "train.lr", "train.batch_size", "train.grad_accum", "train.schedule", "train.seed", "train.weight_decay",
               "extract.enabled", "train.online_top_k", "train.onpolicy_ratio")


_ABSENT = object()


def _pick(tree: dict, dotted: str):
    for part in dotted.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return _ABSENT
        tree = tree[part]
    return tree


def resume_differences(saved: dict, now: dict) -> list[str]:
    """Settings in RESUME_KEYS that differ; a key the checkpoint lacks (an older draftsmith) is not a difference."""
    diffs = []
    for key in RESUME_KEYS:
        a, b = _pick(saved, key), _pick(now, key)
        if isinstance(a, dict) and isinstance(b, dict):
            diffs += [f"{key}.{k}: checkpoint {a[k]!r}, now {b.get(k)!r}" for k in a if a[k] != b.get(k, _ABSENT)]
        elif a is not _ABSENT and a != b:
            diffs.append(f"{key}: checkpoint {a!r}, now {b!r}")
    return diffs


def latest_checkpoint(run_dir: Path) -> Path | None:
    done = [p for p in (run_dir / "checkpoints").glob("step-*") if (p / CHECKPOINT_MARKER).is_file()]
    return max(done, key=lambda p: int(p.name.split("-")[1])) if done else None


def mixed_precision(choice: str) -> str:
    if choice != "auto":
        return choice
    if torch.cuda.is_available():
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "bf16"  # CPU autocast: bf16 matmuls on avx512_bf16/AMX, fp32 elsewhere


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


def average(metric_rows: list[tuple[dict, int]]) -> dict:
    total = sum(n for _, n in metric_rows) or 1
    keys = metric_rows[0][0].keys() if metric_rows else []
    return {k: round(sum(m[k] * n for m, n in metric_rows) / total, 6) for k in keys}


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
    return average(rows)


def save_checkpoint(accelerator, run_dir: Path, step: int, state: dict, keep: int) -> Path:
    """Full state (accelerate) + trainer state; the marker is written last, so partial saves never count."""
    ckpt = run_dir / "checkpoints" / f"step-{step}"
    accelerator.save_state(str(ckpt))
    if accelerator.is_main_process:
        (ckpt / "trainer_state.json").write_text(json.dumps(state, indent=2))
        (ckpt / CHECKPOINT_MARKER).write_text("ok\n")
        done = sorted((p for p in (run_dir / "checkpoints").glob("step-*") if (p / CHECKPOINT_MARKER).is_file()),
                      key=lambda p: int(p.name.split("-")[1]))
        for old in done[: max(0, len(done) - keep)]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return ckpt


def drafter_token_counts(kind: str, rows, target):
    """Label counts over the training rows for kinds that size a vocabulary from them (EAGLE-3), else None."""
    from draftsmith.distill.data import label_counts
    from draftsmith.heads.registry import drafter_class

    return label_counts(rows, target.vocab_size) if getattr(drafter_class(kind), "needs_token_counts", False) else None


def train(cfg, run_dir: Path, resume: bool = False) -> Path:
    """Train the drafter of `cfg` (a RunConfig) into `run_dir`; returns the drafter folder."""
    from accelerate.utils import set_seed
    from torch.utils.data import DataLoader, RandomSampler
    from tqdm.auto import tqdm
    from transformers import get_scheduler

    from draftsmith.distill.collate import collate
    from draftsmith.distill.data import build_datasets
    from draftsmith.distill.target import load_target
    from draftsmith.heads.registry import build_drafter
    from draftsmith.train.config import config_to_dict, write_resolved
    from draftsmith.train.runtime import build_accelerator
    from draftsmith.train.sources import (
        OfflineSource,
        OnlineSource,
        RowDataset,
        ShardDataset,
        collate_shard_items,
        to_device,
    )

    t_cfg, run_dir = cfg.train, Path(run_dir)
    accelerator = build_accelerator(t_cfg.deepspeed, t_cfg.batch_size, t_cfg.max_grad_norm,
                                    gradient_accumulation_steps=t_cfg.grad_accum,
                                    mixed_precision=mixed_precision(t_cfg.mixed_precision),
                                    log_with="wandb" if cfg.log.wandb else None)
    set_seed(t_cfg.seed)
    if accelerator.is_main_process:
        write_resolved(cfg, run_dir)
    now = config_to_dict(cfg)
    ckpt = latest_checkpoint(run_dir) if resume else None
    if resume and ckpt is None:
        raise TrainingError(f"--resume: no complete checkpoint under {run_dir / 'checkpoints'}")
    if ckpt is not None:
        saved = json.loads((ckpt / "trainer_state.json").read_text())
        diffs = resume_differences(saved["config"], now)
        if diffs:
            raise TrainingError(f"refusing to resume {ckpt}: it was trained with another config:\n  " + "\n  ".join(diffs)
                                + "\nstart a new run folder, or restore these settings")

    target = load_target(cfg.model, device=str(accelerator.device))
    eos = set(target.eos_token_ids)
    train_rows, val_rows, stats = build_datasets(cfg.data, target.tokenizer, eos)
    if accelerator.is_main_process:
        print(f"[train] data: {stats.summary()}; {len(train_rows)} train / {len(val_rows)} validation", flush=True)
    if len(train_rows) == 0:
        raise TrainingError(f"no training conversations in {cfg.data.train}: {stats.summary()}")
    drafter = build_drafter(cfg.drafter, target.model, drafter_token_counts(cfg.drafter.kind, train_rows, target))
    keys = list(drafter.feature_layers)
    joint = cfg.drafter.kind == "medusa" and cfg.drafter.medusa_lora_rank > 0
    if joint and cfg.extract.enabled:
        raise TrainingError("Medusa-2 (drafter.medusa_lora_rank > 0) trains the target too, so it needs the live "
                            "target: set extract.enabled: false")
    if t_cfg.onpolicy_ratio > 0 and cfg.extract.enabled:
        raise TrainingError("train.onpolicy_ratio > 0 needs the live target to score the student's own answers, "
                            "but extract.enabled: true trains from fixed shards: set extract.enabled: false")
    if cfg.extract.enabled:
        features = Path(cfg.extract.out) if cfg.extract.out else run_dir / "features"
        train_set = ShardDataset(features / "train", target.name, [str(k) for k in keys])
        val_set = ShardDataset(features / "validation", target.name, [str(k) for k in keys]) if len(val_rows) else None
        source, collate_fn = OfflineSource(), collate_shard_items
    else:
        train_set, val_set = RowDataset(train_rows), RowDataset(val_rows) if len(val_rows) else None
        from draftsmith.train.onpolicy import build_onpolicy_source

        source = build_onpolicy_source(t_cfg, OnlineSource(target, keys, t_cfg.online_top_k or None), drafter, target)
        collate_fn = collate

    steps_per_epoch = math.ceil(len(train_set) / (t_cfg.batch_size * accelerator.num_processes * t_cfg.grad_accum))
    max_steps = t_cfg.max_steps if t_cfg.max_steps is not None else max(1, math.ceil(steps_per_epoch * t_cfg.epochs))
    if joint:
        from draftsmith.train.joint import JointMedusa

        d = cfg.drafter
        module = JointMedusa(target, drafter, d.medusa_lora_rank, d.medusa_lora_alpha, d.medusa_lora_modules, d.medusa_keep_kl)
        source = OfflineSource()  # the joint module runs the (LoRA) target itself
    else:
        module = LossModule(drafter)
    params = [p for p in module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=t_cfg.lr, weight_decay=t_cfg.weight_decay)
    scheduler = get_scheduler(t_cfg.schedule, optimizer, num_warmup_steps=t_cfg.warmup_steps, num_training_steps=max_steps)
    module, optimizer, scheduler = accelerator.prepare(module, optimizer, scheduler)
    val_loader = accelerator.prepare(DataLoader(val_set, batch_size=t_cfg.batch_size, collate_fn=collate_fn)) if val_set else None

    step, epoch, micro_in_epoch = 0, 0, 0
    if ckpt is not None:
        accelerator.load_state(str(ckpt))
        saved = json.loads((ckpt / "trainer_state.json").read_text())
        step, epoch, micro_in_epoch = saved["step"], saved["epoch"], saved["micro_in_epoch"]
        if accelerator.is_main_process:
            print(f"[train] resumed from {ckpt} at step {step}", flush=True)
    if cfg.log.wandb:
        accelerator.init_trackers(cfg.log.project, config=now, init_kwargs={"wandb": {"name": cfg.name, "dir": str(run_dir)}})
    log = MetricsLog(accelerator, run_dir / "metrics.jsonl")
    bar = tqdm(total=max_steps, initial=step, desc=f"train {cfg.drafter.kind}", unit="step",
               disable=not (cfg.log.progress and accelerator.is_main_process))
    window, tokens, start, last_good = [], 0, time.perf_counter(), ckpt

    def state() -> dict:
        return {"step": step, "epoch": epoch, "micro_in_epoch": micro_in_epoch, "config": now}

    while step < max_steps:
        sampler = RandomSampler(train_set, generator=torch.Generator().manual_seed(t_cfg.seed + epoch))
        loader = accelerator.prepare(DataLoader(train_set, batch_size=t_cfg.batch_size, sampler=sampler, collate_fn=collate_fn))
        batches = accelerator.skip_first_batches(loader, micro_in_epoch) if micro_in_epoch else loader
        for batch in batches:
            with accelerator.accumulate(module):
                batch = to_device(source(to_device(batch, accelerator.device)), accelerator.device, torch.float32)
                loss, metrics = module(batch)
                finite = accelerator.gather(torch.isfinite(loss.detach()).reshape(1).float()).min()
                if finite < 1:
                    raise TrainingError(f"non-finite loss ({float(loss.detach())}) at step {step + 1}, epoch {epoch}; "
                                        f"last good checkpoint kept: {last_good or 'none (no checkpoint yet)'}. "
                                        "Lower train.lr, check the data, or resume from that checkpoint.")
                accelerator.backward(loss)
                if accelerator.sync_gradients and t_cfg.max_grad_norm > 0:
                    accelerator.clip_grad_norm_(module.parameters(), t_cfg.max_grad_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            micro_in_epoch += 1
            tokens += int(batch["loss_mask"].sum())
            window.append(metrics)
            if not accelerator.sync_gradients:
                continue
            step += 1
            bar.update(1)
            if step % t_cfg.log_every == 0 or step == max_steps:
                row = average([(m, 1) for m in window])
                row.update(lr=scheduler.get_last_lr()[0], tokens_per_s=round(tokens / (time.perf_counter() - start), 1))
                log.log(step, "train", row)
                bar.set_postfix(loss=f"{row['loss']:.3f}", tau=f"{row.get('expected_tau', 0):.2f}")
                window = []
            if val_loader is not None and ((t_cfg.eval_every and step % t_cfg.eval_every == 0) or step == max_steps):
                log.log(step, "validation", validate(module, val_loader, source, accelerator))
            if (t_cfg.save_every and step % t_cfg.save_every == 0) or step == max_steps:
                last_good = save_checkpoint(accelerator, run_dir, step, state(), t_cfg.keep_checkpoints)
            if step >= max_steps:
                break
        else:
            epoch, micro_in_epoch = epoch + 1, 0
    bar.close()
    out = run_dir / "drafter"
    trained = accelerator.unwrap_model(module)
    # One number per rank: data-parallel replicas must end bit-identical; a difference means desync.
    digest = torch.tensor([sum(p.detach().double().sum().item() for p in trained.parameters() if p.requires_grad)],
                          dtype=torch.float64, device=accelerator.device)
    checksums = accelerator.gather(digest).tolist()
    if accelerator.is_main_process:
        trained.save(out, cfg.model.target, tokenizer=target.tokenizer)
        summary = {"steps": step, "world_size": accelerator.num_processes, "seconds": round(time.perf_counter() - start, 1),
                   "assistant_tokens_seen": tokens, "rank_param_checksums": checksums,
                   "replicas_identical": len(set(checksums)) == 1, "mixed_precision": accelerator.mixed_precision,
                   "distributed_type": str(accelerator.distributed_type).split(".")[-1]}
        (run_dir / "train_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    accelerator.wait_for_everyone()
    accelerator.end_training()
    if torch.distributed.is_initialized():
        # A gloo group left to interpreter shutdown can abort a rank ("terminate called without an
        # active exception") after all the work is done; close it while everything is alive.
        torch.distributed.destroy_process_group()
    return out
