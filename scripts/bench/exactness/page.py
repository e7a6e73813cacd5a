"""The exactness tests' power on a page: docs/results/exactness.md from exactness_power.py's JSON."""

from __future__ import annotations

from draftsmith.eval.measure.campaign import Page, num, pvalue, table


def render_exactness(data: dict) -> list[str]:
    alpha, power = data["alpha"], data["required_power"]
    kept = data.get("sampled_rows_from")
    lines = [] if not kept else [
        f"The sampled tests' rows below were recorded on {kept['date']} (`{kept['command']}`; "
        f"{kept['host'].get('device')}, torch {kept['host'].get('torch')}); the enumeration section was "
        "measured on the host above.", ""]
    lines += [f"Chi-square tests at α = {alpha}; a test must reach power {power} against what it claims to "
             "detect. Power is computed from the enumerated laws (`tests/exactness.py`): the probability "
             "that the test's draws reject a law at that total-variation (TV) distance from the exact one.",
             "", "## The acceptance rule and the batched decoder", "",
             "Each sampled test against a generic alternative at TV 0.03, and each negative twin (a "
             "deliberately wrong rule) at its own TV from the exact law.", ""]
    flat = [r for r in data["rows"] if "tv" in r and "group" not in r]
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
    enum = [r for r in data["rows"] if "group" in r]
    if enum:
        lines += enumeration_section(enum)
    return lines


def enumeration_section(rows: list[dict]) -> list[str]:
    """The enumeration tests: exact distances, no sampling noise."""
    lines = ["", "## Every random outcome enumerated", "",
             "`tests/unit/test_exact_enumeration.py` replays every random outcome of the batch-1 decoder "
             "(`SpeculativeDecoder.generate`: the prefill's token and the first verifications, through the "
             "real proposer and acceptance rule; `tests/exactness.py` `enumerate_decoder`) with its exact "
             "probability, continues each by the target's own sampling and compares the law of the first "
             "tokens with the target's. No draws: a test detects every error above its tolerance with "
             "certainty (power 1), so the negative twins can be subtle. `deep`: probability that a "
             "verification accepted depth 2; `non-first`: that it accepted a node that is not its parent's "
             "first child (trees).", ""]
    head = ["drafting mode", "verifications", "tokens compared", "outcomes", "deep", "non-first",
            "TV from the target's law", "tolerance"]

    def row(r):
        return [r["mode"], r["verifications"], r["length"], num(r["outcomes"]), num(r["deep"], 3),
                num(r["non_first"], 3) if r["tree"] else "–", f"{r['tv']:.1e}", f"< {r['tolerance']:g}"]

    lines += table(head, [row(r) for r in rows if r["group"] == "mode"])
    lines += ["", "Windowed, latent-attention, sink and recurrent families (tests/families.py, V = 4): a "
              "3-level ranked tree from the target's own top-2 (its argmax on a non-first branch every third "
              "step) over two verifications at T = 1, top-k 2, the second one after the first's rollback "
              "(recurrent targets: the tree verified one branch per row, the accepted row kept).", ""]
    lines += table(head, [row(r) for r in rows if r["group"] == "family"])
    lines += ["", "Negative twins (each must be farther than its tolerance from the target's law):", ""]
    lines += table(["twin", "breaks", "outcomes", "TV from the target's law", "must exceed"],
                   [[r["mode"], r["twin_of"], num(r["outcomes"]), f"{r['tv']:.1e}", f"{r['tolerance']:g}"]
                    for r in rows if r["group"] == "twin"])
    return lines


PAGES = {  # docs/results/<name>.md from docs/results/data/<name>.json (scripts/bench/results_pages.py)
    "exactness": Page(
        title="Exactness tests and their power",
        summary="the power of every exact-sampling test and the negative twins each one rejects",
        command="`python scripts/bench/exactness/exactness_power.py OUT.json`",
        render=render_exactness),
}
