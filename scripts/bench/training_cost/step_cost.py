"""What one training step of a recipe costs on this machine, split into its parts, and what a budget buys.

Sizing a recipe's epochs starts here (issue: "measure a step, size the epochs; offline shards where cheaper").
For a recipe (any `-c NAME` and overrides) it builds the run exactly as `draftsmith train` does
(train/setup.py `prepare`: same data, drafter, optimizer) and times, on real batches of the training split:

    target    the frozen target's forward (`target_features`): what the online source pays every step and what
              `draftsmith extract` pays once per sequence
    drafter   the drafter's forward + backward + optimizer step, with the dense target logits (online) and
              with top-k logits (what offline shards hold: `extract.top_k_logits`)

and writes OUT.json: seconds per part (median over the timed steps, after warm-up), sequences per step, the
training split's size, and per budget the epochs each path fits — online: every step pays target + drafter;
offline: one extract pass (target per batch of `extract.batch_size`) and then drafter steps reading shards.

    python scripts/bench/training_cost/step_cost.py -c smollm2-eagle3 --out OUT.json [--steps 8]
        [--budget-hours 2] [KEY=VALUE ...]

Timings: run it alone on the machine (two torch jobs on 2 cores thrash).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-c", "--config", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=8, help="timed steps per path (after 2 warm-up steps)")
    parser.add_argument("--budget-hours", type=float, default=2.0)
    parser.add_argument("--top-k", type=int, default=None,
                        help="offline top-k logits (default: extract.top_k_logits)")
    parser.add_argument("overrides", nargs="*")
    return parser.parse_args()


def main() -> None:
    from torch.utils.data import DataLoader, RandomSampler

    from draftsmith.distill.extract import target_features
    from draftsmith.eval.decode.machine import machine_info
    from draftsmith.train.config import load_config
    from draftsmith.train.setup import prepare
    from draftsmith.train.sources import to_device

    args = parse_args()
    cfg = load_config(args.config, list(args.overrides) + ["log.wandb=false", "log.progress=false"])
    top_k = args.top_k if args.top_k is not None else cfg.extract.top_k_logits
    with tempfile.TemporaryDirectory() as tmp:
        run = prepare(cfg, Path(tmp))
    module, optimizer, target, batch_size = run.module, run.optimizer, run.target, cfg.train.batch_size
    keys = list(run.module.drafter.feature_layers)
    loader = DataLoader(run.train_set, batch_size=batch_size, collate_fn=run.collate_fn,
                        sampler=RandomSampler(run.train_set, generator=torch.Generator().manual_seed(0)))
    batches = iter(loader)
    times = {"target_dense": [], "target_topk": [], "drafter_dense": [], "drafter_topk": []}
    tokens = []

    def timed(fn, *args):
        start = time.perf_counter()
        out = fn(*args)
        return out, time.perf_counter() - start

    def drafter_step(batch):  # the loop's step: the batch in fp32, forward + backward + optimizer step
        loss, _ = module(to_device(batch, target.device, torch.float32))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    for i in range(args.steps + 2):
        batch = to_device(next(batches), target.device)
        dense, t_dense = timed(target_features, target, batch, keys, None)
        sparse, t_topk = timed(target_features, target, batch, keys, top_k)
        _, d_dense = timed(drafter_step, dict(batch, **dense))
        _, d_topk = timed(drafter_step, dict(batch, **sparse))
        if i < 2:
            continue  # warm-up
        for key, value in zip(times, (t_dense, t_topk, d_dense, d_topk)):
            times[key].append(value)
        tokens.append(int(batch["attention_mask"].sum()))
    med = {k: statistics.median(v) for k, v in times.items()}
    n_train = len(run.train_set)
    steps_per_epoch = -(-n_train // batch_size)
    budget = args.budget_hours * 3600
    online = med["target_dense"] + med["drafter_dense"]
    # the extract forward is the same forward per sequence
    extract_pass = n_train / batch_size * med["target_topk"]
    offline = med["drafter_topk"]
    result = {
        "recipe": args.config, "overrides": args.overrides, "machine": machine_info(target),
        "threads": torch.get_num_threads(), "batch_size": batch_size, "timed_steps": args.steps,
        "tokens_per_batch_median": statistics.median(tokens), "train_sequences": n_train,
        "steps_per_epoch": steps_per_epoch, "top_k": top_k,
        "seconds": {k: round(v, 4) for k, v in med.items()},
        "online_step_seconds": round(online, 4), "offline_step_seconds": round(offline, 4),
        "extract_pass_seconds": round(extract_pass, 1),
        "budget_hours": args.budget_hours,
        "epochs_in_budget": {
            "online": round(budget / (online * steps_per_epoch), 3),
            "offline": round(max(0.0, budget - extract_pass) / (offline * steps_per_epoch), 3)},
        "all_runs_seconds": {k: [round(x, 4) for x in v] for k, v in times.items()},
    }
    for epochs in (1, 2, 3, 5):
        result[f"hours_for_{epochs}_epochs"] = {
            "online": round(epochs * steps_per_epoch * online / 3600, 2),
            "offline": round((extract_pass + epochs * steps_per_epoch * offline) / 3600, 2)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "all_runs_seconds"}, indent=2))


if __name__ == "__main__":
    main()
