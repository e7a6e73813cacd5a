"""The block drafters' table (scripts/bench/block_drafters/block_drafters.sh): every finished row under OUT
with what it trained (levers.py's `collect`: row_record, evals, τ paired against the eagle3 row on the same
prompts) plus its drafter's shape read from its own config.resolved.yaml (draft layers, block, slot weight,
Markov rank), and which block drafter the choice split picks -> OUT/block-drafters.json.

    python scripts/bench/block_drafters/block_drafters.py OUT [--command "..."] [--note "..." ...]

The pick: among the block rows (every kind but eagle3: the eagle3 rows are the baseline and its levers), the
highest pooled τ on the choice split at the chain all of them were judged at (chain-4); the report split then
gives its figures and its paired interval against EAGLE-3, prompts it was not picked on. Each `X-acc` row
(steps or slots weighted by exact acceptance) is also paired against its row `X` (the decay it replaces), and
any row `X-L` against `X` when `X` is not eagle3 (lever L on top of X): each lever's ablation.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml

from draftsmith.eval.measure.campaign import (
    accept_lengths,
    command_line,
    host_block,
    load_file,
    pooled_delta,
)

collect = load_file(Path(__file__).resolve().parents[1] / "levers" / "levers.py", "levers").collect

SHAPE_KEYS = ("num_layers", "block_size", "markov_rank", "confidence_head", "anchors", "draft_vocab",
              "slot_weights", "step_weights", "norm_before_fc", "fc_norm", "norm_output", "train_lm_head")


def shape(run: Path) -> dict:
    cfg = yaml.safe_load((run / "config.resolved.yaml").read_text())
    drafter = cfg["drafter"]
    own = drafter.get(drafter["kind"].replace("-", "_")) or {}
    out = {k: own[k] for k in SHAPE_KEYS if k in own}
    out.update(chain=drafter["num_speculative_tokens"], head_decay=drafter.get("head_decay"),
               loss=drafter.get("loss"), answers=(cfg.get("data") or {}).get("limit"),
               optimizer=(cfg.get("train") or {}).get("optimizer", "adamw"),
               muon_lr=(cfg.get("train") or {}).get("muon_lr"),
               group_by_length=bool((cfg.get("train") or {}).get("group_by_length")))
    return out


def paired(out: Path, name: str, other: str, evals) -> dict:
    """Row `name` minus row `other` in τ, prompt by prompt, on every eval both ran."""
    return {e: pooled_delta(accept_lengths(out / name / f"eval-{e}"),
                            accept_lengths(out / other / f"eval-{e}"))
            for e in evals
            if all((out / row / f"eval-{e}" / "samples.jsonl").is_file() for row in (name, other))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--command", default=None)
    parser.add_argument("--note", action="append", default=[])
    args = parser.parse_args()
    out = Path(args.out)
    data = collect(out, "eagle3")
    for name, row in data["rows"].items():
        row["shape"] = shape(out / name)
    for name, row in data["rows"].items():
        if "dflash" in data["rows"] and name != "dflash" and row["kind"] != "eagle3":
            row["paired_dflash"] = paired(out, name, "dflash", row["evals"])  # against the shipped shape
        # a lever's row against the row it extends (its name without the last suffix): an -acc row against the
        # decay it replaces, eagle3-muon10-nbf against eagle3-muon10; the baseline is paired already
        twin = name.rsplit("-", 1)[0]
        if twin != name and twin in data["rows"] and (name.endswith("-acc") or twin != "eagle3"):
            row["paired_twin"] = {"twin": twin, **paired(out, name, twin, row["evals"])}
    blocks = {n: r for n, r in data["rows"].items()
              if r["kind"] != "eagle3" and "choice-chain-4" in r["evals"]}
    if blocks:
        data["pick"] = max(blocks, key=lambda n: blocks[n]["evals"]["choice-chain-4"]["tau"])
    data.update(command=args.command or command_line(), host=host_block(), notes=args.note)
    (out / "block-drafters.json").write_text(json.dumps(data, indent=2) + "\n")
    for name, r in data["rows"].items():
        print(f"{name:12s} {r['kind']:7s} {r['train_steps']:5d} steps  " + "  ".join(
            f"{e} {v['tau']:.3f}" + (f" ({r['paired'][e]['delta_tau']:+.3f})" if e in r.get("paired", {})
                                     else "") for e, v in r["evals"].items()))
    print("pick:", data.get("pick"))


if __name__ == "__main__":
    main()
