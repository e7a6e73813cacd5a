"""The plan's choice and its words: per batch size, the candidate to serve from what eval/measure/plan.py
measured (`choose`, step 3 of that module's doc), the plan as a table for the terminal (`format_plan`), and
across several drafters' plans the one to serve (`compare_plans`, OUT/choice.json).

In the flow: `make_plan` measures candidates -> rows (τ, accepted tokens, tokens/s, speedup ± its standard
error, step_ms) and plain decoding's timing noise -> `choose` ->
`{"plain", "settings", "label", "speedup", "bar", "why"}` inside serving.json;
`draftsmith plan --drafter A --drafter B` hands every drafter's plan to `compare_plans` -> choice.json
(`by_batch[b]`: every drafter's choice, the one to serve, its lead over the runner-up and why).
"""

from __future__ import annotations

import json
from pathlib import Path

from draftsmith.eval.serving import PLAN, plan_at

# τ at or below this: nothing accepted (plain decoding's τ is 1.0), so any lead is timing noise
NULL_TAU = 1.0 + 1e-6
CHOICE = "choice.json"


def lookup_alone(settings: dict) -> bool:
    """True for a candidate where the model drafts nothing (prompt lookup alone)."""
    return settings.get("num_speculative_tokens") == 0


def verify_ratios(curve: dict[int, float], ks=(4, 8, 16)) -> str:
    """'4 / 8 / 16 new tokens costs 1.97 / 2.12 / 2.54 one-token forwards' from a verify_cost curve."""
    ks = [k for k in ks if k in curve]
    return (" / ".join(map(str, ks)) + " new tokens costs "
            + " / ".join(f"{curve[k] / curve[1]:.2f}" for k in ks) + " one-token forwards")


def accepted_nothing(row: dict) -> bool:
    """True for a measured candidate that accepted no draft token: it cannot be faster than plain decoding."""
    return row.get("accepted", 1) == 0 or row["tau"] <= NULL_TAU


def split_text(row: dict) -> str:
    """'drafting 12.1 ms + verifying 45.0 ms + accepting 1.2 ms a step against a plain step's 38.9 ms'
    (measured).

    Per batched forward and without the prefill, so it need not match `step_cost` (τ / speedup, prefill
    included, per sequence) exactly; it says where a step's time went, `step_cost` what the step cost
    overall."""
    ms, plain = row.get("step_ms"), row.get("plain_step_ms")
    if not ms or not plain:
        return ""
    return (f"drafting {ms['draft']:.1f} ms + verifying {ms['verify']:.1f} ms + accepting {ms['accept']:.1f} "
            f"ms a step against a plain step's {sum(plain.values()):.1f} ms")


def noise_text(noise: dict) -> str:
    """'timing noise 4.2% (the range of plain decoding's tok/s over 7 runs)' for reasons and the table."""
    if noise.get("relative") is None:
        return "timing noise unmeasured (fewer than two plain runs)"
    return (f"timing noise {noise['relative']:.1%} (the range of plain decoding's tok/s over {noise['runs']} "
            "runs)")


def choose(rows: list[dict], curve: dict[int, float], margin: float, kind: str, noise: dict) -> dict:
    """The fastest candidate that accepted something and beats plain beyond `margin` + the timing noise (its
    speedup less one standard error), else plain decoding; says why, and where the drafter goes unused."""
    measured = [r for r in rows if "speedup" in r]
    able = [r for r in measured if not accepted_nothing(r)]
    # a negative margin asks for speculation even slower than plain (checking the plumbing): no noise guard to
    # apply
    guarded = margin >= 0
    bar = round(1 + margin + ((noise.get("relative") or 0.0) if guarded else 0.0), 4)
    low = "speedup_low" if guarded else "speedup"
    best = max((r for r in able if r[low] > bar), key=lambda r: r["speedup"], default=None)
    if best is None:
        return {"plain": True, "bar": bar, "why": _plain_why(measured, able, curve, margin, noise, bar)}
    chosen = {"plain": False, "settings": best["settings"], "label": best["label"],
              "speedup": best["speedup"], "speedup_low": best["speedup_low"], "tau": best["tau"], "bar": bar}
    model = max((r for r in measured if not lookup_alone(r["settings"])), key=lambda r: r["speedup"],
                default=None)
    if lookup_alone(best["settings"]) and model is not None:
        chosen["why"] = (f"prompt lookup alone (x{best['speedup']:.3f} of plain, τ {best['tau']:.2f}) beat "
                         f"every setting that drafts with the {kind} drafter on the calibration prompts; the "
                         f"best of those ({model['label']}) reached x{model['speedup']:.3f} (τ "
                         f"{model['tau']:.2f}, a step costing {model['step_cost']:.2f} plain steps: "
                         f"{split_text(model)}): here the drafter costs more than it adds over free n-gram "
                         "drafts; re-plan where verification is cheaper (a GPU) or after more training")
    return chosen


def _plain_why(measured: list[dict], able: list[dict], curve, margin: float, noise: dict, bar: float) -> str:
    """Why plain decoding was chosen: nothing built, nothing accepted, or nothing beat the bar (with the
    figures)."""
    fastest = max(measured, key=lambda r: r["speedup"], default=None)
    if fastest is None:
        return "no candidate could be built"
    null = "" if not accepted_nothing(fastest) else (
        f"; {fastest['label']} looked x{fastest['speedup']:.3f} but accepted no draft token (τ "
        f"{fastest['tau']:.2f}): timing noise, never a choice")
    best = max(able, key=lambda r: r["speedup"], default=None)
    if best is None:
        return ("no candidate accepted a draft token on the calibration prompts (τ 1.00 everywhere), so none "
                f"can be faster than plain decoding{null}")
    guard = (f"less one standard error, x{best['speedup_low']:.3f}, is not above x{bar:.3f} (margin "
             f"{margin:.0%} + {noise_text(noise)})") if margin >= 0 else \
        f"not above x{bar:.3f} (margin {margin:.0%}, no noise guard)"
    return (f"the best candidate ({best['label']}) reached only x{best['speedup']:.3f} ± "
            f"{best['speedup_se']:.3f} of plain decoding on the calibration prompts, which {guard}: it "
            f"accepted τ {best['tau']:.2f} tokens a step, and a step of it (drafting + verifying + "
            f"accepting) cost {best['step_cost']:.2f} plain steps here ({split_text(best)}); verifying "
            + verify_ratios(curve) + " alone" + null)


def format_plan(plan: dict) -> str:
    """The candidates as a table and the choice, for the terminal."""
    lines = []
    for batch in plan.get("batch_sizes") or [plan.get("batch_size", 1)]:
        part = plan_at(plan, batch)
        curves = (part.get("verify_cost_ms_by_context")
                  or {part.get("verify_context", 256): part["verify_cost_ms"]})
        lines += [f"plan for {plan['kind']} on {plan['machine']['device']} ({plan['dtype']}, batch {batch}, "
                  f"{plan['calibration']['n']} calibration prompts x {plan['calibration']['max_new_tokens']} "
                  "tokens)",
                  *(f"verify cost (ms) by new tokens after {c} tokens: "
                    + ", ".join(f"{k}: {v}" for k, v in curve.items()) for c, curve in curves.items())]
        if part.get("noise"):
            lines.append(f"{noise_text(part['noise'])}; a choice must beat plain by its margin + that noise "
                         f"(x{part['chosen'].get('bar', 1.0):.3f}, speedup less one standard error)")
        for r in part["candidates"]:
            if "skipped" in r:
                lines.append(f"  {r['label']:<70} skipped: {r['skipped'][:60]}")
            else:
                ms = r.get("step_ms") or {}
                split = f"  draft {ms['draft']:.1f} + verify {ms['verify']:.1f} ms/step" if ms else ""
                se = f" ±{r['speedup_se']:.3f}" if r.get("speedup_se") else ""
                null = "  accepted nothing" if accepted_nothing(r) else ""
                lines.append(f"  {r['label']:<70} τ {r['tau']:.2f}  {r['tokens_per_s']:6.1f} tok/s  "
                             f"x{r['speedup']:.3f}{se}{split}{null}")
        chosen = part["chosen"]
        lines.append(f"chosen at batch {batch}: "
                     + (f"plain decoding: {chosen['why']}" if chosen["plain"] else
                        f"{chosen['label']} (x{chosen['speedup']:.3f} of plain, τ {chosen['tau']:.2f})"
                        + (f": {chosen['why']}" if chosen.get("why") else "")))
    return "\n".join(lines)


def _choice_row(name: str, plan: dict, batch: int) -> dict:
    """One drafter's line at `batch`: its plan's choice and figures (plain: speedup 1.0 by definition)."""
    part = plan_at(plan, batch)
    chosen = part["chosen"]
    row = {"name": name, "kind": plan["kind"], "drafter": plan["drafter"], "plain": chosen["plain"],
           "label": chosen.get("label", "plain decoding"),
           "speedup": 1.0 if chosen["plain"] else chosen["speedup"],
           "speedup_low": 1.0 if chosen["plain"] else chosen["speedup_low"], "tau": chosen.get("tau", 1.0),
           "noise": (part.get("noise") or {}).get("relative"),
           "plain_tokens_per_s": part.get("plain_tokens_per_s")}
    if not chosen["plain"]:
        row["settings"] = chosen["settings"]
        row["lookup_alone"] = lookup_alone(chosen["settings"])
        best = next((c for c in part["candidates"] if c.get("label") == chosen["label"]), {})
        row["tokens_per_s"], row["step_ms"] = best.get("tokens_per_s"), best.get("step_ms")
    return row


def compare_plans(plans: dict[str, dict]) -> dict:
    """Across drafters' plans (module doc): per batch size every drafter's choice, the one to serve and
    why."""
    if not plans:
        raise ValueError("compare_plans needs at least one plan")
    batches = sorted({int(b) for plan in plans.values() for b in plan.get("batch_sizes") or [1]})
    by_batch = {}
    for batch in batches:
        rows = sorted((_choice_row(name, plan, batch) for name, plan in plans.items()),
                      key=lambda r: -r["speedup"])
        able = [r for r in rows if not r["plain"]]
        if not able:
            why = ("no drafter's plan beat plain decoding beyond its noise: "
                   + "; ".join(f"{r['name']} ({r['kind']}) chose plain" for r in rows))
            by_batch[str(batch)] = {"batch_size": batch, "drafters": rows, "chosen": {"plain": True},
                                    "why": why}
            continue
        best = able[0]
        runner = next((r for r in rows[1:] if not r.get("lookup_alone") or not best.get("lookup_alone")),
                      None)
        runner_speedup = runner["speedup"] if runner is not None else 1.0
        noise = max((r["noise"] or 0.0) for r in (best, runner) if r is not None)
        lead = best["speedup"] / runner_speedup - 1
        clear = lead > noise
        chosen = {"plain": False, "name": None if best.get("lookup_alone") else best["name"],
                  "kind": "prompt-lookup" if best.get("lookup_alone") else best["kind"],
                  "drafter": None if best.get("lookup_alone") else best["drafter"],
                  "serving": f"{best['name']}/{PLAN}", "label": best["label"], "settings": best["settings"],
                  "speedup": best["speedup"], "tau": best["tau"], "lead": round(lead, 4),
                  "noise": round(noise, 4), "clear": clear}
        what = (f"prompt lookup alone ({best['label']}, measured in {best['name']}'s plan)"
                if best.get("lookup_alone")
                else f"{best['name']} ({best['kind']}, {best['label']})")
        other = (f"the runner-up {runner['name']} ({runner['kind']}, {runner['label']}) x{runner_speedup:.3f}"
                 if runner is not None else "plain decoding")
        why = (f"{what} served x{best['speedup']:.3f} of plain (τ {best['tau']:.2f}) against {other}: a lead "
               f"of {lead:.1%}, " + ("beyond" if clear else "within") + f" the timing noise {noise:.1%}"
               + ("" if clear
                  else "; the two are a tie here, re-measure with more calibration prompts to separate them"))
        by_batch[str(batch)] = {"batch_size": batch, "drafters": rows, "chosen": chosen, "why": why}
    first = next(iter(plans.values()))
    return {"plans": {name: {"kind": plan["kind"], "drafter": plan["drafter"], "serving": f"{name}/{PLAN}"}
                         for name, plan in plans.items()},
            "dtype": first["dtype"], "machine": first["machine"], "calibration": first["calibration"],
            "batch_sizes": batches, "by_batch": by_batch, **by_batch[str(batches[0])]}


def format_comparison(comparison: dict) -> str:
    lines = []
    for batch in comparison["batch_sizes"]:
        part = comparison["by_batch"][str(batch)]
        lines.append(f"drafters compared at batch {batch} (each over its own plain runs):")
        for r in part["drafters"]:
            lines.append(f"  {r['name']:<24} {r['kind']:<10} {r['label']:<60} x{r['speedup']:.3f}  τ "
                         f"{r['tau']:.2f}")
        lines.append(f"serve at batch {batch}: " + part["why"])
    return "\n".join(lines)


def write_choice(folder: str | Path, comparison: dict) -> Path:
    """`choice.json` in `folder`, written whole or not at all."""
    path = Path(folder) / CHOICE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(comparison, indent=2) + "\n")
    tmp.rename(path)
    return path
