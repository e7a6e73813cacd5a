"""FP8 against bfloat16 hidden-state shards: disk, training seconds per step and tau at equal steps.

    python scripts/bench/fp8_features/fp8_features.py OUT [--answers 2000] [--steps 300]
                                         [--arms bfloat16:0,float8_e4m3:0,bfloat16:1]
                                         [--limit 40] [--tokens 128] [--trees chain-5,recipe]

The reference recipe (smollm2-eagle3) trained offline on the first N self-distilled answers:
`draftsmith extract` once per storage dtype (OUT/features-<dtype>, `extract.dtype`), then one
`draftsmith train` per arm (dtype:seed) for the same fixed number of steps on those shards (the last step's
drafter, no time budget), each judged by `draftsmith eval` on the same Spec-Bench prompts at T=0 with each
tree (`chain-5`: what vLLM serves; `recipe`: the drafter's recorded 16-node tree). The bfloat16 arm with a
second seed is the noise the fp8 arm's tau change is judged against. A finished stage is kept on a rerun (each
command skips or resumes its own work). Writes OUT/fp8-features.json, which
`python scripts/bench/results_pages.py --add fp8-features OUT/fp8-features.json` publishes. Training seconds
per step are a figure only when nothing else ran on the host's cores.
"""

import argparse
import json
import random
import subprocess
import sys
from pathlib import Path

from draftsmith.eval.measure.campaign import command_line, host_block

RECIPE = "smollm2-eagle3"


def common(args, dtype: str, features: Path) -> list[str]:
    return ["data.train=[smollm2-selfdistill-4k]", f"data.limit={args.answers}", "data.val_fraction=0.02",
            "drafter.lookup_datastore=[]", "extract.enabled=true", f"extract.dtype={dtype}",
            f"extract.out={features}"]


def run(cmd: list[str]) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def draftsmith() -> str:
    return str(Path(sys.executable).with_name("draftsmith"))


def disk(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def paired(a: list[float], b: list[float], draws: int = 2000) -> dict:
    """Mean of b - a over prompts and its bootstrap 95% interval (prompts resampled)."""
    d = [y - x for x, y in zip(a, b)]
    rng = random.Random(0)
    means = sorted(sum(rng.choice(d) for _ in d) / len(d) for _ in range(draws))
    return {"mean": round(sum(d) / len(d), 4), "ci95": [round(means[int(0.025 * draws)], 4),
                                                          round(means[int(0.975 * draws)], 4)]}


def tau_of(summary: Path) -> tuple[float, list[float], list[float]]:
    """Pooled tau (new tokens over verification steps), per-prompt tau and acceptance by depth."""
    s = json.loads(summary.read_text())
    rows = [json.loads(line) for line in (summary.parent / "samples.jsonl").read_text().splitlines()
            if line.strip()]
    steps = sum(len(r["accept_lengths"]) for r in rows)
    pooled = sum(sum(r["accept_lengths"]) for r in rows) / steps
    return round(pooled, 4), [r["tau"] for r in rows], s.get("acceptance_by_depth")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--answers", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--arms", default="bfloat16:0,float8_e4m3:0,bfloat16:1")
    parser.add_argument("--limit", type=int, default=40)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--trees", default="chain-5,recipe")
    args = parser.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    arms = [(a.split(":")[0], int(a.split(":")[1])) for a in args.arms.split(",")]
    record = {"command": command_line(), "host": host_block(), "recipe": RECIPE, "answers": args.answers,
              "steps": args.steps, "prompts": "spec-bench", "limit": args.limit,
              "max_new_tokens": args.tokens, "features": {}, "arms": []}
    for dtype in dict.fromkeys(d for d, _ in arms):
        features = out / f"features-{dtype}"
        if not (features / "validation" / "index.json").is_file():
            run([draftsmith(), "extract", "-c", RECIPE, "--out", str(out / f"extract-{dtype}"),
                 *common(args, dtype, features)])
        index = json.loads((features / "train" / "index.json").read_text())
        record["features"][dtype] = {"bytes": disk(features / "train"), "tokens": index["num_tokens"],
                                     "sequences": index["num_sequences"], "keys": index["feature_keys"],
                                     "top_k_logits": index["top_k_logits"],
                                     "bytes_per_token": round(disk(features / "train") / index["num_tokens"],
                                                              1)}
    for dtype, seed in arms:
        name = f"{dtype}-seed{seed}"
        run_dir = out / name
        if not (run_dir / "train_summary.json").is_file():
            run([draftsmith(), "train", "-c", RECIPE, "--out", str(run_dir),
                 *common(args, dtype, out / f"features-{dtype}"), f"train.seed={seed}",
                 "train.max_minutes=null", f"train.max_steps={args.steps}", "train.select=last",
                 "train.eval_every=0", "train.save_every=100", "train.warmup_steps=30"])
        summary = json.loads((run_dir / "train_summary.json").read_text())
        arm = {"name": name, "dtype": dtype, "seed": seed, "steps": summary["steps"],
               "seconds": summary["seconds"], "s_per_step": round(summary["seconds"] / summary["steps"], 3),
               "evals": {}}
        for tree in args.trees.split(","):
            ev = run_dir / f"eval-{tree}"
            if not (ev / "summary.json").is_file():
                run([draftsmith(), "eval", "-c", RECIPE, "--drafter", str(run_dir / "drafter"), "--out",
                     str(ev), "--limit", str(args.limit), "--max-new-tokens", str(args.tokens),
                     "--temperature", "0", *([] if tree == "recipe" else ["--tree", tree]),
                     "eval.baselines=false"])
            pooled, per_prompt, alpha = tau_of(ev / "summary.json")
            s = json.loads((ev / "summary.json").read_text())
            arm["evals"][tree] = {"tau": pooled, "per_prompt_tau": per_prompt, "acceptance_by_depth": alpha,
                                  "tree": s.get("tree"), "greedy_equal": s.get("greedy_equal")}
        record["arms"].append(arm)
    by = {a["name"]: a for a in record["arms"]}
    ref = by.get("bfloat16-seed0")
    record["comparisons"] = []
    for a in record["arms"]:
        if ref is None or a is ref:
            continue
        for tree in a["evals"]:
            record["comparisons"].append({"arm": a["name"], "against": ref["name"], "tree": tree,
                                          "delta_tau": round(
                                              a["evals"][tree]["tau"] - ref["evals"][tree]["tau"], 4),
                                          "paired": paired(ref["evals"][tree]["per_prompt_tau"],
                                                           a["evals"][tree]["per_prompt_tau"])})
    (out / "fp8-features.json").write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: record[k] for k in ("features", "comparisons")}, indent=1))


if __name__ == "__main__":
    main()
