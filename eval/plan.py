"""`draftsmith plan`: the serving settings that make a drafter fastest on *this* machine, measured.

Speedup is τ over cost, and both the cost of verifying k tokens and the cost of drafting are properties
of the machine, so the tree a drafter should serve with is found where it serves. The plan:

1. measures the target's verification cost: one forward of k = 1..64 new tokens after a context of
   `context` tokens, at batch 1 (`verify_cost`, ms; the curve every choice below trades against);
2. decodes the calibration prompts — a split of the prompt set disjoint from what `eval` and `bench`
   time (`EvalConfig.offset`) — with the plain loop and with each candidate configuration of the
   drafter's kind (chains and trees of several sizes, dynamic trees, adaptive drafting, a prompt-lookup
   branch) and prompt lookup alone with the drafter unused, alternating the order per prompt, and records
   τ, tokens/s and speedup for each;
3. picks the configuration with the most tokens/s; plain decoding when none beats plain by `margin`
   (then the plan says so and why), prompt lookup alone when it beats every setting that uses the
   drafter (and the plan says by how much);
4. writes `serving.json` into the drafter folder (the machine and dtype it was measured on, every
   candidate's figures, the verify curve, the choice as drafter settings). `eval` and `bench` serve with
   it by default (`drafter.plan: false` serves the recipe's settings); SERVE.md notes which machine a
   plan was made for — a plan made on a CPU is not a GPU engine's flags.

Candidates are drafter-setting overrides (the `DrafterConfig` serving fields), so a plan is nothing but
settings a user could also type.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from draftsmith.distill.target import dtype_name
from draftsmith.eval.benchmark import EvalConfig, select_prompts
from draftsmith.eval.decoder import SpeculativeDecoder
from draftsmith.eval.machine import machine_info
from draftsmith.eval.verify import SamplingConfig
from draftsmith.heads.acceptance import tau

PLAN = "serving.json"


@dataclass
class PlanConfig:
    """`plan:` section — the pipeline's plan stage after eval (`draftsmith plan` with these settings, in the
    eval dtype), then a second eval served with the plan into `<run>/eval-plan`."""

    enabled: bool = False
    prompts: str = "spec-bench"
    calibration: int = 8  # calibration prompts, from `offset` on (disjoint from eval's first prompts)
    offset: int = 240
    max_new_tokens: int = 64
    margin: float = 0.03  # speculation must beat plain decoding by this on calibration to be chosen


# every trained drafter's plan also measures prompt lookup alone (the drafter unloaded): where the drafter's cost
# outweighs what it adds over free n-gram drafts, serving it is slower than not using it, and the plan says so
LOOKUP_ALONE = {"num_speculative_tokens": 0, "lookup_branch": 5}


def label_of(overrides: dict) -> str:
    if overrides.get("num_speculative_tokens") == 0:
        return f"prompt lookup alone, chain {overrides.get('lookup_branch')} (the drafter unused)"
    return ", ".join(f"{k}={v}" for k, v in overrides.items()) or "recipe"


@torch.no_grad()
def verify_cost(target, ks=(1, 2, 4, 8, 12, 16, 24, 32, 48, 64), context: int = 256, reps: int = 5) -> dict[int, float]:
    """ms of one target forward of k new tokens after `context` cached tokens (median of `reps`)."""
    from draftsmith.eval.kv_cache import crop_cache, new_cache

    device = target.device
    ids = torch.randint(10, target.vocab_size - 10, (1, context + max(ks)), generator=torch.Generator().manual_seed(0))
    cache = new_cache(target.config)
    target.model(input_ids=ids[:, :context].to(device), cache=cache, use_cache=True)
    out = {}
    for k in ks:
        times = []
        for _ in range(reps):
            crop_cache(cache, context)
            start = time.perf_counter()
            target.model(input_ids=ids[:, context: context + k].to(device), cache=cache, use_cache=True)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        out[k] = round(1000 * statistics.median(times), 3)
    return out


def verify_ratios(curve: dict[int, float], ks=(4, 8, 16)) -> str:
    """'4 / 8 / 16 new tokens costs 1.97 / 2.12 / 2.54 one-token forwards' from a verify_cost curve."""
    ks = [k for k in ks if k in curve]
    return (" / ".join(map(str, ks)) + " new tokens costs "
            + " / ".join(f"{curve[k] / curve[1]:.2f}" for k in ks) + " one-token forwards")


def _decode(decoder: SpeculativeDecoder, prompts: list[list[int]], max_new: int) -> tuple[int, float, list]:
    tokens, seconds, results = 0, 0.0, []
    for p in prompts:
        out = decoder.generate(p, max_new, SamplingConfig())
        tokens, seconds = tokens + out.new_tokens, seconds + out.wall_time
        results.append(out)
    return tokens, seconds, results


def make_plan(target, drafter_cfg, folder, prompts: str = "spec-bench", calibration: int = 8, offset: int = 240,
              max_new_tokens: int = 64, margin: float = 0.03, progress: bool = True) -> dict:
    """Measure every candidate on the calibration prompts; returns the plan (see the module doc)."""
    from tqdm.auto import tqdm

    from draftsmith.eval.proposers import build_proposer

    records = select_prompts(EvalConfig(prompts=prompts, limit=calibration, offset=offset))
    ids = [target.chat_ids(r["prompt"]) for r in records]
    plain = SpeculativeDecoder(target)
    plain.generate(ids[0], 8)  # untimed warm-up
    rows, plain_tok, plain_sec = [], 0, 0.0
    base = dataclasses.replace(drafter_cfg, plan=False)
    options = drafter_cfg.settings.serving_candidates(folder.config if folder is not None else {})
    if drafter_cfg.spec.trainable and LOOKUP_ALONE not in options:
        options = [*options, LOOKUP_ALONE]
    for i, overrides in enumerate(tqdm(options, desc="plan", unit="config", disable=not progress)):
        cfg = base.with_plan({"chosen": {"settings": overrides}})  # exactly what serving.json would serve
        try:
            decoder = SpeculativeDecoder(target, build_proposer(cfg, target))
        except ValueError as exc:  # e.g. a tree deeper than the Medusa heads
            rows.append({"settings": overrides, "label": label_of(overrides), "skipped": str(exc)})
            continue
        decoder.generate(ids[0], 8)  # untimed warm-up of this proposer
        order = [("plain", plain), ("spec", decoder)] if i % 2 == 0 else [("spec", decoder), ("plain", plain)]
        got = {}
        for name, dec in order:
            got[name] = _decode(dec, ids, max_new_tokens)
        (st, ss, res), (pt, ps, _) = got["spec"], got["plain"]
        plain_tok, plain_sec = plain_tok + pt, plain_sec + ps
        rows.append({"settings": overrides, "label": label_of(overrides), "tree": decoder.proposer.tree,
                     "tau": round(tau(res), 4), "tokens_per_s": round(st / ss, 3),
                     "plain_tokens_per_s": round(pt / ps, 3), "speedup": round((st / ss) / (pt / ps), 4),
                     # what one speculative step (drafting + verifying) cost, in plain steps: τ / speedup
                     "step_cost": round(tau(res) / ((st / ss) / (pt / ps)), 4)})
    measured = [r for r in rows if "speedup" in r]
    best = max(measured, key=lambda r: r["speedup"], default=None)
    plain_rate = plain_tok / plain_sec if plain_sec else None
    curve = verify_cost(target)
    if best is None or best["speedup"] < 1 + margin:
        why = ("no candidate could be built" if best is None else
               f"the best candidate ({best['label']}) reached only x{best['speedup']:.3f} of plain decoding on the "
               f"calibration prompts (margin {margin:.0%}): it accepted τ {best['tau']:.2f} tokens a step, and a "
               f"step of it (drafting + verifying) cost {best['step_cost']:.2f} plain steps here; verifying "
               + verify_ratios(curve) + " alone")
        chosen = {"plain": True, "why": why}
    else:
        chosen = {"plain": False, "settings": best["settings"], "label": best["label"], "speedup": best["speedup"],
                  "tau": best["tau"]}
        model = max((r for r in measured if r["settings"] != LOOKUP_ALONE), key=lambda r: r["speedup"], default=None)
        if best["settings"] == LOOKUP_ALONE and model is not None:
            chosen["why"] = (f"prompt lookup alone (x{best['speedup']:.3f} of plain, τ {best['tau']:.2f}) beat every setting "
                             f"that drafts with the {drafter_cfg.kind} drafter on the calibration prompts; the best of those "
                             f"({model['label']}) reached x{model['speedup']:.3f} (τ {model['tau']:.2f}, a step costing "
                             f"{model['step_cost']:.2f} plain steps): here the drafter costs more than it adds over free "
                             "n-gram drafts; re-plan where verification is cheaper (a GPU) or after more training")
    return {"kind": drafter_cfg.kind, "dtype": dtype_name(target.dtype), "batch_size": 1, "machine": machine_info(target),
            "calibration": {"prompts": prompts, "offset": offset, "n": len(ids), "max_new_tokens": max_new_tokens,
                            "ids": [r["id"] for r in records]},
            "verify_cost_ms": curve, "plain_tokens_per_s": round(plain_rate, 3) if plain_rate else None,
            "candidates": rows, "chosen": chosen}


def format_plan(plan: dict) -> str:
    """The candidates as a table and the choice, for the terminal."""
    lines = [f"plan for {plan['kind']} on {plan['machine']['device']} ({plan['dtype']}, batch {plan['batch_size']}, "
             f"{plan['calibration']['n']} calibration prompts x {plan['calibration']['max_new_tokens']} tokens)",
             "verify cost (ms) by new tokens: " + ", ".join(f"{k}: {v}" for k, v in plan["verify_cost_ms"].items())]
    for r in plan["candidates"]:
        if "skipped" in r:
            lines.append(f"  {r['label']:<70} skipped: {r['skipped'][:60]}")
        else:
            lines.append(f"  {r['label']:<70} τ {r['tau']:.2f}  {r['tokens_per_s']:6.1f} tok/s  x{r['speedup']:.3f}")
    chosen = plan["chosen"]
    lines.append("chosen: " + (f"plain decoding: {chosen['why']}" if chosen["plain"] else
                               f"{chosen['label']} (x{chosen['speedup']:.3f} of plain, τ {chosen['tau']:.2f})"
                               + (f": {chosen['why']}" if chosen.get("why") else "")))
    return "\n".join(lines)


def write_plan(folder: Path, plan: dict) -> Path:
    path = Path(folder) / PLAN
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(plan, indent=2) + "\n")
    tmp.rename(path)
    return path
