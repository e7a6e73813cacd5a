"""The τ-vs-data curve from the run folders `scripts/bench/ablations/data_curve.sh` writes: OUT/curve.json and
OUT/curve.png.

Every finished size under OUT (n<size>/ with train_summary.json, eval/ -- the recipe's 16-node dynamic tree --
and eval-chain-5/) is a row, whatever SIZES the last call ran, so a curve measured across sessions is
tabulated as one. The plot puts the field's calibration points beside ours (8B targets, chain drafting: ~5k
samples τ 1.45-1.53, ~50k ~1.9, ~500k 2.8-3.0; speculators / SpecForge issue threads) -- other targets and
trees: a reference, not a comparison. A size still missing an eval is listed as unfinished and left out.

    python scripts/bench/ablations/curve_table.py OUT
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import yaml

from draftsmith.eval.measure.report import run_record

FIELD = [(5_000, 1.45, 1.53), (50_000, 1.9, 1.9), (500_000, 2.8, 3.0)]  # (samples, τ low, τ high)
EVALS = (("chain-5", "eval-chain-5"), ("dynamic-16", "eval"))


# data.limit null: every answer of smollm2-selfdistill-4k (4,005) and smollm2-selfdistill-extra (8,884)
ALL = 12_889


def size_of(run: Path) -> int:
    """Answers the run trained on (train + validation): its data.limit, or all of both vendored sets."""
    limit = yaml.safe_load((run / "config.resolved.yaml").read_text())["data"].get("limit")
    return int(limit) if limit else ALL


def row(run: Path) -> dict | None:
    if not (run / "train_summary.json").is_file() or not all((run / f / "summary.json").is_file()
                                                             for _, f in EVALS):
        return None
    cfg = yaml.safe_load((run / "config.resolved.yaml").read_text())
    return {"run": run.name, "answers": size_of(run), "epochs": cfg["train"]["epochs"],
            **run_record(run, {tree: folder for tree, folder in EVALS})}


def log_fit(rows: list[dict], tree: str) -> dict | None:
    """τ = a + b·log10(answers), least squares: the slope is τ gained per tenfold data at these equal
    epochs."""
    if len(rows) < 2:
        return None
    xs = [math.log10(r["answers"]) for r in rows]
    ys = [r[tree]["tau"] for r in rows]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return {"tau_per_decade": round(b, 4), "intercept": round(my - b * mx, 4),
            "at_all": round(my + b * (math.log10(ALL) - mx), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    out = Path(parser.parse_args().out)
    runs = sorted(p for p in out.glob("n*") if p.is_dir())
    rows, unfinished = [], []
    for run in runs:
        r = row(run)
        if r:
            rows.append(r)
        else:
            unfinished.append(run.name)
    rows.sort(key=lambda r: r["answers"])
    if not rows:
        raise SystemExit(f"{out}: no finished size (n<size>/ with train_summary.json, eval/ and "
                         "eval-chain-5/)")
    epochs = sorted({r["epochs"] for r in rows})
    table = {"epochs": epochs, "rows": rows, "unfinished": unfinished,
             "fit": {tree: log_fit(rows, tree) for tree, _ in EVALS},
             "field": [{"samples": n, "tau_low": lo, "tau_high": hi} for n, lo, hi in FIELD]}
    (out / "curve.json").write_text(json.dumps(table, indent=2) + "\n")
    for r in rows:
        print(f"{r['answers']:>6} answers  {r['epochs']} epoch(s)  {r['train_steps']:>5} steps  "
              f"τ chain-5 {r['chain-5']['tau']:.3f}  dynamic-16 {r['dynamic-16']['tau']:.3f}")
    if len(epochs) > 1:
        print(f"warning: sizes trained for different epochs {epochs}: not one curve")
    if unfinished:
        print(f"unfinished (left out): {', '.join(unfinished)}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for (tree, _), marker in zip(EVALS, "os"):
        ax.plot([r["answers"] for r in rows], [r[tree]["tau"] for r in rows], marker=marker,
                label=f"draftsmith EAGLE-3, {tree} (SmolLM2-135M, {'/'.join(map(str, epochs))} epoch)")
    ax.errorbar([n for n, _, _ in FIELD], [(lo + hi) / 2 for _, lo, hi in FIELD],
                yerr=[[(hi - lo) / 2 for _, lo, hi in FIELD]] * 2, fmt="x", color="grey",
                label="field, 8B targets, chain (reference)")
    ax.set_xscale("log")
    ax.set_xlabel("training answers")
    ax.set_ylabel("τ (tokens per target pass)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "curve.png", dpi=120)
    print(f"curve: {out / 'curve.json'}, {out / 'curve.png'}")


if __name__ == "__main__":
    main()
