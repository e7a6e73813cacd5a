"""The general-chat drafter table: the results page `chat-drafters` from chat_table.py's JSON."""

from __future__ import annotations

from draftsmith.eval.measure.campaign import Page, num, table

SETS = (("sb", "Spec-Bench"), ("mt", "MT-bench"))


def shapes(rows: list[dict]) -> list[str]:
    """The eval shapes measured, chains first ('chain-5', 'tree')."""
    names = {n.split("-", 1)[1].removesuffix("-t07") for r in rows for n in r["evals"]}
    return sorted(names, key=lambda s: (s == "tree", s))


def tree_of(rows: list[dict]) -> str:
    return next((e["tree"] for r in rows for n, e in r["evals"].items() if n.endswith("-tree")), "tree")


def render_chat_table(data: dict) -> list[str]:
    rows = data["rows"]
    first = next(iter(rows[0]["evals"].values()))
    lines = [f"Each recipe trained end to end by `draftsmith pipeline` and judged by `draftsmith eval` on "
             f"{first['n_prompts']} prompts of each set (from 0) x {first['max_new_tokens']} tokens "
             f"({first['dtype']}); τ counts the bonus token (plain decoding = 1.0). The tree is "
             f"`{tree_of(rows)}`; T=0.7 drafts from the drafter's own law (exact: "
             "docs/results/exactness.md). Budget: training's wall hours summed over its resumes "
             "(train_summary.json); extraction's summed over the feature shards where they record it, else "
             "as the last pipeline invocation recorded it with regeneration (a stage an earlier invocation "
             "ran shows as 0: see the notes); core-hours = wall x processes x torch threads.",
             "", "## Budget", ""]
    lines += table(["recipe", "kind", "steps (epochs)", "samples seen", "regenerate + extract h", "train h",
                    "wall h", "core-hours"],
                   [[r["recipe"], r["kind"], f"{r['train_steps']} ({num(r.get('epochs'), 2)})",
                     r.get("samples_seen"), num(r["budget"]["prepare_hours"], 2),
                     num(r["train_seconds"] / 3600, 2), num(r["budget"]["wall_hours"], 2),
                     num(r["budget"]["core_hours"], 1)] for r in rows])
    cols = shapes(rows)
    lines += ["## τ by prompt set, shape and temperature", ""]
    body = []
    for r in rows:
        for short, label in SETS:
            for temp, suffix in (("0", ""), ("0.7", "-t07")):
                got = [r["evals"].get(f"{short}-{c}{suffix}") for c in cols]
                if any(got):
                    chain = next((e for c, e in zip(cols, got) if e and c != "tree"), None)
                    body.append([r["recipe"], label, temp, *[num(e["tau"], 3) if e else "–" for e in got],
                                 " / ".join(num(a, 2) for a in (chain or {}).get("acceptance_by_depth") or [])
                                 or "–"])
    lines += table(["recipe", "prompts", "T", *cols, "acceptance by depth (chain)"], body)
    lines += ["## Spec-Bench by category (T=0)", ""]
    cats = sorted({c for r in rows for n, e in r["evals"].items() if n.startswith("sb-") and not
                   n.endswith("-t07") for c in e["by_category"]})
    lines += table(["recipe", "shape", *cats],
                   [[r["recipe"], c, *[num(r["evals"][f"sb-{c}"]["by_category"].get(cat, {}).get("tau"), 3)
                                      for cat in cats]]
                    for r in rows for c in cols if f"sb-{c}" in r["evals"]])
    served = [(r["recipe"], e) for r in rows for e in r["served"].values()]
    if served:
        lines += ["## Served", "",
                  "Each engine serves the drafter (float32 target and drafter, batch 1, T=0) on the first "
                  "prompts of Spec-Bench beside our decoder on the same prompts: α per position = P(draft "
                  "token i accepted) per verification step; agree = within the engine eval's tolerance at "
                  "every position (docs/serving.md); x plain = the engine with / without the drafter, one "
                  "run after the other on this host.", ""]
        lines += table(["recipe", "engine", "chain", "prompts", "served α by position", "ours α by position",
                        "agree", "served τ", "greedy equal", "x plain", "n-gram x plain"],
                       [[name, f"{e['engine']} {e['engine_version']}", e["num_speculative_tokens"],
                         e["n_prompts"],
                         " / ".join(num(a, 3) for a in e["alpha_by_position"]),
                         " / ".join(num(a, 3) for a in e["ours"]["alpha_by_position"]),
                         "yes" if e["agree"] else "**no**", num(e["tau"], 3),
                         f"{e['greedy_equal_count']}/{e['n_prompts']}", num(e.get("speedup"), 2),
                         ", ".join(f"{t} {num(v.get('speedup'), 2)}"
                                   for t, v in (e.get("ngram") or {}).items()) or "–"]
                        for name, e in served])
    return lines


PAGES = {
    "chat-drafters": Page(
        "General-chat drafters below 200M: τ by prompt set, category, shape and temperature, served in vLLM "
        "and llama.cpp, with their budgets",
        "each finished recipe on Spec-Bench (by category) and MT-bench, chain and tree, T=0 and 0.7, served "
        "by both engines, with its training budget",
        "`bash scripts/bench/chat_table/chat_table.sh RECIPE RUN ...`", render_chat_table),
}
