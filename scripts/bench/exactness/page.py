"""The exactness tests' power on a page: docs/results/exactness.md from exactness_power.py's JSON."""

from __future__ import annotations

from draftsmith.eval.measure.campaign import Page, num, pvalue, table


def render_exactness(data: dict) -> list[str]:
    alpha, power = data["alpha"], data["required_power"]
    lines = [f"Chi-square tests at α = {alpha}; a test must reach power {power} against what it claims to "
             "detect. Power is computed from the enumerated laws (`tests/exactness.py`): the probability "
             "that the test's draws reject a law at that total-variation (TV) distance from the exact one.",
             "", "## The acceptance rule and the batched decoder", "",
             "Each sampled test against a generic alternative at TV 0.03, and each negative twin (a "
             "deliberately wrong rule) at its own TV from the exact law.", ""]
    flat = [r for r in data["rows"] if "tv" in r]
    lines += table(["test", "what is sampled", "against", "draws", "cells", "TV from the exact law", "power"],
                   [[f"`{r['test'].split()[0]}` {' '.join(r['test'].split()[1:])}", r["rule"],
                     r["twin"] or "generic alternative", num(r["draws"]), r["cells"], num(r["tv"], 4),
                     num(r["power"], 4)]
                    for r in flat])
    deep = [r for r in data["rows"] if "detects_tv" in r]
    lines += ["## Decoder-level tests at depth", "",
              "Histograms of whole 4-token outputs (a verification at depth 2 plus the bonus token) through "
              "the batched decoder (`tests/unit/test_exact_depth.py`). `detects TV`: the TV this test "
              f"rejects with power {power}; `p`: the correct decoder's p-value (it must not be rejected); "
              "the twin must be rejected.", ""]
    lines += table(["drafting mode", "sampling", "draws", "cells", "detects TV", "p (correct)",
                    "depth-2 accepts", "negative twin", "twin p", "histogram TV: twin / correct"],
                   [[r["mode"], r["sampling"], num(r["draws"]), r["cells"], num(r["detects_tv"], 3),
                     pvalue(r["p_value"]), num(r["depth2_accepts"]), r["twin"], pvalue(r["twin_p_value"]),
                     f"{num(r['twin_histogram_tv'], 4)} / {num(r['correct_histogram_tv'], 4)}"]
                    for r in deep])
    return lines


PAGES = {  # docs/results/<name>.md from docs/results/data/<name>.json (scripts/bench/results_pages.py)
    "exactness": Page(
        title="Exactness tests and their power",
        summary="the power of every exact-sampling test and the negative twins each one rejects",
        command="`python scripts/bench/exactness/exactness_power.py OUT.json`",
        render=render_exactness),
}
