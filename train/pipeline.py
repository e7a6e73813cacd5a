"""The whole run as stages over one run folder: regenerate -> extract (or online) -> train -> export ->
(the kind's post-train stage) -> eval.

Each stage reads the previous stage's folder plus the config and is skipped when its output is
already complete and was made with the settings asked now, so `draftsmith pipeline` can be rerun after a kill
(or after deleting one stage's folder) and only the missing work happens. What "the settings" are is
train/runfolder.py's: training resumes its checkpoint, or refuses naming what changed, before any stage runs
(`--resume` continues to a new length, `--fresh` moves the old run aside); export, plan and eval record theirs
in `stage.json` beside their output and rerun when it differs, the old output moved aside, never deleted.
`config.resolved.yaml` is written once those decisions are made, so it never names settings no stage used. The target is loaded once, on the training
accelerator's device, and handed to every stage that runs it (a kind that trains the target itself,
Medusa-2, hands later stages its merged target instead). Outputs under the run folder:
`regenerated.jsonl`, `features/{train,validation}/`, `checkpoints/`, `drafter/`, `export/<fmt>/`,
the post-train stage's files (Medusa: `drafter/tree.json`), `eval/summary.json`.

The data source name `regenerated` in `data.train` (and in `drafter.lookup_datastore`, prompt lookup's datastore of
the target's own answers) stands for this run's `regenerated.jsonl`; `regenerated-validation` in `data.validation`
for `regenerated-validation.jsonl`, the target's answers to `data.regenerate.validation_prompts` (the same stage).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from pathlib import Path

from draftsmith.heads.folder import read_folder
from draftsmith.heads.registry import KINDS
from draftsmith.train.runfolder import StageRecord, move_aside, plan_start
from draftsmith.train.runtime import build_accelerator, is_rank_zero, rank0_print, whole_weights

REGENERATED = "regenerated"
REGENERATED_VALIDATION = "regenerated-validation"


def regenerated_path(cfg, run_dir: Path) -> Path:
    return Path(cfg.data.regenerate.out) if cfg.data.regenerate.out else run_dir / "regenerated.jsonl"


def regenerated_validation_path(run_dir: Path) -> Path:
    return run_dir / "regenerated-validation.jsonl"


def with_run_sources(cfg, run_dir: Path):
    """A copy of `cfg` whose `data.train` and `drafter.lookup_datastore` name this run's regenerated file instead of
    `regenerated` (the target's own answers: what the drafter trains on, and what prompt lookup can draft from), and
    whose `data.validation` names its regenerated validation answers instead of `regenerated-validation`."""
    def run_sources(sources):
        return [str(regenerated_path(cfg, run_dir)) if s == REGENERATED else s for s in sources]

    if REGENERATED_VALIDATION in cfg.data.validation and not cfg.data.regenerate.validation_prompts:
        raise ValueError("data.validation names regenerated-validation (the target's answers to held-out prompts) and "
                         "data.regenerate.validation_prompts is empty: name the prompts to answer (e.g. [spec-bench] "
                         "with validation_offset past the prompts eval reports on), or validate on your own answers")
    check_validation_prompts(cfg)
    validation = [str(regenerated_validation_path(run_dir)) if s == REGENERATED_VALIDATION else s
                  for s in cfg.data.validation]
    data = dataclasses.replace(cfg.data, train=run_sources(cfg.data.train), validation=validation)
    return dataclasses.replace(cfg, data=data,
                               drafter=dataclasses.replace(cfg.drafter,
                                                           lookup_datastore=run_sources(cfg.drafter.lookup_datastore)))


def check_validation_prompts(cfg) -> None:
    """Validation answers to the prompts eval reports on would choose checkpoints on the test set: refused."""
    settings, ev = cfg.data.regenerate, cfg.eval
    reported = None if ev.limit is None else ev.offset + ev.limit
    if ev.prompts in settings.validation_prompts and (reported is None or settings.validation_offset < reported):
        raise ValueError(f"data.regenerate.validation_prompts answers {ev.prompts} from prompt "
                         f"{settings.validation_offset} on, and eval reports on its prompts {ev.offset}.."
                         f"{'the last' if reported is None else reported - 1}: validation would choose on the prompts "
                         f"the run is judged on. Set data.regenerate.validation_offset to at least "
                         f"{reported if reported is not None else 'eval.offset + eval.limit (with eval.limit set)'}")


def run_regenerate(cfg, run_dir: Path, target=None, accelerator=None) -> None:
    """Under `accelerate launch` the hf backend splits the prompts across the ranks (each on its own device);
    backend vllm: rank 0 starts vLLM's server for the stage and drives it (`regenerate_server`)."""
    from draftsmith.distill.loading import load_target
    from draftsmith.distill.regenerate import regenerate

    check_validation_prompts(cfg)
    accelerator = accelerator or build_accelerator()
    target = target or load_target(cfg.model, device=str(accelerator.device))
    settings = cfg.data.regenerate
    jobs = [(regenerated_path(cfg, run_dir), settings, "")] if settings.prompts else []
    if settings.validation_prompts:
        prompts = validation_prompts_file(settings, run_dir, accelerator)
        # answered as eval decodes (its length and sampling), every prompt however long: eval measures them all
        jobs.append((regenerated_validation_path(run_dir),
                     dataclasses.replace(settings, prompts=[str(prompts)], limit=None, max_prompt_tokens=1 << 30,
                                         max_new_tokens=cfg.eval.max_new_tokens, temperature=cfg.eval.temperature,
                                         top_p=cfg.eval.top_p), " validation"))
    for out, job, which in jobs:
        with regenerate_server(cfg, target, out, accelerator.is_main_process) as server:
            if server is not None:
                job = dataclasses.replace(job, url=server.url, model=server.model)
            report = regenerate(target, job, out, cfg.data.system_prompt, progress=cfg.log.progress,
                                rank=accelerator.process_index, world=accelerator.num_processes,
                                barrier=accelerator.wait_for_everyone, engine=server and server.meta("vllm"))
        rank0_print(f"[regenerate{which}] {report.written} new conversations ({report.skipped_done} already done), "
                    f"{report.new_tokens} tokens at {report.tokens_per_s:.1f} tok/s "
                    f"({report.backend}, {'batch' if report.backend == 'hf' else 'concurrency'} {report.batch_size})")


def validation_prompts_file(settings, run_dir: Path, accelerator) -> Path:
    """`data.regenerate.validation_prompts` -> `validation-prompts.jsonl` in the run folder: the first turn of each
    prompt in eval's order (eval/measure/evaluate.py `select_prompts`: round-robin over categories), from
    `validation_offset` on, at most `validation_limit` -- prompts disjoint from the first `validation_offset` that eval
    reports on, from their distribution. Written by the main process; the same on every rank and rerun."""
    from draftsmith.eval.measure.evaluate import EvalConfig, select_prompts

    out = run_dir / "validation-prompts.jsonl"
    if accelerator.is_main_process:
        chosen, seen = [], set()
        for source in settings.validation_prompts:
            for p in select_prompts(EvalConfig(prompts=source, limit=settings.validation_limit,
                                               offset=settings.validation_offset)):
                if p["id"] not in seen:  # spec-bench holds mt-bench's ids
                    seen.add(p["id"])
                    chosen.append({"id": p["id"], "category": p["category"], "prompt": p["prompt"]})
        chosen = chosen[: settings.validation_limit]
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(p) + "\n" for p in chosen))
        tmp.replace(out)
        answers = regenerated_validation_path(run_dir)  # answers to prompts no longer chosen (other offset) go
        if answers.is_file():
            keep = {p["id"] for p in chosen}
            lines = answers.read_text().splitlines(keepends=True)
            kept = [line for line in lines if _answer_id(line) in keep]
            if len(kept) < len(lines):
                answers.with_suffix(".tmp").write_text("".join(kept))
                answers.with_suffix(".tmp").replace(answers)
                rank0_print(f"[regenerate validation] {len(lines) - len(kept)} answers to prompts no longer chosen "
                            "(validation_offset / validation_limit changed) dropped")
    accelerator.wait_for_everyone()
    return out


def _answer_id(line: str) -> str | None:
    try:
        return str(json.loads(line)["id"])
    except (ValueError, KeyError, TypeError):
        return None  # a torn last line: regenerate's resume cuts it anyway


@contextlib.contextmanager
def regenerate_server(cfg, target, out: Path, main: bool):
    """Backend vllm, on the main process: vLLM's OpenAI server (the engine venv) serving the resolved target folder
    in the target's dtype for the length of the block, its log beside the answers; otherwise None."""
    if cfg.data.regenerate.backend != "vllm" or not main:
        yield None
        return
    from draftsmith.distill.loading import dtype_name, resolve_target
    from draftsmith.eval.measure.engine_server import engine_server, free_port, vllm_server_argv

    port, folder = free_port(), resolve_target(cfg.model.target, cfg.model.revision)
    argv = vllm_server_argv(folder, dtype_name(target.dtype), port, cfg.data.regenerate.seed)
    log = out.with_name(out.name + ".vllm.log")
    rank0_print(f"[regenerate] starting vLLM's server on port {port} ({dtype_name(target.dtype)}; log {log})")
    with engine_server("vllm", argv, port, log) as server:
        rank0_print(f"[regenerate] vLLM {server.version} serving {server.model} at {server.url}")
        yield server


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
                    f"{len(index.shards)} shards, features {index.feature_keys}, top-{index.top_k_logits} logits")


def run_export_stage(run_dir: Path, fmt: str, out: Path, base_model: str | None = None, dtype: str = "bfloat16",
                     target=None) -> Path:
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


def run_tree_opt(cfg, run_dir: Path, nodes: int, ranks: int = 10, sequences: int = 64, out: Path | None = None,
                 target=None) -> Path:
    """`draftsmith tree-opt`: the best static tree of `nodes` for the run's drafter (validation rows), by its kind's
    `tree_search` (kinds that serve static trees)."""
    from draftsmith.distill.data import target_datasets
    from draftsmith.distill.loading import load_target

    folder = read_folder(run_dir / "drafter")
    if folder.spec.tree_search is None:
        searching = [name for name, spec in KINDS.items() if spec.tree_search is not None]
        raise ValueError(f"tree-opt builds static trees for {' / '.join(searching)} drafters; {folder.path} holds a "
                         f"{folder.kind} drafter (EAGLE drafters build dynamic trees: set drafter.tree_nodes)")
    target = target or load_target(serving_model(cfg.model, folder))
    _, val_rows, _ = target_datasets(cfg.data, target)
    out, lines = folder.spec.tree_search(folder, target, val_rows, nodes, ranks, sequences, out)
    rank0_print("\n".join(lines))
    return out


def serving_model(model, folder):
    """The target a drafter (its read folder) is served with: its `serve_target` (Medusa-2's merged target) or the
    run's."""
    serve = folder.serve_target
    return dataclasses.replace(model, target=str(serve)) if serve else model


def run_pipeline(cfg, run_dir: Path, resume: bool = False, fresh: bool = False) -> dict:
    """All stages, skipping the complete ones made with these settings; returns the eval summary. `resume` and
    `fresh` are `draftsmith train`'s (train/loop.py `train`)."""
    from draftsmith.distill.data import target_datasets
    from draftsmith.distill.loading import load_target, serving_name
    from draftsmith.train.loop import train
    from draftsmith.train.setup import start_mode, training_accelerator

    run_dir, raw = Path(run_dir), cfg
    cfg = with_run_sources(cfg, run_dir)
    drafter, timings, shared = run_dir / "drafter", {}, {}
    start = plan_start(run_dir, cfg.to_dict(), start_mode(resume, fresh))  # a refusal before any stage has run
    trained = {"done": start.finished}  # the drafter folder is this run's (not one about to be replaced)

    def accelerator():
        if "accelerator" not in shared:
            shared["accelerator"] = training_accelerator(cfg)
        return shared["accelerator"]

    if fresh:  # moved here, so training (and every later stage) finds nothing of the old run; train itself runs as a rerun
        accelerator().wait_for_everyone()
        if is_rank_zero():
            moved = move_aside(run_dir, start.supersedes, "pipeline --fresh")
            rank0_print("[pipeline] --fresh: " + (f"the previous run moved to {moved}" if moved else "nothing to move"))
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
        stage("regenerate", False, lambda: run_regenerate(cfg, run_dir, target(), accelerator()))  # resumable: done ids skipped
    if cfg.extract.enabled and cfg.train.onpolicy_ratio > 0:
        raise ValueError("train.onpolicy_ratio > 0 needs the live target to score the student's answers: "
                         "set extract.enabled: false")
    if cfg.extract.enabled:
        feats = features_dir(cfg, run_dir)
        stage("extract", (feats / "train" / "index.json").is_file() and (feats / "validation" / "index.json").is_file(),
              lambda: run_extract_stage(cfg, run_dir, target(), accelerator()))
    stage("train", start.finished, lambda: train(cfg, run_dir, resume, target(), accelerator()))
    trained["done"] = True
    if cfg.drafter.settings.trains_target():
        shared.pop("target", None)  # it was adapted in place; later stages read the merged one
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
              lambda fmt=fmt, out=out: run_export_stage(run_dir, fmt, out, serving_name(cfg.model), cfg.export.dtype,
                                                        target()),
              StageRecord.build(out, cfg.to_dict(), "export", [summary]))
    record = {"stage_seconds": timings, **eval_stages(cfg, run_dir, drafter, stage, target, accelerator, shared)}
    (run_dir / "pipeline.json").write_text(json.dumps(record, indent=2) + "\n")
    return json.loads(Path(record["eval"]).read_text())


def current(name: str, record: StageRecord, run_dir: Path, accelerator) -> bool:
    """Whether a complete stage output was made with the settings asked now (the record beside it says); if not, it
    is moved aside (the main process, once every rank has read the record) so the stage reruns."""
    changed = record.changes()
    if not changed:
        return True
    accelerator().wait_for_everyone()
    if is_rank_zero():
        moved = move_aside(run_dir, [record.output, record.file], f"{name} reran with other settings")
        rank0_print(f"[pipeline] {name}: made with other settings ({'; '.join(changed)}): rerunning; the previous "
                    f"output moved to {moved}")
    accelerator().wait_for_everyone()
    return False


def eval_stages(cfg, run_dir: Path, drafter: Path, stage, target, accelerator, shared: dict) -> dict:
    """The pipeline's eval stage (the recipe's serving settings) and, with `plan.enabled`, the plan stage and an
    eval served with the plan; returns where their summaries are."""
    from draftsmith.distill.loading import load_target, resolve_dtype
    from draftsmith.eval.measure.evaluate import run_eval
    from draftsmith.eval.serving import decide
    from draftsmith.train.runfolder import RECORD

    eval_dir = Path(cfg.eval.out) if cfg.eval.out else run_dir / "eval"
    dtype = cfg.eval.dtype or cfg.model.dtype

    def served(plan: bool):  # what a stage serves: this run's drafter folder, read when the stage runs
        return decide(cfg.model, dataclasses.replace(cfg.drafter, path=str(drafter), plan=plan), dtype=dtype)

    def eval_target(serving):  # the serving target in the eval dtype (the training one when they agree), loaded once
        if resolve_dtype(dtype, cfg.model.device) == resolve_dtype(cfg.model.dtype, cfg.model.device):
            return target()
        if "eval_target" not in shared:
            shared["eval_target"] = load_target(serving.model, dtype=dtype)
        return shared["eval_target"]

    def evaluate(plan: bool, out: Path):
        serving = served(plan)
        run_eval(serving, cfg.eval, out, progress=cfg.log.progress, target=eval_target(serving))

    config, summary = cfg.to_dict(), run_dir / "train_summary.json"
    # the recipe's settings; a plan (below, or one written earlier) is measured in its own eval
    stage("eval", (eval_dir / "summary.json").is_file(), lambda: evaluate(False, eval_dir),
          StageRecord.build(eval_dir, config, "eval", [summary]))
    record = {"eval": str(eval_dir / "summary.json")}
    if cfg.plan.enabled:
        from draftsmith.eval.measure.plan import PLAN, format_plan, make_plan, write_plan

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
              StageRecord.build(drafter / PLAN, config, "plan", [summary], file=drafter / f"{Path(PLAN).stem}.{RECORD}"))
        plan_eval = run_dir / "eval-plan"
        stage("eval with the plan", (plan_eval / "summary.json").is_file(), lambda: evaluate(True, plan_eval),
              StageRecord.build(plan_eval, config, "eval", [summary, drafter / PLAN]))
        record["eval_plan"] = str(plan_eval / "summary.json")
    return record
