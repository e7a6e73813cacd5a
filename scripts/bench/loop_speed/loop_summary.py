"""loop_speed.sh's summary: the medians of RUNS runs per tree (OUT/new-<i>.json, OUT/old-<i>.json from
loop_speed.py), this tree over the other, and the same with each run divided by its own process's HF generate
-> OUT/summary.json.

    python scripts/bench/loop_speed/loop_summary.py OUT RUNS
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def main() -> None:
    out, runs = Path(sys.argv[1]), int(sys.argv[2])
    rows = {t: [json.loads((out / f"{t}-{i}.json").read_text()) for i in range(1, runs + 1)]
            for t in ("new", "old")}
    keys = [k for k in rows["new"][0] if k.endswith(("-b1", "-b4"))]
    hf_keys = {k for k in keys if k.startswith("hf-")}
    med = {t: {k: statistics.median(r[k] for r in rs) for k in keys} for t, rs in rows.items()}
    summary = {"median_tokens_per_s": med,
               "new_over_old": {k: round(med["new"][k] / med["old"][k], 4) for k in keys},
               "new_over_hf": {k: round(med["new"][k] / med["new"][f"hf-{k.split('-')[-1]}"], 4) for k in keys
                               if f"hf-{k.split('-')[-1]}" in hf_keys}}
    # Each process's own HF generate is its yardstick: a process that runs slow (the whole forward, from its
    # placement or allocator history) is slow for both, so loop/HF per run then new/old of the medians removes
    # the between-process spread that raw tokens/s carries (here up to 15%, against a 3% criterion).
    own = {t: {k: statistics.median(r[k] / r[f"hf-{k.split('-')[-1]}"] for r in rs) for k in keys
               if not k.startswith("hf-") and f"hf-{k.split('-')[-1]}" in hf_keys} for t, rs in rows.items()}
    summary["per_process_hf_normalised"] = {"median_loop_over_hf": own,
                                            "new_over_old": {k: round(own["new"][k] / own["old"][k], 4)
                                                             for k in own["new"]}}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
