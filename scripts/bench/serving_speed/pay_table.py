"""bench_pay.sh's table: every bench.json under OUT (one folder per cell and variant) as rows ->
OUT/bench-pay.json, a markdown table printed and OUT/bench-pay.png (speedup over HF generate per cell).

    python scripts/bench/serving_speed/pay_table.py OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def rows_of(out: Path) -> list[dict]:
    """Each drafter config of every bench (τ, tokens/s, speedup over our plain loop and HF generate), and the
    peers beside it (HF's own speculative modes; our plain loop only once, with prompt lookup)."""
    rows = []
    for bench in sorted(out.glob("*/*/bench.json")):
        b = json.loads(bench.read_text())
        cell, variant = bench.parent.parent.name, bench.parent.name
        for c in b["configs"]:
            rows.append({"cell": cell, "variant": variant, "drafter": c.get("title") or c["drafter"],
                         "tree": c["tree"], "batch_size": c["batch_size"], "temperature": c["temperature"],
                         "n_prompts": c["n_prompts"], "tau": c["tau"], "tokens_per_s": c["tokens_per_s"],
                         "plain_tokens_per_s": c["baseline_tokens_per_s"], "speedup": c["speedup"],
                         "speedup_vs_hf": c["speedup_vs_hf"], "bench": str(bench.relative_to(out))})
        for p in b.get("peers") or []:
            if p["peer"] != "hf-generate" and not (p["peer"] == "draftsmith-plain"
                                                   and variant != "prompt-lookup"):
                rows.append({"cell": cell, "variant": variant, "peer": p["peer"],
                             "tokens_per_s": p["tokens_per_s"], "speedup_vs_hf": p["speedup_vs_hf_generate"]})
    return rows


def plot(rows: list[dict], out: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    spec = [r for r in rows if "peer" not in r]
    cells = sorted({r["cell"] for r in spec})
    fig, axes = plt.subplots(1, len(cells), figsize=(5 * len(cells), 4), squeeze=False)
    for ax, cell in zip(axes[0], cells):
        rs = [r for r in spec if r["cell"] == cell]
        ax.barh([r["variant"] for r in rs], [r["speedup_vs_hf"] or 0 for r in rs])
        ax.axvline(1.0, color="grey", ls="--", lw=0.8)
        ax.set(title=cell, xlabel="× HF generate")
    fig.tight_layout()
    fig.savefig(out / "bench-pay.png", dpi=120)


def main() -> None:
    out = Path(sys.argv[1])
    rows = rows_of(out)
    (out / "bench-pay.json").write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    print("| cell | variant | drafter | tree | τ | tok/s | × our plain | × HF generate "
          "|\n|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "peer" in r:
            print(f"| {r['cell']} | {r['variant']} | peer: {r['peer']} | – | – | "
                  f"{r['tokens_per_s'] or 0:.1f} | – | ×{r['speedup_vs_hf'] or 0:.2f} |")
        else:
            print(f"| {r['cell']} | {r['variant']} | {r['drafter']} | {r['tree']} | {r['tau']:.2f} | "
                  f"{r['tokens_per_s']:.1f} | ×{r['speedup']:.2f} | ×{r['speedup_vs_hf']:.2f} |")
    plot(rows, out)


if __name__ == "__main__":
    main()
