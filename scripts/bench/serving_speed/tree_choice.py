"""tree_budget.sh's choice: the serving tree with the most tokens/s on the calibration prompts
(OUT/calibration/<tree>/, Spec-Bench from prompt 240 on), never on the prompts whose figures are reported ->
OUT/choice.json.

    python scripts/bench/serving_speed/tree_choice.py OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> None:
    out = Path(sys.argv[1])
    cal = {p.parent.name: json.loads(p.read_text()) for p in (out / "calibration").glob("*/summary.json")}
    best = max(cal, key=lambda k: cal[k]["tokens_per_s"])
    (out / "choice.json").write_text(json.dumps({"chosen_on": "calibration (eval.offset=240)", "chosen": best,
        "calibration": {k: {"tau": v["tau"], "tokens_per_s": v["tokens_per_s"], "speedup": v["speedup"]}
                        for k, v in cal.items()}}, indent=2) + "\n")
    print(f"[tree-budget] calibration chose {best}")


if __name__ == "__main__":
    main()
