"""The commands behind `draftsmith`'s subcommands (train/cli.py parses, then imports this module and calls
one).

Kept apart from the parser so `draftsmith --help` and argument errors never import torch: everything heavy is
imported here or inside each command. `ERRORS` are the exceptions a command turns into one line on stderr and
exit code 2 (DRAFTSMITH_DEBUG=1 shows the traceback). The measuring commands (`plan`, `bench`) and `resolve`
(a command's flags -> the run config and what serves) are train/measure_commands.py, imported here: cli.py
finds every command in this module, by name.
"""

from __future__ import annotations

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
from draftsmith.train.measure_commands import cmd_bench, cmd_plan, resolve  # noqa: F401
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
    from draftsmith.train.regenerated import run_regenerate

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
    from draftsmith.train.pipeline import features_dir, run_extract_stage
    from draftsmith.train.regenerated import with_run_sources

    cfg = load_config(args.config, args.overrides)
    folder = run_dir(cfg, args.out)
    if args.verify:  # check every shard of the run's features against index.json; write nothing
        for split in ("train", "validation"):
            index = read_index(features_dir(cfg, folder) / split, verify=True)
            rank0_print(f"[extract] {split}: {len(index.shards)} shards, {index.num_sequences} sequences: "
                        "checksums ok")
        return 0
    cfg.write_resolved(folder)
    run_extract_stage(with_run_sources(cfg, folder), folder)
    return 0


def cmd_train(args) -> int:
    from draftsmith.train.loop import train
    from draftsmith.train.regenerated import with_run_sources

    cfg = load_config(args.config, args.overrides)
    folder = run_dir(cfg, args.out)
    try:
        out = train(with_run_sources(cfg, folder), folder, resume=args.resume, fresh=args.fresh)
    except (Interrupted, KeyboardInterrupt) as stop:
        return stopped(args, folder, stop)
    rank0_print(f"[train] drafter: {out}")
    return 0


def stopped(args, folder: Path, stop: BaseException) -> int:
    """One line for a stopped `train` / `pipeline`: what was saved and the command that resumes; the exit
    status a shell gives a process the signal killed (128 + its number: 130 for Ctrl-C, 143 for SIGTERM)."""
    import signal

    from draftsmith.train.checkpoints import latest_checkpoint

    last = latest_checkpoint(folder)
    words = [args.command, *(["-c", args.config] if args.config else []), "--out", str(folder),
             # never --fresh: that would move the saved run aside
             *args.overrides, *(["--resume"] if last else [])]
    # under `draftsmith launch` the same launch line (train/launch.py LAUNCHED_ENV); under accelerate launch /
    # torchrun every rank runs `-m draftsmith.train`: resume under the same launcher
    from draftsmith.train.launch import LAUNCHED_ENV

    launcher = os.environ.get(LAUNCHED_ENV) or (
        "<the same launcher> -m draftsmith.train" if int(os.environ.get("WORLD_SIZE",
                                                                        "1")) > 1 else "draftsmith")
    command = f"{launcher} {shlex.join(words)}"
    if isinstance(stop, Interrupted):
        rank0_print(f"[{args.command}] stopped by {signal.Signals(stop.signum).name} at step {stop.step}: "
                    f"checkpoint saved to {stop.checkpoint}; resume with: {command}")
        return stop.exit_code
    kept = f"the last complete checkpoint is {last}" if last else "no checkpoint was saved"
    rank0_print(f"[{args.command}] interrupted outside a training step: {kept}; continue with: {command}")
    return 130


def cmd_export(args) -> int:
    from draftsmith.train.pipeline import run_export_stage

    folder = Path(args.run)
    if not (folder / "drafter" / "draftsmith.json").is_file():
        raise FileNotFoundError(f"{folder / 'drafter'} holds no drafter: --run must be a run folder whose "
                                "training finished")
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


def eval_flags(args) -> dict:
    """`draftsmith eval`'s quick-use flags as eval settings."""
    flags = {k: getattr(args, k) for k in ("prompts", "limit", "max_new_tokens", "dtype", "temperature",
                                           "top_p", "draft_sampling", "out")}
    if args.categories:
        flags["categories"] = [c.strip() for c in args.categories.split(",") if c.strip()]
    return flags


def cmd_eval(args) -> int:
    from draftsmith.eval.measure.evaluate import run_eval
    from draftsmith.eval.measure.report import format_summary

    if args.serving and args.tree:
        raise ValueError("--serving and --tree both choose the serving settings: pass one of them")
    for flag, value in (("--engine-draft-threads", args.engine_draft_threads),
                        ("--engine-combine", args.engine_combine)):
        if value is not None and args.engine != "llamacpp":
            raise ValueError(f"{flag} is a llama.cpp setting: add --engine llamacpp, or drop it")
    if args.engine and args.serving:
        raise ValueError("--engine serves a chain (--tree chain-K), not a plan's serving.json: drop "
                         "--serving")
    cfg, serving = resolve(args.config, args.overrides, args.target, args.drafter, args.tree, args.serving,
                           args.engine, eval_flags(args))
    out = Path(cfg.eval.out) if cfg.eval.out else run_dir(cfg) / "eval"
    # config.resolved.yaml is written beside the summary it made, once that exists: a stopped eval leaves a
    # finished one's pair as it was (its partial file holds its own settings: evaluate.py's resume key)
    if args.engine == "llamacpp":  # served by llama.cpp beside our decoder (eval/measure/engine_llamacpp.py)
        from draftsmith.eval.measure.engine_llamacpp import (
            format_llamacpp_summary,
            ngram_types,
            run_llamacpp_eval,
        )

        combine = None if args.engine_combine is None else ngram_types(args.engine_combine or "none")
        summary = run_llamacpp_eval(serving, cfg.eval, out, ngram_types(args.engine_ngram),
                                    progress=cfg.log.progress, draft_threads=args.engine_draft_threads,
                                    quantized=not args.engine_no_quantized, combine=combine)
        rank0_print(format_llamacpp_summary(summary))
    elif args.engine:  # served by a real engine beside our decoder (eval/measure/engine.py)
        from draftsmith.eval.measure.engine import run_engine_eval
        from draftsmith.eval.measure.engine_compare import format_engine_summary

        summary = run_engine_eval(serving, cfg.eval, out, args.engine, args.engine_concurrency,
                                  progress=cfg.log.progress)
        rank0_print(format_engine_summary(summary))
    if args.engine:
        cfg.write_resolved(out)
        rank0_print(f"wrote {out / 'summary.json'} (ours: {out / 'ours'}, the engine's raw counters: "
                    f"{out / 'engine.json'})")
        return 0
    summary = run_eval(serving, cfg.eval, out, progress=cfg.log.progress)
    cfg.write_resolved(out)
    rank0_print(format_summary(summary))
    rank0_print(f"wrote {out / 'summary.json'} and {out / 'samples.jsonl'}")
    return 0


def cmd_engine(args) -> int:
    from draftsmith.eval.measure.engine import install_engine

    if args.action == "gguf":
        return target_gguf(args)
    log = (lambda line: print(line, file=sys.stderr)) if args.print_python else rank0_print
    python = install_engine(args.name, log=log)
    if args.print_python:
        print(python)
    return 0


def target_gguf(args) -> int:
    """`draftsmith engine gguf llamacpp --target T --out F`: a user's target as llama.cpp's GGUF (a GGUF
    target is served as it is)."""
    from draftsmith.distill.loading import resolve_target
    from draftsmith.heads import llamacpp

    if args.name != "llamacpp" or not args.target or not args.out:
        raise ValueError("draftsmith engine gguf llamacpp --target TARGET --out FILE.gguf [--outtype f16]")
    if args.target.endswith(".gguf"):
        raise ValueError(f"{args.target} is a GGUF already: llama.cpp serves it as it is")
    out = llamacpp.convert_target(resolve_target(args.target), Path(args.out), args.outtype)
    rank0_print(f"wrote {out} ({args.outtype}, llama.cpp b{llamacpp.BUILD}'s converter)")
    return 0


def cmd_report(args) -> int:
    """One comparison table (printed) + report.md and PNGs from eval summaries (and a bench.json)."""
    from draftsmith.eval.measure.plots import write_report
    from draftsmith.eval.measure.report import format_table, load_summaries

    paths = [Path(p) / "summary.json" if Path(p).is_dir() else Path(p) for p in args.summaries]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"no summary.json at {', '.join(missing)}: run `draftsmith eval` or "
                                "`pipeline` first")
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
    """The kinds table (heads/kind.py, every folder under heads/ registering its rows) and each kind's
    formats."""
    from draftsmith.heads.registry import FORMATS

    for spec in KINDS.values():
        formats = ", ".join(f"{name} ({FORMATS[name].summary})"
                            for name in spec.formats) or "none (training-free)"
        rank0_print(f"{spec.name}: {spec.summary}\n    exports: {formats}")
    return 0


ERRORS = (ConfigError, FileNotFoundError, ValueError, TrainingError, ImportError, WriteError, ServerError,
          EngineError)
