"""The validation estimate against the measured τ, on two validation splits (#40 item 4).

    python scripts/bench/validation_gap/validation_gap.py LEVERS_OUT --data ANSWERS [--rows eagle3,wall,...]
        [--json OUT.json]

For every finished row of a `scripts/bench/levers/levers.sh` output that has the two T=0 evals
(`eval-dynamic-16`: the recipe's 16-node dynamic tree, `eval-chain-5`), the training-time estimate -- the same
code path as training's validation (train/loop.py `validate` over the drafter's forward, then
heads/runtime/acceptance.py `serving_tau` for the row's serving tree and for a chain of 5) -- is computed on

- `held_out`: the row's own validation split (held-out training answers, what `data.val_fraction` gives),
  recomputed here and checked against the figure the row logged while training (the tool reproduces training's
  number);
- `eval_distribution`: ANSWERS, conversations from the eval's distribution and disjoint from its prompts (what
  `data.validation` takes: e.g. the target's greedy answers to Spec-Bench's prompts 240-399 in eval's
  stratified order, `draftsmith regenerate` with `data.regenerate.validation_prompts`),

beside the τ the decoder measured on the eval's prompts, as a ratio (estimate / measured): the serving tree's
against `eval-dynamic-16`, the joint chain estimate (depth max(ttt_steps, 5)) against `eval-chain-5`. ANSWERS
are read as `data.validation` reads them: whole (only the target's positions cut them). Features come from the
live target in the rows' `model.dtype` (their extraction's), top-64 logits, as offline training's did.
Loads the target: run it alone on the cores.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from draftsmith.eval.measure.campaign import command_line, host_block, jsonl

TREE, CHAIN = "dynamic-16", "chain-5"


def estimates(drafter, rows, source, accelerator, batch: int, d_cfg) -> dict:
    """Training's validation figures for `rows` (train/loop.py `validation_scores`, for the DrafterConfig
    `d_cfg`): the chain estimates, the serving tree's simulated τ and a chain of 5 from the same rank
    accuracies."""
    from torch.utils.data import DataLoader

    from draftsmith.distill.collate import collate
    from draftsmith.heads.runtime.acceptance import serving_tau
    from draftsmith.train.loop import validation_scores
    from draftsmith.train.setup import LossModule
    from draftsmith.train.sources import RowDataset

    loader = DataLoader(RowDataset(rows), batch_size=batch, collate_fn=collate)
    scores = validation_scores(LossModule(drafter), loader, source, accelerator, d_cfg)
    chain = serving_tau(scores, 5, 0, 1, getattr(d_cfg.spec.module, "recurrent", True))
    return {"sequences": len(rows), "tokens": sum(sum(r["loss_mask"]) for r in rows),
            "expected_tau": scores.get("expected_tau"),
            "expected_tau_joint": scores.get("expected_tau_joint"),
            "expected_tau_serving": scores.get("expected_tau_serving"),
            "chain5_from_ranks": round(chain, 6) if chain is not None else None}


def row_dirs(out: Path, wanted: list[str] | None) -> list[Path]:
    runs = [p for p in sorted(out.iterdir()) if p.is_dir() and (p / "drafter").exists()
            and (p / f"eval-{TREE}" / "summary.json").is_file()
            and (p / f"eval-{CHAIN}" / "summary.json").is_file()]
    return [p for p in runs if wanted is None or p.name in wanted]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, help="a levers.sh output folder")
    parser.add_argument("--data", required=True, help="validation conversations from the eval's distribution")
    parser.add_argument("--rows", help="comma-separated row names (default: every row with both evals)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--json", type=Path, help="output JSON (default OUT/validation_gap.json)")
    parser.add_argument("--note", action="append", default=[],
                        help="a line for the page (how ANSWERS were made)")
    args = parser.parse_args()
    import torch

    from draftsmith.distill.data import DataConfig, target_datasets
    from draftsmith.distill.loading import load_target
    from draftsmith.heads.folder import read_folder
    from draftsmith.train.config import load_config
    from draftsmith.train.runtime import build_accelerator
    from draftsmith.train.sources import OnlineSource

    runs = row_dirs(args.out, args.rows.split(",") if args.rows else None)
    if not runs:
        sys.exit(f"validation_gap: no row under {args.out} has a drafter and both evals ({TREE}, {CHAIN})")
    first = load_config(runs[0] / "config.resolved.yaml")
    target = load_target(first.model)
    accelerator = build_accelerator()
    # as data.validation reads them: every one a validation conversation, whole (its own prompts leave train
    # empty)
    _, eval_rows, eval_stats = target_datasets(DataConfig(train=[args.data], validation=[args.data],
                                                          system_prompt=first.data.system_prompt), target)
    eval_rows = [dict(r) for r in eval_rows]
    result = {"command": command_line(), "host": host_block(), "target_dtype": str(target.dtype),
              "data": args.data, "data_line": eval_stats.summary(), "notes": args.note, "rows": {}}
    for run in runs:
        cfg = load_config(run / "config.resolved.yaml")
        drafter = read_folder(run / "drafter").load(target.model).to(target.device)
        source = OnlineSource(target, list(drafter.feature_layers), cfg.train.online_top_k or 64)
        _, held_rows, _ = target_datasets(cfg.data, target)
        with torch.no_grad():
            held = estimates(drafter, [dict(r) for r in held_rows], source, accelerator, args.batch,
                             cfg.drafter)
            dist = estimates(drafter, eval_rows, source, accelerator, args.batch, cfg.drafter)
        logged = [r for r in jsonl(run / "metrics.jsonl") if r.get("split") == "validation"] \
            if (run / "metrics.jsonl").is_file() else []
        measured = {name: json.loads((run / f"eval-{name}" / "summary.json").read_text())
                    for name in (TREE, CHAIN)}
        tau = {name: m["tau"] for name, m in measured.items()}
        steps = json.loads((run / "train_summary.json").read_text())["steps"]
        record = {"drafter": str((run / "drafter").resolve()), "steps": steps,
                  "ttt_steps": getattr(drafter, "ttt_steps", None),
                  "logged": {k: v for k, v in logged[-1].items() if k.startswith("expected_tau")} if logged
                  else None, "held_out": held, "eval_distribution": dist,
                  "measured": {name: {"tau": m["tau"], "prompts": m.get("n_prompts"), "dtype": m.get("dtype")}
                               for name, m in measured.items()}}
        record["ratio"] = {split: {TREE: round(est["expected_tau_serving"] / tau[TREE], 4),
                                   CHAIN: round(est["expected_tau_joint"] / tau[CHAIN], 4)}
                           for split, est in (("held_out", held), ("eval_distribution", dist))}
        result["rows"][run.name] = record
        print(f"{run.name}: tree-16 measured {tau[TREE]:.3f}, estimate held-out "
              f"{held['expected_tau_serving']:.3f} (x{record['ratio']['held_out'][TREE]:.3f}), "
              f"eval-distribution {dist['expected_tau_serving']:.3f} "
              f"(x{record['ratio']['eval_distribution'][TREE]:.3f}); chain-5 measured {tau[CHAIN]:.3f}, "
              f"joint held-out {held['expected_tau_joint']:.3f} (x{record['ratio']['held_out'][CHAIN]:.3f}), "
              f"eval-distribution {dist['expected_tau_joint']:.3f} "
              f"(x{record['ratio']['eval_distribution'][CHAIN]:.3f})", flush=True)
    out = args.json or args.out / "validation_gap.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
