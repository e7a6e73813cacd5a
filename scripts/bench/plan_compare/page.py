"""The serving plan across drafters on a page: docs/results/plan-compare.md from plan_compare.py's JSON."""

from __future__ import annotations

from draftsmith.eval.measure.campaign import Page, num, table


def render_plan_compare(data: dict) -> list[str]:
    cal = data["calibration"]
    lines = ["`draftsmith plan` with several drafters of one target: each planned by our decoder on the same "
             f"{cal['n']} calibration prompts ({cal['prompts']}, from {cal['offset']}, disjoint from eval's) "
             f"x {cal['max_new_tokens']} tokens, {data['dtype']}; a drafter's figures are over its own plain "
             "runs, and the choice is the fastest chosen setting, its lead counted only beyond the larger "
             "timing noise.", ""]
    for batch, part in data["choices"].items():
        lines += [f"## Batch {batch}: what to serve", "", part["why"], ""]
        lines += table(["drafter", "kind", "its plan's choice", "τ", "x its plain", "noise"],
                       [[r["name"], r["kind"], r["label"], num(r["tau"], 2), num(r["speedup"], 3),
                         num(r["noise"], 3)]
                        for r in part["drafters"]])
        for name, plan in data["plans"].items():
            own = plan["by_batch"].get(batch)
            if not own:
                continue
            lines += [f"Every candidate of **{name}** ({plan['kind']}), plain "
                      f"{num(own['plain_tokens_per_s'], 1)} tok/s:", ""]
            lines += table(["candidate", "τ", "tok/s", "x plain", "draft ms / step", "verify ms / step"],
                           [[c["label"], num(c.get("tau"), 2), num(c.get("tokens_per_s"), 1),
                             num(c.get("speedup"), 3), num((c.get("step_ms") or {}).get("draft"), 1),
                             num((c.get("step_ms") or {}).get("verify"), 1)]
                            if not c.get("skipped") else [c["label"], "skipped", "", "", "", ""]
                            for c in own["candidates"]])
    return lines


PAGES = {  # docs/results/<name>.md from docs/results/data/<name>.json (scripts/bench/results_pages.py)
    "plan-compare": Page(
        title="Which drafter to serve: the plan across EAGLE-3, the parallel drafters and prompt lookup",
        summary="draftsmith plan with several drafters on the same calibration prompts: every drafter's "
                "candidates and chosen setting, and the one to serve",
        command="`python scripts/bench/plan_compare/plan_compare.py OUT DRAFTER [DRAFTER ...]`",
        render=render_plan_compare),
}
