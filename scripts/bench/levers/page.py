"""The levers at equal data on a page: docs/results/levers.md from levers.py's JSON."""

from __future__ import annotations

from draftsmith.eval.measure.campaign import Page, num, served_table, table, tau_paired


def render_levers(data: dict) -> list[str]:
    base = data["baseline"]
    # the baseline first
    rows = {base: data["rows"][base], **{n: r for n, r in data["rows"].items() if n != base}}
    b = rows[base]
    first = b["evals"].get("chain-5") or next(iter(b["evals"].values()))

    def lever(name: str, r: dict) -> str:
        if r["kind"] != b["kind"]:
            return f"kind {r['kind']} (a block of 4 in one forward)"
        said = []
        if r["ttt_steps"] != b["ttt_steps"]:
            said.append(f"TTT {r['ttt_steps']}")
        if r["lookup_weight"] != b["lookup_weight"]:
            said.append(f"lookup weight {r['lookup_weight']:g}")
        if r["train_steps"] != b["train_steps"]:
            said.append(f"{r['train_steps']} steps ({r.get('epochs', '?')} epochs)")
        return ", ".join(said) or "the baseline"

    lines = [f"Every row trained from the same offline features ({b.get('train_sequences', '?')} training "
             "sequences of the EAGLE-3 recipe's first answers, "
             "`scripts/bench/speculators_peer/speculators_peer.sh`'s extraction), the same draft vocabulary, "
             f"learning rate {b['lr']} and warm-up, and judged by `draftsmith eval` on the same "
             f"{first['n_prompts']} Spec-Bench prompts x {first['max_new_tokens']} tokens at T=0. The "
             f"baseline `{base}` is speculators-peer's draftsmith row ({b['train_steps']} steps, TTT "
             f"{b['ttt_steps']}). In brackets: the row minus the baseline in τ, paired over the prompts "
             "(pooled, bootstrap 95 % interval, 2,000 resamples); an interval that holds 0 is no difference. "
             "Train s: the training loop's seconds (its validation pass included); s / step: the median over "
             "its logging intervals of 10 steps.", ""]
    eagle = [(n, r) for n, r in rows.items() if r["kind"] == b["kind"]]
    def secs(r: dict) -> str:
        return f"{num(r['train_seconds'], 0)} ({num(r.get('median_step_seconds'), 2)})"

    lines += table(["row", "lever", "steps (epochs)", "train s (median s / step)", "τ 16-node tree (Δ)",
                    "τ chain-5 (Δ)", "τ 16-node tree + lookup 5 (Δ)", "validation expected τ chain-5"],
                   [[n, lever(n, r), f"{r['train_steps']} ({r.get('epochs', '?')})", secs(r),
                     tau_paired(r, "dynamic-16"), tau_paired(r, "chain-5"),
                     tau_paired(r, "dynamic-16-lookup"),
                     num((r.get("validation") or {}).get("expected_tau_joint"), 3)] for n, r in eagle])
    blocks = [(n, r) for n, r in rows.items() if "chain-4-fp32" in r["evals"]]
    if len(blocks) > 1:
        e0 = b["evals"].get("chain-4-fp32") or blocks[0][1]["evals"]["chain-4-fp32"]
        lines += ["The parallel drafters against EAGLE-3 at equal steps, each drafting 4 tokens per "
                  "verification (a chain of 4), in float32 with timing; plain decoding measured once in the "
                  f"baseline's run ({num(e0.get('baseline_tokens_per_s'), 1)} tokens/s). Single runs on this "
                  "host: tokens/s is indicative (timing noise here 9–24 %, docs/results/plan-compare.md).",
                  ""]
        plain = e0.get("baseline_tokens_per_s")
        lines += table(["row", "kind", "train s (median s / step)", "τ chain-4 (Δ)", "acceptance by depth",
                        "draft ms / step", "verify ms / step", "tokens/s", "x plain"],
                       [[n, r["kind"], secs(r), tau_paired(r, "chain-4-fp32"),
                         " / ".join(num(a, 2) for a in r["evals"]["chain-4-fp32"]["acceptance_by_depth"]
                                    or []),
                         num((r["evals"]["chain-4-fp32"].get("step_ms") or {}).get("draft"), 1),
                         num((r["evals"]["chain-4-fp32"].get("step_ms") or {}).get("verify"), 1),
                         num(r["evals"]["chain-4-fp32"]["tokens_per_s"], 1),
                         num(r["evals"]["chain-4-fp32"]["tokens_per_s"] / plain, 2) if plain else "—"]
                        for n, r in blocks])
    chosen = [(n, r) for n, r in rows.items() if "choice-dynamic-16" in r["evals"]]
    if chosen:
        c0 = chosen[0][1]["evals"]["choice-dynamic-16"]
        start = c0.get("offset") or 0
        lines += ["The choice split: the same rows on Spec-Bench's prompts "
                  f"{start}–{start + c0['n_prompts'] - 1} of eval's stratified order (disjoint from the ones "
                  f"above), {c0['max_new_tokens']} tokens, T=0, paired against `{base}` on them. A lever is "
                  "adopted only where its interval here excludes 0 as well.", ""]
        lines += table(["row", "lever", "τ 16-node tree (Δ)", "τ chain-5 (Δ)"],
                       [[n, lever(n, r), tau_paired(r, "choice-dynamic-16"), tau_paired(r, "choice-chain-5")]
                        for n, r in chosen])
    served = [(n, r["engine"]) for n, r in rows.items() if r.get("engine")]
    lines += served_table(served, "row")
    return lines


PAGES = {  # docs/results/<name>.md from docs/results/data/<name>.json (scripts/bench/results_pages.py)
    "levers": Page(
        title="Levers at equal data: TTT depth, epochs, lookup-aware weighting and the parallel drafters "
              "against EAGLE-3",
        summary="rows trained from one set of offline features and judged on the same prompts, paired "
                "against the EAGLE-3 baseline: τ, training seconds, tokens/s, served α",
        command="`bash scripts/bench/levers/levers.sh OUT PEER`",
        render=render_levers),
}
