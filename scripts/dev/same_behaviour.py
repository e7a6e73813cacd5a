"""same_behaviour.sh's comparison: each recipe's run at the old and the new revision, saved weights byte for
byte (sha256 of every .safetensors outside checkpoints/) and eval samples token for token (ids, output ids,
accept lengths, τ) -> OUT/same-behaviour.json, printed.

    python scripts/dev/same_behaviour.py OUT OLD_SHA NEW_SHA RECIPE [RECIPE ...]
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

KEEP = ("id", "category", "output_ids", "accept_lengths", "tau")


def weights(run: Path) -> dict[str, str]:
    return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run.rglob("*.safetensors")) if "checkpoints" not in p.parts}


def samples(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "eval" / "samples.jsonl").read_text().splitlines()]
    return [{k: r.get(k) for k in KEEP if k in r} for r in rows]


def main() -> None:
    out, old, new, recipes = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
    rows = []
    for r in recipes:
        a, b = out / old / r, out / new / r
        wa, wb = weights(a), weights(b)
        rows.append({"recipe": r, "weight_files": sorted(wa), "weights_equal": wa == wb and bool(wa),
                     "weight_differences": sorted(k for k in set(wa) | set(wb) if wa.get(k) != wb.get(k)),
                     "samples_equal": samples(a) == samples(b), "samples": len(samples(a))})
    res = {"old": old, "new": new, "rows": rows,
           "settings": "fp32, train.max_steps=6, data.limit=48, eval 3 prompts x 24 tokens, seed 0",
           "all_equal": all(r["weights_equal"] and r["samples_equal"] for r in rows)}
    (out / "same-behaviour.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
