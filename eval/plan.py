"""`draftsmith plan`: the serving settings that make a drafter fastest on *this* machine, measured.

Speedup is τ over cost, and both the cost of verifying k tokens and the cost of drafting are properties
of the machine, so the tree a drafter should serve with is found where it serves. The plan:

1. measures the target's verification cost: one forward of k = 1..64 new tokens after a context of each
   length asked (`--contexts`, default 256 tokens), at each batch size asked (`verify_cost`, ms; attention makes
   long contexts dearer, more so on a GPU); the curve at the asked length nearest the calibration prompts' own
   contexts is the one every choice below is explained against (`verify_cost_ms`), all are recorded
   (`verify_cost_ms_by_context`);
2. decodes the calibration prompts — a split of the prompt set disjoint from what `eval` and `bench`
   time (`EvalConfig.offset`) — with the plain loop and with each candidate configuration of the
   drafter's kind (chains and trees of several sizes, dynamic trees, adaptive drafting, a prompt-lookup
   branch; with `drafter.lookup_datastore`, each prompt-lookup candidate again drafting from that datastore of
   the target's answers too) and prompt lookup alone with the drafter unused, alternating the order per prompt, at each batch
   size asked (`--batch-sizes`, default 1), and records τ, tokens/s and speedup for each;
3. picks, per batch size, the configuration with the most tokens/s; plain decoding when none beats plain by `margin`
   (then the plan says so and why), prompt lookup alone when it beats every setting that uses the
   drafter (and the plan says by how much);
4. writes `serving.json` into the drafter folder (the machine and dtype it was measured on, every
   candidate's figures — with the measured ms per step spent drafting, verifying and accepting, beside the plain
   loop's (`step_ms`, `plain_step_ms`) — the verify curve, the choice as drafter settings). `eval` and `bench` serve with
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
from draftsmith.eval.bench import Tally
from draftsmith.eval.benchmark import EvalConfig, select_prompts
from draftsmith.eval.decoder import SpeculativeDecoder
from draftsmith.eval.machine import machine_info
from draftsmith.eval.proposers import plan_at
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
    batch_sizes: list[int] = dataclasses.field(default_factory=lambda: [1])  # a plan for each (serving picks its own)
    contexts: list[int] = dataclasses.field(default_factory=lambda: [256])  # verify-cost curves after these contexts


# every trained drafter's plan also measures prompt lookup alone (the drafter unloaded), as a chain and as a trie of
# several matches: where the drafter's cost outweighs what it adds over free n-gram drafts, serving it is slower
# than not using it, and the plan says so
LOOKUP_ALONE = {"num_speculative_tokens": 0, "lookup_branch": 5}
LOOKUP_TRIE = {"num_speculative_tokens": 0, "lookup_branch": 8, "lookup_matches": 3}


def lookup_alone(settings: dict) -> bool:
    """True for a candidate where the model drafts nothing (prompt lookup alone)."""
    return settings.get("num_speculative_tokens") == 0


def with_datastore(options: list[dict], datastore: list[str], kind: str) -> list[dict]:
    """`options` and, where `datastore` is given, a twin of each that drafts with prompt lookup (alone, as the kind or
    as a branch) drafting from the datastore too: the plan measures whether its path pays."""
    if not datastore:
        return options
    looks = [o for o in options if kind == "prompt-lookup" or o.get("lookup_branch", 0) > 0]
    return [*options, *({**o, "lookup_datastore": list(datastore)} for o in looks)]


def label_of(overrides: dict) -> str:
    store = " + datastore" if overrides.get("lookup_datastore") else ""
    if lookup_alone(overrides):
        matches = overrides.get("lookup_matches", 1)
        shape = f"chain {overrides.get('lookup_branch')}" if matches == 1 else \
            f"a trie of {matches} matches x {overrides.get('lookup_branch')}"
        return f"prompt lookup alone, {shape}{store} (the drafter unused)"
    # tree=None serves the tree the folder recorded (the recipe's), not "no tree"
    return ", ".join(f"{k}=" + ("the folder's" if v is None and k == "tree" else f"{v}") for k, v in overrides.items()
                     if k != "lookup_datastore") + store or "recipe"


@torch.no_grad()
def verify_cost(target, ks=(1, 2, 4, 8, 12, 16, 24, 32, 48, 64), context: int = 256, reps: int = 5,
                batch: int = 1) -> dict[int, float]:
    """ms of one target forward of k new tokens per row after `context` cached tokens, `batch` rows (median of `reps`,
    after one untimed forward of that shape, whose first call may allocate and pick kernels: without it one AMD host's
    plan read k = 1, the first measured, at 85.7 ms against 81.0 for k = 2)."""
    from draftsmith.eval.kv_cache import crop_cache, new_cache

    device = target.device
    ids = torch.randint(10, target.vocab_size - 10, (batch, context + max(ks)), generator=torch.Generator().manual_seed(0))
    cache = new_cache(target.config)
    target.model(input_ids=ids[:, :context].to(device), cache=cache, use_cache=True)
    out = {}
    for k in ks:
        times = []
        for rep in range(reps + 1):
            crop_cache(cache, context)
            start = time.perf_counter()
            target.model(input_ids=ids[:, context: context + k].to(device), cache=cache, use_cache=True)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if rep:  # the first is the warm-up
                times.append(time.perf_counter() - start)
        out[k] = round(1000 * statistics.median(times), 3)
    return out


def verify_contexts(target, contexts, typical: float) -> tuple[list[int], int]:
    """The context lengths to measure verification after (sorted, checked against the target's window) and the one
    nearest `typical` (the calibration prompts' mean context): the curve the choice is explained against."""
    contexts = sorted({int(c) for c in contexts})
    window = getattr(target.config, "max_position_embeddings", None)
    if not contexts or contexts[0] < 1:
        raise ValueError(f"plan contexts must be positive token counts (e.g. --contexts 256,2048), got {contexts}")
    if window and contexts[-1] + 64 > window:
        raise ValueError(f"plan context {contexts[-1]} + 64 new tokens exceeds the target's window of {window} "
                         f"(config.max_position_embeddings): ask for contexts up to {window - 64}")
    return contexts, min(contexts, key=lambda c: (abs(c - typical), c))


def verify_ratios(curve: dict[int, float], ks=(4, 8, 16)) -> str:
    """'4 / 8 / 16 new tokens costs 1.97 / 2.12 / 2.54 one-token forwards' from a verify_cost curve."""
    ks = [k for k in ks if k in curve]
    return (" / ".join(map(str, ks)) + " new tokens costs "
            + " / ".join(f"{curve[k] / curve[1]:.2f}" for k in ks) + " one-token forwards")


def _decode(decoder: SpeculativeDecoder, prompts: list[list[int]], max_new: int, batch: int = 1) -> Tally:
    """The calibration prompts in batches of `batch` (greedy) -> their tally (tokens, seconds, per-sequence results,
    steps and where the steps' time went), as bench keeps it."""
    tally = Tally()
    for i in range(0, len(prompts), batch):
        out = decoder.generate_batch(prompts[i: i + batch], max_new, SamplingConfig())
        tally.add(out.new_tokens, out.wall_time, out.results, out.steps, out.phase_seconds)
    return tally


def _measure(target, base, options, ids, max_new_tokens, batch, progress) -> tuple[list[dict], float | None]:
    """Every candidate against the plain loop at one batch size, alternating which runs first -> (rows, plain tok/s)."""
    from tqdm.auto import tqdm

    from draftsmith.eval.proposers import build_proposer

    plain = SpeculativeDecoder(target)
    plain.generate_batch(ids[:batch], 8)  # untimed warm-up
    rows, plain_tok, plain_sec = [], 0, 0.0
    for i, overrides in enumerate(tqdm(options, desc=f"plan b{batch}", unit="config", disable=not progress)):
        cfg = base.with_plan({"chosen": {"settings": overrides}})  # exactly what serving.json would serve
        try:
            decoder = SpeculativeDecoder(target, build_proposer(cfg, target))
        except ValueError as exc:  # e.g. a tree deeper than the Medusa heads
            rows.append({"settings": overrides, "label": label_of(overrides), "skipped": str(exc)})
            continue
        decoder.generate_batch(ids[:batch], 8)  # untimed warm-up of this proposer
        order = [("plain", plain), ("spec", decoder)] if i % 2 == 0 else [("spec", decoder), ("plain", plain)]
        got = {}
        for name, dec in order:
            got[name] = _decode(dec, ids, max_new_tokens, batch)
        spec, base_run = got["spec"], got["plain"]
        (st, ss, res), (pt, ps) = (spec.tokens, spec.seconds, spec.results), (base_run.tokens, base_run.seconds)
        plain_tok, plain_sec = plain_tok + pt, plain_sec + ps
        rows.append({"settings": overrides, "label": label_of(overrides), "tree": decoder.proposer.tree,
                     "tau": round(tau(res), 4), "tokens_per_s": round(st / ss, 3),
                     "plain_tokens_per_s": round(pt / ps, 3), "speedup": round((st / ss) / (pt / ps), 4),
                     # what one speculative step (drafting + verifying + accepting) cost, in plain steps: τ / speedup
                     "step_cost": round(tau(res) / ((st / ss) / (pt / ps)), 4),
                     # and where it went, measured: ms per step drafting / verifying / accepting, beside plain's
                     "step_ms": spec.step_ms, "plain_step_ms": base_run.step_ms})
    return rows, (plain_tok / plain_sec if plain_sec else None)


def split_text(row: dict) -> str:
    """'drafting 12.1 ms + verifying 45.0 ms + accepting 1.2 ms a step against a plain step's 38.9 ms' (measured).

    Per batched forward and without the prefill, so it need not match `step_cost` (τ / speedup, prefill included,
    per sequence) exactly; it says where a step's time went, `step_cost` what the step cost overall."""
    ms, plain = row.get("step_ms"), row.get("plain_step_ms")
    if not ms or not plain:
        return ""
    return (f"drafting {ms['draft']:.1f} ms + verifying {ms['verify']:.1f} ms + accepting {ms['accept']:.1f} ms a "
            f"step against a plain step's {sum(plain.values()):.1f} ms")


def _choose(rows: list[dict], curve: dict[int, float], margin: float, kind: str) -> dict:
    """The fastest candidate, or plain decoding when none beats plain by `margin`; why, where the drafter goes unused."""
    measured = [r for r in rows if "speedup" in r]
    best = max(measured, key=lambda r: r["speedup"], default=None)
    if best is None or best["speedup"] < 1 + margin:
        why = ("no candidate could be built" if best is None else
               f"the best candidate ({best['label']}) reached only x{best['speedup']:.3f} of plain decoding on the "
               f"calibration prompts (margin {margin:.0%}): it accepted τ {best['tau']:.2f} tokens a step, and a "
               f"step of it (drafting + verifying + accepting) cost {best['step_cost']:.2f} plain steps here "
               f"({split_text(best)}); "
               "verifying " + verify_ratios(curve) + " alone")
        return {"plain": True, "why": why}
    chosen = {"plain": False, "settings": best["settings"], "label": best["label"], "speedup": best["speedup"],
              "tau": best["tau"]}
    model = max((r for r in measured if not lookup_alone(r["settings"])), key=lambda r: r["speedup"], default=None)
    if lookup_alone(best["settings"]) and model is not None:
        chosen["why"] = (f"prompt lookup alone (x{best['speedup']:.3f} of plain, τ {best['tau']:.2f}) beat every setting "
                         f"that drafts with the {kind} drafter on the calibration prompts; the best of those "
                         f"({model['label']}) reached x{model['speedup']:.3f} (τ {model['tau']:.2f}, a step costing "
                         f"{model['step_cost']:.2f} plain steps: {split_text(model)}): here the drafter costs more "
                         "than it adds over free "
                         "n-gram drafts; re-plan where verification is cheaper (a GPU) or after more training")
    return chosen


def make_plan(target, drafter_cfg, folder, prompts: str = "spec-bench", calibration: int = 8, offset: int = 240,
              max_new_tokens: int = 64, margin: float = 0.03, progress: bool = True,
              batch_sizes: tuple[int, ...] | list[int] = (1,), contexts: tuple[int, ...] | list[int] = (256,)) -> dict:
    """Measure every candidate on the calibration prompts at each batch size; returns the plan (see the module doc).

    The top level holds the smallest batch size's plan (`candidates`, `chosen`, `verify_cost_ms`); `by_batch`
    holds every batch size's, and serving picks the one measured at its batch size (`proposers.plan_at`)."""
    batch_sizes = sorted(set(batch_sizes))
    if not batch_sizes or batch_sizes[0] < 1:
        raise ValueError(f"plan batch sizes must be positive integers, got {batch_sizes}")
    records = select_prompts(EvalConfig(prompts=prompts, limit=max(calibration, batch_sizes[-1]), offset=offset))
    ids = [target.chat_ids(r["prompt"]) for r in records]
    contexts, context = verify_contexts(target, contexts, statistics.mean(map(len, ids)) + max_new_tokens / 2)
    base = dataclasses.replace(drafter_cfg, plan=False)
    options = drafter_cfg.settings.serving_candidates(folder.config if folder is not None else {})
    if drafter_cfg.spec.trainable:
        options = [*options, *(o for o in (LOOKUP_ALONE, LOOKUP_TRIE) if o not in options)]
    options = with_datastore(options, drafter_cfg.lookup_datastore, drafter_cfg.kind)
    by_batch = {}
    for batch in batch_sizes:
        rows, plain_rate = _measure(target, base, options, ids, max_new_tokens, batch, progress)
        curves = {c: verify_cost(target, batch=batch, context=c) for c in contexts}
        curve = curves[context]
        by_batch[str(batch)] = {"batch_size": batch, "verify_cost_ms": curve, "verify_context": context,
                                "verify_cost_ms_by_context": {str(c): v for c, v in curves.items()},
                                "plain_tokens_per_s": round(plain_rate, 3) if plain_rate else None,
                                "candidates": rows, "chosen": _choose(rows, curve, margin, drafter_cfg.kind)}
    first = by_batch[str(batch_sizes[0])]
    return {"kind": drafter_cfg.kind, "dtype": dtype_name(target.dtype), "machine": machine_info(target),
            "calibration": {"prompts": prompts, "offset": offset, "n": len(ids), "max_new_tokens": max_new_tokens,
                            "ids": [r["id"] for r in records]},
            **first, "batch_sizes": batch_sizes, "by_batch": by_batch}


def format_plan(plan: dict) -> str:
    """The candidates as a table and the choice, for the terminal."""
    lines = []
    for batch in plan.get("batch_sizes") or [plan.get("batch_size", 1)]:
        part = plan_at(plan, batch)
        lines += [f"plan for {plan['kind']} on {plan['machine']['device']} ({plan['dtype']}, batch {batch}, "
                  f"{plan['calibration']['n']} calibration prompts x {plan['calibration']['max_new_tokens']} tokens)",
                  *(f"verify cost (ms) by new tokens after {c} tokens: " + ", ".join(f"{k}: {v}" for k, v in curve.items())
                    for c, curve in (part.get("verify_cost_ms_by_context")
                                     or {part.get("verify_context", 256): part["verify_cost_ms"]}).items())]
        for r in part["candidates"]:
            if "skipped" in r:
                lines.append(f"  {r['label']:<70} skipped: {r['skipped'][:60]}")
            else:
                ms = r.get("step_ms") or {}
                split = f"  draft {ms['draft']:.1f} + verify {ms['verify']:.1f} ms/step" if ms else ""
                lines.append(f"  {r['label']:<70} τ {r['tau']:.2f}  {r['tokens_per_s']:6.1f} tok/s  x{r['speedup']:.3f}{split}")
        chosen = part["chosen"]
        lines.append(f"chosen at batch {batch}: " + (f"plain decoding: {chosen['why']}" if chosen["plain"] else
                                                     f"{chosen['label']} (x{chosen['speedup']:.3f} of plain, τ "
                                                     f"{chosen['tau']:.2f})" + (f": {chosen['why']}" if chosen.get("why") else "")))
    return "\n".join(lines)


def write_plan(folder: Path, plan: dict) -> Path:
    path = Path(folder) / PLAN
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(plan, indent=2) + "\n")
    tmp.rename(path)
    return path
