"""Served by vLLM against our decoder on a page: docs/results/engine-served.md and engine-served-goal.md from
engine_served.py's JSON.
"""

from __future__ import annotations

from draftsmith.eval.measure.campaign import Page, num, table


def render_engine_served(data: dict) -> list[str]:
    st = data["settings"]
    eh = (data["rows"][0]["engine_host"] if data["rows"] else {}) or {}
    lines = [f"Each drafter served by {data['engine']} on this CPU (its own venv: `draftsmith engine install "
             f"vllm`) and run in our decoder on the same {st['limit']} Spec-Bench prompts (from "
             f"{st['offset']}) x {st['tokens']} tokens, {st['dtype']}, T={st['temperature']}; vLLM at batch "
             f"1 and at {st['concurrency']} requests in flight, vLLM plain before and after (the noise), "
             f"vLLM's own n-gram lookup as the drafter-free baseline. Engine: torch {eh.get('torch')}, "
             f"transformers {eh.get('transformers')}, OpenMP binding "
             f"{'; '.join(eh.get('omp_binding') or []) or 'not recorded'}.", "",
             "## What to serve in vLLM on this machine", ""]
    levels = sorted({c for r in data["rows"] for c in r["best"]}, key=int)
    header = ["drafter", "kind / format"]
    for c in levels:
        header += [f"best chain @{c}", f"x vLLM plain @{c}", f"n-gram x plain @{c}"]
    header += ["vLLM plain tok/s @1", "plan's choice @1"]
    rows = []
    for r in data["rows"]:
        row = [r["drafter"], f"{r['kind']} / {r['format']}"]
        for c in levels:
            b, ng = r["best"].get(c) or {}, (r["ngram"] or {}).get(c) or {}
            row += [f"chain-{b.get('k')}", num(b.get("speedup"), 2), num(ng.get("speedup"), 2)]
        row += [num(r["best"]["1"]["plain_tokens_per_s"], 1), r["best"]["1"]["plan_choice"]]
        rows.append(row)
    lines += table(header, rows)
    lines += ["## Served vs ours, per chain length", "",
              "α per position: served (vLLM's counters) / ours (our decoder, the same drafter and prompts). "
              "`agree`: within max(0.03, 3 SE) at every position and concurrency; `greedy equal`: vLLM's "
              "speculative output equals its plain output on every prompt.", ""]
    detail = []
    for r in data["rows"]:
        for c in r["chains"]:
            detail.append([r["drafter"], c["k"], " / ".join(num(a, 3) for a in c["served_alpha"]),
                           " / ".join(num(a, 3) for a in c["ours_alpha"]), num(c["served_tau"], 3),
                           num(c["ours_tau"], 3), c["agree"], c["greedy_equal"],
                           " / ".join(num(c["speedup"].get(x), 2) for x in levels),
                           num(c.get("ours_draft_ms"), 1)])
    lines += table(["drafter", "k", "served α by position", "our α by position", "served τ", "our τ", "agree",
                    "greedy equal", "x vLLM plain @" + " / @".join(levels), "our draft ms / step"], detail)
    lines += ["Served τ counts accepted drafts past a stop token that the output drops (vLLM's scheduler "
              "counts them before the stop check), ours emitted tokens; compare α per position.", ""]
    if data.get("earlier"):  # rows kept from earlier runs (engine_served.py --keep): each row's own command
        lines += ["## The command behind each row", ""]
        lines += table(["drafter", "measured by"],
                       [[r["drafter"],
                         "`" + (data["earlier"][r["measured_by"]]["command"] if "measured_by" in r
                                             else data["command"]) + "`"] for r in data["rows"]])
    return lines


PAGES = {  # docs/results/<name>.md from docs/results/data/<name>.json (scripts/bench/results_pages.py)
    "engine-served": Page(
        title="Served by vLLM: acceptance served vs ours, and what pays",
        summary="each drafter in vLLM's CPU build at chains 1-5 beside vLLM's n-gram and plain, and in our "
                "decoder: α per position, greedy equality, speedup",
        command="`python scripts/bench/engine_served/engine_served.py OUT NAME=DRAFTER ...`",
        render=render_engine_served),
    "engine-served-goal": Page(
        title="Served by vLLM at the goal's size: full-recipe drafters, 40 prompts x 128 tokens",
        summary="full-recipe drafters in vLLM's CPU build at chains 1-5 (batch 1 and 8 in flight) beside "
                "vLLM's n-gram and plain and our decoder: α per position, greedy equality, speedup",
        command="`python scripts/bench/engine_served/engine_served.py OUT NAME=DRAFTER ... --limit 40 "
                "--tokens 128`",
        render=render_engine_served),
}
