"""FP8 feature shards on a page: docs/results/fp8-features.md from fp8_features.py's JSON."""

from __future__ import annotations

from draftsmith.eval.measure.campaign import Page, num, table


def render_fp8_features(data: dict) -> list[str]:
    base = data["features"].get("bfloat16", {})
    lines = [f"EAGLE-3 (`{data['recipe']}`) trained offline from shards of the first {data['answers']} "
             f"self-distilled answers, {data['steps']} steps each (the last step's drafter, no time budget), "
             f"judged by `draftsmith eval` on {data['limit']} {data['prompts']} prompts x "
             f"{data['max_new_tokens']} tokens at T=0. `float8_e4m3`: hidden states as e4m3 with a float32 "
             "scale per token row, top-k logits in bfloat16 (`extract.dtype`). The second bfloat16 seed is "
             "the noise a change is judged against.", "", "Storage of the training split:", ""]
    lines += table(["extract.dtype", "features", "tokens", "bytes / token", "GiB", "of bfloat16"],
                   [[d, ", ".join(f["keys"]), f["tokens"], num(f["bytes_per_token"], 1),
                     num(f["bytes"] / 2**30, 2), num(f["bytes"] / base["bytes"], 3) if base else "–"]
                    for d, f in data["features"].items()])
    trees = list(data["arms"][0]["evals"]) if data["arms"] else []
    lines += ["", "Each arm:", ""]
    lines += table(["arm", "steps", "s / step", *[f"τ {t}" for t in trees],
                    *[f"acceptance by depth, {t}" for t in trees[:1]]],
                   [[a["name"], a["steps"], num(a["s_per_step"], 3),
                     *[num(a["evals"][t]["tau"], 3) for t in trees], *[" / ".join(
                         num(x, 2) for x in (a["evals"][t]["acceptance_by_depth"] or [])) for t in trees[:1]]]
                    for a in data["arms"]])
    lines += ["", "Against bfloat16 seed 0 (paired over prompts: mean per-prompt τ change and its bootstrap "
                  "95 % interval):",
              ""]
    lines += table(["arm", "tree", "Δτ (pooled)", "mean per-prompt Δτ", "95 % interval"],
                   [[c["arm"], c["tree"], num(c["delta_tau"], 3), num(c["paired"]["mean"], 3),
                     f"[{num(c['paired']['ci95'][0], 3)}, {num(c['paired']['ci95'][1], 3)}]"]
                    for c in data.get("comparisons", [])])
    return lines


PAGES = {  # docs/results/<name>.md from docs/results/data/<name>.json (scripts/bench/results_pages.py)
    "fp8-features": Page(
        title="FP8 hidden-state shards against bfloat16",
        summary="extract.dtype float8_e4m3 vs bfloat16 on the reference EAGLE-3 at equal steps: disk, "
                "training s/step, τ (a second bf16 seed as the noise)",
        command="`python scripts/bench/fp8_features/fp8_features.py OUT`",
        render=render_fp8_features),
}
