"""export_eval.sh's Python: what a run's drafter exports to and how its eval ran, and the comparison of each
export's eval with the run folder's own.

    python scripts/dev/export_eval.py formats RUN               the formats RUN/drafter exports to
    python scripts/dev/export_eval.py settings RUN              RUN/eval's prompt count, new tokens, target,
                                                                prompts
    python scripts/dev/export_eval.py compare OUT.json REF EXP [REF EXP ...]

`compare`: per (folder eval, export eval) pair, τ of each and the prompts whose ids, output ids and accept
lengths are identical (the folder's eval compared its ids with HF generate, so identical ids are greedy
equality); writes OUT.json and prints one line per export.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def settings(run: Path) -> str:
    summary = json.loads((run / "eval" / "summary.json").read_text())
    limit = sum(1 for _ in open(run / "eval" / "samples.jsonl"))
    return f"{limit} {summary['max_new_tokens']} {summary['target']} {summary['prompts']}"


def compare(out: Path, pairs: list[str]) -> list[dict]:
    rows = []
    for ref, exp in zip(pairs[::2], pairs[1::2], strict=True):
        a = [json.loads(x) for x in Path(ref, "samples.jsonl").read_text().splitlines()]
        b = [json.loads(x) for x in Path(exp, "samples.jsonl").read_text().splitlines()]
        sa, sb = (json.loads(Path(d, "summary.json").read_text()) for d in (ref, exp))
        same = [x["id"] == y["id"] and x["output_ids"] == y["output_ids"]
                and x["accept_lengths"] == y["accept_lengths"]
                for x, y in zip(a, b, strict=True)]
        rows.append({"export": str(Path(exp).parent.name), "folder_eval": ref, "prompts": len(a),
                     "tau_folder": sa["tau"], "tau_export": sb["tau"], "tree_folder": sa.get("tree"),
                     "tree_export": sb.get("tree"), "identical_prompts": sum(same),
                     "greedy_equal_to_hf": sum(x.get("equal_to_hf", False) and s for x, s in zip(a, same))})
    out.write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("formats").add_argument("run", type=Path)
    sub.add_parser("settings").add_argument("run", type=Path)
    c = sub.add_parser("compare")
    c.add_argument("out", type=Path)
    c.add_argument("pairs", nargs="*", help="REF_EVAL EXPORT_EVAL, repeated")
    args = parser.parse_args()
    if args.what == "formats":
        from draftsmith.heads.folder import read_folder

        print(" ".join(read_folder(f"{args.run}/drafter").formats))
    elif args.what == "settings":
        print(settings(args.run))
    else:
        for r in compare(args.out, args.pairs):
            print(f"{r['export']:<40} tau folder {r['tau_folder']:.4f} export {r['tau_export']:.4f}  "
                  f"identical {r['identical_prompts']}/{r['prompts']}  greedy equal "
                  f"{r['greedy_equal_to_hf']}/{r['prompts']}")


if __name__ == "__main__":
    main()
