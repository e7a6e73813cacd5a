"""Drafting cost per verification on a page: docs/results/draft-cost.md from draft_cost.py's JSON."""

from __future__ import annotations

from draftsmith.eval.measure.campaign import Page, num, table


def render_draft_cost(data: dict) -> list[str]:
    lines = [f"Our decoder on the first {data['limit']} Spec-Bench prompts x {data['tokens']} tokens, T=0, "
             f"{data['dtype']}, {data['repeats']} rounds of every arm in turn; drafters of the reference "
             "target with random weights and the recipes' shapes (cost does not depend on training: every "
             "step drafts the whole chain or block). Draft ms per verification from the decoder's step "
             "split; one EAGLE-3 level is its chain-1 cost.", ""]
    lines += table(["arm", "draft vocabulary", "draft ms / verification", "rounds", "x one EAGLE-3 level",
                    "verify ms / step"],
                   [[a["name"], f"{a['draft_vocab']:,}", num(a["draft_ms"], 2),
                     " / ".join(num(x, 2) for x in a["draft_ms_rounds"]), num(a["of_one_eagle3_level"], 2),
                     num(a["verify_ms"], 1)] for a in data["arms"]])
    return lines


PAGES = {  # docs/results/<name>.md from docs/results/data/<name>.json (scripts/bench/results_pages.py)
    "draft-cost": Page(
        title="Drafting cost per verification: EAGLE-3 levels against one-forward blocks",
        summary="ms of drafting per target verification for EAGLE-3 chains, P-EAGLE and DFlash blocks of 4 "
                "and 8 (a full and a reduced draft vocabulary)",
        command="`python scripts/bench/draft_cost/draft_cost.py OUT.json`",
        render=render_draft_cost),
}
