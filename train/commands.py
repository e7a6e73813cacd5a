"""The commands behind `draftsmith`'s subcommands (train/cli.py parses, then imports this module and calls one).

Kept apart from the parser so `draftsmith --help` and argument errors never import torch: everything heavy is
imported here or inside each command. `ERRORS` are the exceptions a command turns into one line on stderr and
exit code 2 (DRAFTSMITH_DEBUG=1 shows the traceback).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys
import time
from pathlib import Path

from draftsmith.distill.cache import WriteError
from draftsmith.distill.regenerate import ServerError
from draftsmith.eval.measure.engine import EngineError
from draftsmith.heads.registry import KINDS
from draftsmith.train.config import ConfigError, RunConfig, dump_config, load_config
from draftsmith.train.runtime import Interrupted, TrainingError, rank0_print


def run_dir(cfg: RunConfig, out: str | None = None) -> Path:
    return Path(out) if out else Path(cfg.log.run_dir) / cfg.name


def cmd_config(args) -> int:
    cfg = load_config(args.config, args.overrides)
    sys.stdout.write(dump_config(cfg))
    return 0


def cmd_target(args) -> int:
    from draftsmith.distill.loading import ModelConfig, load_target

    t0 = time.perf_counter()
    target = load_target(ModelConfig(target=args.target, dtype=args.dtype, device="cpu"))
    loaded = time.perf_counter() - t0
    t1 = time.perf_counter()
    new, _ = target.generate([target.chat_ids(args.prompt)], args.max_new_tokens)[0]
    gen = time.perf_counter() - t1
    rank0_print(f"target {target.name}: {target.num_layers} layers, hidden {target.config.hidden_size}, "
                f"vocab {target.vocab_size}, {target.dtype}; loaded in {loaded:.2f} s")
    rank0_print(f"prompt: {args.prompt}\nanswer: {target.tokenizer.decode(new, skip_special_tokens=True)}")
    rank0_print(f"greedy: {len(new)} tokens in {gen:.2f} s ({len(new) / gen:.1f} tok/s)")
    return 0


def cmd_regenerate(args) -> int:
    from draftsmith.train.pipeline import run_regenerate

    cfg = load_config(args.config, args.overrides)
    if not cfg.data.regenerate.prompts and not cfg.data.regenerate.validation_prompts:
        raise ConfigError("data.regenerate.prompts is empty: name the prompt sources to answer "
                          "(e.g. data.regenerate.prompts=[train-general])")
    folder = run_dir(cfg, args.out)
    cfg.write_resolved(folder)
    run_regenerate(cfg, folder)
    return 0


def cmd_extract(args) -> int:
    from draftsmith.distill.features import read_index
    from draftsmith.train.pipeline import features_dir, run_extract_stage, with_run_sources

    cfg = load_config(args.config, args.overrides)
    folder = run_dir(cfg, args.out)
    if args.verify:  # check every shard of the run's features against index.json; write nothing
        for split in ("train", "validation"):
            index = read_index(features_dir(cfg, folder) / split, verify=True)
            rank0_print(f"[extract] {split}: {len(index.shards)} shards, {index.num_sequences} sequences: checksums ok")
        return 0
    cfg.write_resolved(folder)
    run_extract_stage(with_run_sources(cfg, folder), folder)
    return 0


def cmd_train(args) -> int:
    from draftsmith.train.loop import train
    from draftsmith.train.pipeline import with_run_sources

    cfg = load_config(args.config, args.overrides)
    folder = run_dir(cfg, args.out)
    try:
        out = train(with_run_sources(cfg, folder), folder, resume=args.resume, fresh=args.fresh)
    except (Interrupted, KeyboardInterrupt) as stop:
        return stopped(args, folder, stop)
    rank0_print(f"[train] drafter: {out}")
    return 0


def stopped(args, folder: Path, stop: BaseException) -> int:
    """One line for a stopped `train` / `pipeline`: what was saved and the command that resumes; the exit status a
    shell gives a process the signal killed (128 + its number: 130 for Ctrl-C, 143 for SIGTERM)."""
    import signal

    from draftsmith.train.checkpoints import latest_checkpoint

    last = latest_checkpoint(folder)
    words = [args.command, *(["-c", args.config] if args.config else []), "--out", str(folder), *args.overrides,
             *(["--resume"] if last else [])]  # never --fresh: that would move the saved run aside
    # under `draftsmith launch` the same launch line (train/launch.py LAUNCHED_ENV); under accelerate launch / torchrun
    # every rank runs `-m draftsmith.train`: resume under the same launcher
    from draftsmith.train.launch import LAUNCHED_ENV

    launcher = os.environ.get(LAUNCHED_ENV) or (
        "<the same launcher> -m draftsmith.train" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else "draftsmith")
    command = f"{launcher} {shlex.join(words)}"
    if isinstance(stop, Interrupted):
        rank0_print(f"[{args.command}] stopped by {signal.Signals(stop.signum).name} at step {stop.step}: checkpoint "
                    f"saved to {stop.checkpoint}; resume with: {command}")
        return stop.exit_code
    kept = f"the last complete checkpoint is {last}" if last else "no checkpoint was saved"
    rank0_print(f"[{args.command}] interrupted outside a training step: {kept}; continue with: {command}")
    return 130


def cmd_export(args) -> int:
    from draftsmith.train.pipeline import run_export_stage

    folder = Path(args.run)
    if not (folder / "drafter" / "draftsmith.json").is_file():
        raise FileNotFoundError(f"{folder / 'drafter'} holds no drafter: --run must be a run folder whose training finished")
    out = run_export_stage(folder, args.format, Path(args.out), args.base_model, args.dtype)
    rank0_print(f"[export] {args.format} written to {out}\n")
    rank0_print((out / "SERVE.md").read_text())
    return 0


def cmd_tree_opt(args) -> int:
    from draftsmith.train.pipeline import run_tree_opt

    folder = Path(args.run)
    cfg = load_config(folder / "config.resolved.yaml", args.overrides)
    run_tree_opt(cfg, folder, args.nodes, args.ranks, args.sequences, Path(args.out) if args.out else None)
    return 0


def cmd_pipeline(args) -> int:
    from draftsmith.eval.measure.report import format_summary
    from draftsmith.train.pipeline import run_pipeline

    cfg = load_config(args.config, args.overrides)
    try:
        summary = run_pipeline(cfg, run_dir(cfg, args.out), resume=args.resume, fresh=args.fresh)
    except (Interrupted, KeyboardInterrupt) as stop:
        return stopped(args, run_dir(cfg, args.out), stop)
    rank0_print(format_summary(summary))
    return 0


def resolve(config, overrides, target: str | None = None, drafter: str | None = None, tree: str | None = None,
            serving: str | None = None, engine: str | None = None, eval_flags: dict | None = None):
    """The run config with a command's flags applied (typed; flags win over the config file) and what serves
    (eval/serving.py `decide`, the drafter folder read once) -> (RunConfig, Serving). `--drafter` names a kind or a
    folder (whose kind it is); with no target named anywhere, a folder serves the target it was trained for."""
    from draftsmith.eval.serving import decide

    flags: dict = {"eval": {k: v for k, v in (eval_flags or {}).items() if v is not None}}
    if target:
        flags["model"] = {"target": target}
    drafter_flags: dict = {}
    if drafter in KINDS:
        drafter_flags["kind"] = drafter
    elif drafter:
        if not Path(drafter).is_dir():
            raise FileNotFoundError(f"--drafter '{drafter}' is neither a kind ({', '.join(KINDS)}) nor a folder")
        drafter_flags["path"] = str(drafter)
    if tree is not None:
        drafter_flags.update(tree=tree, plan=False)  # an explicit tree wins over a folder's plan
    if drafter_flags:
        flags["drafter"] = drafter_flags
    cfg = load_config(config, overrides, flags)
    named = bool(target or config or any(o.startswith("model.target=") for o in overrides or []))
    chosen = decide(cfg.model, cfg.drafter, serving=serving, dtype=cfg.eval.dtype, engine=engine, target_named=named,
                    folder_decides="path" in drafter_flags)
    return dataclasses.replace(cfg, model=chosen.model, drafter=chosen.drafter), chosen


def eval_flags(args) -> dict:
    """`draftsmith eval`'s quick-use flags as eval settings."""
    flags = {k: getattr(args, k) for k in ("prompts", "limit", "max_new_tokens", "dtype", "temperature", "out")}
    if args.categories:
        flags["categories"] = [c.strip() for c in args.categories.split(",") if c.strip()]
    return flags


def cmd_eval(args) -> int:
    from draftsmith.eval.measure.evaluate import run_eval
    from draftsmith.eval.measure.report import format_summary

    if args.serving and args.tree:
        raise ValueError("--serving and --tree both choose the serving settings: pass one of them")
    if args.engine and args.serving:
        raise ValueError("--engine serves a chain (--tree chain-K), not a plan's serving.json: drop --serving")
    cfg, serving = resolve(args.config, args.overrides, args.target, args.drafter, args.tree, args.serving, args.engine,
                           eval_flags(args))
    out = Path(cfg.eval.out) if cfg.eval.out else run_dir(cfg) / "eval"
    cfg.write_resolved(out)
    if args.engine:  # served by a real engine beside our decoder (eval/measure/engine.py)
        from draftsmith.eval.measure.engine import format_engine_summary, run_engine_eval

        summary = run_engine_eval(serving, cfg.eval, out, args.engine, args.engine_concurrency,
                                  progress=cfg.log.progress)
        rank0_print(format_engine_summary(summary))
        rank0_print(f"wrote {out / 'summary.json'} (ours: {out / 'ours'}, the engine's raw counters: {out / 'engine.json'})")
        return 0
    summary = run_eval(serving, cfg.eval, out, progress=cfg.log.progress)
    rank0_print(format_summary(summary))
    rank0_print(f"wrote {out / 'summary.json'} and {out / 'samples.jsonl'}")
    return 0


def cmd_engine(args) -> int:
    from draftsmith.eval.measure.engine import install_engine

    log = (lambda line: print(line, file=sys.stderr)) if args.print_python else rank0_print
    python = install_engine(args.name, log=log)
    if args.print_python:
        print(python)
    return 0


def csv(text: str, kind, flag: str) -> list:
    """A comma-separated flag (`--batch-sizes 1,4,16`) as a list, or an error naming the flag."""
    try:
        return [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated numbers (e.g. {flag} 1,4,16), got '{text}'") from None


def cmd_plan(args) -> int:
    from draftsmith.distill.loading import load_target
    from draftsmith.eval.measure.plan import default_out, format_plan, make_plan, prepare_out, write_plan

    if len(args.drafter) > 1:
        return plan_several(args)
    cfg, serving = resolve(args.config, args.overrides, args.target, args.drafter[0])
    folder = serving.folder
    if folder is None:
        raise ValueError("draftsmith plan needs --drafter DIR: a drafter folder or an export")
    if args.into_drafter and args.out and Path(args.out).resolve() != folder.path.resolve():
        raise ValueError(f"--into-drafter writes into {folder.path} and --out names {args.out}: pass one of them")
    # checked before the target loads and minutes of measuring: a folder that cannot be written fails now
    out = prepare_out(folder.path if args.into_drafter else args.out or default_out(cfg.log.run_dir, folder.path))
    if args.engine:
        return engine_plan(args, cfg, serving, out)
    target = load_target(cfg.model, dtype=args.dtype)
    plan = make_plan(target, serving, prompts=args.prompts, calibration=args.calibration, offset=args.offset,
                     max_new_tokens=args.max_new_tokens, margin=args.margin, progress=cfg.log.progress,
                     batch_sizes=csv(args.batch_sizes, int, "--batch-sizes"), contexts=csv(args.contexts, int, "--contexts"))
    path = write_plan(out, plan)
    rank0_print(format_plan(plan))
    if out.resolve() == folder.path.resolve():
        rank0_print(f"wrote {path}: eval and bench now serve this drafter with it (drafter.plan=false: the recipe's "
                    "settings)")
    else:
        rank0_print(f"wrote {path}; the drafter folder is unchanged: serve the plan with "
                    f"draftsmith eval --drafter {folder.path} --serving {path}")
    return 0


def plan_several(args) -> int:
    """`plan --drafter A --drafter B ...`: each drafter planned on the same calibration prompts with one loaded target
    (OUT/NAME/serving.json), then the one to serve per batch size (OUT/choice.json, eval/measure/plan.py)."""
    from draftsmith.distill.loading import load_target, resolve_target
    from draftsmith.eval.measure.evaluate import run_of
    from draftsmith.eval.measure.plan import (
        compare_plans,
        format_comparison,
        format_plan,
        make_plan,
        prepare_out,
        write_choice,
        write_plan,
    )

    if args.engine or args.into_drafter:
        raise ValueError("several --drafter plan on our decoder into --out: plan --engine and --into-drafter take one "
                         "drafter at a time")
    drafters = []
    for path in args.drafter:
        if not Path(path).is_dir():
            raise ValueError(f"--drafter {path} is not a drafter folder: several --drafter compare trained drafters")
        cfg, serving = resolve(args.config, args.overrides, args.target, path)
        run, fmt = run_of(path)
        drafters.append((f"{run}-{fmt}" if fmt else run, cfg, serving))
    names = [name for name, *_ in drafters]
    if len(set(names)) < len(names):
        raise ValueError(f"two --drafter folders share a run name ({', '.join(names)}): each is planned into OUT/NAME; "
                         "give them distinct run folders")
    targets = {resolve_target(cfg.model.target, cfg.model.revision) for _, cfg, _ in drafters}
    if len(targets) > 1:
        raise ValueError(f"the drafters serve different targets ({', '.join(map(str, targets))}): plan each alone, or "
                         "pass --target")
    out = prepare_out(args.out or Path(drafters[0][1].log.run_dir) / "plan" / "+".join(names))
    target = load_target(drafters[0][1].model, dtype=args.dtype)
    plans = {}
    for name, cfg, serving in drafters:
        plans[name] = make_plan(target, serving, prompts=args.prompts, calibration=args.calibration,
                                offset=args.offset, max_new_tokens=args.max_new_tokens, margin=args.margin,
                                progress=cfg.log.progress, batch_sizes=csv(args.batch_sizes, int, "--batch-sizes"),
                                contexts=csv(args.contexts, int, "--contexts"))
        write_plan(out / name, plans[name])
        rank0_print(format_plan(plans[name]))
    comparison = compare_plans(plans)
    path = write_choice(out, comparison)
    rank0_print(format_comparison(comparison))
    chosen = comparison["chosen"]
    serve = ("plain decoding" if chosen["plain"] else
             f"draftsmith eval --drafter {chosen['drafter']} --serving {out / chosen['serving']}" if chosen["drafter"]
             else f"prompt lookup alone: draftsmith eval --drafter {plans[chosen['serving'].split('/')[0]]['drafter']} "
                  f"--serving {out / chosen['serving']}")
    rank0_print(f"wrote {path} and each drafter's plan in {out}/NAME/; serve: {serve}")
    return 0


def engine_plan(args, cfg, serving, out: Path) -> int:
    """`plan --engine vllm`: the chain length served fastest in the engine (eval/measure/engine_plan.py)."""
    import dataclasses

    from draftsmith.eval.measure.engine_plan import format_engine_plan, served_sweep, write_engine_plan
    from draftsmith.eval.measure.plan import default_out

    calibration = dataclasses.replace(cfg.eval, prompts=args.prompts, limit=args.calibration, offset=args.offset,
                                      max_new_tokens=args.max_new_tokens, dtype=args.dtype, temperature=0.0,
                                      categories=[], warmup=1)
    work = (out if not args.into_drafter else default_out(cfg.log.run_dir, serving.folder.path)) / f"{args.engine}-runs"
    plan = served_sweep(serving, calibration, work, csv(args.chains, int, "--chains"),
                        args.engine_concurrency, ngram=not args.no_ngram, engine=args.engine, margin=args.margin,
                        progress=cfg.log.progress)
    path = write_engine_plan(out, plan)
    rank0_print(format_engine_plan(plan))
    rank0_print(f"wrote {path} (an engine plan: {args.engine} serves chains only; our decoder's plan is serving.json)"
                + (f"; {out / 'SERVE.md'} carries the measured command" if (out / "SERVE.md").is_file() else ""))
    return 0


def cmd_bench(args) -> int:
    from draftsmith.eval.measure.bench import BenchConfig, format_bench, run_bench

    drafters, cfg = [], None
    for drafter in args.drafter:  # each --drafter resolves exactly as `draftsmith eval --drafter` does
        cfg, serving = resolve(args.config, args.overrides, args.target, drafter, args.tree)
        drafters.append(serving)
    bench = BenchConfig(batch_sizes=csv(args.batch_sizes, int, "--batch-sizes"),
                        temperatures=csv(args.temperatures, float, "--temperatures"), prompts=args.prompts,
                        limit=args.limit, categories=csv(args.categories or "", str, "--categories"),
                        max_new_tokens=args.max_new_tokens, dtype=args.dtype, seed=args.seed, fallback=args.fallback,
                        fallback_margin=args.fallback_margin,
                        calibration_tokens=args.calibration_tokens, calibration_prompts=args.calibration_prompts,
                        peers=args.peers, out=args.out)
    result = run_bench(drafters, bench, progress=cfg.log.progress)
    rank0_print(format_bench(result))
    rank0_print(f"wrote {Path(args.out) / 'bench.json'}, configs/ and the PNGs")
    return 0


def cmd_report(args) -> int:
    """One comparison table (printed) + report.md and PNGs from eval summaries (and a bench.json)."""
    from draftsmith.eval.measure.plots import write_report
    from draftsmith.eval.measure.report import format_table, load_summaries

    paths = [Path(p) / "summary.json" if Path(p).is_dir() else Path(p) for p in args.summaries]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"no summary.json at {', '.join(missing)}: run `draftsmith eval` or `pipeline` first")
    summaries = load_summaries(paths)
    bench = json.loads(Path(args.bench).read_text()) if args.bench else None
    out = write_report(summaries, bench, args.out)
    rank0_print(format_table(summaries))
    rank0_print(f"wrote {out} and its plots")
    return 0


def cmd_launch(args) -> int:
    from draftsmith.train.launch import run_launch

    return run_launch(args)


def cmd_size(args) -> int:
    from draftsmith.train.sizing import format_size, size_recipe

    cfg = load_config(args.config, args.overrides)
    sizes = size_recipe(cfg, args.target_config, num_processes=args.num_processes)
    print(json.dumps(sizes, indent=1) if args.json else format_size(sizes))
    return 0


def cmd_kinds(args) -> int:
    """The kinds table (heads/kind.py, every folder under heads/ registering its rows) and each kind's formats."""
    from draftsmith.heads.registry import FORMATS

    for spec in KINDS.values():
        formats = ", ".join(f"{name} ({FORMATS[name].summary})" for name in spec.formats) or "none (training-free)"
        rank0_print(f"{spec.name}: {spec.summary}\n    exports: {formats}")
    return 0


ERRORS = (ConfigError, FileNotFoundError, ValueError, TrainingError, ImportError, WriteError, ServerError, EngineError)
