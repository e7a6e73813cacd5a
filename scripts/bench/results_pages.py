"""The results pages: docs/results/<campaign>.md from docs/results/data/<campaign>.json, and their index.

    python scripts/bench/results_pages.py                      regenerate every page and docs/results/README.md
    python scripts/bench/results_pages.py --add NAME FILE      copy a campaign script's JSON into data/NAME.json
                                                               (through the campaign's `slim`), then regenerate
    python scripts/bench/results_pages.py --out DIR            write the pages elsewhere (the docs test compares)

A campaign is one row of `CAMPAIGNS`: its title, what it measures, the script that writes its JSON and a renderer
(JSON -> markdown tables). Adding one = its JSON under docs/results/data/ + a renderer + a row. Every page
shows the date, the host block and the exact command the JSON records; a figure is published only from a JSON
committed here. The campaign scripts record the host with `host_block()` (eval/decode/machine.py's description of
this machine plus the CPU flags that decide its speed) and their command line with `command_line()`.
"""

import argparse
import json
import re
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")  # what decides a CPU's speed here (counting.md)


# ---- what a campaign script records -------------------------------------------------------------------------------
def cpu_flags() -> list[str]:
    """Which of FLAGS this CPU has (/proc/cpuinfo; [] where it cannot be read)."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                have = set(line.split(":", 1)[1].split())
                return [f for f in FLAGS if f in have]
    except OSError:
        pass
    return []


def host_block() -> dict:
    """This machine as every campaign JSON records it: `eval/machine.machine_info` for the CPU (device and model,
    torch's kernels, native bf16, threads, versions, date) plus the CPU flags that decide its speed."""
    from types import SimpleNamespace

    import torch

    from draftsmith.eval.decode.machine import machine_info

    return {**machine_info(SimpleNamespace(device=torch.device("cpu"))), "cpu_flags": cpu_flags()}


def command_line() -> str:
    """The command that is running, as a user would type it from the repository root."""
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    return shlex.join(["python", str(shown), *sys.argv[1:]])


def shown_command(command: str, notes: list[str]) -> str:
    """A recorded command for a page: each `--note TEXT` argument that is one of the page's notes (listed below it)
    shows as `--note (note N)`, so a note's own code spans do not break the command's."""
    try:
        words = shlex.split(command)
    except ValueError:
        return command
    shown = [f"(note {notes.index(w) + 1})" if i and words[i - 1] == "--note" and w in notes else w
             for i, w in enumerate(words)]
    return shlex.join(shown) if shown != words else command


# ---- markdown helpers -----------------------------------------------------------------------------------------------
def table(header: list[str], rows: list[list]) -> list[str]:
    def cell(v) -> str:
        return "–" if v is None else str(v).replace("|", "\\|")

    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(cell(v) for v in row) + " |" for row in rows), ""]


def num(x, digits: int = 3) -> str:
    if x is None:
        return "–"
    if isinstance(x, float) and x != 0 and abs(x) < 10 ** -digits:
        return f"{x:.1e}"
    return f"{x:.{digits}f}" if isinstance(x, float) else f"{x:,}" if isinstance(x, int) else str(x)


def pvalue(p: float) -> str:
    return "0 (below float range)" if p == 0 else f"{p:.2g}"


def host_lines(host: dict | None) -> list[str]:
    if not host:
        return ["Host: not recorded.", ""]
    if host.get("cuda"):  # a GPU machine: its CPU flags and threads decide nothing here
        return table(["host", ""], [["GPU", host.get("device")], ["CUDA", host.get("cuda")],
                                    ["torch / transformers / python",
                                     f"{host.get('torch')} / {host.get('transformers')} / {host.get('python')}"]])
    rows = [["CPU / device", host.get("device")],
            ["CPU flags that matter", ", ".join(host.get("cpu_flags") or []) or "none of " + ", ".join(FLAGS)],
            ["torch kernels (`cpu_capability`)", host.get("cpu_capability")],
            ["native bf16", host.get("cpu_native_bf16")], ["torch threads", host.get("torch_threads")],
            ["torch / transformers / python", f"{host.get('torch')} / {host.get('transformers')} / {host.get('python')}"]]
    return table(["host", ""], rows)


# ---- campaigns ------------------------------------------------------------------------------------------------------
def render_exactness(data: dict) -> list[str]:
    alpha, power = data["alpha"], data["required_power"]
    lines = [f"Chi-square tests at α = {alpha}; a test must reach power {power} against what it claims to detect. "
             "Power is computed from the enumerated laws (`tests/exactness.py`): the probability that the test's "
             "draws reject a law at that total-variation (TV) distance from the exact one.", "",
             "## The acceptance rule and the batched decoder", "",
             "Each sampled test against a generic alternative at TV 0.03, and each negative twin (a deliberately "
             "wrong rule) at its own TV from the exact law.", ""]
    flat = [r for r in data["rows"] if "tv" in r]
    lines += table(["test", "what is sampled", "against", "draws", "cells", "TV from the exact law", "power"],
                   [[f"`{r['test'].split()[0]}` {' '.join(r['test'].split()[1:])}", r["rule"],
                     r["twin"] or "generic alternative", num(r["draws"]), r["cells"], num(r["tv"], 4), num(r["power"], 4)]
                    for r in flat])
    deep = [r for r in data["rows"] if "detects_tv" in r]
    lines += ["## Decoder-level tests at depth", "",
              "Histograms of whole 4-token outputs (a verification at depth 2 plus the bonus token) through the batched "
              "decoder (`tests/unit/test_exact_depth.py`). `detects TV`: the TV this test rejects with power "
              f"{power}; `p`: the correct decoder's p-value (it must not be rejected); the twin must be rejected.", ""]
    lines += table(["drafting mode", "sampling", "draws", "cells", "detects TV", "p (correct)", "depth-2 accepts",
                    "negative twin", "twin p", "histogram TV: twin / correct"],
                   [[r["mode"], r["sampling"], num(r["draws"]), r["cells"], num(r["detects_tv"], 3), pvalue(r["p_value"]),
                     num(r["depth2_accepts"]), r["twin"], pvalue(r["twin_p_value"]),
                     f"{num(r['twin_histogram_tv'], 4)} / {num(r['correct_histogram_tv'], 4)}"] for r in deep])
    return lines


INTERRUPT_CHECKS = [("stopped_with_checkpoint", "stopped with a checkpoint"), ("lost_nothing", "lost nothing"),
                    ("checkpoints_kept", "checkpoints kept"), ("metrics_continuous", "metrics continuous"),
                    ("weights_equal", "weights equal"), ("eval_written", "eval written")]


def render_interrupts(data: dict) -> list[str]:
    lines = [f"A tiny target (2-layer, 32-wide Llama), Medusa, {data['steps']} steps, a checkpoint every "
             f"{data['save_every']} steps, the newest {data['keep_checkpoints']} kept, seed {data['seed']}. Each trial "
             "sends a real SIGINT at a random step, then reruns the same command (plain, or with `--resume`) to the end "
             "and compares it with an uninterrupted run. Columns count the trials where each check holds "
             "(`scripts/bench/interrupt_trials.py` defines them).", ""]
    cells = data["cells"]
    lines += table(["command / rerun", "trials", *(label for _, label in INTERRUPT_CHECKS), "max steps lost", "seconds"],
                   [[f"`{name}`", c["trials"], *(c.get(key) for key, _ in INTERRUPT_CHECKS), c["lost_steps_max"],
                     num(c["seconds"], 1)] for name, c in cells.items()])
    lines += ["## Per trial", ""]
    rows = []
    for name, c in cells.items():
        details = c.get("details") or []
        rows.append([f"`{name}`", ", ".join(str(d["interrupt_at"]) for d in details),
                     ", ".join(str(d.get("resumed_from")) for d in details),
                     ", ".join(sorted({str(d["stop_rc"]) for d in details}))])
    lines += table(["command / rerun", "SIGINT after step", "rerun resumed from", "exit status of the stopped run"], rows)
    example = next((d["stop_line"] for c in cells.values() for d in c.get("details") or [] if d.get("stop_line")), None)
    if example:
        lines += ["What a stopped run printed (first trial):", "", "```text", example, "```", ""]
    return lines


def slim_interrupts(data: dict) -> dict:
    """The committed copy keeps every figure; the printed stop line only for each cell's first trial (the others
    repeat it with another step number)."""
    for cell in data["cells"].values():
        for d in (cell.get("details") or [])[1:]:
            d.pop("stop_line", None)
    data.setdefault("notes", []).append("stop_line kept for the first trial of each cell only "
                                        "(results_pages.py --add interrupts)")
    return data


def render_engine_served(data: dict) -> list[str]:
    st = data["settings"]
    eh = (data["rows"][0]["engine_host"] if data["rows"] else {}) or {}
    lines = [f"Each drafter served by {data['engine']} on this CPU (its own venv: `draftsmith engine install vllm`) and "
             f"run in our decoder on the same {st['limit']} Spec-Bench prompts (from {st['offset']}) x {st['tokens']} "
             f"tokens, {st['dtype']}, T={st['temperature']}; vLLM at batch 1 and at {st['concurrency']} requests in "
             "flight, vLLM plain before and after (the noise), vLLM's own n-gram lookup as the drafter-free baseline. "
             f"Engine: torch {eh.get('torch')}, transformers {eh.get('transformers')}, OpenMP binding "
             f"{'; '.join(eh.get('omp_binding') or []) or 'not recorded'}.", "", "## What to serve in vLLM on this machine", ""]
    levels = sorted({c for r in data["rows"] for c in r["best"]}, key=int)
    header = ["drafter", "kind / format"]
    for c in levels:
        header += [f"best chain @{c}", f"x vLLM plain @{c}", f"n-gram x plain @{c}"]
    header += ["vLLM plain tok/s @1", "plan's choice @1"]
    rows = []
    for r in data["rows"]:
        row = [r["drafter"], f"{r['kind']} / {r['format']}"]
        for c in levels:
            b, ng = r["best"].get(c) or {}, (r["ngram"] or {}).get(c) or {}
            row += [f"chain-{b.get('k')}", num(b.get("speedup"), 2), num(ng.get("speedup"), 2)]
        row += [num(r["best"]["1"]["plain_tokens_per_s"], 1), r["best"]["1"]["plan_choice"]]
        rows.append(row)
    lines += table(header, rows)
    lines += ["## Served vs ours, per chain length", "",
              "α per position: served (vLLM's counters) / ours (our decoder, the same drafter and prompts). `agree`: "
              "within max(0.03, 3 SE) at every position and concurrency; `greedy equal`: vLLM's speculative output equals "
              "its plain output on every prompt.", ""]
    detail = []
    for r in data["rows"]:
        for c in r["chains"]:
            detail.append([r["drafter"], c["k"], " / ".join(num(a, 3) for a in c["served_alpha"]),
                           " / ".join(num(a, 3) for a in c["ours_alpha"]), num(c["served_tau"], 3), num(c["ours_tau"], 3),
                           c["agree"], c["greedy_equal"],
                           " / ".join(num(c["speedup"].get(x), 2) for x in levels), num(c.get("ours_draft_ms"), 1)])
    lines += table(["drafter", "k", "served α by position", "our α by position", "served τ", "our τ", "agree",
                    "greedy equal", "x vLLM plain @" + " / @".join(levels), "our draft ms / step"], detail)
    lines += ["Served τ counts accepted drafts past a stop token that the output drops (vLLM's scheduler counts them "
              "before the stop check), ours emitted tokens; compare α per position.", ""]
    if data.get("earlier"):  # rows kept from earlier runs (engine_served.py --keep): each row's own command
        lines += ["## The command behind each row", ""]
        lines += table(["drafter", "measured by"],
                       [[r["drafter"], "`" + (data["earlier"][r["measured_by"]]["command"] if "measured_by" in r
                                             else data["command"]) + "`"] for r in data["rows"]])
    return lines


def render_regen_vllm(data: dict) -> list[str]:
    engine = next((r["vllm"].get("engine") for r in data["runs"] if r["vllm"].get("engine")), {}) or {}
    lines = [f"Self-distillation (`draftsmith regenerate -c smollm2-regenerate`): the reference target answers the first "
             f"{data['prompts']} training prompts, at most {data['max_new_tokens']} tokens, dtype {data['dtype']}, "
             f"T={data['temperature']}, once with backend `hf` (batches of {data['hf_batch']}) and once with backend "
             f"`vllm` ({engine.get('package')} {engine.get('version')}'s OpenAI server started for the stage, "
             f"{data['vllm_concurrency']} requests in flight). tok/s: answer tokens over the answering time (the "
             "stage's own figure); wall: the whole command, with the target's load and, for vllm, the server's start. "
             "Same answers: conversations whose answer text is identical on both sides.", ""]
    rows = [[i + 1, num(r["hf"]["tokens_per_s"], 1), num(r["vllm"]["tokens_per_s"], 1), num(r["vllm_over_hf"], 2),
             num(r["hf"]["wall_s"], 1), num(r["vllm"]["wall_s"], 1), f"{r['same_answers']}/{data['prompts']}"]
            for i, r in enumerate(data["runs"])]
    lines += table(["run", "hf tok/s", "vllm tok/s", "vllm / hf", "hf wall s", "vllm wall s", "same answers"], rows)
    return lines


def render_fp8_features(data: dict) -> list[str]:
    base = data["features"].get("bfloat16", {})
    lines = [f"EAGLE-3 (`{data['recipe']}`) trained offline from shards of the first {data['answers']} self-distilled "
             f"answers, {data['steps']} steps each (the last step's drafter, no time budget), judged by `draftsmith eval` "
             f"on {data['limit']} {data['prompts']} prompts x {data['max_new_tokens']} tokens at T=0. `float8_e4m3`: "
             "hidden states as e4m3 with a float32 scale per token row, top-k logits in bfloat16 "
             "(`extract.dtype`). The second bfloat16 seed is the noise a change is judged against.", "",
             "Storage of the training split:", ""]
    lines += table(["extract.dtype", "features", "tokens", "bytes / token", "GiB", "of bfloat16"],
                   [[d, ", ".join(f["keys"]), f["tokens"], num(f["bytes_per_token"], 1), num(f["bytes"] / 2**30, 2),
                     num(f["bytes"] / base["bytes"], 3) if base else "–"] for d, f in data["features"].items()])
    trees = list(data["arms"][0]["evals"]) if data["arms"] else []
    lines += ["", "Each arm:", ""]
    lines += table(["arm", "steps", "s / step", *[f"τ {t}" for t in trees], *[f"acceptance by depth, {t}" for t in trees[:1]]],
                   [[a["name"], a["steps"], num(a["s_per_step"], 3), *[num(a["evals"][t]["tau"], 3) for t in trees],
                     *[" / ".join(num(x, 2) for x in (a["evals"][t]["acceptance_by_depth"] or [])) for t in trees[:1]]]
                    for a in data["arms"]])
    lines += ["", "Against bfloat16 seed 0 (paired over prompts: mean per-prompt τ change and its bootstrap 95 % interval):",
              ""]
    lines += table(["arm", "tree", "Δτ (pooled)", "mean per-prompt Δτ", "95 % interval"],
                   [[c["arm"], c["tree"], num(c["delta_tau"], 3), num(c["paired"]["mean"], 3),
                     f"[{num(c['paired']['ci95'][0], 3)}, {num(c['paired']['ci95'][1], 3)}]"]
                    for c in data.get("comparisons", [])])
    return lines


def served_table(served: list[tuple[str, dict]], label: str) -> list[str]:
    """Drafters served by vLLM beside our decoder (`draftsmith eval --engine vllm` summaries, named): α per position
    served and ours, agreement, served τ, greedy equality, tokens/s and speedup over vLLM plain."""
    if not served:
        return []
    e0 = served[0][1]
    lines = [f"Served by vLLM {e0['engine_version']} (CPU build, `draftsmith eval --engine vllm`, float32, batch 1) as "
             f"a chain of {e0['num_speculative_tokens']} on the first {e0['n_prompts']} of the prompts, beside our "
             "decoder on the same prompts: α per position is P(draft token i accepted) per drafting step; agree = "
             "within the engine eval's tolerance at every position (docs/serving.md).", ""]
    return lines + table([label, "served α by position", "ours α by position", "agree", "served τ", "greedy equal",
                          "vLLM tokens/s", "x vLLM plain"],
                         [[name, " / ".join(num(a, 3) for a in e["alpha_by_position"]),
                           " / ".join(num(a, 3) for a in e["ours"]["alpha_by_position"]),
                           "yes" if e["agree"] else "**no**", num(e["tau"], 3),
                           f"{e['greedy_equal_count']}/{e['n_prompts']}", num(e.get("tokens_per_s"), 1),
                           num(e["speedup"], 2)] for name, e in served])


def answers_used(data: dict) -> str:
    """'all the answers' when the command's ANSWERS limit exceeds the sequences extracted, else 'the first N answers'."""
    limit = re.search(r"\bANSWERS=(\d+)", data.get("command", ""))
    got = (data.get("peer_info") or {}).get("sequences")
    if limit and got is not None and int(limit.group(1)) > got:
        return "all the answers"
    return f"the first {limit.group(1)} answers" if limit else "the answers"


def render_speculators_peer(data: dict) -> list[str]:
    info = data.get("peer_info") or {}
    first = data["ours"]["chain-5"]
    evals = data["ours"].get("evals") or {"spec-bench": {}}
    names = {"spec-bench": "Spec-Bench", "mt-bench": "MT-bench"}
    more = sorted({t for trees in evals.values() for t in trees} - {"dynamic-16", "chain-5"})
    peer = data["peer"]
    span, sittings = peer.get("train_steps_span_seconds"), peer.get("train_sittings") or 1
    lines = [f"EAGLE-3 on the reference target trained twice from the same offline features (`draftsmith extract` of "
             f"{answers_used(data)} of the smollm2-eagle3 recipe: {info.get('train_sequences', '?')} training sequences), the "
             "same draft vocabulary, steps, learning rate and schedule: by draftsmith (`draftsmith train`) and by "
             "speculators 0.9.0's own trainer (one CPU process, `scripts/bench/speculators_peer.py train`). Both "
             f"judged by `draftsmith eval` on {first['n_prompts']} "
             + (f"{names.get(next(iter(evals)), next(iter(evals)))} prompts" if len(evals) == 1 else
                f"prompts of each of {' and '.join(names.get(x, x) for x in evals)}") + f" x {first['max_new_tokens']} "
             f"tokens at T=0{', ' + first['dtype'] if first.get('dtype') else ''} with the recipe's 16-node dynamic "
             "tree and a chain of 5" + (f" (and {', '.join(more)} in the table of every set and tree)" if more else "")
             + "." + (" The third row is draftsmith again for as many steps as speculators' "
             "training seconds buy at draftsmith's seconds per step (its own cosine schedule over those steps)."
             if "ours_wall" in data else ""), "",
             "Training seconds: draftsmith's are its training loop (its validation pass included), speculators' its "
             "whole process (start-up, a validation pass and the save included)" + (
                 f", summed over the {sittings} runs it took (each resumed from the last of its own checkpoints, saved "
                 "in float32 so the resumed run continues exactly; each run's start-up counted)" if sittings > 1 else "")
             + (f"; its log spans {num(span, 0)} s from its first line to its last training step"
                + (f", so the equal wall-clock row gives draftsmith up to {num(100 * (1 - span / peer['train_seconds']), 1)}"
                   " % more time than exact equality" if "ours_wall" in data else "")
                if span else "") + ".", ""]
    rows = []
    trainers = [(who, name) for who, name in (("ours", "draftsmith"), ("peer", "speculators 0.9.0"),
                ("ours_wall", "draftsmith at speculators' training seconds")) if who in data]
    median = any("median_step_seconds" in data[who] for who, _ in trainers)  # stage 2 on: each trainer's own timer
    if median:
        lines += ["Median s / step: draftsmith's over its logging intervals of 10 steps, speculators' over its own "
                  "per-step timer (profile/step_ms, from fetching a batch to the optimizer step's end); unlike the "
                  "summed seconds, blind to start-ups and to the steps a resumed run repeated.", ""]
    for who, name in trainers:
        r = data[who]
        rows.append([name, r["train_steps"], num(r["train_seconds"], 0), num(r["train_seconds"] / r["train_steps"], 2),
                     *([num(r.get("median_step_seconds"), 2)] if median else []),
                     num(r["dynamic-16"]["tau"], 3), num(r["chain-5"]["tau"], 3),
                     " / ".join(num(x, 2) for x in r["chain-5"]["acceptance_by_depth"] or [])])
    lines += table(["trainer", "steps", "train s", "s / step", *(["median s / step"] if median else []),
                    "τ 16-node tree", "τ chain-5", "acceptance by depth, chain-5"], rows)
    if data.get("paired"):
        lines += ["draftsmith − speculators in τ, paired over the same prompts (pooled Δτ and a bootstrap 95 % interval "
                  "over prompts, 2,000 resamples): " + "; ".join(
                      f"{tree} {num(c['delta_tau'], 3)} [{num(c['ci95'][0], 3)}, {num(c['ci95'][1], 3)}]"
                      for tree, c in data["paired"].items()) + ".", ""]
    if data["ours"].get("evals") and data["peer"].get("evals"):  # every prompt set and tree (the full head-to-head)
        sets = data["ours"]["evals"]
        paired = data.get("paired_by_set") or {}
        lines += ["τ on every prompt set and tree (T=0, the same prompts for both; Δ = draftsmith − speculators, paired "
                  "over prompts, pooled, with a bootstrap 95 % interval):", ""]
        lines += table(["prompts", "tree", "draftsmith τ", "speculators τ", "Δτ [95 % interval]"],
                       [[f"{prompt_set} ({trees[tree]['n_prompts']} x {trees[tree]['max_new_tokens']})", tree,
                         num(trees[tree]["tau"], 3), num(data["peer"]["evals"][prompt_set][tree]["tau"], 3),
                         (f"{num(c['delta_tau'], 3)} [{num(c['ci95'][0], 3)}, {num(c['ci95'][1], 3)}]"
                          if (c := paired.get(f"{prompt_set} {tree}")) else "–")]
                        for prompt_set, trees in sets.items() for tree in trees])
    trainers = (("ours", "draftsmith"), ("peer", "speculators 0.9.0"))
    more = any(data[who].get("engine_by_set") for who, _ in trainers)  # served on more sets than Spec-Bench
    served = [(name + (", Spec-Bench" if more else ""), data[who]["engine"]) for who, name in trainers
              if data[who].get("engine")]
    served += [(f"{name}, {names.get(s, s)}", e) for who, name in trainers
               for s, e in (data[who].get("engine_by_set") or {}).items()]
    lines += served_table(served, "trainer" + (", prompts" if more else ""))
    v = data["ours"].get("validation")
    if v:
        measured = data["ours"]["chain-5"]["tau"]
        rows = [[label, num(v.get(key), 3), num(measured, 3),
                 f"{100 * (v[key] - measured) / measured:+.1f} %" if v.get(key) is not None else "—"]
                for label, key in (("joint counters (conditional rates)", "expected_tau_joint"),
                                   ("marginal accuracies as if independent", "expected_tau"))]
        lines += [f"What draftsmith's validation (its held-out answers, teacher-forced, step {v['step']}) "
                  "predicts for the chain of 5 against what the decoder measured on the prompts above (training "
                  "unrolls 3 steps: depths 4 and 5 reuse the third step's rate):", ""]
        lines += table(["estimate", "expected τ", "measured τ chain-5", "estimate - measured"], rows)
    answered = [(name, data[who]["on_answers"]) for who, name in (("ours", "draftsmith"), ("peer", "speculators 0.9.0"))
                if data[who].get("on_answers")]
    if answered:
        lines += ["The same estimate on the decoder's own chain-5 answers (`scripts/bench/validate_outputs.py`: at T=0 "
                  "they are the target's greedy answers, teacher-forced with every position a drafting root; the "
                  "decoder ran in bfloat16, the estimate in float32, so near-ties can differ), its conditional rate by "
                  "depth beside the rate the decoder measured (only at the roots its verifications left). The rates "
                  "are averaged over batches of 4 answers weighted by their tokens, as validation does: at depths 4–5 "
                  "a batch holds few trials, so those two are rough:", ""]
        lines += table(["trainer", "answers (tokens)", "expected τ joint", "as if independent", "measured τ",
                        "conditional by depth, estimate", "measured by depth"],
                       [[name, f"{a['n_answers']} ({a['answer_tokens']:,})", num(a["expected_tau_joint"], 3),
                         num(a["expected_tau_marginal"], 3), num(a["measured_tau"], 3),
                         " / ".join(num(x, 3) for x in a["cond_acc"]),
                         " / ".join(num(x, 3) for x in a["measured_acceptance_by_depth"] or [])]
                        for name, a in answered])
    return lines


def render_levers(data: dict) -> list[str]:
    base = data["baseline"]
    rows = {base: data["rows"][base], **{n: r for n, r in data["rows"].items() if n != base}}  # the baseline first
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

    def tau(r: dict, e: str) -> str:
        if e not in r["evals"]:
            return "—"
        p = (r.get("paired") or {}).get(e)
        return num(r["evals"][e]["tau"], 3) + (f" ({num(p['delta_tau'], 3)} [{num(p['ci95'][0], 3)}, "
                                                f"{num(p['ci95'][1], 3)}])" if p else "")

    lines = [f"Every row trained from the same offline features ({b.get('train_sequences', '?')} training sequences of "
             "the EAGLE-3 recipe's first answers, `scripts/bench/speculators_peer.sh`'s extraction), the same draft "
             f"vocabulary, learning rate {b['lr']} and warm-up, and judged by `draftsmith eval` on the same "
             f"{first['n_prompts']} Spec-Bench prompts x {first['max_new_tokens']} tokens at T=0. The baseline "
             f"`{base}` is speculators-peer's draftsmith row ({b['train_steps']} steps, TTT {b['ttt_steps']}). In "
             "brackets: the row minus the baseline in τ, paired over the prompts (pooled, bootstrap 95 % interval, "
             "2,000 resamples); an interval that holds 0 is no difference. Train s: the training loop's seconds (its "
             "validation pass included); s / step: the median over its logging intervals of 10 steps.", ""]
    eagle = [(n, r) for n, r in rows.items() if r["kind"] == b["kind"]]
    def secs(r: dict) -> str:
        return f"{num(r['train_seconds'], 0)} ({num(r.get('median_step_seconds'), 2)})"

    lines += table(["row", "lever", "steps (epochs)", "train s (median s / step)", "τ 16-node tree (Δ)", "τ chain-5 (Δ)",
                    "τ 16-node tree + lookup 5 (Δ)", "validation expected τ chain-5"],
                   [[n, lever(n, r), f"{r['train_steps']} ({r.get('epochs', '?')})", secs(r), tau(r, "dynamic-16"),
                     tau(r, "chain-5"), tau(r, "dynamic-16-lookup"),
                     num((r.get("validation") or {}).get("expected_tau_joint"), 3)] for n, r in eagle])
    blocks = [(n, r) for n, r in rows.items() if "chain-4-fp32" in r["evals"]]
    if len(blocks) > 1:
        e0 = b["evals"].get("chain-4-fp32") or blocks[0][1]["evals"]["chain-4-fp32"]
        lines += ["The parallel drafters against EAGLE-3 at equal steps, each drafting 4 tokens per verification "
                  f"(a chain of 4), in float32 with timing; plain decoding measured once in the baseline's run "
                  f"({num(e0.get('baseline_tokens_per_s'), 1)} tokens/s). Single runs on this host: tokens/s is "
                  "indicative (timing noise here 9–24 %, docs/results/plan-compare.md).", ""]
        plain = e0.get("baseline_tokens_per_s")
        lines += table(["row", "kind", "train s (median s / step)", "τ chain-4 (Δ)", "acceptance by depth", "draft ms / step",
                        "verify ms / step", "tokens/s", "x plain"],
                       [[n, r["kind"], secs(r), tau(r, "chain-4-fp32"),
                         " / ".join(num(a, 2) for a in r["evals"]["chain-4-fp32"]["acceptance_by_depth"] or []),
                         num((r["evals"]["chain-4-fp32"].get("step_ms") or {}).get("draft"), 1),
                         num((r["evals"]["chain-4-fp32"].get("step_ms") or {}).get("verify"), 1),
                         num(r["evals"]["chain-4-fp32"]["tokens_per_s"], 1),
                         num(r["evals"]["chain-4-fp32"]["tokens_per_s"] / plain, 2) if plain else "—"]
                        for n, r in blocks])
    chosen = [(n, r) for n, r in rows.items() if "choice-dynamic-16" in r["evals"]]
    if chosen:
        c0 = chosen[0][1]["evals"]["choice-dynamic-16"]
        start = c0.get("offset") or 0
        lines += [f"The choice split: the same rows on Spec-Bench's prompts {start}–{start + c0['n_prompts'] - 1} of "
                  "eval's stratified order (disjoint from the ones above), "
                  f"{c0['max_new_tokens']} tokens, T=0, paired against `{base}` on them. A lever is adopted only where "
                  "its interval here excludes 0 as well.", ""]
        lines += table(["row", "lever", "τ 16-node tree (Δ)", "τ chain-5 (Δ)"],
                       [[n, lever(n, r), tau(r, "choice-dynamic-16"), tau(r, "choice-chain-5")] for n, r in chosen])
    served = [(n, r["engine"]) for n, r in rows.items() if r.get("engine")]
    lines += served_table(served, "row")
    return lines


def render_gpu_check(data: dict) -> list[str]:
    runs = data["runs"]
    lines = [f"`scripts/gpu_check.sh` on {data['host']['device']} (torch {data['host']['torch']}, CUDA "
             f"{data['host'].get('cuda')}, transformers {data['host']['transformers']}), {len(runs)} runs of the same "
             "command on fresh leases: Llama-shaped targets with random weights in bfloat16 (HF eager attention, batch "
             "1, no CUDA graphs), so only the cost side is measured, never acceptance. Verification: one forward of "
             "k new tokens on a 512-token cached context with a tree mask, then the cache cropped back; relative = "
             "ms(k) / ms(1), what a k-node tree costs against a plain step. Decoder overhead: 128 greedy tokens by our "
             "decoder's loop (no drafter) against HF `generate`, best of 3.", ""]
    for name in runs[0]["targets"]:
        ids = [i + 1 for i, r in enumerate(runs) if name in r["targets"]]  # a lease cut short lacks later sizes
        rows = [runs[i - 1]["targets"][name] for i in ids]
        ks = list(rows[0]["verification"]["ms"])
        lines += [f"**{name}** ({rows[0]['parameters'] / 1e9:.2f} B parameters), verification forward:", ""]
        lines += table(["k new tokens", *[f"ms, run {i}" for i in ids], *[f"relative, run {i}" for i in ids]],
                       [[k, *[num(r["verification"]["ms"][k], 1) for r in rows],
                         *[num(r["verification"]["relative"][k], 2) for r in rows]] for k in ks])
        lines += table(["decoder overhead", *[f"run {i}" for i in ids]],
                       [[label, *[num(r["decoder_overhead"][key], 3 if key == "ours_over_hf" else 1) for r in rows]]
                        for label, key in (("ours tok/s", "ours_tok_s"), ("HF generate tok/s", "hf_tok_s"),
                                           ("ours / HF", "ours_over_hf"))])
        for i, r in zip(ids, rows):
            if not r.get("draft_cost"):
                continue
            c = r["draft_cost"]
            lines += [f"Draft cost on {name}, run {i}: untrained drafters built for it as the recipes build them "
                      f"({c['draft_vocab']:,}-token draft vocabulary), our decoder on {c['prompts']} random prompts x "
                      f"{c['new_tokens']} tokens, {c['rounds']} rounds of every arm in turn; drafting ms per "
                      "verification from the step split (best round), and that over one EAGLE-3 level (its chain-1 "
                      "cost):", ""]
            lines += table(["arm", "draft ms / verification", "rounds", "x one EAGLE-3 level", "verify ms / step"],
                           [[arm, num(a["draft_ms"], 2), " / ".join(num(x, 2) for x in a["draft_ms_rounds"]),
                             num(a["of_one_eagle3_level"], 2), num(a["verify_ms"], 1)] for arm, a in c["arms"].items()])
    lines += ["Tests marked `gpu` (`pytest -m gpu`, greedy speculative output equals HF `generate` on CUDA with an "
              "untrained Medusa tree and EAGLE-3 dynamic tree):", "", f"    {data['pytest']}", ""]
    return lines


def render_plan_compare(data: dict) -> list[str]:
    cal = data["calibration"]
    lines = [f"`draftsmith plan` with several drafters of one target: each planned by our decoder on the same "
             f"{cal['n']} calibration prompts ({cal['prompts']}, from {cal['offset']}, disjoint from eval's) x "
             f"{cal['max_new_tokens']} tokens, {data['dtype']}; a drafter's figures are over its own plain runs, and "
             "the choice is the fastest chosen setting, its lead counted only beyond the larger timing noise.", ""]
    for batch, part in data["choices"].items():
        lines += [f"## Batch {batch}: what to serve", "", part["why"], ""]
        lines += table(["drafter", "kind", "its plan's choice", "τ", "x its plain", "noise"],
                       [[r["name"], r["kind"], r["label"], num(r["tau"], 2), num(r["speedup"], 3), num(r["noise"], 3)]
                        for r in part["drafters"]])
        for name, plan in data["plans"].items():
            own = plan["by_batch"].get(batch)
            if not own:
                continue
            lines += [f"Every candidate of **{name}** ({plan['kind']}), plain {num(own['plain_tokens_per_s'], 1)} tok/s:",
                      ""]
            lines += table(["candidate", "τ", "tok/s", "x plain", "draft ms / step", "verify ms / step"],
                           [[c["label"], num(c.get("tau"), 2), num(c.get("tokens_per_s"), 1), num(c.get("speedup"), 3),
                             num((c.get("step_ms") or {}).get("draft"), 1), num((c.get("step_ms") or {}).get("verify"), 1)]
                            if not c.get("skipped") else [c["label"], "skipped", "", "", "", ""]
                            for c in own["candidates"]])
    return lines


def render_draft_cost(data: dict) -> list[str]:
    lines = [f"Our decoder on the first {data['limit']} Spec-Bench prompts x {data['tokens']} tokens, T=0, "
             f"{data['dtype']}, {data['repeats']} rounds of every arm in turn; drafters of the reference target with "
             "random weights and the recipes' shapes (cost does not depend on training: every step drafts the whole "
             "chain or block). Draft ms per verification from the decoder's step split; one EAGLE-3 level is its "
             "chain-1 cost.", ""]
    lines += table(["arm", "draft vocabulary", "draft ms / verification", "rounds", "x one EAGLE-3 level",
                    "verify ms / step"],
                   [[a["name"], f"{a['draft_vocab']:,}", num(a["draft_ms"], 2),
                     " / ".join(num(x, 2) for x in a["draft_ms_rounds"]), num(a["of_one_eagle3_level"], 2),
                     num(a["verify_ms"], 1)] for a in data["arms"]])
    return lines


def render_validation_gap(data: dict) -> list[str]:
    rows = data["rows"]
    any_row = next(iter(rows.values()))
    tree = any_row["measured"]["dynamic-16"]
    ev = any_row["eval_distribution"]
    lines = [f"The training-time estimate of τ (training's own validation: `validate` then `serving_tau`, the same code "
             f"path as `train.select: expected_tau`) against the τ our decoder measured on {tree['prompts']} Spec-Bench "
             f"prompts at T=0 ({tree['dtype']}), for the rows of [levers](levers.md). Two validation splits: "
             "**held-out**, the row's own (held-out training answers, `data.val_fraction`), and **eval distribution**, "
             f"{ev['sequences']} conversations ({ev['tokens']:,} answer tokens) from `{Path(data['data']).name}`: the "
             "target's greedy answers to Spec-Bench prompts disjoint from the measured ones (what `data.validation` "
             "takes). Ratio = estimate / measured; the goal is within 10 %. 16-node tree: `expected_tau_serving` "
             "(the best static tree of 16 nodes from the rank accuracies) against the recipe's dynamic 16-node tree; "
             "chain of 5: `expected_tau_joint` (conditional acceptance by depth) against a chain of 5.", ""]
    logged = [n for n, r in rows.items() if r.get("logged") and r["logged"].get("expected_tau_serving") is not None]
    if logged:
        gap = max(abs(rows[n]["held_out"]["expected_tau_serving"] - rows[n]["logged"]["expected_tau_serving"])
                  for n in logged)
        lines += [f"The held-out figures are recomputed here from the live target; they match what each row logged "
                  f"while training within {num(gap, 3)} τ (the tool reproduces training's number).", ""]
    lines += table(["row", "steps", "τ tree-16 measured", "estimate held-out (ratio)", "estimate eval distribution "
                    "(ratio)", "τ chain-5 measured", "estimate held-out (ratio)", "estimate eval distribution (ratio)"],
                   [[n, r.get("steps", "—"), num(r["measured"]["dynamic-16"]["tau"], 3),
                     f"{num(r['held_out']['expected_tau_serving'], 3)} ({num(r['ratio']['held_out']['dynamic-16'], 3)})",
                     f"{num(r['eval_distribution']['expected_tau_serving'], 3)} "
                     f"({num(r['ratio']['eval_distribution']['dynamic-16'], 3)})",
                     num(r["measured"]["chain-5"]["tau"], 3),
                     f"{num(r['held_out']['expected_tau_joint'], 3)} ({num(r['ratio']['held_out']['chain-5'], 3)})",
                     f"{num(r['eval_distribution']['expected_tau_joint'], 3)} "
                     f"({num(r['ratio']['eval_distribution']['chain-5'], 3)})"] for n, r in rows.items()])
    return lines


FULL_RECIPES_REFERENCE = ("EAGLE-3's full recipe as it was at 0.7 epoch online (before it took 3 epochs offline), at the "
                          "same chain lengths, the reference at equal training budget")


def render_full_recipes(data: dict) -> list[str]:
    rows = data["rows"]
    lines = ["Each recipe run end to end by `draftsmith pipeline -c RECIPE` and judged by `draftsmith eval` at T=0; "
             "online, the frozen target runs inside each training step; offline, its features are extracted once and "
             "every epoch reads them. Steps, epochs and seconds are what the run recorded (train_summary.json; epochs = "
             "sequences seen / training sequences); s / step is the median over its logging intervals. The kept "
             "checkpoint is the one `train.select` ranked best on the run's validation split; its estimate is the "
             "expected τ of the recipe's serving shape, set beside the τ the pipeline's own eval measured (`eval`).", ""]

    def kept(r: dict) -> list:
        """The kept checkpoint's step, its estimate, and the estimate over the τ the pipeline's own eval measured."""
        pipeline_eval = r["evals"].get("eval") or r["evals"].get((r.get("evals_same_as") or {}).get("eval"))
        sel, measured = r.get("selected") or {}, (pipeline_eval or {}).get("tau")
        estimate = sel.get("expected_tau") or (r.get("validation") or {}).get("expected_tau_serving")
        return [sel.get("step"), num(estimate, 3), num(estimate / measured if estimate and measured else None, 3)]

    lines += table(["recipe", "kind", "features", "epochs asked (budget)", "steps (epochs)", "train min", "s / step",
                    "kept step", "its validation expected τ", "÷ measured τ"],
                   [[r["recipe"], r["kind"], r.get("features", "online"),
                     f"{r['epochs_asked']} (max {r['max_minutes']} min)" if r["max_minutes"] else r["epochs_asked"],
                     f"{r['train_steps']} ({num(r.get('epochs'), 2)})", num(r["train_seconds"] / 60, 1),
                     num(r.get("median_step_seconds"), 2), *kept(r)] for r in rows])
    groups: dict[tuple, list[tuple[dict, dict]]] = {}  # evals made with the same settings, whatever the folder
    for r in rows:
        for e in r["evals"].values():
            groups.setdefault((e["n_prompts"], e.get("offset") or 0, e["max_new_tokens"], e["dtype"]), []).append((r, e))
    for (n, offset, tokens, dtype), members in groups.items():
        lines += [f"**{n} Spec-Bench prompts from {offset} x {tokens} tokens, {dtype}**, each recipe's serving shape.", ""]
        lines += table(["recipe", "shape", "τ", "acceptance by depth", "tokens/s", "x plain", "draft ms / step",
                        "verify ms / step", "greedy equal"],
                       [[r["recipe"], e["tree"], num(e["tau"], 3), " / ".join(num(a, 2) for a in e["acceptance_by_depth"]),
                         num(e["tokens_per_s"], 1), num(e["speedup"], 2), num((e["step_ms"] or {}).get("draft"), 1),
                         num((e["step_ms"] or {}).get("verify"), 1),
                         f"{e['greedy_equal_count']}/{e['n_prompts']}" if e["greedy_equal_count"] is not None else None]
                        for r, e in members])
    lines += served_table([(r["recipe"], r["engine"]) for r in rows if r.get("engine")], "recipe")
    ref = data.get("reference")
    if ref:
        host = ref["host"]
        lines += [f"{ref.get('label') or FULL_RECIPES_REFERENCE}: "
                  f"`{ref['drafter']}` in our decoder from [{Path(ref['source']).stem}]({Path(ref['source']).stem}.md) "
                  f"({ref['n_prompts']} Spec-Bench prompts from 0 x {ref['max_new_tokens']} tokens, float32, T=0; "
                  f"host {host.get('device')}, {host.get('date', '').split(' ')[0]}). Its τ and α carry over between "
                  "hosts; its draft ms does not.", ""]
        lines += table(["drafter", "chain", "τ", "α by position", "draft ms / step"],
                       [[ref["drafter"], f"chain-{k}", num(c["tau"], 3),
                         " / ".join(num(a, 3) for a in c["alpha_by_position"]), num(c["draft_ms"], 1)]
                        for k, c in sorted(ref["chains"].items(), key=lambda kv: int(kv[0]))])
    return lines


def render_onpolicy_ceiling(data: dict) -> list[str]:
    dtypes = data["dtypes"]
    any_row = next(iter(dtypes.values()))
    depth = data["depth"]
    lines = [f"How much of training-time test is already on-policy at T=0, on {any_row['sequences']} of "
             f"`{data['config']}`'s training answers ({any_row['answer_tokens']:,} answer tokens; sources "
             f"{', '.join(data['data'])}; seeded sample, seed {data['seed']}). A verification at T=0 accepts a drafted "
             "token only where it is the target's argmax after the accepted prefix; training-time test trains depth j "
             "on the data's j tokens before the label as the drafted prefix. Where each of them is the target's argmax "
             "(teacher-forced, in the dtype named), depth j trains on a prefix a verification accepts: that share is "
             "what on-policy training (Draft-OPD: the drafter's own rollouts, the target's distribution where they "
             "go) leaves unchanged; it can only change the rest. Where the answers are the target's own greedy "
             "answers (the reference recipe's are: smollm2-selfdistill-*, greedy in bfloat16, distill/corpora/LICENSES.md), "
             "a token disagrees where the teacher-forced forward in the named dtype picks another argmax than the "
             "generation did.", ""]
    lines += table(["target dtype", "answer tokens = target's argmax", "answers reproduced whole",
                    *[f"on-policy share, depth {j}" for j in range(depth)]],
                   [[name, num(r["token_agreement"], 4), num(r["answers_identical"], 3),
                     *[num(s, 3) for s in r["onpolicy_share"]]] for name, r in dtypes.items()])
    return lines


@dataclass(frozen=True)
class Campaign:
    title: str
    summary: str  # one line for the index
    script: str  # what writes the JSON
    render: Callable[[dict], list[str]]
    slim: Callable[[dict], dict] = lambda data: data  # applied by --add before the JSON is committed


CAMPAIGNS: dict[str, Campaign] = {
    "exactness": Campaign("Exactness tests and their power",
                          "the power of every exact-sampling test and the negative twins each one rejects",
                          "scripts/bench/exactness_power.py", render_exactness),
    "interrupts": Campaign("Ctrl-C during training: what survives",
                           "SIGINT at a random step of train and pipeline, then a rerun: steps lost, checkpoints, weights",
                           "scripts/bench/interrupt_trials.py", render_interrupts, slim_interrupts),
    "engine-served": Campaign("Served by vLLM: acceptance served vs ours, and what pays",
                              "each drafter in vLLM's CPU build at chains 1-5 beside vLLM's n-gram and plain, and in our "
                              "decoder: α per position, greedy equality, speedup",
                              "scripts/bench/engine_served.py", render_engine_served),
    "engine-served-goal": Campaign("Served by vLLM at the goal's size: full-recipe drafters, 40 prompts x 128 tokens",
                                   "full-recipe drafters in vLLM's CPU build at chains 1-5 (batch 1 and 8 in flight) "
                                   "beside vLLM's n-gram and plain and our decoder: α per position, greedy equality, "
                                   "speedup", "scripts/bench/engine_served.py", render_engine_served),
    "regen-vllm": Campaign("Self-distillation through vLLM against HF generate",
                           "the regenerate stage with backend vllm (vLLM's server) and hf on the same prompts: tokens/s, "
                           "wall time, identical answers", "scripts/bench/regen_vllm.py", render_regen_vllm),
    "fp8-features": Campaign("FP8 hidden-state shards against bfloat16",
                             "extract.dtype float8_e4m3 vs bfloat16 on the reference EAGLE-3 at equal steps: disk, "
                             "training s/step, τ (a second bf16 seed as the noise)", "scripts/bench/fp8_features.py",
                             render_fp8_features),
    "draft-cost": Campaign("Drafting cost per verification: EAGLE-3 levels against one-forward blocks",
                           "ms of drafting per target verification for EAGLE-3 chains, P-EAGLE and DFlash blocks of "
                           "4 and 8 (a full and a reduced draft vocabulary)", "scripts/bench/draft_cost.py",
                           render_draft_cost),
    "gpu-check": Campaign("GPU mechanics: verification cost, decoder overhead and draft cost on an H200",
                          "random-weight 1B and 8B Llama shapes in bf16: ms of a k-node verification forward, our "
                          "decoder's loop against HF generate, drafting ms per verification of EAGLE-3 chains and "
                          "P-EAGLE / DFlash blocks, and the CUDA tests", "scripts/gpu_check.sh",
                          render_gpu_check),
    "plan-compare": Campaign("Which drafter to serve: the plan across EAGLE-3, the parallel drafters and prompt lookup",
                             "draftsmith plan with several drafters on the same calibration prompts: every drafter's "
                             "candidates and chosen setting, and the one to serve", "scripts/bench/plan_compare.py",
                             render_plan_compare),
    "speculators-peer": Campaign("draftsmith's EAGLE-3 trainer against speculators' at equal steps and equal "
                                 "training seconds", "the same features, vocabulary and schedule trained by both; τ "
                                 "in our decoder and served by vLLM, training seconds, the estimate vs the measured τ", "scripts/bench/speculators_peer.sh", render_speculators_peer),
    "speculators-peer-epoch": Campaign("draftsmith's EAGLE-3 trainer against speculators' over one epoch of every "
                                       "answer", "stage 2 of the head-to-head: both trainers on the features of all "
                                       "the recipe's answers for one epoch at equal steps, judged on Spec-Bench and "
                                       "MT-bench with the 16-node tree and chains 1-5, served by vLLM",
                                       "scripts/bench/speculators_peer.sh", render_speculators_peer),
    "levers": Campaign("Levers at equal data: TTT depth, epochs, lookup-aware weighting and the parallel drafters "
                       "against EAGLE-3", "rows trained from one set of offline features and judged on the same "
                       "prompts, paired against the EAGLE-3 baseline: τ, training seconds, tokens/s, served α",
                       "scripts/bench/levers.sh", render_levers),
    "validation-gap": Campaign("The validation estimate against the measured τ: held-out training answers vs the eval's "
                               "distribution", "training's expected τ on two validation splits beside the τ our "
                               "decoder measured, for every levers row", "scripts/bench/validation_gap.py",
                               render_validation_gap),
    "full-recipes": Campaign("Full recipes of the parallel drafters beside EAGLE-3's at equal training budget",
                             "a parallel drafter's full recipe run end to end (0.7 epoch of the EAGLE-3 recipe's "
                             "answers): steps, seconds, τ, acceptance by depth, tokens/s, draft cost, served by vLLM, "
                             "beside EAGLE-3's full recipe at the same chain", "scripts/bench/full_recipes.py",
                             render_full_recipes),
    "eagle3-recipe": Campaign("The EAGLE-3 recipe with the levers that won: 3 epochs over offline features, beside the "
                              "0.7-epoch recipe it replaces", "smollm2-eagle3 run end to end with 3 epochs over features "
                              "extracted once and a validation split from the eval's distribution: steps, seconds, τ "
                              "of its 16-node tree and a chain of 5, the estimate vs the measured τ, beside the "
                              "0.7-epoch recipe at the same chain", "scripts/bench/full_recipes.py",
                              render_full_recipes),
    "onpolicy-ceiling": Campaign("On-policy drafter training: how much of training-time test it could change",
                                 "the recipe's answers teacher-forced through the target: answer tokens equal to its "
                                 "argmax, and the share of each TTT depth whose drafted prefix a T=0 verification "
                                 "accepts", "scripts/bench/onpolicy_ceiling.py", render_onpolicy_ceiling),
}


# ---- pages ------------------------------------------------------------------------------------------------------------
def date_of(data: dict) -> str:
    return str(data.get("date") or (data.get("host") or {}).get("date") or "not recorded").split(" ")[0]


def page(name: str, data: dict) -> str:
    c = CAMPAIGNS[name]
    lines = [f"# {c.title}", "",
             f"Generated from [data/{name}.json](data/{name}.json) by `scripts/bench/results_pages.py` — do not edit.",
             "", f"- date: {date_of(data)}",
             f"- command: `{shown_command(data.get('command') or 'not recorded', data.get('notes', []))}`"]
    lines += [f"- note {i}: {n}" for i, n in enumerate(data.get("notes", []), 1)]
    lines += ["", *host_lines(data.get("host")), *c.render(data)]
    return "\n".join(lines).rstrip() + "\n"


def index(datasets: dict[str, dict]) -> str:
    lines = ["# Results", "",
             "One page per measurement campaign, each generated from the JSON its script wrote (committed under "
             "[data/](data/)) by `python scripts/bench/results_pages.py` — do not edit the pages. Every page names "
             "its date, host and the exact command.", ""]
    lines += table(["campaign", "what it measures", "date", "host", "script"],
                   [[f"[{CAMPAIGNS[n].title}]({n}.md)", CAMPAIGNS[n].summary, date_of(d),
                     (d.get("host") or {}).get("device", "–"), f"`{CAMPAIGNS[n].script}`"] for n, d in datasets.items()])
    lines += ["Results measured before these pages existed were written only into the README's prose and their JSON "
              "stayed on the hosts that made them, so they are not republished here; they are in git history "
              "(`git show 35b5121:README.md`).", "",
              "Adding a campaign: its script records `host_block()` and `command_line()` from this generator in its JSON; "
              "`python scripts/bench/results_pages.py --add NAME OUT.json` copies it into `data/NAME.json`; a renderer "
              "and a `CAMPAIGNS` row in `scripts/bench/results_pages.py` turn it into a page."]
    return "\n".join(lines) + "\n"


def load(results: Path = RESULTS) -> dict[str, dict]:
    """Every campaign that has a JSON, in CAMPAIGNS order."""
    return {n: json.loads((results / "data" / f"{n}.json").read_text()) for n in CAMPAIGNS
            if (results / "data" / f"{n}.json").is_file()}


def write_pages(out: Path, results: Path = RESULTS) -> list[Path]:
    """Write every page and the index into `out`; returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    datasets, written = load(results), []
    for name, data in datasets.items():
        (out / f"{name}.md").write_text(page(name, data))
        written.append(out / f"{name}.md")
    (out / "README.md").write_text(index(datasets))
    return [*written, out / "README.md"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--add", nargs=2, metavar=("NAME", "FILE"), help="copy a campaign JSON into data/NAME.json")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the pages (default docs/results)")
    args = parser.parse_args()
    if args.add:
        name, source = args.add
        if name not in CAMPAIGNS:
            sys.exit(f"unknown campaign '{name}'; known: {', '.join(CAMPAIGNS)} (add a row to CAMPAIGNS first)")
        data = CAMPAIGNS[name].slim(json.loads(Path(source).read_text()))
        (RESULTS / "data").mkdir(parents=True, exist_ok=True)
        (RESULTS / "data" / f"{name}.json").write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    for path in write_pages(args.out):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
