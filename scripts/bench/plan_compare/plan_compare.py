"""The serving plan across drafters of one target: which to serve on this machine, measured.

    python scripts/bench/plan_compare/plan_compare.py OUT DRAFTER [DRAFTER ...] [--calibration 8]
                                         [--max-new-tokens 64] [--batch-sizes 1] [--note TEXT ...]

Runs `draftsmith plan --drafter D1 --drafter D2 ... --out OUT` (each drafter planned on the same calibration
prompts, prompt lookup alone among every plan's candidates; eval/measure/plan.py `compare_plans`), then writes
OUT/plan-compare.json: the choice per batch size and why, every drafter's chosen setting, and every candidate
each plan measured (τ, tokens/s, speedup over its own plain runs, ms per step drafting and verifying), with
the host and command. `python scripts/bench/results_pages.py --add plan-compare OUT/plan-compare.json`
publishes it. Speed is a figure only when nothing else ran on the host's cores.
"""

import argparse
import json
import sys
from pathlib import Path

from draftsmith.eval.measure.campaign import command_line, host_block


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("drafters", nargs="+")
    parser.add_argument("--calibration", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--batch-sizes", default="1")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--note", action="append", default=[])
    args = parser.parse_args()
    from draftsmith.train.cli import main as cli

    flags = ["plan", *(x for d in args.drafters for x in ("--drafter", d)), "--out", str(args.out),
             "--calibration", str(args.calibration), "--max-new-tokens", str(args.max_new_tokens),
             "--batch-sizes", args.batch_sizes, "--dtype", args.dtype, "log.progress=false"]
    if cli(flags) != 0:
        sys.exit("plan_compare: draftsmith plan failed")
    choice = json.loads((args.out / "choice.json").read_text())
    plans = {}
    for name, entry in choice["plans"].items():
        plan = json.loads((args.out / entry["serving"]).read_text())
        plans[name] = {"kind": plan["kind"], "drafter": plan["drafter"], "by_batch": {
            b: {"plain_tokens_per_s": part.get("plain_tokens_per_s"),
                "noise": (part.get("noise") or {}).get("relative"), "candidates": [
                    {k: c.get(k) for k in ("label", "tau", "tokens_per_s", "speedup", "speedup_se", "step_ms",
                                                      "skipped")} for c in part["candidates"]]}
            for b, part in plan["by_batch"].items()}}
    result = {"command": command_line(), "host": host_block(), "calibration": choice["calibration"],
              "dtype": choice["dtype"], "batch_sizes": choice["batch_sizes"],
              "choices": {b: {k: part[k] for k in ("chosen", "why", "drafters")}
                          for b, part in choice["by_batch"].items()},
              "plans": plans, "notes": args.note}
    (args.out / "plan-compare.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out / 'plan-compare.json'}")


if __name__ == "__main__":
    main()
