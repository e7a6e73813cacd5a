"""The sizing table of docs/training-at-scale.md: `draftsmith size` for the vendored public configs
(configs/models/).

    python scripts/bench/training_cost/size_table.py [--json OUT.json]

Runs the same code as
`draftsmith size --target-config NAME drafter.kind=KIND model.dtype=auto data.max_length=2048
train.batch_size=4 --num-processes
8` for each target and kind, reading config.json files only, and prints the markdown table pasted into the
docs (and the figures as JSON with --json).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from draftsmith.train.config import load_config
from draftsmith.train.sizing import size_recipe

TARGETS = ["llama-3.1-8b", "qwen3-8b", "llama-3.1-70b"]
KINDS = ["eagle3", "eagle", "medusa", "draft-lm"]
OVERRIDES = ["model.dtype=auto", "data.max_length=2048", "train.batch_size=4"]
PROCESSES = 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="also write every figure to this JSON file")
    args = parser.parse_args()
    rows, figures = [], {}
    for target in TARGETS:
        for kind in KINDS:
            cfg = load_config(None, [f"drafter.kind={kind}", *OVERRIDES])
            s = size_recipe(cfg, target, num_processes=PROCESSES, count_data=False)
            figures[f"{target}/{kind}"] = s
            f, m, d = s["features"], s["memory"]["gb"], s["drafter"]
            rows.append(f"| {target} | {kind} | {s['target_shape']['parameters'] / 1e9:.2f}B | "
                        f"{d['trainable_parameters'] / 1e6:,.1f}M | {f['bytes_per_token']:,} | "
                        f"{f['gb_per_million_tokens']:.1f} | {m['ddp']['target']:.1f} | "
                        f"{m['ddp']['drafter+optimizer']:.1f} | {m['ddp']['activations']:.1f} | "
                        f"{m['ddp']['total']:.1f} | {m['zero2']['total']:.1f} | "
                        f"{m['zero3/fsdp']['total']:.1f} |")
    print("| target | kind | target params | drafter trainable | feature B/token | GB per 10⁶ tokens | "
          "target GB | drafter + AdamW GB (DDP) | activations GB | total DDP | total ZeRO-2 ×8 | total "
          "ZeRO-3/FSDP ×8 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
