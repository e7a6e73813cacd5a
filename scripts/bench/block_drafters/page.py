"""The block drafters against EAGLE-3 at equal steps on a page: docs/results/block-drafters.md from
block_drafters.py's JSON."""

from __future__ import annotations

from draftsmith.eval.measure.campaign import Page, delta_ci, num, table, tau_paired

QUICK_ANCHORS = 64  # the quick block recipes' drafter.dflash.anchors (configs/runs/smollm2-dflash-quick.yaml)

def describe(r: dict) -> str:
    s = r.get("shape") or {}
    optimizer = ((f", {s['optimizer']}" if s.get("optimizer", "adamw") != "adamw" else "")
                 + (f" at lr {s['muon_lr']}" if s.get("muon_lr") and s.get("optimizer") == "muon" else "")
                 + (f", loss {s['loss']}" if s.get("loss", "kl") != "kl" else "")
                 + (", batches grouped by length" if s.get("group_by_length") else "")
                + (", lm_head frozen" if s.get("train_lm_head") is False else ""))
    if r["kind"] == "eagle3":
        norms = [k for k in ("norm_before_fc", "fc_norm", "norm_output") if s.get(k)]
        return (f"EAGLE-3, TTT {r.get('ttt_steps')}"
                + (", steps weighted by their share of the expected accepted length"
                   if s.get("step_weights") == "acceptance" else "")
                + (f", EAGLE-3.1 norms ({', '.join(norms)})" if norms else "") + optimizer)
    weights = {"acceptance": "slots weighted by their share of the expected accepted length",
               "dpace": "D-PACE slot weights (softened acceptance, / the counted slots)"}
    words = [f"{s.get('num_layers')} layers", f"a block of {s.get('block_size') or s.get('chain')}",
             weights.get(s.get("slot_weights"), f"slot weight {num(s.get('head_decay'), 3)}^(i-1)")]
    if s.get("anchors") and s["anchors"] != QUICK_ANCHORS:
        words.append(f"up to {s['anchors']} anchors a sequence")
    if r["kind"] == "dspark":
        words.append(f"Markov rank {s.get('markov_rank')}" + (", confidence head" if s.get("confidence_head")
                                                               else ""))
    return f"{r['kind']}: " + ", ".join(words) + optimizer


def render_block_drafters(data: dict) -> list[str]:
    rows, base = data["rows"], data["baseline"]
    b = rows[base]
    first = next(iter(b["evals"].values()))
    lines = [f"Every row trained online on the reference target from the same self-distilled answers "
             f"({(b.get('shape') or {}).get('answers')} answers, {b.get('train_sequences', '?')} training "
             f"sequences), {b['train_steps']} steps of batch 4 at learning rate {b['lr']}, the same 8k "
             f"draft vocabulary and the quick recipes' settings otherwise, and judged by `draftsmith eval` "
             f"in float32 at T=0 on the first Spec-Bench prompts (the table gives how many) x "
             f"{first['max_new_tokens']} tokens of each split (eval's stratified order, so a shorter run's "
             f"prompts are the first of a longer one's): the **choice** split (prompts from 80), "
             f"where a block drafter is picked or a lever adopted, and the **report** split (prompts from "
             f"0), where the pick is reported. In brackets: the row minus `{base}` in τ on the prompts "
             f"both decoded (pooled, bootstrap 95 % interval, 2,000 resamples); an interval that holds 0 "
             f"is no difference. Training seconds are not figures here: the rows shared the cores with "
             f"other jobs.", ""]

    def depth(r: dict, e: str) -> str:
        ev = r["evals"].get(e)
        return " / ".join(num(a, 2) for a in ev["acceptance_by_depth"] or []) if ev else "—"

    ordered = [base, *[n for n in rows if n != base]]

    def prompts(r: dict) -> str:
        return " / ".join(str(r["evals"][e]["n_prompts"]) if e in r["evals"] else "—"
                          for e in ("choice-chain-4", "report-chain-4"))

    lines += table(["row", "drafter", "steps", "prompts (choice / report)", "τ chain-4, choice (Δ)",
                    "τ chain-4, report (Δ)",
                    "acceptance by depth, report", "validation expected τ"],
                   [[n, describe(rows[n]), rows[n]["train_steps"], prompts(rows[n]),
                     tau_paired(rows[n], "choice-chain-4"),
                     tau_paired(rows[n], "report-chain-4"), depth(rows[n], "report-chain-4"),
                     num((rows[n].get("validation") or {}).get("expected_tau"), 3)] for n in ordered])
    against = [(n, r) for n, r in rows.items() if r.get("paired_dflash")]
    if against:
        lines += ["The same rows against `dflash` (the shipped DFlash shape), paired on the prompts both "
                  "decoded:", ""]
        lines += table(["row", "Δτ chain-4 vs dflash, choice", "Δτ chain-4 vs dflash, report"],
                       [[n, *(delta_ci(p) if (p := r["paired_dflash"].get(e)) else "—"
                              for e in ("choice-chain-4", "report-chain-4"))] for n, r in against])
    levers = [(n, r) for n, r in rows.items() if r.get("paired_twin")]
    if levers:
        lines += ["Each lever on top of the row it extends: a row `X-L` minus row `X`, which differs only in "
                  "lever L (an `-acc` row: acceptance weights instead of the position decay), paired on the "
                  "prompts both decoded:", ""]
        lines += table(["row", "against", "Δτ chain-4, choice", "Δτ chain-4, report"],
                       [[n, r["paired_twin"]["twin"], *(delta_ci(p) if (p := r["paired_twin"].get(e)) else "—"
                                                        for e in ("choice-chain-4", "report-chain-4"))]
                        for n, r in levers])
    longer = sorted({e.split("-", 1)[1] for r in rows.values() for e in r["evals"]} - {"chain-4"})
    for chain in longer:  # a row whose block is longer than 4, judged at its own length too
        judged = [n for n in ordered if f"choice-{chain}" in rows[n]["evals"]]
        lines += [f"At its own block length, a {chain}:", ""]
        lines += table(["row", f"τ {chain}, choice", f"τ {chain}, report", "acceptance by depth, report"],
                       [[n, num(rows[n]["evals"][f"choice-{chain}"]["tau"], 3),
                         num((rows[n]["evals"].get(f"report-{chain}") or {}).get("tau"), 3),
                         depth(rows[n], f"report-{chain}")] for n in judged])
    if data.get("pick") and "report-chain-4" in b["evals"]:
        p = data["pick"]
        lines += [f"Picked on the choice split: **{p}** ({describe(rows[p])}); on the report split it drafts "
                  f"τ {tau_paired(rows[p], 'report-chain-4')} as a chain of 4 against EAGLE-3's "
                  f"{num(b['evals']['report-chain-4']['tau'], 3)}.", ""]
    return lines


PAGES = {  # docs/results/<name>.md from docs/results/data/<name>.json (scripts/bench/results_pages.py)
    "block-drafters": Page(
        title="Block drafters (DFlash, DSpark) against EAGLE-3 at equal steps",
        summary="rows trained online from the same answers for the same steps, picked on one Spec-Bench "
                "split and reported on another, paired against EAGLE-3",
        command="`bash scripts/bench/block_drafters/block_drafters.sh OUT`",
        render=render_block_drafters),
    "block-drafters-muon": Page(
        title="DFlash and DSpark against EAGLE-3, all trained with Muon at 10x lr, at equal steps",
        summary="the picked block drafter (dflash-acc) and DSpark with the optimiser the eagle3 recipe took, "
                "paired against the eagle3-muon10 row on two Spec-Bench splits",
        command="`ROWS='dflash-acc-muon10 dspark-acc-muon10' bash "
                "scripts/bench/block_drafters/block_drafters.sh OUT` "
                "(OUT/eagle3: the eagle3-muon10 row)",
        render=render_block_drafters),
    "eagle3-ablations": Page(
        title="EAGLE-3 levers one at a time (Muon, EAGLE-3.1 norms, acceptance weights, acceptance-aligned "
              "losses) against EAGLE-3",
        summary="each lever against the eagle3 row that differs only in it, trained online from the same "
                "answers for the same steps, judged on two Spec-Bench splits",
        command="`ROWS='eagle3 eagle3-acc eagle3-muon eagle3-muon10 eagle3-norms eagle3-muon10-nbf "
                "eagle3-muon10-lk eagle3-muon10-tvd' bash "
                "scripts/bench/block_drafters/block_drafters.sh OUT`",
        render=render_block_drafters),
}
