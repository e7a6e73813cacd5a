"""The validation estimate against the measured τ on a page: docs/results/validation-gap.md from
validation_gap.py's JSON.
"""

from __future__ import annotations

from pathlib import Path

from draftsmith.eval.measure.campaign import Page, num, table


def render_validation_gap(data: dict) -> list[str]:
    rows = data["rows"]
    any_row = next(iter(rows.values()))
    tree = any_row["measured"]["dynamic-16"]
    ev = any_row["eval_distribution"]
    lines = ["The training-time estimate of τ (training's own validation: `validate` then `serving_tau`, the "
             "same code path as `train.select: expected_tau`) against the τ our decoder measured on "
             f"{tree['prompts']} Spec-Bench prompts at T=0 ({tree['dtype']}), for the rows of "
             "[levers](levers.md). Two validation splits: **held-out**, the row's own (held-out training "
             f"answers, `data.val_fraction`), and **eval distribution**, {ev['sequences']} conversations "
             f"({ev['tokens']:,} answer tokens) from `{Path(data['data']).name}`: the target's greedy "
             "answers to Spec-Bench prompts disjoint from the measured ones (what `data.validation` takes). "
             "Ratio = estimate / measured; the goal is within 10 %. 16-node tree: `expected_tau_serving` "
             "(the best static tree of 16 nodes from the rank accuracies) against the recipe's dynamic "
             "16-node tree; chain of 5: `expected_tau_joint` (conditional acceptance by depth) against a "
             "chain of 5.", ""]
    logged = [n for n, r in rows.items() if r.get("logged")
              and r["logged"].get("expected_tau_serving") is not None]
    if logged:
        gap = max(abs(rows[n]["held_out"]["expected_tau_serving"] - rows[n]["logged"]["expected_tau_serving"])
                  for n in logged)
        lines += ["The held-out figures are recomputed here from the live target; they match what each row "
                  f"logged while training within {num(gap, 3)} τ (the tool reproduces training's number).",
                  ""]
    lines += table(["row", "steps", "τ tree-16 measured", "estimate held-out (ratio)",
                    "estimate eval distribution (ratio)", "τ chain-5 measured", "estimate held-out (ratio)",
                    "estimate eval distribution (ratio)"],
                   [[n, r.get("steps", "—"), num(r["measured"]["dynamic-16"]["tau"], 3),
                     f"{num(r['held_out']['expected_tau_serving'], 3)} "
                     f"({num(r['ratio']['held_out']['dynamic-16'], 3)})",
                     f"{num(r['eval_distribution']['expected_tau_serving'], 3)} "
                     f"({num(r['ratio']['eval_distribution']['dynamic-16'], 3)})",
                     num(r["measured"]["chain-5"]["tau"], 3),
                     f"{num(r['held_out']['expected_tau_joint'], 3)} "
                     f"({num(r['ratio']['held_out']['chain-5'], 3)})",
                     f"{num(r['eval_distribution']['expected_tau_joint'], 3)} "
                     f"({num(r['ratio']['eval_distribution']['chain-5'], 3)})"] for n, r in rows.items()])
    return lines


PAGES = {  # docs/results/<name>.md from docs/results/data/<name>.json (scripts/bench/results_pages.py)
    "validation-gap": Page(
        title="The validation estimate against the measured τ: held-out training answers vs the eval's "
              "distribution",
        summary="training's expected τ on two validation splits beside the τ our decoder measured, for every "
                "levers row",
        command="`python scripts/bench/validation_gap/validation_gap.py LEVERS_OUT --data ANSWERS`",
        render=render_validation_gap),
}
