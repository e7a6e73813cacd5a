"""Full recipes side by side: what each pipeline run trained (steps, epochs, seconds) and what its evals
measured, beside EAGLE-3's full recipe at the same chain length from a committed campaign (#41: the parallel
drafters against EAGLE-3 at equal training budget).

    python scripts/bench/full_recipes/full_recipes.py OUT.json NAME=RUN_DIR [NAME=RUN_DIR ...]
        [NAME=EARLIER.json#RECIPE ...] [--evals eval eval-fp32-40]
        [--reference docs/results/data/engine-served-goal.json:eagle3-full] [--note TEXT ...]

NAME is the recipe (e.g. smollm2-dflash), RUN_DIR its `draftsmith pipeline` folder; what it trained with and
how long is `row_record` (draftsmith.eval.measure.campaign) of the folder (steps, epochs, seconds, the median
s / step, the last validation line). Each eval folder named in --evals that a run has is read (`summary.json`:
τ, acceptance by depth, prompts, tokens, dtype, tokens/s, step split); a run with none of them is an error
naming it; of two folders of one run made with the same settings (prompts, offset, tokens, dtype, tree) the
first in --evals order is kept (`evals_same_as` names the other). RUN_DIR/engine, where present, is the
drafter served by vLLM (`draftsmith eval --engine vllm --out RUN_DIR/engine`): served α beside ours. The page
puts evals made with the same settings (prompts, offset, tokens, dtype) in one table, whatever their folder is
called. The reference row is our decoder's figures for the named drafter of an `engine_served.py` campaign
JSON (float32, its prompts from 0), at each chain length an eval here drafted: compare it with an eval made
the same way (float32, the same prompts: `draftsmith eval --dtype float32 --limit N --tree chain-K`);
--reference-label says what it is to the rows (default: EAGLE-3's full recipe at equal training budget). Each
row also records whether it trained online or from offline features (extract.enabled) and the checkpoint
`train.select` kept, whose validation estimate the page sets beside the τ the pipeline's own eval measured,
and its optimiser. NAME=EARLIER.json#RECIPE carries the row RECIPE of an earlier full_recipes.py JSON (a
committed page's data: a run whose folder is gone) over as NAME, with that file's host and date (`carried`):
its τ, α and estimates compare with the other rows where the settings match; its seconds were timed on its
own host. No model is loaded: this only reads JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from draftsmith.eval.measure.campaign import (
    EVAL_KEYS,
    budget_hours,
    command_line,
    engine_record,
    host_block,
    row_record,
)


def recipe_row(name: str, run: Path, evals: list[str]) -> dict:
    """One run folder as a row: `row_record`, the recipe's budget and the kept checkpoint, each eval's summary
    and the vLLM eval where there is one."""
    from draftsmith.train.config import load_config

    for need in ("config.resolved.yaml", "train_summary.json"):
        if not (run / need).is_file():
            raise SystemExit(f"full_recipes: {run} has no {need}: finish `draftsmith pipeline` first")
    if not any((run / e / "summary.json").is_file() for e in evals):
        raise SystemExit(f"full_recipes: {run} has none of " + ", ".join(f"{e}/summary.json" for e in evals)
                         + ": finish `draftsmith pipeline` (or `draftsmith eval --out RUN_DIR/FOLDER`) first")
    cfg = load_config(run / "config.resolved.yaml")
    train = json.loads((run / "train_summary.json").read_text())
    row = {"recipe": name, "run": str(run), **row_record(run),
           "num_speculative_tokens": cfg.drafter.num_speculative_tokens,
           "features": "offline" if cfg.extract.enabled else "online", "epochs_asked": cfg.train.epochs,
           "max_minutes": cfg.train.max_minutes, "budget": train.get("budget"),
           "selected": train.get("selected"), "evals": {}}
    # settings -> the folder kept: a run judged twice the same way shows once, the first in --evals order
    seen = {}
    for e in evals:
        if (run / e / "summary.json").is_file():
            s = json.loads((run / e / "summary.json").read_text())
            key = (s.get("n_prompts"), s.get("offset") or 0, s.get("max_new_tokens"), s.get("dtype"),
                   s.get("tree"))
            if key in seen:
                row.setdefault("evals_same_as", {})[e] = seen[key]
                continue
            seen[key] = e
            row["evals"][e] = {k: s.get(k) for k in EVAL_KEYS}
    if (run / "engine" / "summary.json").is_file():  # `draftsmith eval --engine vllm --out RUN_DIR/engine`
        row["engine"] = engine_record(json.loads((run / "engine" / "summary.json").read_text()))
    return row


def carried_row(name: str, spec: str) -> dict:
    """`EARLIER.json#RECIPE`: that row of an earlier full_recipes.py JSON as `name`, marked with its source,
    host and date (module doc)."""
    path, _, recipe = spec.rpartition("#")
    if not Path(path).is_file():
        raise SystemExit(f"full_recipes: {name}={spec}: no file {path} (write NAME=EARLIER.json#RECIPE)")
    data, row = row_of(path, "recipe", recipe)
    host = data.get("host") or {}
    carried = {"source": path, "recipe": recipe, "date": host.get("date"), "device": host.get("device")}
    return {**row, "recipe": name, "carried": carried}


def row_of(path: str, field: str, value: str) -> tuple[dict, dict]:
    """(the campaign JSON at `path`, its first row whose `field` is `value`); an error naming the rows it
    has otherwise."""
    data = json.loads(Path(path).read_text())
    found = [r for r in data.get("rows", []) if r.get(field) == value]
    if not found:
        raise SystemExit(f"full_recipes: {path} has no row {value!r} "
                         f"(it has {[r.get(field) for r in data.get('rows', [])]})")
    return data, found[0]


def reference_row(spec: str, chains: set[int], label: str | None = None) -> dict:
    """`FILE:DRAFTER` of an engine_served.py campaign: our decoder's τ, α and draft ms at each chain in
    `chains`; `label` says on the page what the reference is to the rows (None: page.py's wording, EAGLE-3's
    0.7-epoch recipe at equal training budget)."""
    path, _, drafter = spec.rpartition(":")
    data, r = row_of(path, "drafter", drafter)
    by_k = {c["k"]: {"tau": c["ours_tau"], "alpha_by_position": c["ours_alpha"],
                     "draft_ms": c.get("ours_draft_ms")}
            for c in r["chains"] if c["k"] in chains}
    return {"drafter": drafter, "label": label, "source": path, "n_prompts": r["n_prompts"],
            "max_new_tokens": r["max_new_tokens"], "host": data["host"], "date": data["host"].get("date"),
            "notes": data.get("notes", []), "chains": by_k}


def chain_length(tree) -> int | None:
    """k of a `chain-k` tree label as eval summaries record it (None for any other tree)."""
    return int(tree.split("-")[1]) if isinstance(tree, str) and tree.startswith("chain-") else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("runs", nargs="+", help="NAME=RUN_DIR")
    parser.add_argument("--evals", nargs="+", default=["eval"])
    parser.add_argument("--reference", help="FILE:DRAFTER of an engine_served.py campaign JSON")
    parser.add_argument("--reference-label",
                        help="what the reference is to the rows (the page says it before the reference's "
                             "table; default: EAGLE-3's 0.7-epoch recipe at equal training budget)")
    parser.add_argument("--note", action="append", default=[])
    args = parser.parse_args()
    rows = []
    for spec in args.runs:
        name, sep, run = spec.partition("=")
        if not sep:
            raise SystemExit(f"full_recipes: {spec!r}: write NAME=RUN_DIR")
        rows.append(carried_row(name, run) if ".json#" in run else recipe_row(name, Path(run), args.evals))
    host = host_block()
    for row in rows:
        if "carried" not in row:  # a carried row keeps the cost its own host recorded
            row["cost"] = budget_hours(row, int(host.get("torch_threads") or 1))
    result = {"command": command_line(), "host": host, "evals": args.evals, "rows": rows,
              "notes": args.note}
    if args.reference:
        chains = {chain_length(e["tree"]) for r in rows for e in r["evals"].values()} - {None}
        result["reference"] = reference_row(args.reference, chains, args.reference_label)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for r in rows:
        print(r["recipe"], r["train_steps"], "steps", {e: v["tau"] for e, v in r["evals"].items()})


if __name__ == "__main__":
    main()
