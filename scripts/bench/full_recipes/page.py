"""Full recipes side by side on a page: docs/results/full-recipes.md (the parallel drafters' recipes),
eagle3-recipe.md (the EAGLE-3 recipe of recipe_epochs.sh with AdamW) and eagle3-recipe-muon.md (the same
recipe with Muon at 10 x lr, beside the AdamW run) from full_recipes.py's JSON.
"""

from __future__ import annotations

from pathlib import Path

from draftsmith.eval.measure.campaign import Page, num, served_table, table

FULL_RECIPES_REFERENCE = ("EAGLE-3's full recipe as it was at 0.7 epoch online (before it took 3 epochs "
                          "offline), at the same chain lengths, the reference at equal training budget")


def cost(r: dict) -> str | None:
    """Wall and core-hours of regeneration, extraction and training (full_recipes.py budget_hours);
    "+ extract" where an offline run's extraction is in neither its shards nor its last pipeline
    invocation."""
    b = r.get("cost")
    if not b:
        return None
    more = " + extract" if b["extract"] == "none" and r.get("features") == "offline" else ""
    return f"{num(b['wall_hours'], 2)} ({num(b['core_hours'], 1)}){more}"


def optimiser(r: dict) -> str:
    """AdamW at lr, or Muon at muon_lr on the draft matrices with AdamW at lr on the rest; "–" where the
    row did not record it."""
    if "optimizer" not in r:
        return "–"
    if r["optimizer"] == "muon":
        return f"Muon {r.get('muon_lr'):g} (AdamW {r['lr']:g} on the rest)"
    return f"AdamW {r['lr']:g}"


def kept(r: dict) -> list:
    """The kept checkpoint's step, its estimate, and the estimate over the τ the pipeline's own eval
    measured."""
    pipeline_eval = r["evals"].get("eval") or r["evals"].get((r.get("evals_same_as") or {}).get("eval"))
    sel, measured = r.get("selected") or {}, (pipeline_eval or {}).get("tau")
    estimate = sel.get("expected_tau") or (r.get("validation") or {}).get("expected_tau_serving")
    return [sel.get("step"), num(estimate, 3),
            num(estimate / measured if estimate and measured else None, 3)]


def carried(r: dict) -> str:
    """Where a carried row (full_recipes.py NAME=EARLIER.json#RECIPE) came from."""
    c = r["carried"]
    return (f"`{r['recipe']}` is the row `{c['recipe']}` of [{Path(c['source']).stem}]"
            f"({Path(c['source']).stem}.md), carried over (its run folder is gone): trained and judged on "
            f"{c.get('device')}, {(c.get('date') or '').split(' ')[0]}. Its τ, α and estimate compare with "
            "the rows here where the settings match; its seconds were timed on that host.")


def render_full_recipes(data: dict) -> list[str]:
    rows = data["rows"]
    lines = ["Each recipe run end to end by `draftsmith pipeline -c RECIPE` and judged by `draftsmith eval` "
             "at T=0; online, the frozen target runs inside each training step; offline, its features are "
             "extracted once and every epoch reads them. Steps, epochs and seconds are what the run recorded "
             "(train_summary.json; epochs = sequences seen / training sequences); s / step is the median "
             "over its logging intervals. The kept checkpoint is the one `train.select` ranked best on the "
             "run's validation split; its estimate is the expected τ of the recipe's serving shape, set "
             "beside the τ the pipeline's own eval measured (`eval`). Wall h: regeneration, extraction "
             "and training summed over the run's resumes (core h: x processes x torch threads); "
             "\"+ extract\" where neither the features' shards nor the last pipeline invocation recorded "
             "extraction's. Runs that read one feature folder each count its whole extraction: do not add "
             "rows up.", ""]

    # the optimiser column where a row recorded it (rows collected before row_record did show none)
    optim = any("optimizer" in r for r in rows)
    lines += table(["recipe", "kind", *(["optimiser (lr)"] if optim else []), "features",
                    "epochs asked (budget)", "steps (epochs)", "train min", "s / step", "wall h (core h)",
                    "kept step", "its validation expected τ", "÷ measured τ"],
                   [[r["recipe"], r["kind"], *([optimiser(r)] if optim else []), r.get("features", "online"),
                     f"{r['epochs_asked']} (max {r['max_minutes']} min)" if r["max_minutes"]
                     else r["epochs_asked"],
                     f"{r['train_steps']} ({num(r.get('epochs'), 2)})", num(r["train_seconds"] / 60, 1),
                     num(r.get("median_step_seconds"), 2), cost(r), *kept(r)] for r in rows])
    lines += [line for r in rows if r.get("carried") for line in (carried(r), "")]
    # evals made with the same settings, whatever the folder
    groups: dict[tuple, list[tuple[dict, dict]]] = {}
    for r in rows:
        for e in r["evals"].values():
            groups.setdefault((e["n_prompts"], e.get("offset") or 0, e["max_new_tokens"], e["dtype"]),
                              []).append((r, e))
    for (n, offset, tokens, dtype), members in groups.items():
        lines += [f"**{n} Spec-Bench prompts from {offset} x {tokens} tokens, {dtype}**, each recipe's "
                  "serving shape.", ""]
        lines += table(["recipe", "shape", "τ", "acceptance by depth", "tokens/s", "x plain",
                        "draft ms / step", "verify ms / step", "greedy equal"],
                       [[r["recipe"], e["tree"], num(e["tau"], 3),
                         " / ".join(num(a, 2) for a in e["acceptance_by_depth"]), num(e["tokens_per_s"], 1),
                         num(e["speedup"], 2), num((e["step_ms"] or {}).get("draft"), 1),
                         num((e["step_ms"] or {}).get("verify"), 1),
                         f"{e['greedy_equal_count']}/{e['n_prompts']}" if e["greedy_equal_count"] is not None
                         else None]
                        for r, e in members])
    lines += served_table([(r["recipe"], r["engine"]) for r in rows if r.get("engine")], "recipe")
    ref = data.get("reference")
    if ref:
        host = ref["host"]
        lines += [f"{ref.get('label') or FULL_RECIPES_REFERENCE}: `{ref['drafter']}` in our decoder from "
                  f"[{Path(ref['source']).stem}]({Path(ref['source']).stem}.md) ({ref['n_prompts']} "
                  f"Spec-Bench prompts from 0 x {ref['max_new_tokens']} tokens, float32, T=0; host "
                  f"{host.get('device')}, {host.get('date', '').split(' ')[0]}). Its τ and α carry over "
                  "between hosts; its draft ms does not.", ""]
        lines += table(["drafter", "chain", "τ", "α by position", "draft ms / step"],
                       [[ref["drafter"], f"chain-{k}", num(c["tau"], 3),
                         " / ".join(num(a, 3) for a in c["alpha_by_position"]), num(c["draft_ms"], 1)]
                        for k, c in sorted(ref["chains"].items(), key=lambda kv: int(kv[0]))])
    return lines


PAGES = {  # docs/results/<name>.md from docs/results/data/<name>.json (scripts/bench/results_pages.py)
    "full-recipes": Page(
        title="Full recipes of the parallel drafters beside EAGLE-3's at equal training budget",
        summary="a parallel drafter's full recipe run end to end (0.7 epoch of the EAGLE-3 recipe's "
                "answers): steps, seconds, τ, acceptance by depth, tokens/s, draft cost, served by vLLM, "
                "beside EAGLE-3's full recipe at the same chain",
        command="`python scripts/bench/full_recipes/full_recipes.py OUT.json NAME=RUN_DIR ...`",
        render=render_full_recipes),
    "eagle3-recipe": Page(
        title="The EAGLE-3 recipe with the levers that won: 3 epochs over offline features, beside the "
              "0.7-epoch recipe it replaces",
        summary="smollm2-eagle3 run end to end with 3 epochs over features extracted once and a validation "
                "split from the eval's distribution: steps, seconds, τ of its 16-node tree and a chain of 5, "
                "the estimate vs the measured τ, beside the 0.7-epoch recipe at the same chain",
        command="`bash scripts/bench/full_recipes/recipe_epochs.sh OUT`, then `python "
                "scripts/bench/full_recipes/full_recipes.py OUT.json smollm2-eagle3=OUT`",
        render=render_full_recipes),
    "eagle3-recipe-muon": Page(
        title="The EAGLE-3 recipe with Muon at 10 x lr against AdamW at its full budget (3 epochs offline)",
        summary="smollm2-eagle3 run end to end with Muon at 10 x lr (the 300-step ablation's winner, "
                "docs/results/eagle3-ablations.md) beside the AdamW run of the same recipe, data, features "
                "and steps (docs/results/eagle3-recipe.md): steps, wall and core-hours, the validation "
                "estimate, τ of the 16-node tree",
        command="`bash scripts/bench/full_recipes/recipe_epochs.sh OUT 3 train.optimizer=muon`, then `python "
                "scripts/bench/full_recipes/full_recipes.py OUT.json NAME=OUT "
                "NAME2=docs/results/data/eagle3-recipe.json#smollm2-eagle3`",
        render=render_full_recipes),
}
