"""draftsmith's EAGLE-3 trainer against speculators' on a page: docs/results/speculators-peer.md (stage 1) and
speculators-peer-epoch.md (stage 2) from the peer.json speculators_peer.sh writes (collect.py); its DFlash arm
(ARM=dflash) on speculators-peer-dflash.md and speculators-peer-dflash-epoch.md. The columns are the JSON's
`columns` (the committed EAGLE-3 pages have none: the 16-node tree and a chain of 5).
"""

from __future__ import annotations

import re

from draftsmith.eval.measure.campaign import Page, delta_ci, num, served_table, table


def answers_used(data: dict) -> str:
    """'all the answers' when the command's ANSWERS limit exceeds the sequences extracted, else 'the first N
    answers'."""
    limit = re.search(r"\bANSWERS=(\d+)", data.get("command", ""))
    got = (data.get("peer_info") or {}).get("sequences")
    if limit and got is not None and int(limit.group(1)) > got:
        return "all the answers"
    return f"the first {limit.group(1)} answers" if limit else "the answers"


NAMES = {"spec-bench": "Spec-Bench", "mt-bench": "MT-bench"}
COLUMNS = ("dynamic-16", "chain-5")  # a JSON without `columns`: the EAGLE-3 arm's


def columns_of(data: dict) -> list[str]:
    return list(data.get("columns") or COLUMNS)


def depth_tree(columns: list[str]) -> str:
    """The column whose acceptance by depth the page shows: its longest chain."""
    return max((t for t in columns if t.startswith("chain-")), key=lambda t: int(t.split("-")[1]),
               default=columns[-1])


def tree_header(tree: str) -> str:
    kind, _, n = tree.partition("-")
    return f"τ {n}-node tree" if kind == "dynamic" else f"τ {tree}"


def trees_phrase(columns: list[str]) -> str:
    """'the recipe's 16-node dynamic tree and a chain of 5', 'chains of 4 and 3'."""
    sizes = [t.partition("-")[2] for t in columns]
    if len(columns) > 1 and all(t.startswith("chain-") for t in columns):
        return f"chains of {' and '.join(sizes)}"
    return " and ".join(f"the recipe's {n}-node dynamic tree" if t.startswith("dynamic-") else
                        f"a chain of {n}" for t, n in zip(columns, sizes))


def render_speculators_peer(data: dict) -> list[str]:
    return [*_setup(data), *_arm(data), *_trainers(data), *_every_set_and_tree(data), *_served(data),
            *_estimates(data)]


def _setup(data: dict) -> list[str]:
    """What both trained on and how they were judged and timed."""
    info = data.get("peer_info") or {}
    columns = columns_of(data)
    first = data["ours"][depth_tree(columns)]
    evals = data["ours"].get("evals") or {"spec-bench": {}}
    more = sorted({t for trees in evals.values() for t in trees} - set(columns))
    peer = data["peer"]
    span, sittings = peer.get("train_steps_span_seconds"), peer.get("train_sittings") or 1
    dflash = info.get("arm") == "dflash"
    lines = [("DFlash" if dflash else "EAGLE-3") + " on the reference target trained twice from the same "
             "offline features (" + ("the EAGLE-3 arm's " if dflash else "") + "`draftsmith "
             f"extract` of {answers_used(data)} of the smollm2-eagle3 recipe: "
             f"{info.get('train_sequences', '?')} training sequences), the same draft vocabulary, steps, "
             "learning rate and schedule: by draftsmith (`draftsmith train"
             + (" -c smollm2-dflash" if dflash else "") + "`) and by speculators 0.9.0's own trainer ("
             + ("`--speculator-type dflash`, " if dflash else "") + "one CPU process, "
             "`scripts/bench/speculators_peer/speculators_peer.py train`). Both "
             f"judged by `draftsmith eval` on {first['n_prompts']} "
             + (f"{NAMES.get(next(iter(evals)), next(iter(evals)))} prompts" if len(evals) == 1 else
                f"prompts of each of {' and '.join(NAMES.get(x, x) for x in evals)}")
             + f" x {first['max_new_tokens']} tokens at "
               f"T=0{', ' + first['dtype'] if first.get('dtype') else ''} with {trees_phrase(columns)}"
             + (f" (and {', '.join(more)} in the table of every set and tree)" if more else "")
             + "." + (" The third row is draftsmith again for as many steps as speculators' training seconds "
                      "buy at draftsmith's seconds per step (its own cosine schedule over those steps)."
             if "ours_wall" in data else ""), "",
             "Training seconds: draftsmith's are its training loop (its validation pass included), "
             "speculators' its whole process (start-up, a validation pass and the save included)" + (
                 f", summed over the {sittings} runs it took (each resumed from the last of its own "
                 "checkpoints, saved in float32 so the resumed run continues exactly; each run's start-up "
                 "counted)" if sittings > 1 else "")
             + (f"; its log spans {num(span, 0)} s from its first line to its last training step"
                + (", so the equal wall-clock row gives draftsmith up to "
                   f"{num(100 * (1 - span / peer['train_seconds']), 1)} % more time than exact equality"
                   if "ours_wall" in data else "")
                if span else "") + ".", ""]
    return lines


def _optimiser(s: dict) -> str:
    if s.get("optimizer") == "muon":
        return f"Muon at {s.get('muon_lr')} on the draft layers' matrices, AdamW at {s.get('lr')} on the rest"
    return f"{'AdamW' if s.get('optimizer') == 'adamw' else s.get('optimizer')} at {s.get('lr')}"


def _arm(data: dict) -> list[str]:
    """The optimiser each trainer ran with (where recorded) and, for DFlash, the block, the anchors and the
    differences kept (speculators' recipe, not ours)."""
    settings, info = data.get("settings") or {}, data.get("peer_info") or {}
    ours, peer = settings.get("ours") or {}, settings.get("peer") or {}
    lines = []
    if ours.get("optimizer") and peer.get("optimizer"):
        mine, theirs = _optimiser(ours), _optimiser(peer)
        who = f"both trainers: {mine}" if mine == theirs else f"draftsmith {mine}; speculators {theirs}"
        lines += [f"Optimiser, {who}; no weight decay in either group.", ""]
    if info.get("arm") != "dflash":
        return lines
    blocks = info.get("blocks_per_step") or {}
    on_average = (f": {num(blocks['peer_blocks_per_step'], 1)} and {num(blocks['ours_blocks_per_step'], 1)} "
                  "blocks per step on average over the epoch (`speculators_peer.py anchors`)"
                  if "peer_blocks_per_step" in blocks else "")
    if (peer.get("loss_fn"), peer.get("per_position_loss_weight")) == ("ce", "dpace"):
        their_loss = "cross-entropy on the target's argmax with D-PACE position weights"
    else:
        their_loss = f"{peer.get('loss_fn')} with {peer.get('per_position_loss_weight')} position weights"
    lines += [f"DFlash: {peer.get('num_layers', 2)} Qwen3 draft layers on both, full attention, a non-causal "
              f"block of {ours.get('block_size', 4)} mask slots after the anchor (speculators' --block-size "
              f"{peer.get('block_size', '?')} counts the anchor, --no-sample-from-anchor), mask token "
              f"{peer.get('mask_token_id', '?')}; at most {peer.get('max_anchors', '?')} blocks per packed "
              f"row (speculators) and {ours.get('anchors', '?')} per sequence, 4 sequences a step "
              f"(draftsmith){on_average}.", "",
              "Differences kept (speculators' own recipe):", "",
              f"- loss: speculators' {their_loss}; draftsmith's {str(ours.get('loss', 'kl')).upper()} to the "
              f"target's top-64 logits with {ours.get('slot_weights', 'acceptance')} slot weights",
              "- mask embedding: speculators' mask slots embed the target's frozen embedding of the mask "
              "token; draftsmith trains its own",
              "- anchors off by one: draftsmith anchors a block at a where token a + 1 is counted, "
              "speculators where token a is (both read the same loss mask): on an answer span s..e "
              "speculators never drafts the span's first token from slot 1, and its anchor at e drafts "
              "nothing counted",
              "- anchor cap: per packed row (speculators) against per sequence (draftsmith): equal blocks "
              "per step hold on average, not step by step", ""]
    return lines


def _trainers(data: dict) -> list[str]:
    """Each trainer's steps, seconds and τ on the trees of the page's columns, and the paired Δτ."""
    lines, rows = [], []
    columns = columns_of(data)
    depth = depth_tree(columns)
    trainers = [(who, name) for who, name in (("ours", "draftsmith"), ("peer", "speculators 0.9.0"),
                ("ours_wall", "draftsmith at speculators' training seconds")) if who in data]
    # stage 2 on: each trainer's own timer
    median = any("median_step_seconds" in data[who] for who, _ in trainers)
    if median:
        lines += ["Median s / step: draftsmith's over its logging intervals of 10 steps, speculators' over "
                  "its own per-step timer (profile/step_ms, from fetching a batch to the optimizer step's "
                  "end); unlike the summed seconds, blind to start-ups and to the steps a resumed run "
                  "repeated.", ""]
    for who, name in trainers:
        r = data[who]
        rows.append([name, r["train_steps"], num(r["train_seconds"], 0),
                     num(r["train_seconds"] / r["train_steps"], 2),
                     *([num(r.get("median_step_seconds"), 2)] if median else []),
                     *(num(r[tree]["tau"], 3) for tree in columns),
                     " / ".join(num(x, 2) for x in r[depth]["acceptance_by_depth"] or [])])
    lines += table(["trainer", "steps", "train s", "s / step", *(["median s / step"] if median else []),
                    *map(tree_header, columns), f"acceptance by depth, {depth}"], rows)
    if data.get("paired"):
        lines += ["draftsmith − speculators in τ, paired over the same prompts (pooled Δτ and a bootstrap 95 "
                  "% interval over prompts, 2,000 resamples): " + "; ".join(
                      f"{tree} {delta_ci(c)}"
                      for tree, c in data["paired"].items()) + ".", ""]
    return lines


def _every_set_and_tree(data: dict) -> list[str]:
    """The full head-to-head: both drafters on every prompt set and tree, paired per set and tree."""
    lines = []
    if data["ours"].get("evals") and data["peer"].get("evals"):
        sets = data["ours"]["evals"]
        paired = data.get("paired_by_set") or {}
        lines += ["τ on every prompt set and tree (T=0, the same prompts for both; Δ = draftsmith − "
                  "speculators, paired over prompts, pooled, with a bootstrap 95 % interval):", ""]
        lines += table(["prompts", "tree", "draftsmith τ", "speculators τ", "Δτ [95 % interval]"],
                       [[f"{prompt_set} ({trees[tree]['n_prompts']} x {trees[tree]['max_new_tokens']})", tree,
                         num(trees[tree]["tau"], 3), num(data["peer"]["evals"][prompt_set][tree]["tau"], 3),
                         delta_ci(c) if (c := paired.get(f"{prompt_set} {tree}")) else "–"]
                        for prompt_set, trees in sets.items() for tree in trees])
    return lines


def _served(data: dict) -> list[str]:
    """Both drafters served by vLLM beside our decoder, on each prompt set they were served on."""
    trainers = (("ours", "draftsmith"), ("peer", "speculators 0.9.0"))
    more = any(data[who].get("engine_by_set") for who, _ in trainers)  # served on more sets than Spec-Bench
    served = [(name + (", Spec-Bench" if more else ""), data[who]["engine"]) for who, name in trainers
              if data[who].get("engine")]
    served += [(f"{name}, {NAMES.get(s, s)}", e) for who, name in trainers
               for s, e in (data[who].get("engine_by_set") or {}).items()]
    return served_table(served, "trainer" + (", prompts" if more else ""))


def _estimates(data: dict) -> list[str]:
    """draftsmith's training-time estimate of τ beside the measured τ, on its validation split and on the
    answers."""
    lines = []
    v = data["ours"].get("validation")
    depth = depth_tree(columns_of(data))
    dflash = (data.get("peer_info") or {}).get("arm") == "dflash"
    if v:
        measured = data["ours"][depth]["tau"]
        rows = [[label, num(v.get(key), 3), num(measured, 3),
                 f"{100 * (v[key] - measured) / measured:+.1f} %" if v.get(key) is not None else "—"]
                for label, key in (("joint counters (conditional rates)", "expected_tau_joint"),
                                   ("marginal accuracies as if independent", "expected_tau"))]
        unrolled = "" if dflash else " (training unrolls 3 steps: depths 4 and 5 reuse the third step's rate)"
        lines += [f"What draftsmith's validation (its held-out answers, teacher-forced, step {v['step']}) "
                  f"predicts for the chain of {depth.partition('-')[2]} against what the decoder measured on "
                  f"the prompts above{unrolled}:", ""]
        lines += table(["estimate", "expected τ", f"measured τ {depth}", "estimate - measured"], rows)
    answered = [(name, data[who]["on_answers"])
                for who, name in (("ours", "draftsmith"), ("peer", "speculators 0.9.0"))
                if data[who].get("on_answers")]
    if answered:
        lines += ["The same estimate on the decoder's own chain-5 answers "
                  "(`scripts/bench/speculators_peer/validate_outputs.py`: at T=0 they are the target's "
                  "greedy answers, teacher-forced with every position a drafting root; the decoder ran in "
                  "bfloat16, the estimate in float32, so near-ties can differ), its conditional rate by "
                  "depth beside the rate the decoder measured (only at the roots its verifications left). "
                  "The rates are averaged over batches of 4 answers weighted by their tokens, as validation "
                  "does: at depths 4–5 a batch holds few trials, so those two are rough:", ""]
        lines += table(["trainer", "answers (tokens)", "expected τ joint", "as if independent", "measured τ",
                        "conditional by depth, estimate", "measured by depth"],
                       [[name, f"{a['n_answers']} ({a['answer_tokens']:,})", num(a["expected_tau_joint"], 3),
                         num(a["expected_tau_marginal"], 3), num(a["measured_tau"], 3),
                         " / ".join(num(x, 3) for x in a["cond_acc"]),
                         " / ".join(num(x, 3) for x in a["measured_acceptance_by_depth"] or [])]
                        for name, a in answered])
    return lines


PAGES = {  # docs/results/<name>.md from docs/results/data/<name>.json (scripts/bench/results_pages.py)
    "speculators-peer": Page(
        title="draftsmith's EAGLE-3 trainer against speculators' at equal steps and equal training seconds",
        summary="the same features, vocabulary and schedule trained by both; τ in our decoder and served by "
                "vLLM, training seconds, the estimate vs the measured τ",
        command="`bash scripts/bench/speculators_peer/speculators_peer.sh OUT`",
        render=render_speculators_peer),
    "speculators-peer-epoch": Page(
        title="draftsmith's EAGLE-3 trainer against speculators' over one epoch of every answer",
        summary="stage 2 of the head-to-head: both trainers on the features of all the recipe's answers for "
                "one epoch at equal steps, judged on Spec-Bench and MT-bench with the 16-node tree and "
                "chains 1-5, served by vLLM",
        command="`bash scripts/bench/speculators_peer/speculators_peer.sh OUT` with stage 2's settings (the "
                "page's command)",
        render=render_speculators_peer),
    "speculators-peer-dflash": Page(
        title="draftsmith's DFlash trainer against speculators' at equal steps",
        summary="the EAGLE-3 arm's features and vocabulary, DFlash trained by both with Muon; τ in our "
                "decoder on chains of 4 and 3 and served by vLLM, training seconds, the differences kept",
        command="`ARM=dflash FROM=OUT_EAGLE3 bash scripts/bench/speculators_peer/speculators_peer.sh OUT`",
        render=render_speculators_peer),
    "speculators-peer-dflash-epoch": Page(
        title="draftsmith's DFlash trainer against speculators' over one epoch of every answer",
        summary="stage 2 of the DFlash arm: both trainers on the EAGLE-3 arm's features of all the recipe's "
                "answers for one epoch at equal steps",
        command="`ARM=dflash FROM=OUT_EAGLE3 bash scripts/bench/speculators_peer/speculators_peer.sh OUT` "
                "with stage 2's settings (the page's command)",
        render=render_speculators_peer),
}
