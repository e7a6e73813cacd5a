"""Served by llama.cpp against our decoder on a page: the results page `llamacpp-served` (in docs/results/)
from llamacpp_served.py's JSON.
"""

from __future__ import annotations

from draftsmith.eval.measure.campaign import Page, num, table


def alphas(values) -> str:
    return " / ".join(num(a, 3) for a in values or [])


def render_llamacpp_served(data: dict) -> list[str]:
    st, e = data["settings"], data.get("engine_info") or {}
    lines = [f"Each drafter served by llama.cpp b{str(e.get('version', '')).removeprefix('b')} on this CPU "
             "(built from the PyPI sdist by `draftsmith engine install llamacpp`; `llama-server`, one slot, "
             "every core; the draft model on every core too unless its row names its own threads, `-td`) "
             "and run in our decoder on the same "
             f"{st['limit']} Spec-Bench prompts (from {st['offset']}) x {st['tokens']} tokens, "
             f"{st['dtype']}, T={st['temperature']}, a chain of {chains(data)}. The target is served as an "
             "f32 GGUF converted from the folder our decoder loads (f32 KV cache), the drafter as an f32 "
             "GGUF: the same weights on both sides. Served α per position comes from llama.cpp's own "
             "counters (`/metrics`: accepted per position / verification steps).", "",
             "## Served vs ours", ""]
    rows = []
    for r in data["rows"]:
        rows.append([r["drafter"], f"{r['kind']} / {r['method']}", setting(r), alphas(r["alpha_by_position"]),
                     alphas(r["ours"]["alpha_by_position"]),
                     "yes" if r["comparison"]["agree"] else "**no**", num(r["tau"], 3),
                     num(r["ours"]["tau"], 3), f"{r['greedy_equal_count']}/{r['n_prompts']}",
                     f"{r['equal_to_ours_count']}/{r['n_prompts']}",
                     num(r["tokens_per_s"], 1), num(r["baseline_tokens_per_s"], 1), num(r["speedup"], 2)])
    lines += table(["drafter", "kind / --spec-type", "chain, draft threads", "served α by position",
                    "our α by position", "agree",
                    "served τ", "our τ", "greedy equal to llama.cpp plain", "equal to ours",
                    "tok/s", "plain tok/s", "x plain"], rows)
    lines += ["`agree`: within max(0.03, 3 SE) at every position. Served τ counts llama.cpp's verification "
              "steps (a draft is cut to the tokens left near the end), ours the emitted tokens: compare α "
              "per position.", ""]
    lines += combined_lines(data)
    lines += ngram_lines(data)
    q = data.get("quantized")
    if q:
        r = q["spec"]
        lines += ["## The quantized target (the preset's GGUF as it is)", "",
                  f"`{q['gguf'].rsplit('/', 1)[-1]}` with the first drafter's f32 GGUF; its logits are not "
                  "our fp32 decoder's, so its α is reported, not compared.", ""]
        lines += table(["served α by position", "served τ", "greedy equal to its plain", "tok/s",
                        "plain tok/s", "x plain"],
                       [[alphas(r["alpha_by_position"]), num(r["tau"], 3),
                         f"{r['greedy_equal_count']}/{data['rows'][0]['n_prompts']}",
                         num(r["tokens_per_s"], 1), num(q["plain_tokens_per_s"], 1), num(r["speedup"], 2)]])
    return lines


def setting(row: dict) -> str:
    """A row's chain and its draft model's threads (`-td`; every core where not set)."""
    threads = row.get("draft_threads")
    return f"{row['num_speculative_tokens']}, " + (f"-td {threads}" if threads else "every core")


def chains(data: dict) -> str:
    ks = sorted({r["num_speculative_tokens"] for r in data["rows"]})
    return str(ks[0]) if len(ks) == 1 else " or ".join(map(str, ks)) + " (each row's own)"


def first_positions(values, shown: int = 5) -> str:
    """α at the first `shown` positions (an n-gram type drafts up to 48 tokens)."""
    values = values or []
    return alphas(values[:shown]) + (f" … ({len(values)} positions)" if len(values) > shown else "")


def combined(data: dict) -> list[tuple[dict, str, dict]]:
    """(drafter row, n-gram type, its figures) for each drafter served behind an n-gram type."""
    return [(r, t, c) for r in data["rows"] for t, c in (r.get("combined") or {}).items()]


def combined_lines(data: dict) -> list[str]:
    """Each drafter behind an n-gram type (`--spec-type TYPE,draft-...`): speed and greedy equality."""
    rows = combined(data)
    if not rows:
        return []
    lines = ["## The drafter behind an n-gram type", "",
             "`--spec-type TYPE,draft-...`: each step llama.cpp's n-gram type drafts first and the drafter "
             "only where it finds nothing (heads/engines.py RULES `llamacpp-spec-combined`). Its counters "
             "mix the two proposers, so its α is no drafter's own and is not compared with ours.", ""]
    lines += table(["drafter", "behind", "chain, draft threads", "verification steps", "τ",
                    "greedy equal to llama.cpp plain", "tok/s", "x plain", "the drafter alone, x plain"],
                   [[r["drafter"], t, setting(r), c["num_drafts"], num(c["tau"], 3),
                     f"{c['greedy_equal_count']}/{r['n_prompts']}", num(c["tokens_per_s"], 1),
                     num(c["speedup"], 2), num(r["speedup"], 2)] for r, t, c in rows])
    return lines


def ngram_lines(data: dict) -> list[str]:
    """The drafter-free rows and the drafter-vs-n-gram table."""
    ngram = data.get("ngram") or {}
    if not ngram:
        return []
    lines = ["## llama.cpp's n-gram spec types (no drafter)", ""]
    lines += table(["--spec-type", "drafts", "served α by position", "τ", "greedy equal", "tok/s",
                    "x plain"],
                   [[t, r["num_drafts"], first_positions(r["alpha_by_position"]), num(r["tau"], 3),
                     f"{r['greedy_equal_count']}/{data['rows'][0]['n_prompts']}", num(r["tokens_per_s"], 1),
                     num(r["speedup"], 2)] for t, r in ngram.items()])
    best_ngram = max(ngram.items(), key=lambda kv: kv[1].get("speedup") or 0)
    best = max(data["rows"], key=lambda r: r.get("speedup") or 0)
    lines += ["## Trained drafter against n-gram, both x llama.cpp plain", ""]
    lines += table(["", "what", "x plain"],
                   [["best trained drafter", f"{best['drafter']} ({best['method']}, chain of "
                                             f"{best['num_speculative_tokens']}"
                                             + (f", -td {best['draft_threads']}" if best.get("draft_threads")
                                                else "") + ")", num(best["speedup"], 2)],
                    ["best n-gram type", best_ngram[0], num(best_ngram[1].get("speedup"), 2)]]
                   + [["best trained drafter behind an n-gram type", f"{r['drafter']} behind {t}",
                       num(c["speedup"], 2)]
                      for r, t, c in sorted(combined(data), key=lambda x: -(x[2].get("speedup") or 0))[:1]])
    plain = [r["baseline_tokens_per_s"] for r in data["rows"] if r.get("baseline_tokens_per_s")]
    if len(plain) > 1:  # each drafter's eval ran llama.cpp plain once: their spread is the timing noise
        spread = (max(plain) - min(plain)) / (sum(plain) / len(plain))
        lines += [f"llama.cpp plain, run once in each drafter's eval: {num(min(plain), 1)}–"
                  f"{num(max(plain), 1)} tok/s, a spread of {100 * spread:.1f} % of their mean: a difference "
                  "in x plain smaller than that is within the timing noise.", ""]
    return lines


PAGES = {  # docs/results/<name>.md from docs/results/data/<name>.json (scripts/bench/results_pages.py)
    "llamacpp-served": Page(
        title="Served by llama.cpp: acceptance served vs ours, n-gram and quantized rows",
        summary="the draft LM, EAGLE-3 and DFlash drafters served by llama.cpp (built from source) as f32 "
                "GGUFs beside our decoder: α per position, greedy equality with llama.cpp plain, tokens/s, "
                "llama.cpp's n-gram spec types, the Q4_1 target",
        command="`python scripts/bench/llamacpp_served/llamacpp_served.py OUT NAME=DRAFTER ...`",
        render=render_llamacpp_served),
    "llamacpp-served-dspark": Page(
        title="Served by llama.cpp: a trained DSpark, acceptance served vs ours",
        summary="a DSpark trained 300 steps served by llama.cpp (`draft-dspark`, f32 GGUFs) beside our "
                "decoder: α per position, greedy equality with llama.cpp plain, tokens/s",
        command="`python scripts/bench/llamacpp_served/llamacpp_served.py OUT NAME=DRAFTER --drafters-only`",
        render=render_llamacpp_served),
    "llamacpp-vs-ngram": Page(
        title="In llama.cpp on this CPU: the trained recipe's drafter against llama.cpp's n-gram modes",
        summary="the shipped EAGLE-3 recipe's drafter (3 epochs) served by llama.cpp as chains of 1 and 2 "
                "with the draft model on one thread (what `draftsmith plan --engine llamacpp` measures and "
                "picks), alone and behind ngram-simple, beside llama.cpp plain and every n-gram spec type, "
                "each x llama.cpp plain; α served vs ours",
        command="`python scripts/bench/llamacpp_served/llamacpp_served.py OUT "
                "NAME=DRAFTER,chain=1,td=1,combine=ngram-simple "
                "NAME2=DRAFTER,chain=2,td=1,combine=ngram-simple --limit 40 --tokens 128`",
        render=render_llamacpp_served),
}
