"""One table from the pipeline run folders of an ablation (scripts/bench/ablations/draft_ablation.sh,
scripts/bench/ablations/objective_ablation.sh).

For each row folder: what it trained with (drafter kind and loss, on-policy share, steps, seconds, whether the
kept drafter was the best by validation; read from the folder's own config.resolved.yaml and
train_summary.json, not from a hand-kept list), its last validation (top-1 per TTT step, expected τ of a chain
and of the serving tree) and its eval τ with acceptance by depth, for each eval folder named. A row whose
folder or evals are not finished yet is named and left out, so a call with every row name tabulates whatever
earlier calls (or sessions) finished. Writes OUT/table.json and prints the table.

    python scripts/bench/ablations/ablation_table.py OUT ROW [ROW ...] [--evals eval eval-chain-5]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml

from draftsmith.eval.measure.report import run_record


def row(run: Path, evals: list[str]) -> dict:
    cfg = yaml.safe_load((run / "config.resolved.yaml").read_text())
    return {"row": run.name, "kind": cfg["drafter"]["kind"], "loss": cfg["drafter"]["loss"],
            "onpolicy_ratio": cfg["train"].get("onpolicy_ratio", 0),
            "data_limit": (cfg.get("data") or {}).get("limit"), **run_record(run, {e: e for e in evals})}


def budget_warnings(rows: list[dict], evals: list[str]) -> list[str]:
    """What differs between rows that an equal-budget table assumes equal (rows from separate calls may
    differ)."""
    fields = {"train steps": lambda r: r["train_steps"], "answers (data.limit)": lambda r: r["data_limit"],
              **{f"{e} prompts x tokens": (lambda r, e=e: (r[e]["n_prompts"], r[e]["max_new_tokens"]))
                 for e in evals}}
    out = []
    for name, get in fields.items():
        values = {r["row"]: get(r) for r in rows}
        if len(set(map(str, values.values()))) > 1:
            out.append(f"warning: rows differ in {name}: " + ", ".join(f"{k} {v}" for k, v in values.items()))
    return out


def missing(run: Path, evals: list[str]) -> list[str]:
    """The files a finished row has and this one lacks (empty: the row is finished)."""
    need = ["config.resolved.yaml", *(f"{name}/summary.json" for name in evals)]
    return [name for name in need if not (run / name).is_file()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("rows", nargs="+")
    parser.add_argument("--evals", nargs="+", default=["eval"],
                        help="eval folders inside each row (default: eval)")
    args = parser.parse_args()
    out = Path(args.out)
    unfinished = {name: missing(out / name, args.evals) for name in args.rows}
    unfinished = {name: lack for name, lack in unfinished.items() if lack}
    for name, lack in unfinished.items():
        print(f"[table] {name}: not finished, left out (no {', '.join(lack)} in {out / name})")
    rows = [row(out / name, args.evals) for name in dict.fromkeys(args.rows) if name not in unfinished]
    if not rows:
        raise SystemExit(f"no finished row under {out}: a row needs config.resolved.yaml and "
                         + ", ".join(f"{e}/summary.json" for e in args.evals)
                         + " (run the ablation script first)")
    (out / "table.json").write_text(json.dumps(rows, indent=2) + "\n")
    head = f"{'row':18s} {'loss':10s} {'steps':>6s} {'val top-1':>9s}"
    print(head + "".join(f"  {'τ ' + e:>14s}  α@1..4" for e in args.evals))
    for r in rows:
        top1 = "–" if r["val_top1"] is None else f"{r['val_top1']:.3f}"
        line = f"{r['row']:18s} {r['loss']:10s} {r['train_steps'] or 0:6d} {top1:>9s}"
        for e in args.evals:
            line += f"  {r[e]['tau']:14.3f}  " + "/".join(f"{a:.2f}" for a in r[e]["acceptance_by_depth"][:4])
        print(line)
    # e.g. an untrained row on purpose, or a row from another call
    for warning in budget_warnings(rows, args.evals):
        print(warning)


if __name__ == "__main__":
    main()
