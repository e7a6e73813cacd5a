"""The commands that measure how a drafter serves: `draftsmith plan` (one drafter on our decoder, several
compared, or chains in an engine: eval/measure/plan.py, plan_choice.py, engine_plan.py) and `draftsmith bench`
(eval/measure/bench.py), with `resolve`: a command's flags applied to the run config and what serves decided
once (eval/serving.py `decide`), which `eval` (train/commands.py) uses too.

In the flow: train/cli.py parses, train/commands.py dispatches by name (it imports `cmd_plan` and `cmd_bench`
from here); a plan writes OUT/serving.json (several drafters: OUT/NAME/serving.json and OUT/choice.json),
bench OUT/bench.json and its PNGs. Like train/commands.py, nothing heavy is imported before a command runs.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from draftsmith.heads.registry import KINDS
from draftsmith.train.config import load_config
from draftsmith.train.runtime import rank0_print


def resolve(config, overrides, target: str | None = None, drafter: str | None = None, tree: str | None = None,
            serving: str | None = None, engine: str | None = None, eval_flags: dict | None = None):
    """The run config with a command's flags applied (typed; flags win over the config file) and what serves
    (eval/serving.py `decide`, the drafter folder read once) -> (RunConfig, Serving). `--drafter` names a kind
    or a folder (whose kind it is); with no target named anywhere, a folder serves the target it was trained
    for."""
    from draftsmith.eval.serving import decide

    flags: dict = {"eval": {k: v for k, v in (eval_flags or {}).items() if v is not None}}
    if target:
        flags["model"] = {"target": target}
    drafter_flags: dict = {}
    if drafter in KINDS:
        drafter_flags["kind"] = drafter
    elif drafter:
        if not Path(drafter).is_dir():
            raise FileNotFoundError(f"--drafter '{drafter}' is neither a kind ({', '.join(KINDS)}) nor a "
                                    "folder")
        drafter_flags["path"] = str(drafter)
    if tree is not None:
        drafter_flags.update(tree=tree, plan=False)  # an explicit tree wins over a folder's plan
    if drafter_flags:
        flags["drafter"] = drafter_flags
    cfg = load_config(config, overrides, flags)
    named = bool(target or config or any(o.startswith("model.target=") for o in overrides or []))
    chosen = decide(cfg.model, cfg.drafter, serving=serving, dtype=cfg.eval.dtype, engine=engine,
                    target_named=named, folder_decides="path" in drafter_flags)
    return dataclasses.replace(cfg, model=chosen.model, drafter=chosen.drafter), chosen


def csv(text: str, kind, flag: str) -> list:
    """A comma-separated flag (`--batch-sizes 1,4,16`) as a list, or an error naming the flag."""
    try:
        return [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated numbers (e.g. {flag} 1,4,16), got '{text}'") from None


def cmd_plan(args) -> int:
    from draftsmith.distill.loading import load_target
    from draftsmith.eval.measure.plan import default_out, make_plan, prepare_out, write_plan
    from draftsmith.eval.measure.plan_choice import format_plan

    if len(args.drafter) > 1:
        return plan_several(args)
    cfg, serving = resolve(args.config, args.overrides, args.target, args.drafter[0])
    folder = serving.folder
    if folder is None:
        raise ValueError("draftsmith plan needs --drafter DIR: a drafter folder or an export")
    if args.into_drafter and args.out and Path(args.out).resolve() != folder.path.resolve():
        raise ValueError(f"--into-drafter writes into {folder.path} and --out names {args.out}: pass one of "
                         "them")
    # checked before the target loads and minutes of measuring: a folder that cannot be written fails now
    out = prepare_out(folder.path if args.into_drafter else args.out or default_out(cfg.log.run_dir,
                                                                                    folder.path))
    if args.engine:
        return engine_plan(args, cfg, serving, out)
    target = load_target(cfg.model, dtype=args.dtype)
    plan = make_plan(target, serving, prompts=args.prompts, calibration=args.calibration, offset=args.offset,
                     max_new_tokens=args.max_new_tokens, margin=args.margin, progress=cfg.log.progress,
                     batch_sizes=csv(args.batch_sizes, int, "--batch-sizes"),
                     contexts=csv(args.contexts, int, "--contexts"))
    path = write_plan(out, plan)
    rank0_print(format_plan(plan))
    if out.resolve() == folder.path.resolve():
        rank0_print(f"wrote {path}: eval and bench now serve this drafter with it (drafter.plan=false: the "
                    "recipe's settings)")
    else:
        rank0_print(f"wrote {path}; the drafter folder is unchanged: serve the plan with draftsmith eval "
                    f"--drafter {folder.path} --serving {path}")
    return 0


def plan_several(args) -> int:
    """`plan --drafter A --drafter B ...`: each drafter planned on the same calibration prompts with one
    loaded target (OUT/NAME/serving.json), then the one to serve per batch size (OUT/choice.json,
    eval/measure/plan.py)."""
    from draftsmith.distill.loading import load_target, resolve_target
    from draftsmith.eval.measure.evaluate import run_of
    from draftsmith.eval.measure.plan import make_plan, prepare_out, write_plan
    from draftsmith.eval.measure.plan_choice import (
        compare_plans,
        format_comparison,
        format_plan,
        write_choice,
    )

    if args.engine or args.into_drafter:
        raise ValueError("several --drafter plan on our decoder into --out: plan --engine and --into-drafter "
                         "take one drafter at a time")
    drafters = []
    for path in args.drafter:
        if not Path(path).is_dir():
            raise ValueError(f"--drafter {path} is not a drafter folder: several --drafter compare trained "
                             "drafters")
        cfg, serving = resolve(args.config, args.overrides, args.target, path)
        run, fmt = run_of(path)
        drafters.append((f"{run}-{fmt}" if fmt else run, cfg, serving))
    names = [name for name, *_ in drafters]
    if len(set(names)) < len(names):
        raise ValueError(f"two --drafter folders share a run name ({', '.join(names)}): each is planned into "
                         "OUT/NAME; give them distinct run folders")
    targets = {resolve_target(cfg.model.target, cfg.model.revision) for _, cfg, _ in drafters}
    if len(targets) > 1:
        raise ValueError(f"the drafters serve different targets ({', '.join(map(str, targets))}): plan each "
                         "alone, or pass --target")
    out = prepare_out(args.out or Path(drafters[0][1].log.run_dir) / "plan" / "+".join(names))
    target = load_target(drafters[0][1].model, dtype=args.dtype)
    plans = {}
    for name, cfg, serving in drafters:
        plans[name] = make_plan(target, serving, prompts=args.prompts, calibration=args.calibration,
                                offset=args.offset, max_new_tokens=args.max_new_tokens, margin=args.margin,
                                progress=cfg.log.progress,
                                batch_sizes=csv(args.batch_sizes, int, "--batch-sizes"),
                                contexts=csv(args.contexts, int, "--contexts"))
        write_plan(out / name, plans[name])
        rank0_print(format_plan(plans[name]))
    comparison = compare_plans(plans)
    path = write_choice(out, comparison)
    rank0_print(format_comparison(comparison))
    chosen = comparison["chosen"]
    serve = ("plain decoding" if chosen["plain"] else
             f"draftsmith eval --drafter {chosen['drafter']} --serving {out / chosen['serving']}"
             if chosen["drafter"]
             else "prompt lookup alone: draftsmith eval --drafter "
                  f"{plans[chosen['serving'].split('/')[0]]['drafter']} --serving {out / chosen['serving']}")
    rank0_print(f"wrote {path} and each drafter's plan in {out}/NAME/; serve: {serve}")
    return 0


def engine_plan(args, cfg, serving, out: Path) -> int:
    """`plan --engine vllm`: the chain length served fastest in the engine (eval/measure/engine_plan.py)."""
    import dataclasses

    from draftsmith.eval.measure.engine_plan import format_engine_plan, served_sweep, write_engine_plan
    from draftsmith.eval.measure.plan import default_out

    calibration = dataclasses.replace(cfg.eval, prompts=args.prompts, limit=args.calibration,
                                      offset=args.offset, max_new_tokens=args.max_new_tokens,
                                      dtype=args.dtype, temperature=0.0, categories=[], warmup=1)
    work = (out if not args.into_drafter else default_out(cfg.log.run_dir,
                                                          serving.folder.path)) / f"{args.engine}-runs"
    if args.engine == "llamacpp":  # eval/measure/engine_plan_llamacpp.py
        from draftsmith.eval.measure.engine_llamacpp import COMBINE_TYPES, NGRAM_TYPES
        from draftsmith.eval.measure.engine_plan_llamacpp import llamacpp_sweep, write_llamacpp_plan

        plan = llamacpp_sweep(serving, calibration, work, csv(args.chains, int, "--chains"),
                              () if args.no_ngram else NGRAM_TYPES, margin=args.margin,
                              combine=() if args.no_ngram else COMBINE_TYPES)
        path = write_llamacpp_plan(out, plan)
        rank0_print(format_engine_plan(plan))
        rank0_print(f"wrote {path} (an engine plan: llama.cpp serves chains and its n-gram types; our "
                    "decoder's plan is serving.json)")
        return 0
    plan = served_sweep(serving, calibration, work, csv(args.chains, int, "--chains"),
                        args.engine_concurrency, ngram=not args.no_ngram, engine=args.engine,
                        margin=args.margin, progress=cfg.log.progress)
    path = write_engine_plan(out, plan)
    rank0_print(format_engine_plan(plan))
    rank0_print(f"wrote {path} (an engine plan: {args.engine} serves chains only; our decoder's plan is "
                "serving.json)"
                + (f"; {out / 'SERVE.md'} carries the measured command" if (out / "SERVE.md").is_file()
                   else ""))
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
                        max_new_tokens=args.max_new_tokens, dtype=args.dtype, seed=args.seed,
                        fallback=args.fallback, fallback_margin=args.fallback_margin,
                        calibration_tokens=args.calibration_tokens,
                        calibration_prompts=args.calibration_prompts, peers=args.peers, out=args.out)
    result = run_bench(drafters, bench, progress=cfg.log.progress)
    rank0_print(format_bench(result))
    rank0_print(f"wrote {Path(args.out) / 'bench.json'}, configs/ and the PNGs")
    return 0
