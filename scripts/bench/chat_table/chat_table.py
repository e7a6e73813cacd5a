"""The general-chat drafter table's JSON: each finished recipe run, its budget, what chat_table.sh measured.

    python scripts/bench/chat_table/chat_table.py OUT.json RECIPE=RUN [RECIPE=RUN ...] [--command C]
                                                  [--note T]

Per run, from its own files (no model is loaded): what it trained with and how long (`row_record`: steps,
epochs, seconds, samples), the pipeline's stage seconds (pipeline.json: regenerate, extract, train, ...) and
the wall and core-hours they make (`budget_hours`: extraction from the feature shards' own records where
they hold them, torch threads from the run, else the host's), and every `chat-*` eval folder chat_table.sh
wrote: τ,
acceptance by depth and τ per category (`by_category`) keyed by prompt set, shape and temperature;
`chat-vllm` / `chat-llamacpp`: served α beside ours (`engine_record`) and, for llama.cpp, its n-gram row and
speed against plain.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from draftsmith.eval.measure.campaign import budget_hours, engine_record, eval_summary, host_block, row_record

SETS = {"sb": "spec-bench", "mt": "mt-bench"}


def eval_entry(summary: dict) -> dict:
    """What the page keeps of one chat eval."""
    return {"prompts": summary.get("prompts"), "n_prompts": summary.get("n_prompts"),
            "max_new_tokens": summary.get("max_new_tokens"), "dtype": summary.get("dtype"),
            "temperature": summary.get("temperature"), "tree": summary.get("tree"), "tau": summary.get("tau"),
            "acceptance_by_depth": summary.get("acceptance_by_depth"),
            "by_category": {c: {"tau": v["tau"], "n": v["n"]}
                            for c, v in (summary.get("by_category") or {}).items()}}


def served_entry(summary: dict) -> dict:
    """What the page keeps of an engine eval: `engine_record`, and llama.cpp's n-gram rows."""
    rec = {"engine": summary.get("engine", "vllm"), **engine_record(summary)}
    if summary.get("ngram"):
        rec["ngram"] = {t: {k: v.get(k) for k in ("tau", "speedup", "tokens_per_s")}
                        for t, v in summary["ngram"].items()}
    return rec


def recipe_row(recipe: str, run: Path) -> dict:
    for need in ("config.resolved.yaml", "train_summary.json"):
        if not (run / need).is_file():
            raise SystemExit(f"chat_table: {run} has no {need}: finish `draftsmith pipeline -c {recipe}` "
                             "first")
    row = {"recipe": recipe, "run": str(run), **row_record(run), "evals": {}, "served": {}}
    for folder in sorted(run.glob("chat-*")):
        summary = eval_summary(folder)
        if summary is None:
            continue
        name = folder.name.removeprefix("chat-")
        if name in ("vllm", "llamacpp"):
            row["served"][name] = served_entry(summary)
        else:
            row["evals"][name] = eval_entry(summary)
    if not row["evals"]:
        raise SystemExit(f"chat_table: {run} has no finished chat-* eval: run chat_table.sh first")
    made = {name: (e["n_prompts"], e["max_new_tokens"], e["dtype"]) for name, e in row["evals"].items()}
    if len(set(made.values())) > 1:  # a rerun with other LIMIT / TOKENS kept the finished folders
        raise SystemExit(f"chat_table: {run}'s chat evals differ in (prompts, tokens, dtype): {made}; move "
                         "the ones made with other settings aside and rerun chat_table.sh")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("runs", nargs="+", help="RECIPE=RUN")
    parser.add_argument("--command", default=None, help="the command that made the evals (chat_table.sh's)")
    parser.add_argument("--note", action="append", default=[])
    args = parser.parse_args()
    host = host_block()
    rows = []
    for spec in args.runs:
        recipe, sep, run = spec.partition("=")
        if not sep:
            raise SystemExit(f"chat_table: {spec!r}: write RECIPE=RUN")
        row = recipe_row(recipe, Path(run))
        row["budget"] = budget_hours(row, int(host.get("torch_threads") or 1))
        rows.append(row)
    command = args.command or "python scripts/bench/chat_table/chat_table.py " + " ".join(args.runs)
    result = {"command": command,
              "host": host, "rows": rows, "notes": args.note}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for r in rows:
        print(r["recipe"], {name: e["tau"] for name, e in r["evals"].items()})


if __name__ == "__main__":
    main()
