"""The levers table (scripts/bench/levers.sh): every finished row under OUT, what it trained with (read from its own
config.resolved.yaml and train_summary.json, not from a hand-kept list), its evals, and its τ paired against the
baseline row's on the same prompts -> OUT/levers.json.

    python scripts/bench/levers.py OUT [--baseline eagle3] [--command "..."] [--note "..." ...]

Paired: Δτ = (Σ accepted / Σ steps of the row) - (the same of the baseline) over the prompts both decoded, with a
2,000-resample bootstrap 95 % interval over prompts (`pooled_delta`, as scripts/bench/speculators_peer.sh's).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import yaml

EVAL_KEYS = ("tau", "acceptance_by_depth", "n_prompts", "offset", "max_new_tokens", "dtype", "tree", "tokens_per_s",
             "baseline_tokens_per_s", "speedup", "step_ms", "greedy_equal_count")
ENGINE_KEYS = ("engine_version", "num_speculative_tokens", "n_prompts", "tau", "alpha_by_position", "tokens_per_s",
               "baseline_tokens_per_s", "speedup", "greedy_equal", "greedy_equal_count")


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def pooled_delta(mine: dict[str, list[int]], base: dict[str, list[int]], resamples: int = 2000, seed: int = 0) -> dict:
    """mine - base in pooled τ (accept lengths per prompt id) over the shared prompts, with a bootstrap interval."""
    ids = sorted(set(mine) & set(base))

    def delta(sample):
        return (sum(sum(mine[i]) for i in sample) / sum(len(mine[i]) for i in sample)
                - sum(sum(base[i]) for i in sample) / sum(len(base[i]) for i in sample))

    rng = random.Random(seed)
    boot = sorted(delta([rng.choice(ids) for _ in ids]) for _ in range(resamples))
    lo, hi = int(0.025 * resamples) - 1, int(0.975 * resamples) - 1
    return {"prompts": len(ids), "delta_tau": round(delta(ids), 4), "ci95": [round(boot[lo], 4), round(boot[hi], 4)],
            "resamples": resamples}


def accept_lengths(eval_dir: Path) -> dict[str, list[int]]:
    return {r["id"]: r["accept_lengths"] for r in jsonl(eval_dir / "samples.jsonl")}


def median_step_seconds(metrics: list[dict]) -> float | None:
    """A run's seconds per step, the median over its logging intervals (metrics.jsonl's train rows): robust to a
    validation pass, a brief shared-core blip or the start-up of a resumed run."""
    logged = [(r["step"], r["time"]) for r in metrics if r.get("split") == "train" and "time" in r]
    per_step = sorted((t1 - t0) / (s1 - s0) for (s0, t0), (s1, t1) in zip(logged, logged[1:]) if s1 > s0)
    return round(per_step[len(per_step) // 2], 3) if per_step else None


def row_record(run: Path) -> dict:
    """What the row trained with and how long, from its own files."""
    cfg = yaml.safe_load((run / "config.resolved.yaml").read_text())
    summary = json.loads((run / "train_summary.json").read_text())
    drafter, kind = cfg["drafter"], cfg["drafter"]["kind"]
    own = drafter.get(kind.replace("-", "_")) or {}
    record = {"kind": kind, "ttt_steps": own.get("ttt_steps"), "lookup_weight": drafter.get("lookup_weight", 1.0),
              "loss": drafter.get("loss"), "lr": cfg["train"]["lr"], "train_steps": summary["steps"],
              "train_seconds": summary["seconds"], "seconds_per_step": round(summary["seconds"] / summary["steps"], 3),
              "samples_seen": summary.get("samples_seen")}
    data = run / "data.json"  # the run's data record: the training sequences it drew from
    sequences = json.loads(data.read_text()).get("train") if data.is_file() else None
    if sequences and summary.get("samples_seen"):
        record["train_sequences"], record["epochs"] = sequences, round(summary["samples_seen"] / sequences, 2)
    metrics = jsonl(run / "metrics.jsonl") if (run / "metrics.jsonl").is_file() else []
    if (median := median_step_seconds(metrics)) is not None:
        record["median_step_seconds"] = median
    val = [r for r in metrics if r.get("split") == "validation"]
    if val:
        record["validation"] = {k: v for k, v in val[-1].items() if k == "step" or k.startswith("expected_tau")}
    return record


def collect(out: Path, baseline: str) -> dict:
    rows, missing = {}, []
    for run in sorted(p for p in out.iterdir() if p.is_dir()):
        if not (run / "train_summary.json").is_file():
            missing.append(run.name)
            continue
        rec = row_record(run)
        rec["evals"] = {e.name[len("eval-"):]: {k: s.get(k) for k in EVAL_KEYS}
                        for e in sorted(run.glob("eval-*")) if (s := _summary(e))}
        engine = _summary(run / "engine")
        if engine:
            rec["engine"] = engine_record(engine)
        rows[run.name] = rec
    if baseline in rows:
        base = out / baseline
        for name, rec in rows.items():
            if name == baseline:
                continue
            rec["paired"] = {e: pooled_delta(accept_lengths(out / name / f"eval-{e}"), accept_lengths(base / f"eval-{e}"))
                             for e in rec["evals"] if (base / f"eval-{e}" / "samples.jsonl").is_file()
                             and (out / name / f"eval-{e}" / "samples.jsonl").is_file()}
    return {"baseline": baseline, "rows": rows, "unfinished": missing}


def engine_record(engine: dict) -> dict:
    """What a results page keeps of a `draftsmith eval --engine vllm` summary (results_pages.served_table reads it)."""
    rec = {k: engine.get(k) for k in ENGINE_KEYS}
    rec["ours"] = {k: engine["ours"][k] for k in ("tau", "alpha_by_position", "dtype")}
    rec["agree"] = engine["comparison"]["agree"]
    return rec


def _summary(folder: Path) -> dict | None:
    f = folder / "summary.json"
    return json.loads(f.read_text()) if f.is_file() else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--baseline", default="eagle3")
    parser.add_argument("--command", default=None, help="the levers.sh command line to record")
    parser.add_argument("--note", action="append", default=[], help="a line for the page (what the rows cannot say)")
    args = parser.parse_args()
    out = Path(args.out)
    sys.path.insert(0, str(Path(__file__).parent))
    from results_pages import command_line, host_block

    data = collect(out, args.baseline)
    data.update(command=args.command or command_line(), host=host_block(), notes=args.note)
    (out / "levers.json").write_text(json.dumps(data, indent=2) + "\n")
    for name, r in data["rows"].items():
        taus = "  ".join(f"{e} {v['tau']:.3f}" + (f" ({r['paired'][e]['delta_tau']:+.3f})" if e in r.get("paired", {})
                                                    else "") for e, v in r["evals"].items())
        print(f"{name:8s} {r['kind']:7s} {r['train_steps']:5d} steps {r['train_seconds']:6.0f} s  {taus}")
    for name in data["unfinished"]:
        print(f"{name}: not finished (no train_summary.json), left out")


if __name__ == "__main__":
    main()
