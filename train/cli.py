"""draftsmith: train speculative-decoding drafters for any Hugging Face causal LM, judge them, plan and export
them.

    draftsmith pipeline -c configs/runs/X.yaml [a.b=c ...]    the whole job: data -> train -> export -> eval
    draftsmith config | regenerate | extract | train -c X.yaml  one stage (train/pipeline: --resume | --fresh)
    draftsmith export --run DIR --format FORMAT --out DIR2      a serving layout + SERVE.md (engine commands)
    draftsmith eval | plan | bench | report                    measure a drafter, choose its serving settings
    draftsmith engine install vllm; draftsmith eval --engine vllm --drafter DIR    served by the engine itself
    draftsmith engine install llamacpp; draftsmith eval --engine llamacpp ...    the same in llama.cpp (CPU)
    draftsmith launch ddp -- train -c X.yaml                    every GPU of this machine, the config checked
    once draftsmith size -c X.yaml [model.target=...]                disk, GPU memory and tokens, from
    config.json alone

The parser imports nothing heavy (the commands live in train/commands.py and, plan and bench,
train/measure_commands.py, imported after parsing), so `--help` and argument errors answer at once.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
import warnings

# The kinds and formats are discovered from heads/ (importing torch), so the parser names the command that
# lists them; tests/unit/test_cli.py keeps ENGINE_NAMES equal to eval/measure/engine.py ENGINES.
KIND_NAMES = "a drafter kind (draftsmith kinds lists them)"
FORMAT_NAMES = "see draftsmith kinds"
ENGINE_NAMES = ["vllm", "llamacpp"]

# what each subcommand is for, and one example (shown by `draftsmith COMMAND --help`)
EXAMPLES = {
    "config": "draftsmith config -c configs/runs/smollm2-eagle3.yaml train.lr=3e-4",
    "target": "draftsmith target --target smollm2-135m-instruct",
    "regenerate": "draftsmith regenerate -c configs/runs/smollm2-eagle3.yaml --out runs/eagle3",
    "extract": "draftsmith extract -c configs/runs/smollm2-eagle3.yaml --out runs/eagle3",
    "train": "draftsmith train -c configs/runs/smollm2-eagle3.yaml --out runs/eagle3",
    "pipeline": "draftsmith pipeline -c configs/runs/smollm2-eagle3-quick.yaml --out runs/eagle3-quick",
    "tree-opt": "draftsmith tree-opt --run runs/medusa --nodes 48",
    "export": "draftsmith export --run runs/eagle3 --format eagle3 --out runs/eagle3/export/eagle3",
    "eval": "draftsmith eval --target smollm2-135m-instruct --drafter runs/eagle3/drafter --limit 20",
    "plan": "draftsmith plan --drafter runs/eagle3/drafter --out runs/plan/eagle3",
    "bench": "draftsmith bench --drafter runs/eagle3/drafter --batch-sizes 1,4 --temperatures 0,1",
    "engine": "draftsmith engine install vllm",
    "report": "draftsmith report runs/*/eval --out runs/report",
    "launch": "draftsmith launch ddp -- train -c my-eagle3.yaml --out runs/mine",
    "kinds": "draftsmith kinds",
    "size": "draftsmith size -c smollm2-eagle3 --target-config configs/models/llama-3.1-8b.json",
}


def add_command(sub, name: str, help: str):
    """A subcommand with its description (the help line), its example, and defaults shown in every option's
    help."""
    return sub.add_parser(name, help=help, description=help[:1].upper() + help[1:] + ".",
                          epilog=f"example:\n  {EXAMPLES[name]}", formatter_class=HelpFormatter)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Each option's default after its help (where it has one worth showing); the example keeps its line."""

    def _get_help_string(self, action):
        shown = action.default not in (None, False, argparse.SUPPRESS) and action.option_strings
        return action.help + (" (default: %(default)s)" if shown and "%(default)" not in action.help else "")


def quiet_third_parties(verbose: int) -> None:
    """Below -v, other libraries' warnings, progress bars and info logs stay out of our progress lines (set
    before they are imported); -v lets their warnings and bars through, -vv their info logs."""
    if verbose >= 1:
        return
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning,
                            module=r"(torch|transformers|accelerate|deepspeed)\.")
    for name in ("transformers", "datasets", "accelerate", "DeepSpeed", "deepspeed", "torch.distributed"):
        logging.getLogger(name).setLevel(logging.ERROR)


def add_eval_flags(parser) -> None:
    """Flags for quick use without a config; each overrides the matching config key."""
    parser.add_argument("--target", help="model.target: preset, HF folder or .gguf")
    parser.add_argument("--drafter", help=f"{KIND_NAMES} | <drafter folder or export>")
    parser.add_argument("--prompts", help="spec-bench | mt-bench | FILE.jsonl")
    parser.add_argument("--limit", type=int, help="eval.limit: prompts to evaluate")
    parser.add_argument("--categories", help="comma-separated categories")
    parser.add_argument("--max-new-tokens", type=int, help="eval.max_new_tokens per prompt")
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"],
                        help="eval.dtype: the target's dtype for this eval (auto: bfloat16 where this CPU "
                             "multiplies it natively)")
    parser.add_argument("--temperature", type=float, help="eval.temperature (0 = greedy)")
    parser.add_argument("--top-p", type=float, help="eval.top_p (1 = off)")
    parser.add_argument("--draft-sampling", choices=["sampled", "greedy"],
                        help="eval.draft_sampling at T > 0: drafts drawn from the drafter's law, or its "
                             "argmax (the rule vLLM and llama.cpp serve; --engine uses the engine's)")
    parser.add_argument("--tree", help="static tree name (configs/trees) or JSON file; chain-N for a chain; "
                                       "dynamic-N for an EAGLE-2 dynamic tree of N nodes")
    parser.add_argument("--out", help="output folder")


def with_config(p):
    p.add_argument("-c", "--config", help="run YAML (configs/runs/*.yaml); without it the defaults")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.lr=3e-4")
    return p


def add_run_commands(add) -> None:
    """The run's stages: config, target, regenerate, extract, train, pipeline, tree-opt, export."""
    with_config(add("config", help="print the resolved config")).set_defaults(fn="cmd_config")
    p = add("target", help="prepare the target (download/convert once) and run a greedy demo")
    p.add_argument("--target", default="smollm2-135m-instruct", help="preset, HF Hub id, folder or .gguf")
    p.add_argument("--dtype", default="float32", choices=["auto", "float32", "bfloat16"],
                   help="weights dtype")
    p.add_argument("--prompt", default="What is speculative decoding? Answer in one sentence.",
                   help="the demo's user turn")
    p.add_argument("--max-new-tokens", type=int, default=48, help="tokens the demo generates")
    p.set_defaults(fn="cmd_target")
    p = with_config(add("regenerate", help="the target answers the prompts (self-distillation)"))
    p.add_argument("--out", help="run folder (default <log.run_dir>/<name>)")
    p.set_defaults(fn="cmd_regenerate")
    for name, fn, text in [("extract", "cmd_extract",
                            "target features -> safetensors shards (offline training)"),
                           ("train", "cmd_train", "train the drafter (offline shards or online target)"),
                           ("pipeline", "cmd_pipeline",
                            "regenerate -> extract/online -> train -> export -> eval")]:
        p = with_config(add(name, help=text))
        p.add_argument("--out", help="run folder (default <log.run_dir>/<name>)")
        if name in ("train", "pipeline"):
            again = p.add_mutually_exclusive_group()
            again.add_argument("--resume", action="store_true", help=(
                "continue from the latest complete checkpoint, also past the end of a finished run when only "
                "train.max_steps / epochs / max_minutes changed (the schedule is re-sized to the new "
                "length). Without either flag a rerun into a folder resumes its checkpoint by itself when "
                "the settings that shape training match, leaves a finished run alone, and refuses naming the "
                "settings that differ"))
            again.add_argument("--fresh", action="store_true", help=(
                "start training over: the folder's checkpoints, metrics, drafter, exports and evals are "
                "moved (never deleted) into OUT/superseded/<time>/; the regenerated answers and features are "
                "kept and reused"))
        if name == "extract":
            p.add_argument("--verify", action="store_true",
                           help="check every shard's checksum instead of extracting")
        p.set_defaults(fn=fn)
    p = add("tree-opt", help="best static tree for a node budget from measured head accuracies")
    p.add_argument("--run", required=True, help="run folder with drafter/ and config.resolved.yaml")
    p.add_argument("--nodes", type=int, default=48, help="node budget (verification width)")
    p.add_argument("--ranks", type=int, default=10, help="top-k candidates measured per head")
    p.add_argument("--sequences", type=int, default=64, help="validation sequences to measure on")
    p.add_argument("--out", help="tree JSON (default <run>/tree-opt-<nodes>.json)")
    p.add_argument("overrides", nargs="*",
                   help="dotted overrides of the run's config, e.g. data.max_length=512")
    p.set_defaults(fn="cmd_tree_opt")
    p = add("export", help="write a trained drafter in a serving layout")
    p.add_argument("--run", required=True, help="run folder holding drafter/")
    p.add_argument("--format", required=True, metavar="FORMAT",
                   help=f"serving layout, one the drafter's kind writes: {FORMAT_NAMES}")
    p.add_argument("--out", required=True, help="folder to write the export into")
    p.add_argument("--base-model",
                   help="the target as engines should name it (default: the run's target's Hub id or "
                        "resolved folder)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"],
                   help="weights dtype")
    p.set_defaults(fn="cmd_export")


def add_measure_commands(add) -> None:
    """Measuring a drafter: eval (and --engine), plan, bench, engine, report."""
    p = with_config(add("eval", help="τ, acceptance, speedup and losslessness of a drafter"))
    add_eval_flags(p)
    p.add_argument("--serving",
                   help="a plan's serving.json (draftsmith plan --out) to serve the drafter with; default: "
                        "the drafter folder's own serving.json if it has one (drafter.plan=false: the "
                        "config's settings). summary.json records which served")
    p.add_argument("--engine", choices=ENGINE_NAMES,
                   help="serve the drafter in this engine too (installed by draftsmith engine install) on "
                        "the same prompts: served vs our acceptance per position, greedy equality, the "
                        "engine's speed with and without it")
    p.add_argument("--engine-concurrency", type=int, default=8,
                   help="with --engine: prompts per llm.generate call, measured beside batch 1")
    p.add_argument("--engine-ngram", default="all",
                   help="with --engine llamacpp: its n-gram spec types served as drafter-free rows (all, "
                        "none, or a comma-separated list such as ngram-simple,ngram-mod)")
    p.add_argument("--engine-combine",
                   help="with --engine llamacpp: also serve the drafter behind these n-gram types (none, or "
                        "a comma-separated list such as ngram-simple; --spec-type ngram-simple,draft-...: "
                        "the n-gram type drafts first, the drafter where it finds nothing); default: the one "
                        "the drafter's llama.cpp plan chose it behind, if any")
    p.add_argument("--engine-draft-threads", type=int,
                   help="with --engine llamacpp: threads of the draft model (-td/-tbd); default: what the "
                        "drafter's llama.cpp plan chose with its chain, else the target's")
    p.add_argument("--engine-no-quantized", action="store_true",
                   help="with --engine llamacpp: leave out the quantized target's pair (the GGUF the target "
                        "came from, served with and without the drafter beside the float one)")
    p.set_defaults(fn="cmd_eval")
    add_plan_command(add)
    p = with_config(add("bench", help="batched speculative decoding: speedup by batch size and temperature"))
    p.add_argument("--target", help="model.target: preset, HF folder or .gguf")
    p.add_argument("--drafter", action="append", required=True,
                   help=f"{KIND_NAMES} | <drafter folder or export>; repeat for several drafters")
    p.add_argument("--batch-sizes", default="1,4,16", help="comma-separated, e.g. 1,4,16")
    p.add_argument("--temperatures", default="0", help="comma-separated, 0 = greedy, e.g. 0,0.7,1.0")
    p.add_argument("--prompts", default="spec-bench", help="spec-bench | mt-bench | FILE.jsonl")
    p.add_argument("--limit", type=int, default=32, help="prompts timed")
    p.add_argument("--categories", help="comma-separated categories")
    p.add_argument("--max-new-tokens", type=int, default=128, help="tokens per prompt")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], help="model.dtype")
    p.add_argument("--tree", help="draft tree for every drafter (default: each drafter's own)")
    p.add_argument("--no-fallback", dest="fallback", action="store_false",
                   help="always speculate, even where calibration finds plain decoding faster")
    p.add_argument("--fallback-margin", type=float, default=0.05,
                   help="speculation must beat plain decoding by this fraction in calibration to be kept "
                        "(a margin above timing noise, so the fall-back errs toward plain decoding)")
    p.add_argument("--calibration-tokens", type=int, default=32, help="tokens per fall-back calibration run")
    p.add_argument("--calibration-prompts", type=int, default=8,
                   help="prompts the fall-back calibration decodes")
    p.add_argument("--no-peers", dest="peers", action="store_false",
                   help="skip the HF generate / assisted peers")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--out", default="runs/bench", help="output folder")
    p.set_defaults(fn="cmd_bench")
    p = add("engine", help="install a serving engine under $DRAFTSMITH_HOME/engines (vLLM: its own venv; "
                           "llama.cpp: built from source), or write a target as llama.cpp's GGUF")
    p.add_argument("action", choices=["install", "gguf"],
                   help="install: the engine; gguf: --target as a GGUF (llamacpp)")
    p.add_argument("name", choices=ENGINE_NAMES, help="the engine")
    p.add_argument("--print-python", action="store_true",
                   help="print the engine venv's python (llama.cpp: llama-server) alone on stdout, "
                        "installing first if needed")
    p.add_argument("--target", help="gguf: the target (preset, HF folder or Hub id)")
    p.add_argument("--out", help="gguf: the GGUF file to write")
    p.add_argument("--outtype", default="f16", choices=["f32", "f16", "bf16", "q8_0"],
                   help="gguf: the converter's type")
    p.set_defaults(fn="cmd_engine")
    p = add("report", help="comparison table + report.md + PNGs from eval summaries (and bench.json)")
    p.add_argument("summaries", nargs="+", help="summary.json files or the eval folders holding them")
    p.add_argument("--bench", help="a bench.json from `draftsmith bench` (adds speedup vs batch size)")
    p.add_argument("--out", required=True, help="report folder")
    p.set_defaults(fn="cmd_report")


def add_plan_command(add) -> None:
    """`draftsmith plan`: the serving settings measured fastest here, for our decoder or an engine."""
    p = with_config(add("plan", help="measure the serving settings that make a drafter fastest on this "
                                                "machine -> serving.json (default <log.run_dir>/plan/<run>)"))
    p.add_argument("--drafter", action="append", required=True,
                   help="a drafter folder; repeat it to plan several drafters of one target on the same "
                        "prompts and pick the one to serve (OUT/NAME/serving.json each, OUT/choice.json)")
    p.add_argument("--target", help="model.target (default: the one the folder names)")
    p.add_argument("--prompts", default="spec-bench", help="spec-bench | mt-bench | FILE.jsonl")
    p.add_argument("--calibration", type=int, default=8, help="calibration prompts")
    p.add_argument("--offset", type=int, default=240,
                   help="skip this many prompts (disjoint from eval's first ones)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens per calibration decode")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="auto: bfloat16 where this machine multiplies it natively, else float32")
    p.add_argument("--margin", type=float, default=0.03,
                   help="speculation must beat plain by this fraction beyond the measured timing noise to be "
                        "chosen (negative: the fastest candidate that accepted anything, no noise guard)")
    p.add_argument("--batch-sizes", default="1",
                   help="comma-separated: a plan for each (eval and bench serve the one measured at their "
                        "batch size)")
    p.add_argument("--contexts", default="256",
                   help="comma-separated context lengths to measure verification after (e.g. 256,2048; the "
                        "one nearest the calibration prompts explains the choice)")
    p.add_argument("--out", help="folder to write serving.json into, created if missing (default "
                                 "<log.run_dir>/plan/<run>, e.g. runs/plan/X for runs/X/drafter); eval "
                                 "serves it with --serving OUT/serving.json")
    p.add_argument("--into-drafter", action="store_true",
                   help="write serving.json into the drafter folder: eval and bench then serve it by default")
    p.add_argument("--engine", choices=ENGINE_NAMES,
                   help="plan for this serving engine instead of our decoder: the chain length (or the "
                        "engine's n-gram, or none) served fastest there -> serving-vllm.json or "
                        "serving-llamacpp.json (+ a SERVE.md section beside an export)")
    p.add_argument("--chains", default="1,2,3,4,5", help="with --engine: the chain lengths to serve")
    p.add_argument("--engine-concurrency", type=int, default=8,
                   help="with --engine: requests in flight, planned beside batch 1")
    p.add_argument("--no-ngram", action="store_true",
                   help="with --engine: leave the engine's n-gram lookup out")
    p.set_defaults(fn="cmd_plan")


def add_machine_commands(add) -> None:
    """The machine: launch a stage on its processes, size a recipe before spending."""
    p = add("launch",
            help="run a stage on every GPU of this machine (or N CPU processes) with a shipped accelerate "
                 "preset sized to it; the config is checked once before any process starts")
    p.add_argument("preset",
                   help="a shipped preset (single, ddp, fsdp, zero2, zero3, multinode-ddp, multinode-zero3) "
                        "or an accelerate YAML file")
    p.add_argument("--num-processes", type=int,
                   help="processes to start (default: the visible CUDA devices, times the nodes of a "
                        "multi-node preset; 1 on a CPU)")
    p.add_argument("--mixed-precision", choices=["no", "bf16", "fp16"],
                   help="the launcher's mixed precision (default: bf16 where the GPU or CPU multiplies it "
                        "natively, fp16 on older GPUs, else no); train.mixed_precision in the recipe decides "
                        "what training uses")
    p.add_argument("--machine-rank", type=int,
                   help="multi-node presets: this node's rank (0 on the rendezvous node)")
    p.add_argument("--main-process-ip", help="multi-node presets: the rendezvous node's address")
    p.add_argument("--print-config", action="store_true",
                   help="print the preset resolved for this machine (its installed path, processes, "
                        "precision, DeepSpeed JSON) for raw `accelerate launch`, and exit")
    p.add_argument("command_args", nargs="*", metavar="-- STAGE ARGS",
                   help="after --: the draftsmith stage and its arguments, e.g. -- train -c RECIPE --out "
                        "runs/NAME")
    p.set_defaults(fn="cmd_launch")
    p = add("size",
            help="disk, GPU memory and tokens a recipe needs, from config.json files alone (no weights)")
    p.add_argument("-c", "--config", help="run YAML (configs/runs/*.yaml) or a shipped recipe's name")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. model.target=meta-llama/Llama-3.1-8B")
    p.add_argument("--target-config",
                   help="a bare config.json of the target (instead of resolving model.target through a local "
                        "folder or the HF cache)")
    p.add_argument("--num-processes", type=int, default=1,
                   help="data-parallel processes (shards ZeRO/FSDP states)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON instead of a table")
    p.set_defaults(fn="cmd_size")
    add("kinds", help="the drafter kinds and the export formats each writes").set_defaults(fn="cmd_kinds")


def build_parser() -> argparse.ArgumentParser:
    from importlib.metadata import PackageNotFoundError, version

    parser = argparse.ArgumentParser(prog="draftsmith",
                                     description=" ".join(__doc__.split("\n\n")[0].split()),
                                     epilog="draftsmith COMMAND --help: what it does, an example, every "
                                            "option",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more output: -v shows third-party warnings and progress bars (transformers, "
                             "datasets, DeepSpeed), -vv their info logs too")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no progress bars, ours or third parties' (TQDM_DISABLE)")
    try:
        parser.add_argument("--version", action="version", version=f"draftsmith {version('draftsmith')}")
    except PackageNotFoundError:  # run from a tree that was never installed
        parser.add_argument("--version", action="version", version="draftsmith (not installed)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    for group in (add_run_commands, add_measure_commands, add_machine_commands):
        group(functools.partial(add_command, sub))
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # `launch ... -- STAGE ARGS`: split here, argparse's REMAINDER would swallow launch's own options
    stage = None
    if "--" in argv and "launch" in argv[:argv.index("--")]:
        argv, stage = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    args = build_parser().parse_args(argv)
    if stage is not None:
        args.command_args = stage
    quiet_third_parties(args.verbose)
    if args.quiet:
        os.environ["TQDM_DISABLE"] = "1"  # every tqdm bar, ours included (tqdm >= 4.66 reads it)
    from draftsmith.train import commands
    from draftsmith.train.launch import ERRORS_ENV, record_failure

    if args.fn == "cmd_launch":
        args.build_parser = build_parser  # launch checks the stage's arguments with this parser, once
    try:
        code = getattr(commands, args.fn)(args)
    except commands.ERRORS as exc:
        if os.environ.get("DRAFTSMITH_DEBUG"):
            raise
        # under draftsmith launch the parent reports it once
        if not record_failure(args.command, 2, str(exc)):
            print(f"draftsmith {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a bug: under draftsmith launch one traceback (the parent's), not one per rank
        if not os.environ.get(ERRORS_ENV):
            raise
        import traceback

        record_failure(args.command, 1, f"{type(exc).__name__}: {exc}", traceback.format_exc())
        return 1
    if code:
        record_failure(args.command, code)
    return code


if __name__ == "__main__":
    sys.exit(main())
