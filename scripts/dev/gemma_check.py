"""gemma_check.sh's table: every eval under OUT (the quick recipes' pipeline evals and the fp32 evals) as one
row, with the stage seconds of its pipeline and the count of answers Gemma regenerated ->
OUT/gemma-check.json, printed as a markdown table.

    python scripts/dev/gemma_check.py OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def rows_of(out: Path) -> list[dict]:
    rows = []
    for summary in sorted(out.glob("*/eval/summary.json")) + sorted(out.glob("fp32-*/summary.json")):
        s = json.loads(summary.read_text())
        run = summary.parent.parent if summary.parent.name == "eval" else summary.parent
        record = json.loads((run / "pipeline.json").read_text()) if (run / "pipeline.json").is_file() else {}
        rows.append({"run": run.name, "kind": s["drafter_kind"], "dtype": s["dtype"], "tree": s["tree"],
                     "prompts": s["n_prompts"], "max_new_tokens": s["max_new_tokens"], "tau": s["tau"],
                     "tokens_per_s": s["tokens_per_s"], "plain_tokens_per_s": s["baseline_tokens_per_s"],
                     "hf_generate_tokens_per_s": s["hf_generate_tokens_per_s"], "speedup": s["speedup"],
                     "speedup_vs_hf": s["speedup_vs_hf"],
                     "greedy_equal": f"{s['greedy_equal_count']}/{s['n_prompts']}",
                     "stage_seconds": record.get("stage_seconds", {})})
    return rows


def main() -> None:
    out = Path(sys.argv[1])
    rows = rows_of(out)
    regen = out / "regenerated.jsonl"
    result = {"target": "gemma3-270m",
              "regenerated_answers": sum(1 for _ in regen.open()) if regen.is_file() else 0, "rows": rows}
    (out / "gemma-check.json").write_text(json.dumps(result, indent=2))
    print(f"regenerated answers: {result['regenerated_answers']}")
    print("| run | kind | dtype | tree | prompts x tokens | tau | tok/s | plain tok/s | HF tok/s | x plain | "
          "x HF | greedy equal |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['run']} | {r['kind']} | {r['dtype']} | {r['tree']} | {r['prompts']} x "
              f"{r['max_new_tokens']} | {r['tau']:.3f} | {r['tokens_per_s']:.1f} | "
              f"{r['plain_tokens_per_s']:.1f} | {r['hf_generate_tokens_per_s']:.1f} | {r['speedup']:.2f} | "
              f"{r['speedup_vs_hf']:.2f} | {r['greedy_equal']} |")


if __name__ == "__main__":
    main()
