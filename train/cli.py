"""`draftsmith` console script: one subcommand table; each subcommand imports its stage lazily.

    draftsmith config -c configs/runs/X.yaml [a.b=c ...]     print the resolved config
    draftsmith target [--target NAME] [--prompt TEXT]         prepare the target, greedy demo
    draftsmith regenerate -c X.yaml [a.b=c ...]               target writes answers (self-distillation)
    draftsmith extract | train | pipeline -c X.yaml [--out DIR] [--resume | --fresh] [a.b=c ...]
    draftsmith export --run DIR --format FORMAT --out DIR2              a serving layout (heads/export.py FORMATS)
    draftsmith tree-opt --run DIR [--nodes 48]                 static tree from measured head accuracies
    draftsmith eval -c X.yaml [a.b=c ...] | --target ... --drafter ... [--serving FILE]   τ, speedup, losslessness
    draftsmith plan --drafter DIR [--out DIR | --into-drafter]  measured serving settings -> serving.json
    draftsmith report SUMMARY... [--bench bench.json] --out DIR                 table + report.md + PNGs
    draftsmith bench --target T --drafter D [--drafter D2] --batch-sizes 1,4,16 --temperatures 0,1
    draftsmith engine install vllm [--print-python]            vLLM's CPU build in its own venv
    draftsmith eval --engine vllm --drafter DIR [--tree chain-K]  served acceptance per position vs ours

Every stage writes `config.resolved.yaml` into its run folder (`<log.run_dir>/<name>/` or --out). `train` and
`pipeline` rerun into a folder resume it (train/runfolder.py); Ctrl-C saves a checkpoint and names the command
that resumes (exit 130; SIGTERM 143).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

from draftsmith.distill.cache import WriteError
from draftsmith.distill.regenerate import ServerError
from draftsmith.eval.engine import ENGINES, EngineError
from draftsmith.heads.export import FORMATS
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
    from draftsmith.distill.target import ModelConfig, load_target

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
    if not cfg.data.regenerate.prompts:
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
    # under accelerate launch / torchrun every rank runs `-m draftsmith.train`: resume under the same launcher
    launcher = "<the same launcher> -m draftsmith.train" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else "draftsmith"
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
    from draftsmith.eval.report import format_summary
    from draftsmith.train.pipeline import run_pipeline

    cfg = load_config(args.config, args.overrides)
    try:
        summary = run_pipeline(cfg, run_dir(cfg, args.out), resume=args.resume, fresh=args.fresh)
    except (Interrupted, KeyboardInterrupt) as stop:
        return stopped(args, run_dir(cfg, args.out), stop)
    rank0_print(format_summary(summary))
    return 0


def eval_overrides(args) -> list[str]:
    """Translate the quick-use flags into config overrides (flags win over the config file)."""
    from draftsmith.heads.folder import read_folder

    ov = []
    if args.target:
        ov.append(f"model.target={args.target}")
    if args.drafter:
        if args.drafter in KINDS:
            ov.append(f"drafter.kind={args.drafter}")
        else:
            if not Path(args.drafter).is_dir():
                raise FileNotFoundError(f"--drafter '{args.drafter}' is neither a kind ({', '.join(KINDS)}) nor a folder")
            folder = read_folder(args.drafter)  # the kind comes from the folder
            ov += [f"drafter.kind={folder.kind}", f"drafter.path={folder.path}"]
            named = args.target or getattr(args, "config", None) or any(
                o.startswith("model.target=") for o in getattr(args, "overrides", None) or [])
            if folder.serve_target and not args.target:  # Medusa-2: heads serve with their merged target
                ov.append(f"model.target={folder.serve_target}")
            elif folder.target and not named:  # no target named anywhere: the one the drafter was trained for
                ov.append(f"model.target={folder.target}")
    if getattr(args, "tree", None) is not None:
        ov.append("drafter.plan=false")  # an explicit tree wins over a folder's plan
    for flag, key in [("prompts", "eval.prompts"), ("limit", "eval.limit"), ("max_new_tokens", "eval.max_new_tokens"),
                      ("dtype", "eval.dtype"), ("temperature", "eval.temperature"), ("tree", "drafter.tree"),
                      ("out", "eval.out")]:
        if getattr(args, flag) is not None:
            ov.append(f"{key}={getattr(args, flag)}")
    if args.categories:
        ov.append(f"eval.categories=[{args.categories}]")
    return ov


def cmd_eval(args) -> int:
    from draftsmith.eval.benchmark import run_eval
    from draftsmith.eval.report import format_summary

    if args.serving and args.tree:
        raise ValueError("--serving and --tree both choose the serving settings: pass one of them")
    cfg = load_config(args.config, list(args.overrides) + eval_overrides(args))
    out = Path(cfg.eval.out) if cfg.eval.out else run_dir(cfg) / "eval"
    cfg.write_resolved(out)
    if args.engine:  # served by a real engine beside our decoder (eval/engine.py)
        from draftsmith.eval.engine import format_engine_summary, run_engine_eval

        if args.serving:
            raise ValueError("--engine serves a chain (--tree chain-K), not a plan's serving.json: drop --serving")
        summary = run_engine_eval(cfg.model, cfg.drafter, cfg.eval, out, args.engine, args.engine_concurrency,
                                  progress=cfg.log.progress)
        rank0_print(format_engine_summary(summary))
        rank0_print(f"wrote {out / 'summary.json'} (ours: {out / 'ours'}, the engine's raw counters: {out / 'engine.json'})")
        return 0
    summary = run_eval(cfg.model, cfg.drafter, cfg.eval, out, progress=cfg.log.progress, serving=args.serving)
    rank0_print(format_summary(summary))
    rank0_print(f"wrote {out / 'summary.json'} and {out / 'samples.jsonl'}")
    return 0


def cmd_engine(args) -> int:
    from draftsmith.eval.engine import install_engine

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
    from draftsmith.distill.target import load_target
    from draftsmith.eval.plan import default_out, format_plan, make_plan, prepare_out, write_plan
    from draftsmith.heads.folder import read_folder

    flags = argparse.Namespace(target=args.target, drafter=args.drafter, tree=None, categories=None, prompts=None,
                               config=args.config, overrides=args.overrides,
                               limit=None, max_new_tokens=None, dtype=None, temperature=None, out=None)
    cfg = load_config(args.config, list(args.overrides) + eval_overrides(flags))
    if not cfg.drafter.path:
        raise ValueError("draftsmith plan needs --drafter DIR: a drafter folder or an export")
    folder = read_folder(cfg.drafter.path)
    if args.into_drafter and args.out and Path(args.out).resolve() != folder.path.resolve():
        raise ValueError(f"--into-drafter writes into {folder.path} and --out names {args.out}: pass one of them")
    # checked before the target loads and minutes of measuring: a folder that cannot be written fails now
    out = prepare_out(folder.path if args.into_drafter else args.out or default_out(cfg.log.run_dir, folder.path))
    target = load_target(cfg.model, dtype=args.dtype)
    plan = make_plan(target, cfg.drafter, folder, prompts=args.prompts, calibration=args.calibration, offset=args.offset,
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


def cmd_bench(args) -> int:
    from draftsmith.eval.bench import BenchConfig, format_bench, run_bench

    drafters, cfg = [], None
    for drafter in args.drafter:  # each --drafter resolves exactly as `draftsmith eval --drafter` does
        flags = argparse.Namespace(target=args.target, drafter=drafter, tree=args.tree, categories=None, prompts=None,
                                   config=args.config, overrides=args.overrides,
                                   limit=None, max_new_tokens=None, dtype=None, temperature=None, out=None)
        cfg = load_config(args.config, list(args.overrides) + eval_overrides(flags))
        drafters.append((cfg.model, cfg.drafter))
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
    from draftsmith.eval.plots import write_report
    from draftsmith.eval.report import format_table, load_summaries

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


def add_eval_flags(parser) -> None:
    """Flags for quick use without a config; each overrides the matching config key."""
    parser.add_argument("--target", help="model.target: preset, HF folder or .gguf")
    parser.add_argument("--drafter", help=f"{' | '.join(KINDS)} | <drafter folder or export>")
    parser.add_argument("--prompts", help="spec-bench | mt-bench | FILE.jsonl")
    parser.add_argument("--limit", type=int)
    parser.add_argument("--categories", help="comma-separated categories")
    parser.add_argument("--max-new-tokens", type=int)
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"])
    parser.add_argument("--temperature", type=float)
    parser.add_argument("--tree", help="static tree name (configs/trees) or JSON file; chain-N for a chain; "
                                       "dynamic-N for an EAGLE-2 dynamic tree of N nodes")
    parser.add_argument("--out", help="output folder")


def build_parser() -> argparse.ArgumentParser:
    from importlib.metadata import PackageNotFoundError, version

    parser = argparse.ArgumentParser(prog="draftsmith", description=__doc__.split("\n\n")[0])
    try:
        parser.add_argument("--version", action="version", version=f"draftsmith {version('draftsmith')}")
    except PackageNotFoundError:  # run from a tree that was never installed
        parser.add_argument("--version", action="version", version="draftsmith (not installed)")
    sub = parser.add_subparsers(dest="command", required=True)

    def with_config(p):
        p.add_argument("-c", "--config", help="run YAML (configs/runs/*.yaml); without it the defaults")
        p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.lr=3e-4")
        return p

    with_config(sub.add_parser("config", help="print the resolved config")).set_defaults(fn=cmd_config)
    p = sub.add_parser("target", help="prepare the target (download/convert once) and run a greedy demo")
    p.add_argument("--target", default="smollm2-135m-instruct")
    p.add_argument("--dtype", default="float32", choices=["auto", "float32", "bfloat16"])
    p.add_argument("--prompt", default="What is speculative decoding? Answer in one sentence.")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.set_defaults(fn=cmd_target)
    p = with_config(sub.add_parser("regenerate", help="the target answers the prompts (self-distillation)"))
    p.add_argument("--out", help="run folder (default <log.run_dir>/<name>)")
    p.set_defaults(fn=cmd_regenerate)
    for name, fn, text in [("extract", cmd_extract, "target features -> safetensors shards (offline training)"),
                           ("train", cmd_train, "train the drafter (offline shards or online target)"),
                           ("pipeline", cmd_pipeline, "regenerate -> extract/online -> train -> export -> eval")]:
        p = with_config(sub.add_parser(name, help=text))
        p.add_argument("--out", help="run folder (default <log.run_dir>/<name>)")
        if name in ("train", "pipeline"):
            again = p.add_mutually_exclusive_group()
            again.add_argument("--resume", action="store_true", help=(
                "continue from the latest complete checkpoint, also past the end of a finished run when only "
                "train.max_steps / epochs / max_minutes changed (the schedule is re-sized to the new length). Without "
                "either flag a rerun into a folder resumes its checkpoint by itself when the settings that shape "
                "training match, leaves a finished run alone, and refuses naming the settings that differ"))
            again.add_argument("--fresh", action="store_true", help=(
                "start training over: the folder's checkpoints, metrics, drafter, exports and evals are moved (never "
                "deleted) into OUT/superseded/<time>/; the regenerated answers and features are kept and reused"))
        if name == "extract":
            p.add_argument("--verify", action="store_true", help="check every shard's checksum instead of extracting")
        p.set_defaults(fn=fn)
    p = sub.add_parser("tree-opt", help="best static tree for a node budget from measured head accuracies")
    p.add_argument("--run", required=True, help="run folder with drafter/ and config.resolved.yaml")
    p.add_argument("--nodes", type=int, default=48, help="node budget (verification width)")
    p.add_argument("--ranks", type=int, default=10, help="top-k candidates measured per head")
    p.add_argument("--sequences", type=int, default=64, help="validation sequences to measure on")
    p.add_argument("--out", help="tree JSON (default <run>/tree-opt-<nodes>.json)")
    p.add_argument("overrides", nargs="*")
    p.set_defaults(fn=cmd_tree_opt)
    p = sub.add_parser("export", help="write a trained drafter in a serving layout")
    p.add_argument("--run", required=True, help="run folder holding drafter/")
    p.add_argument("--format", required=True, choices=list(FORMATS), help="serving layout")
    p.add_argument("--out", required=True)
    p.add_argument("--base-model", help="the target as engines should name it (default: the run's target's Hub id "
                                        "or resolved folder)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.set_defaults(fn=cmd_export)
    p = with_config(sub.add_parser("eval", help="τ, acceptance, speedup and losslessness of a drafter"))
    add_eval_flags(p)
    p.add_argument("--serving", help="a plan's serving.json (draftsmith plan --out) to serve the drafter with; "
                                     "default: the drafter folder's own serving.json if it has one (drafter.plan=false: "
                                     "the config's settings). summary.json records which served")
    p.add_argument("--engine", choices=list(ENGINES), help="serve the drafter in this engine too (installed by "
                   "draftsmith engine install) on the same prompts: served vs our acceptance per position, greedy "
                   "equality, the engine's speed with and without it")
    p.add_argument("--engine-concurrency", type=int, default=8,
                   help="with --engine: prompts per llm.generate call, measured beside batch 1")
    p.set_defaults(fn=cmd_eval)
    p = with_config(sub.add_parser("plan", help="measure the serving settings that make a drafter fastest on this "
                                                "machine -> serving.json (default <log.run_dir>/plan/<run>)"))
    p.add_argument("--drafter", required=True, help="a drafter folder")
    p.add_argument("--target", help="model.target (default: the one the folder names)")
    p.add_argument("--prompts", default="spec-bench")
    p.add_argument("--calibration", type=int, default=8, help="calibration prompts")
    p.add_argument("--offset", type=int, default=240, help="skip this many prompts (disjoint from eval's first ones)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="auto: bfloat16 where this machine multiplies it natively, else float32")
    p.add_argument("--margin", type=float, default=0.03,
                   help="speculation must beat plain by this fraction beyond the measured timing noise to be chosen "
                        "(negative: the fastest candidate that accepted anything, no noise guard)")
    p.add_argument("--batch-sizes", default="1", help="comma-separated: a plan for each (eval and bench serve the "
                                                      "one measured at their batch size)")
    p.add_argument("--contexts", default="256", help="comma-separated context lengths to measure verification after "
                                                     "(e.g. 256,2048; the one nearest the calibration prompts explains the choice)")
    p.add_argument("--out", help="folder to write serving.json into, created if missing (default "
                                 "<log.run_dir>/plan/<run>, e.g. runs/plan/X for runs/X/drafter); eval serves it with "
                                 "--serving OUT/serving.json")
    p.add_argument("--into-drafter", action="store_true",
                   help="write serving.json into the drafter folder: eval and bench then serve it by default")
    p.set_defaults(fn=cmd_plan)
    p = with_config(sub.add_parser("bench", help="batched speculative decoding: speedup by batch size and temperature"))
    p.add_argument("--target", help="model.target: preset, HF folder or .gguf")
    p.add_argument("--drafter", action="append", required=True,
                   help=f"{' | '.join(KINDS)} | <drafter folder or export>; repeat for several drafters")
    p.add_argument("--batch-sizes", default="1,4,16", help="comma-separated, e.g. 1,4,16")
    p.add_argument("--temperatures", default="0", help="comma-separated, 0 = greedy, e.g. 0,0.7,1.0")
    p.add_argument("--prompts", default="spec-bench", help="spec-bench | mt-bench | FILE.jsonl")
    p.add_argument("--limit", type=int, default=32)
    p.add_argument("--categories", help="comma-separated categories")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--tree", help="draft tree for every drafter (default: each drafter's own)")
    p.add_argument("--no-fallback", dest="fallback", action="store_false",
                   help="always speculate, even where calibration finds plain decoding faster")
    p.add_argument("--fallback-margin", type=float, default=0.05,
                   help="speculation must beat plain decoding by this fraction in calibration to be kept "
                        "(a margin above timing noise, so the fall-back errs toward plain decoding)")
    p.add_argument("--calibration-tokens", type=int, default=32, help="tokens per fall-back calibration run")
    p.add_argument("--calibration-prompts", type=int, default=8, help="prompts the fall-back calibration decodes")
    p.add_argument("--no-peers", dest="peers", action="store_false", help="skip the HF generate / assisted peers")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/bench", help="output folder")
    p.set_defaults(fn=cmd_bench)
    p = sub.add_parser("engine", help="install a serving engine (its own venv under $DRAFTSMITH_HOME/engines)")
    p.add_argument("action", choices=["install"])
    p.add_argument("name", choices=list(ENGINES))
    p.add_argument("--print-python", action="store_true", help="print the engine venv's python alone on stdout "
                                                               "(installing first if needed)")
    p.set_defaults(fn=cmd_engine)
    p = sub.add_parser("report", help="comparison table + report.md + PNGs from eval summaries (and bench.json)")
    p.add_argument("summaries", nargs="+", help="summary.json files or the eval folders holding them")
    p.add_argument("--bench", help="a bench.json from `draftsmith bench` (adds speedup vs batch size)")
    p.add_argument("--out", required=True, help="report folder")
    p.set_defaults(fn=cmd_report)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except (ConfigError, FileNotFoundError, ValueError, TrainingError, ImportError, WriteError, ServerError,
            EngineError) as exc:
        if os.environ.get("DRAFTSMITH_DEBUG"):
            raise
        print(f"draftsmith {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
