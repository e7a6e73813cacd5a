#!/usr/bin/env bash
# tau vs training data for EAGLE-3 on the reference target: the EAGLE-3 recipe (configs/runs/smollm2-eagle3.yaml)
# trained on the first 1k / 2k / 4k / all of the target's own answers (smollm2-selfdistill-4k followed by
# smollm2-selfdistill-extra: 12.9k), the same epochs for every size, each judged in our decoder on the same
# Spec-Bench prompts (bf16, T=0) with a chain of 5 and with the recipe's 16-node dynamic tree. The plot puts
# the field's calibration points beside ours (8B targets, chain drafting: ~5k samples tau 1.45-1.53, ~50k ~1.9,
# ~500k 2.8-3.0; speculators / SpecForge threads) -- other targets and trees, a reference, not a comparison.
#   bash scripts/data_curve.sh OUT        -> OUT/n<size>/ (pipeline runs), OUT/curve.json, OUT/curve.png
# Env: SIZES (default "1000 2000 4000 all"), EPOCHS (default 2), LIMIT (prompts, default 80), TOKENS (default 128),
# EXTRA (more overrides for every run, e.g. "train.max_steps=20" for a smoke run, or model.target=...).
# Resumable across sessions: every run is a pipeline folder (finished stages are skipped, training resumes from its
# last checkpoint) and each eval is skipped once its summary exists. Budget on this 2-core CPU: ~2.7 s per step of
# 4 sequences, so 2 epochs of all 12.9k answers are ~6.5k steps (~5 h); the whole curve ~8 h.
set -euo pipefail
out=${1:?usage: data_curve.sh OUT}
here=$(cd "$(dirname "$0")/.." && pwd)
ds=${DS:-$here/.venv/bin/draftsmith}
py=${PY:-$here/.venv/bin/python}
sizes=${SIZES:-1000 2000 4000 all}
epochs=${EPOCHS:-2}
limit=${LIMIT:-80}
tokens=${TOKENS:-128}
read -r -a extra <<< "${EXTRA:-}"
mkdir -p "$out"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
for size in $sizes; do
  run="$out/n$size"
  lim=$([ "$size" = all ] && echo null || echo "$size")
  "$ds" pipeline -c smollm2-eagle3 --out "$run" "data.train=[smollm2-selfdistill-4k,smollm2-selfdistill-extra]" \
    "data.limit=$lim" "train.epochs=$epochs" "eval.limit=$limit" "eval.max_new_tokens=$tokens" eval.baselines=false \
    export.formats=[] log.progress=false "${extra[@]}"
  for tree in chain-5 dynamic-16; do
    [ -f "$run/eval-$tree/summary.json" ] || "$ds" eval --drafter "$run/drafter" --prompts spec-bench --limit "$limit" \
      --max-new-tokens "$tokens" --dtype "${DTYPE:-auto}" --tree "$tree" --out "$run/eval-$tree" eval.baselines=false \
      drafter.plan=false log.progress=false "${extra[@]}"
  done
done
"$py" - "$out" $sizes <<'PY'
import json, sys
from pathlib import Path
out, sizes = Path(sys.argv[1]), sys.argv[2:]
FIELD = [  # (samples, tau low, tau high): 8B targets, chain drafting (speculators / SpecForge issue threads)
    (5_000, 1.45, 1.53), (50_000, 1.9, 1.9), (500_000, 2.8, 3.0)]
rows = []
for size in sizes:
    run = out / f"n{size}"
    train = json.loads((run / "train_summary.json").read_text())
    row = {"size": size, "steps": train["steps"], "train_seconds": train["seconds"],
           "assistant_tokens_seen": train.get("assistant_tokens_seen")}
    for tree in ("chain-5", "dynamic-16"):
        s = json.loads((run / f"eval-{tree}" / "summary.json").read_text())
        row[tree] = {"tau": s["tau"], "n_prompts": s["n_prompts"], "max_new_tokens": s["max_new_tokens"],
                     "acceptance_by_depth": s["acceptance_by_depth"]}
    rows.append(row)
(out / "curve.json").write_text(json.dumps({"rows": rows, "field": FIELD}, indent=2) + "\n")
for r in rows:
    print(f"{r['size']:>6} answers  {r['steps']:>6} steps  tau chain-5 {r['chain-5']['tau']:.3f}  "
          f"dynamic-16 {r['dynamic-16']['tau']:.3f}")
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
xs = [12_889 if r["size"] == "all" else int(r["size"]) for r in rows]  # 4,005 + 8,884 answers (train + validation)
fig, ax = plt.subplots(figsize=(6, 4))
for tree, marker in (("chain-5", "o"), ("dynamic-16", "s")):
    ax.plot(xs, [r[tree]["tau"] for r in rows], marker=marker, label=f"draftsmith EAGLE-3, {tree} (SmolLM2-135M)")
ax.errorbar([f[0] for f in FIELD], [(f[1] + f[2]) / 2 for f in FIELD], yerr=[[(f[2] - f[1]) / 2 for f in FIELD]] * 2,
            fmt="x", color="grey", label="field, 8B targets, chain (reference)")
ax.set_xscale("log"), ax.set_xlabel("training answers"), ax.set_ylabel("tau (tokens per target pass)")
ax.legend(fontsize=7), ax.grid(alpha=0.3)
fig.tight_layout()
fig.savefig(out / "curve.png", dpi=120)
print(f"curve: {out / 'curve.json'}, {out / 'curve.png'}")
PY
