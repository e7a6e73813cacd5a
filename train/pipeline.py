"""The whole run as stages over one run folder: regenerate -> extract (or online) -> train -> export ->
(the kind's post-train stage) -> eval.

Each stage reads the previous stage's folder plus the config and is skipped when its output is
already complete and was made with the settings asked now, so `draftsmith pipeline` can be rerun after a kill
(or after deleting one stage's folder) and only the missing work happens. What "the settings" are is
train/runfolder.py's: training resumes its checkpoint, or refuses naming what changed, before any stage runs
(`--resume` continues to a new length, `--fresh` moves the old run aside); export, plan and eval record theirs
in `stage.json` beside their output and rerun when it differs, the old output moved aside, never deleted.
`config.resolved.yaml` is written once those decisions are made, so it never names settings no stage used. The
target is loaded once, on the training accelerator's device, and handed to every stage that runs it (a kind
that trains the target itself, Medusa-2, hands later stages its merged target instead). Outputs under the run
folder: `regenerated.jsonl`, `features/{train,validation}/`, `checkpoints/`, `drafter/`, `export/<fmt>/`,
the post-train stage's files (Medusa: `drafter/tree.json`), `eval/summary.json`.

The data source name `regenerated` in `data.train` (and in `drafter.lookup_datastore`, prompt lookup's
datastore of the target's own answers) stands for this run's `regenerated.jsonl`; `regenerated-validation` in
`data.validation` for `regenerated-validation.jsonl`, the target's answers to
`data.regenerate.validation_prompts` (the same stage; both are train/regenerated.py's, `with_run_sources`).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from draftsmith.heads.folder import read_folder
from draftsmith.heads.registry import KINDS
from draftsmith.train.regenerated import run_regenerate, with_run_sources
from draftsmith.train.runfolder import StageRecord, move_aside, plan_start
from draftsmith.train.runtime import build_accelerator, is_rank_zero, rank0_print, whole_weights


def features_dir(cfg, run_dir: Path) -> Path:
    return Path(cfg.extract.out) if cfg.extract.out else run_dir / "features"


def run_extract_stage(cfg, run_dir: Path, target=None, accelerator=None) -> None:
    """Target features of every training and validation sequence -> shards (the kind says which features)."""
    from draftsmith.distill.data import target_datasets
    from draftsmith.distill.extract import run_extract
    from draftsmith.distill.loading import load_target

    accelerator = accelerator or build_accelerator()
    target = target or load_target(cfg.model, device=str(accelerator.device))
    with accelerator.main_process_first():  # rank 0 tokenises into the shared cache, the others load it
        train_rows, val_rows, stats = target_datasets(cfg.data, target)
    config = target.config.get_text_config() if hasattr(target.config, "get_text_config") else target.config
    keys = list(dict.fromkeys([*cfg.drafter.settings.feature_layers(config), *cfg.extract.layers]))
    rank0_print(f"[extract] data: {stats.summary()}")
    for split, rows in (("train", train_rows), ("validation", val_rows)):
        index = run_extract(target, rows, features_dir(cfg, run_dir) / split, keys, cfg.extract, accelerator,
                            progress=cfg.log.progress)
        rank0_print(f"[extract] {split}: {index.num_sequences} sequences, {index.num_tokens} tokens, "
                    f"{len(index.shards)} shards, features {index.feature_keys}, top-{index.top_k_logits} "
                    "logits")


def run_export_stage(run_dir: Path, fmt: str, out: Path, base_model: str | None = None,
                     dtype: str = "bfloat16", target=None) -> Path:
    """The drafter in a serving layout + SERVE.md; engines name the target by its Hub id or resolved folder.
    Layouts that carry target weights (speculators: the embedding) load the target unless it is given."""
    from draftsmith.distill.loading import ModelConfig, load_target, serving_name
    from draftsmith.heads.export import FORMATS, export_drafter

    folder = read_folder(run_dir / "drafter")
    base_model = base_model or serving_name(ModelConfig(target=folder.target))
    if FORMATS[fmt].needs_target and target is None:
        target = load_target(ModelConfig(target=folder.target, device="cpu"))
    return export_drafter(folder, fmt, out, base_model=base_model, dtype=dtype,
                          target_model=target.model if target is not None else None)


def run_tree_opt(cfg, run_dir: Path, nodes: int, ranks: int = 10, sequences: int = 64,
                 out: Path | None = None, target=None) -> Path:
    """`draftsmith tree-opt`: the best static tree of `nodes` for the run's drafter (validation rows), by its
    kind's `tree_search` (kinds that serve static trees)."""
    from draftsmith.distill.data import target_datasets
    from draftsmith.distill.loading import load_target

    folder = read_folder(run_dir / "drafter")
    if folder.spec.tree_search is None:
        searching = [name for name, spec in KINDS.items() if spec.tree_search is not None]
        raise ValueError(f"tree-opt builds static trees for {' / '.join(searching)} drafters; {folder.path} "
                         f"holds a {folder.kind} drafter (EAGLE drafters build dynamic trees: set "
                         "drafter.tree_nodes)")
    target = target or load_target(serving_model(cfg.model, folder))
    _, val_rows, _ = target_datasets(cfg.data, target)
    out, lines = folder.spec.tree_search(folder, target, val_rows, nodes, ranks, sequences, out)
    rank0_print("\n".join(lines))
    return out


def serving_model(model, folder):
    """The target a drafter (its read folder) is served with: its `serve_target` (Medusa-2's merged target) or
    the run's."""
    serve = folder.serve_target
    return dataclasses.replace(model, target=str(serve)) if serve else model


def run_pipeline(cfg, run_dir: Path, resume: bool = False, fresh: bool = False) -> dict:
    """All stages, skipping the complete ones made with these settings; returns the eval summary. `resume` and
    `fresh` are `draftsmith train`'s (train/loop.py `train`)."""
    from draftsmith.distill.loading import load_target
    from draftsmith.train.loop import train
    from draftsmith.train.setup import start_mode, training_accelerator

    run_dir, raw = Path(run_dir), cfg
    cfg = with_run_sources(cfg, run_dir)
    drafter, timings, shared = run_dir / "drafter", {}, {}
    # a refusal before any stage has run
    start = plan_start(run_dir, cfg.to_dict(), start_mode(resume, fresh))
    trained = {"done": start.finished}  # the drafter folder is this run's (not one about to be replaced)

    def accelerator():
        if "accelerator" not in shared:
            shared["accelerator"] = training_accelerator(cfg)
        return shared["accelerator"]

    # moved here, so training (and every later stage) finds nothing of the old run; train itself runs as a
    # rerun
    if fresh:
        accelerator().wait_for_everyone()
        if is_rank_zero():
            moved = move_aside(run_dir, start.supersedes, "pipeline --fresh")
            rank0_print("[pipeline] --fresh: "
                        + (f"the previous run moved to {moved}" if moved else "nothing to move"))
        accelerator().wait_for_everyone()
    if is_rank_zero():
        raw.write_resolved(run_dir)

    def target():  # loaded once; after a stage that trained it, the target the drafter serves with
        if "target" not in shared:
            model = serving_model(cfg.model, read_folder(drafter)) if trained["done"] else cfg.model
            with whole_weights(accelerator()):
                shared["target"] = load_target(model, device=str(accelerator().device))
        return shared["target"]

    def stage(name: str, done: bool, fn, record: StageRecord | None = None) -> None:
        if done and record is not None:
            done = current(name, record, run_dir, accelerator)
        if done:
            rank0_print(f"[pipeline] {name}: complete, skipped")
            return
        rank0_print(f"[pipeline] {name} ...")
        began = time.perf_counter()
        fn()
        if record is not None and is_rank_zero():
            record.write()
        timings[name] = round(time.perf_counter() - began, 1)
        rank0_print(f"[pipeline] {name}: {timings[name]} s")

    if cfg.data.regenerate.prompts or cfg.data.regenerate.validation_prompts:
        # resumable: done ids skipped
        stage("regenerate", False, lambda: run_regenerate(cfg, run_dir, target(), accelerator()))
    if cfg.extract.enabled and cfg.train.onpolicy_ratio > 0:
        raise ValueError("train.onpolicy_ratio > 0 needs the live target to score the student's answers: "
                         "set extract.enabled: false")
    if cfg.extract.enabled:
        feats = features_dir(cfg, run_dir)
        stage("extract",
              (feats / "train" / "index.json").is_file() and (feats / "validation" / "index.json").is_file(),
              lambda: run_extract_stage(cfg, run_dir, target(), accelerator()))
    stage("train", start.finished, lambda: train(cfg, run_dir, resume, target(), accelerator()))
    trained["done"] = True
    if cfg.drafter.settings.trains_target():
        shared.pop("target", None)  # it was adapted in place; later stages read the merged one
    post_train_stages(cfg, run_dir, stage, target)
    record = {"stage_seconds": timings,
              **eval_stages(cfg, run_dir, drafter, stage, target, accelerator, shared)}
    (run_dir / "pipeline.json").write_text(json.dumps(record, indent=2) + "\n")
    return json.loads(Path(record["eval"]).read_text())


def post_train_stages(cfg, run_dir: Path, stage, target) -> None:
    """The stages between training and eval: the kind's own (e.g. Medusa's static-tree search), then every
    export format asked; `stage` and `target` are `run_pipeline`'s (a stage runner that skips complete stages,
    the loaded target)."""
    from draftsmith.distill.data import target_datasets
    from draftsmith.distill.loading import serving_name

    post = cfg.drafter.spec.post_train
    planned = post(cfg, run_dir) if post else None
    if planned:  # e.g. Medusa's static-tree search, before the exports: they carry the tree the folder serves
        name, done, fn = planned

        def post_train():
            _, val_rows, _ = target_datasets(cfg.data, target())
            rank0_print("\n".join(fn(target(), val_rows)))

        stage(name, done, post_train)
    summary = run_dir / "train_summary.json"
    for fmt in cfg.export.formats:
        out = run_dir / "export" / fmt
        stage(f"export {fmt}", (out / "config.json").is_file(),
              lambda fmt=fmt, out=out: run_export_stage(run_dir, fmt, out, serving_name(cfg.model),
                                                        cfg.export.dtype, target()),
              StageRecord.build(out, cfg.to_dict(), "export", [summary]))


def current(name: str, record: StageRecord, run_dir: Path, accelerator) -> bool:
    """Whether a complete stage output was made with the settings asked now (the record beside it says); if
    not, it is moved aside (the main process, once every rank has read the record) so the stage reruns."""
    changed = record.changes()
    if not changed:
        return True
    accelerator().wait_for_everyone()
    if is_rank_zero():
        moved = move_aside(run_dir, [record.output, record.file], f"{name} reran with other settings")
        rank0_print(f"[pipeline] {name}: made with other settings ({'; '.join(changed)}): rerunning; the "
                    f"previous output moved to {moved}")
    accelerator().wait_for_everyone()
    return False


def eval_stages(cfg, run_dir: Path, drafter: Path, stage, target, accelerator, shared: dict) -> dict:
    """The pipeline's eval stage (the recipe's serving settings) and, with `plan.enabled`, the plan stage and
    an eval served with the plan; returns where their summaries are."""
    from draftsmith.distill.loading import load_target, resolve_dtype
    from draftsmith.eval.measure.evaluate import run_eval
    from draftsmith.eval.serving import decide
    from draftsmith.train.runfolder import RECORD

    eval_dir = Path(cfg.eval.out) if cfg.eval.out else run_dir / "eval"
    dtype = cfg.eval.dtype or cfg.model.dtype

    def served(plan: bool):  # what a stage serves: this run's drafter folder, read when the stage runs
        return decide(cfg.model, dataclasses.replace(cfg.drafter, path=str(drafter), plan=plan), dtype=dtype)

    # the serving target in the eval dtype (the training one when they agree), loaded once
    def eval_target(serving):
        if resolve_dtype(dtype, cfg.model.device) == resolve_dtype(cfg.model.dtype, cfg.model.device):
            return target()
        if "eval_target" not in shared:
            shared["eval_target"] = load_target(serving.model, dtype=dtype)
        return shared["eval_target"]

    def evaluate(plan: bool, out: Path):  # as the plan stage: the main process loads, decodes and writes
        if accelerator().is_main_process:  # one writer of the folder (its resumable partial file above all)
            serving = served(plan)
            run_eval(serving, cfg.eval, out, progress=cfg.log.progress, target=eval_target(serving))
        accelerator().wait_for_everyone()

    config, summary = cfg.to_dict(), run_dir / "train_summary.json"
    # the recipe's settings; a plan (below, or one written earlier) is measured in its own eval
    stage("eval", (eval_dir / "summary.json").is_file(), lambda: evaluate(False, eval_dir),
          StageRecord.build(eval_dir, config, "eval", [summary]))
    record = {"eval": str(eval_dir / "summary.json")}
    if cfg.plan.enabled:
        from draftsmith.eval.measure.plan import PLAN, make_plan, write_plan
        from draftsmith.eval.measure.plan_choice import format_plan

        def plan_stage():  # measured and written once (the main process); every rank then serves that file
            p = cfg.plan
            if accelerator().is_main_process:
                serving = served(False)
                made = make_plan(eval_target(serving), serving, prompts=p.prompts,
                                 calibration=p.calibration, offset=p.offset, max_new_tokens=p.max_new_tokens,
                                 margin=p.margin, progress=cfg.log.progress, batch_sizes=p.batch_sizes,
                                 contexts=p.contexts)
                write_plan(drafter, made)
                rank0_print(format_plan(made))
            accelerator().wait_for_everyone()

        stage("plan", (drafter / PLAN).is_file(), plan_stage,
              StageRecord.build(drafter / PLAN, config, "plan", [summary],
                                file=drafter / f"{Path(PLAN).stem}.{RECORD}"))
        plan_eval = run_dir / "eval-plan"
        stage("eval with the plan", (plan_eval / "summary.json").is_file(), lambda: evaluate(True, plan_eval),
              StageRecord.build(plan_eval, config, "eval", [summary, drafter / PLAN]))
        record["eval_plan"] = str(plan_eval / "summary.json")
    return record
