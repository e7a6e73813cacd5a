"""Human-readable views of eval summaries: one comparison table (Markdown) from summary.json files.

Read by the eval command (one row) and by the benchmark suite (all drafters side by side). It only
formats what `evaluate.summarize` measured; it computes nothing new.
"""

from __future__ import annotations

import json
from pathlib import Path

COLUMNS = ["drafter", "tree", "dtype", "T", "n", "τ", "α@1..4", "tok/s", "AR tok/s", "HF tok/s", "speedup",
           "vs HF", "greedy equal"]


def fmt(value, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def summary_row(s: dict) -> list[str]:
    alphas = "/".join(f"{a:.2f}" for a in s.get("acceptance_by_depth", [])[:4]) or "–"
    equal, count = s.get("greedy_equal"), f"{s.get('greedy_equal_count')}/{s['n_prompts']}"
    if equal is None:
        equal_txt = "–"
    elif equal or s.get("dtype", "float32") == "float32":
        equal_txt = f"{fmt(equal)} ({count})"
    else:  # half precision rounds a k-token forward differently from k one-token forwards: near-ties flip
        equal_txt = f"{count} ({s['dtype']}: not claimed, fp32 is)"
    return [s["drafter"], s["tree"], s["dtype"], fmt(s["temperature"], 1), str(s["n_prompts"]), fmt(s["tau"]),
            alphas, fmt(s["tokens_per_s"], 1), fmt(s.get("baseline_tokens_per_s"), 1),
            fmt(s.get("hf_generate_tokens_per_s"), 1), fmt(s.get("speedup")), fmt(s.get("speedup_vs_hf")),
            equal_txt]


def format_table(summaries: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(summary_row(s)) + " |" for s in summaries]
    return "\n".join(lines)


def format_summary(s: dict) -> str:
    cats = ", ".join(f"{c}: τ {fmt(v['tau'])} ×{fmt(v['speedup'])} (n={v['n']})"
                     for c, v in s["by_category"].items())
    return f"{format_table([s])}\nby category: {cats}"


def load_summaries(paths: list[str | Path]) -> list[dict]:
    return [json.loads(Path(p).read_text()) for p in paths]


def run_record(run: Path, evals: dict[str, str]) -> dict:
    """One pipeline run folder as a table row (the ablation and τ-vs-data scripts): what training did
    (train_summary.json), its last validation line (metrics.jsonl: top-1 per training-time-test step, expected
    τ of a chain and of the serving tree) and, for each `{name: eval folder}`, the eval's τ and acceptance by
    depth. Missing training files read as None; an eval folder without summary.json is an error (callers check
    first)."""
    def read(name: str) -> dict:
        return json.loads((run / name).read_text()) if (run / name).is_file() else {}

    train = read("train_summary.json")
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()] \
        if (run / "metrics.jsonl").is_file() else []
    val = next((m for m in reversed(metrics) if m.get("split") == "validation"), {})
    ttt = [val[f"acc_top1/step{i}"] for i in range(16) if f"acc_top1/step{i}" in val]
    out = {"train_steps": train.get("steps"), "train_seconds": train.get("seconds"),
           "step_seconds": (train.get("budget") or {}).get("step_seconds"),
           "samples_seen": train.get("samples_seen"),
           "assistant_tokens_seen": train.get("assistant_tokens_seen"), "selected": train.get("selected"),
           "val_top1": val.get("acc_top1", ttt[0] if ttt else None), "val_top1_ttt": ttt,
           "val_expected_tau": val.get("expected_tau"),
           "val_expected_tau_serving": val.get("expected_tau_serving")}
    for name, folder in evals.items():
        s = json.loads((run / folder / "summary.json").read_text())
        out[name] = {"tau": s["tau"], "acceptance_by_depth": s["acceptance_by_depth"],
                     "n_prompts": s["n_prompts"], "max_new_tokens": s.get("max_new_tokens"),
                     "tree": s.get("tree"), "summary": str(run / folder / "summary.json")}
    return out
