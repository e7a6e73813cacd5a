"""Human-readable views of eval summaries: one comparison table (Markdown) from summary.json files.

Read by the eval command (one row) and by the benchmark suite (all drafters side by side). It only
formats what `benchmark.summarize` measured; it computes nothing new.
"""

from __future__ import annotations

import json
from pathlib import Path

COLUMNS = ["drafter", "tree", "dtype", "T", "n", "τ", "α@1..4", "tok/s", "AR tok/s", "HF tok/s", "speedup", "vs HF", "greedy equal"]


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
            fmt(s.get("hf_generate_tokens_per_s"), 1), fmt(s.get("speedup")), fmt(s.get("speedup_vs_hf")), equal_txt]


def format_table(summaries: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(summary_row(s)) + " |" for s in summaries]
    return "\n".join(lines)


def format_summary(s: dict) -> str:
    cats = ", ".join(f"{c}: τ {fmt(v['tau'])} ×{fmt(v['speedup'])} (n={v['n']})" for c, v in s["by_category"].items())
    return f"{format_table([s])}\nby category: {cats}"


def load_summaries(paths: list[str | Path]) -> list[dict]:
    return [json.loads(Path(p).read_text()) for p in paths]
