"""GPU mechanics on a page: docs/results/gpu-check.md from the JSON scripts/gpu_check.sh writes (the runner
stays in scripts/: a user runs it on a CUDA machine).
"""

from __future__ import annotations

from draftsmith.eval.measure.campaign import Page, num, table


def render_gpu_check(data: dict) -> list[str]:
    runs = data["runs"]
    lines = [f"`scripts/gpu_check.sh` on {data['host']['device']} (torch {data['host']['torch']}, CUDA "
             f"{data['host'].get('cuda')}, transformers {data['host']['transformers']}), {len(runs)} runs of "
             "the same command on fresh leases: Llama-shaped targets with random weights in bfloat16 (HF "
             "eager attention, batch 1, no CUDA graphs), so only the cost side is measured, never "
             "acceptance. Verification: one forward of k new tokens on a 512-token cached context with a "
             "tree mask, then the cache cropped back; relative = ms(k) / ms(1), what a k-node tree costs "
             "against a plain step. Decoder overhead: 128 greedy tokens by our decoder's loop (no drafter) "
             "against HF `generate`, best of 3.", ""]
    for name in runs[0]["targets"]:
        # a lease cut short lacks later sizes
        ids = [i + 1 for i, r in enumerate(runs) if name in r["targets"]]
        rows = [runs[i - 1]["targets"][name] for i in ids]
        ks = list(rows[0]["verification"]["ms"])
        lines += [f"**{name}** ({rows[0]['parameters'] / 1e9:.2f} B parameters), verification forward:", ""]
        lines += table(["k new tokens", *[f"ms, run {i}" for i in ids], *[f"relative, run {i}" for i in ids]],
                       [[k, *[num(r["verification"]["ms"][k], 1) for r in rows],
                         *[num(r["verification"]["relative"][k], 2) for r in rows]] for k in ks])
        lines += table(["decoder overhead", *[f"run {i}" for i in ids]],
                       [[label,
                         *[num(r["decoder_overhead"][key], 3 if key == "ours_over_hf" else 1) for r in rows]]
                        for label, key in (("ours tok/s", "ours_tok_s"), ("HF generate tok/s", "hf_tok_s"),
                                           ("ours / HF", "ours_over_hf"))])
        for i, r in zip(ids, rows):
            if not r.get("draft_cost"):
                continue
            c = r["draft_cost"]
            lines += [f"Draft cost on {name}, run {i}: untrained drafters built for it as the recipes build "
                      f"them ({c['draft_vocab']:,}-token draft vocabulary), our decoder on {c['prompts']} "
                      f"random prompts x {c['new_tokens']} tokens, {c['rounds']} rounds of every arm in "
                      "turn; drafting ms per verification from the step split (best round), and that over "
                      "one EAGLE-3 level (its chain-1 cost):", ""]
            lines += table(["arm", "draft ms / verification", "rounds", "x one EAGLE-3 level",
                            "verify ms / step"],
                           [[arm, num(a["draft_ms"], 2), " / ".join(num(x, 2) for x in a["draft_ms_rounds"]),
                             num(a["of_one_eagle3_level"], 2), num(a["verify_ms"], 1)]
                            for arm, a in c["arms"].items()])
    lines += ["Tests marked `gpu` (`pytest -m gpu`, greedy speculative output equals HF `generate` on CUDA "
              "with an untrained Medusa tree and EAGLE-3 dynamic tree):", "", f"    {data['pytest']}", ""]
    return lines


PAGES = {  # docs/results/<name>.md from docs/results/data/<name>.json (scripts/bench/results_pages.py)
    "gpu-check": Page(
        title="GPU mechanics: verification cost, decoder overhead and draft cost on an H200",
        summary="random-weight 1B and 8B Llama shapes in bf16: ms of a k-node verification forward, our "
                "decoder's loop against HF generate, drafting ms per verification of EAGLE-3 chains and "
                "P-EAGLE / DFlash blocks, and the CUDA tests",
        command="`bash scripts/gpu_check.sh` (on a CUDA machine)",
        render=render_gpu_check),
}
