"""The whole run as stages over one run folder: regenerate -> extract (or online) -> train -> export -> (tree-opt) -> eval.

Each stage reads the previous stage's folder plus the config and is skipped when its output is
already complete, so `draftsmith pipeline` can be rerun after a kill (or after deleting one
stage's folder) and only the missing work happens. Outputs under the run folder:
`regenerated.jsonl`, `features/{train,validation}/`, `checkpoints/`, `drafter/`, `export/<fmt>/`,
`drafter/tree.json` (Medusa with `drafter.tree_nodes`), `eval/summary.json`.

The data source name `regenerated` in `data.train` stands for this run's `regenerated.jsonl`.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from draftsmith.train.runtime import build_accelerator, rank0_print

REGENERATED = "regenerated"


def regenerated_path(cfg, run_dir: Path) -> Path:
    return Path(cfg.data.regenerate.out) if cfg.data.regenerate.out else run_dir / "regenerated.jsonl"


def with_run_sources(cfg, run_dir: Path):
    """A copy of `cfg` whose `data.train` names this run's regenerated file instead of `regenerated`."""
    train = [str(regenerated_path(cfg, run_dir)) if s == REGENERATED else s for s in cfg.data.train]
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, train=train))


def run_regenerate(cfg, run_dir: Path, target=None) -> None:
    from draftsmith.distill.regenerate import regenerate
    from draftsmith.distill.target import load_target

    target = target or load_target(cfg.model)
    report = regenerate(target, cfg.data.regenerate, regenerated_path(cfg, run_dir), cfg.data.system_prompt,
                        progress=cfg.log.progress)
    rank0_print(f"[regenerate] {report.written} new conversations ({report.skipped_done} already done), "
                f"{report.new_tokens} tokens at {report.tokens_per_s:.1f} tok/s, batch {report.batch_size}")


def features_dir(cfg, run_dir: Path) -> Path:
    return Path(cfg.extract.out) if cfg.extract.out else run_dir / "features"


def run_extract_stage(cfg, run_dir: Path) -> None:
    from draftsmith.distill.data import build_datasets
    from draftsmith.distill.extract import run_extract
    from draftsmith.distill.target import load_target
    from draftsmith.heads.registry import build_drafter
    from draftsmith.train.loop import drafter_token_counts

    accelerator = build_accelerator()
    target = load_target(cfg.model, device=str(accelerator.device))
    train_rows, val_rows, stats = build_datasets(cfg.data, target.tokenizer, set(target.eos_token_ids))
    drafter = build_drafter(cfg.drafter, target.model, drafter_token_counts(cfg.drafter.kind, train_rows, target))
    keys = list(dict.fromkeys([*drafter.feature_layers, *cfg.extract.layers]))
    rank0_print(f"[extract] data: {stats.summary()}")
    for split, rows in (("train", train_rows), ("validation", val_rows)):
        index = run_extract(target, rows, features_dir(cfg, run_dir) / split, keys, cfg.extract, accelerator,
                            progress=cfg.log.progress)
        rank0_print(f"[extract] {split}: {index.num_sequences} sequences, {index.num_tokens} tokens, "
                    f"{len(index.shards)} shards, features {index.feature_keys}, top-{index.top_k_logits} logits")


def run_export_stage(run_dir: Path, fmt: str, out: Path, base_model: str, dtype: str = "bfloat16") -> Path:
    from draftsmith.heads.export import export_drafter

    return export_drafter(run_dir / "drafter", fmt, out, base_model=base_model, dtype=dtype)


def run_tree_opt(cfg, run_dir: Path, nodes: int, ranks: int = 10, sequences: int = 64, out: Path | None = None) -> Path:
    """Best static tree of `nodes` for the run's Medusa heads, from rank accuracies on validation sequences."""
    import torch

    from draftsmith.distill.collate import collate
    from draftsmith.distill.data import build_datasets
    from draftsmith.distill.extract import target_features
    from draftsmith.distill.target import load_target
    from draftsmith.eval.tree import load_tree
    from draftsmith.eval.tree_search import expected_tau, optimal_tree, rank_accuracies, write_tree
    from draftsmith.heads.registry import load_drafter

    heads = load_drafter(run_dir / "drafter")
    if heads.kind != "medusa":
        raise ValueError(f"tree-opt builds static trees for Medusa heads; {run_dir} holds a {heads.kind} drafter "
                         "(EAGLE drafters build dynamic trees: set drafter.tree_nodes)")
    target = load_target(cfg.model)
    _, val_rows, _ = build_datasets(cfg.data, target.tokenizer, set(target.eos_token_ids))
    rows = [val_rows[i] for i in range(min(len(val_rows), sequences))]
    if not rows:
        raise ValueError("the run's validation split is empty: set data.val_fraction > 0")
    heads = heads.to(target.device, torch.float32)

    def batches():
        for b in range(0, len(rows), 4):
            batch = collate(rows[b: b + 4])
            feats = target_features(target, batch, ["final"], top_k=0)
            yield dict(batch, features={"final": feats["features"]["final"].float()})

    acc = rank_accuracies(heads, batches(), ranks)
    paths, tau = optimal_tree(acc.tolist(), nodes)
    out = write_tree(paths, tau, acc, out or run_dir / f"tree-opt-{nodes}.json")
    rank0_print(f"[tree-opt] rank accuracy top-1 per head: {[round(a, 3) for a in acc[:, 0].tolist()]}")
    if heads.num_heads >= 4:
        default = load_tree("medusa-k4-default")
        rank0_print(f"[tree-opt] expected τ: medusa-k4-default ({len(default)} nodes) {expected_tau(default, acc.tolist()):.3f}")
    rank0_print(f"[tree-opt] expected τ: optimised ({len(paths)} nodes) {tau:.3f} -> {out} (use it with --tree {out})")
    return out


def serving_model(model, drafter: Path):
    """The target a drafter is served with: Medusa-2 heads go with their LoRA-merged target."""
    import json

    meta = json.loads((drafter / "draftsmith.json").read_text())
    if meta.get("serve_target"):
        return dataclasses.replace(model, target=str(drafter / meta["serve_target"]))
    return model


def run_pipeline(cfg, run_dir: Path) -> dict:
    """All stages, skipping the complete ones; returns the eval summary."""
    import json

    from draftsmith.eval.benchmark import run_eval
    from draftsmith.train.config import write_resolved
    from draftsmith.train.loop import train

    run_dir = Path(run_dir)
    write_resolved(cfg, run_dir)
    cfg = with_run_sources(cfg, run_dir)
    timings = {}

    def stage(name: str, done: bool, fn) -> None:
        if done:
            rank0_print(f"[pipeline] {name}: complete, skipped")
            return
        rank0_print(f"[pipeline] {name} ...")
        start = time.perf_counter()
        fn()
        timings[name] = round(time.perf_counter() - start, 1)
        rank0_print(f"[pipeline] {name}: {timings[name]} s")

    if cfg.data.regenerate.prompts:
        stage("regenerate", False, lambda: run_regenerate(cfg, run_dir))  # resumable: finished ids are skipped
    if cfg.extract.enabled and cfg.train.onpolicy_ratio > 0:
        raise ValueError("train.onpolicy_ratio > 0 needs the live target to score the student's answers: "
                         "set extract.enabled: false")
    if cfg.extract.enabled:
        feats = features_dir(cfg, run_dir)
        stage("extract", (feats / "train" / "index.json").is_file() and (feats / "validation" / "index.json").is_file(),
              lambda: run_extract_stage(cfg, run_dir))
    drafter = run_dir / "drafter"
    resume = (run_dir / "checkpoints").is_dir() and any((run_dir / "checkpoints").glob("step-*/COMPLETE"))
    stage("train", (drafter / "draftsmith.json").is_file(), lambda: train(cfg, run_dir, resume=resume))
    for fmt in cfg.export.formats:
        out = run_dir / "export" / fmt
        stage(f"export {fmt}", (out / "config.json").is_file(),
              lambda fmt=fmt, out=out: run_export_stage(run_dir, fmt, out, cfg.model.target, cfg.export.dtype))
    if cfg.drafter.kind == "medusa" and cfg.drafter.tree_nodes > 0 and not cfg.drafter.tree:
        # the heads' own best tree for this budget; eval (and `eval --drafter DIR/drafter`) use it by default
        stage(f"tree-opt {cfg.drafter.tree_nodes}", (drafter / "tree.json").is_file(),
              lambda: run_tree_opt(cfg, run_dir, cfg.drafter.tree_nodes, out=drafter / "tree.json"))
    eval_dir = Path(cfg.eval.out) if cfg.eval.out else run_dir / "eval"
    drafter_cfg = dataclasses.replace(cfg.drafter, path=str(drafter))
    stage("eval", (eval_dir / "summary.json").is_file(),
          lambda: run_eval(serving_model(cfg.model, drafter), drafter_cfg, cfg.eval, eval_dir, progress=cfg.log.progress))
    summary = json.loads((eval_dir / "summary.json").read_text())
    (run_dir / "pipeline.json").write_text(json.dumps({"stage_seconds": timings, "eval": str(eval_dir / "summary.json")},
                                                      indent=2) + "\n")
    return summary
