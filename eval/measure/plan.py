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
3. picks, per batch size, the configuration with the most tokens/s among those that beat plain decoding beyond the
   measured timing noise: a candidate that accepted no draft token (τ 1.00) is never chosen, whatever its timing (it
   does plain decoding's work plus drafting, so a lead is noise), and a choice's speedup less one standard error of
   its per-batch paired ratios must exceed 1 + `margin` + the noise (the spread of the plain loop's tokens/s over its
   runs, one beside each candidate: `noise`). Plain decoding when none does (then the plan says so and why), prompt
   lookup alone when it beats every setting that uses the drafter (and the plan says by how much);
4. writes `serving.json` where asked (`draftsmith plan --out DIR`, default `<log.run_dir>/plan/<run>`; into the
   drafter folder only with `--into-drafter`, as the pipeline's plan stage does): the machine and dtype it was measured
   on, the drafter it was measured for, the noise, every candidate's figures — with the measured ms per step spent
   drafting, verifying and accepting, beside the plain loop's (`step_ms`, `plain_step_ms`) — the verify curve, the
   choice as drafter settings. `eval --serving FILE` serves a plan from anywhere; a drafter folder's own serving.json
   is served by default (`drafter.plan: false` serves the recipe's settings), and eval says which it served.
   SERVE.md notes which machine a plan was made for — a plan made on a CPU is not a GPU engine's flags.

Candidates are drafter-setting overrides (the `DrafterConfig` serving fields), so a plan is nothing but
settings a user could also type.

Several drafters of one target (`draftsmith plan --drafter A --drafter B ...`, e.g. EAGLE-3 beside a DFlash and a
P-EAGLE drafter): each is planned as above on the same calibration prompts (OUT/NAME/serving.json, prompt lookup alone
among every plan's candidates), and `compare_plans` picks, per batch size, the drafter whose plan chose the fastest
setting over its own plain runs (speedups, not raw tokens/s, so drift between the plans' turns cancels); the lead over
the runner-up (the next drafter, or plain) counts only beyond the larger of the two plans' timing noise, and
OUT/choice.json says which drafter to serve, with which serving.json, and why.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from draftsmith.distill.loading import dtype_name
from draftsmith.eval.decode.decoder import SpeculativeDecoder
from draftsmith.eval.decode.machine import machine_info
from draftsmith.eval.measure.bench import Tally
from draftsmith.eval.measure.evaluate import EvalConfig, run_of, select_prompts
from draftsmith.eval.serving import plan_at
from draftsmith.heads.runtime.acceptance import tau
from draftsmith.heads.runtime.verify import SamplingConfig

PLAN = "serving.json"
NULL_TAU = 1.0 + 1e-6  # τ at or below this: nothing accepted (plain decoding's τ is 1.0), so any lead is timing noise


@dataclass
class PlanConfig:
    """`plan:` section — the pipeline's plan stage after eval (`draftsmith plan` with these settings, in the
    eval dtype), then a second eval served with the plan into `<run>/eval-plan`."""

    enabled: bool = False
    prompts: str = "spec-bench"
    calibration: int = 8  # calibration prompts, from `offset` on (disjoint from eval's first prompts)
    offset: int = 240
    max_new_tokens: int = 64
    # speculation must beat plain decoding by this beyond the measured timing noise to be chosen (negative: the
    # fastest candidate that accepted anything, even slower than plain, no noise guard)
    margin: float = 0.03
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
    from draftsmith.heads.runtime.kv_cache import crop_cache, new_cache

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


def _measure(target, serving, options, ids, max_new_tokens, batch, progress) -> tuple[list[dict], list[float]]:
    """Every candidate against the plain loop at one batch size, alternating which runs first -> (rows, plain decoding's
    tokens/s in each of its runs: at least two, their spread is the calibration's timing noise)."""
    from tqdm.auto import tqdm

    base = dataclasses.replace(serving.drafter, plan=False)
    plain = SpeculativeDecoder(target)
    plain.generate_batch(ids[:batch], 8)  # untimed warm-up
    rows, plain_rates = [], []
    for i, overrides in enumerate(tqdm(options, desc=f"plan b{batch}", unit="config", disable=not progress)):
        cfg = base.with_plan({"chosen": {"settings": overrides}})  # exactly what serving.json would serve
        try:
            decoder = SpeculativeDecoder(target, dataclasses.replace(serving, drafter=cfg, plan=None).proposer(target))
        except ValueError as exc:  # e.g. a tree deeper than the Medusa heads
            rows.append({"settings": overrides, "label": label_of(overrides), "skipped": str(exc)})
            continue
        decoder.generate_batch(ids[:batch], 8)  # untimed warm-up of this proposer
        order = [("plain", plain), ("spec", decoder)] if i % 2 == 0 else [("spec", decoder), ("plain", plain)]
        got = {}
        for name, dec in order:
            got[name] = _decode(dec, ids, max_new_tokens, batch)
        plain_rates.append(got["plain"].tokens / got["plain"].seconds)
        rows.append({"settings": overrides, "label": label_of(overrides), "tree": decoder.proposer.tree,
                     **_figures(got["spec"], got["plain"])})
    while plain_rates and len(plain_rates) < 2:  # one candidate measured: plain once more, or there is no spread
        again = _decode(plain, ids, max_new_tokens, batch)
        plain_rates.append(again.tokens / again.seconds)
    return rows, plain_rates


def _figures(spec: Tally, plain: Tally) -> dict:
    """One candidate's calibration figures against the plain run beside it: τ, draft tokens accepted, tokens/s, the
    speedup and its standard error over the batches (paired: each batch's speculative over its plain tokens/s)."""
    rate, plain_rate = spec.tokens / spec.seconds, plain.tokens / plain.seconds
    speedup = rate / plain_rate
    ratios = [s / p for s, p in zip(spec.batch_rates, plain.batch_rates) if p > 0]
    # one batch: no spread to estimate, the plain runs' noise is then the only guard
    se = statistics.stdev(ratios) / math.sqrt(len(ratios)) if len(ratios) > 1 else 0.0
    return {"tau": round(tau(spec.results), 4), "accepted": sum(sum(r.accepted_drafts) for r in spec.results),
            "tokens_per_s": round(rate, 3), "plain_tokens_per_s": round(plain_rate, 3), "speedup": round(speedup, 4),
            "speedup_se": round(se, 4), "speedup_low": round(speedup - se, 4),
            # what one speculative step (drafting + verifying + accepting) cost, in plain steps: τ / speedup
            "step_cost": round(tau(spec.results) / speedup, 4),
            # and where it went, measured: ms per step drafting / verifying / accepting, beside plain's
            "step_ms": spec.step_ms, "plain_step_ms": plain.step_ms}


def timing_noise(plain_rates: list[float]) -> dict:
    """The calibration's run-to-run timing noise: the range of plain decoding's tokens/s over its runs (the same work
    each time, one run beside each candidate) over their median. With several runs the range spans about the two-sigma
    spread of a ratio of two such runs, which is what a candidate's speedup is."""
    if len(plain_rates) < 2:
        return {"method": "plain-runs-range", "runs": len(plain_rates), "relative": None}
    return {"method": "plain-runs-range", "runs": len(plain_rates),
            "relative": round((max(plain_rates) - min(plain_rates)) / statistics.median(plain_rates), 4),
            "plain_tokens_per_s": [round(r, 3) for r in plain_rates]}


def accepted_nothing(row: dict) -> bool:
    """True for a measured candidate that accepted no draft token: it cannot be faster than plain decoding."""
    return row.get("accepted", 1) == 0 or row["tau"] <= NULL_TAU


def split_text(row: dict) -> str:
    """'drafting 12.1 ms + verifying 45.0 ms + accepting 1.2 ms a step against a plain step's 38.9 ms' (measured).

    Per batched forward and without the prefill, so it need not match `step_cost` (τ / speedup, prefill included,
    per sequence) exactly; it says where a step's time went, `step_cost` what the step cost overall."""
    ms, plain = row.get("step_ms"), row.get("plain_step_ms")
    if not ms or not plain:
        return ""
    return (f"drafting {ms['draft']:.1f} ms + verifying {ms['verify']:.1f} ms + accepting {ms['accept']:.1f} ms a "
            f"step against a plain step's {sum(plain.values()):.1f} ms")


def noise_text(noise: dict) -> str:
    """'timing noise 4.2% (the range of plain decoding's tok/s over 7 runs)' for reasons and the table."""
    if noise.get("relative") is None:
        return "timing noise unmeasured (fewer than two plain runs)"
    return f"timing noise {noise['relative']:.1%} (the range of plain decoding's tok/s over {noise['runs']} runs)"


def _choose(rows: list[dict], curve: dict[int, float], margin: float, kind: str, noise: dict) -> dict:
    """The fastest candidate that accepted something and beats plain beyond `margin` + the timing noise (its speedup
    less one standard error), else plain decoding; says why, and where the drafter goes unused."""
    measured = [r for r in rows if "speedup" in r]
    able = [r for r in measured if not accepted_nothing(r)]
    # a negative margin asks for speculation even slower than plain (checking the plumbing): no noise guard to apply
    guarded = margin >= 0
    bar = round(1 + margin + ((noise.get("relative") or 0.0) if guarded else 0.0), 4)
    low = "speedup_low" if guarded else "speedup"
    best = max((r for r in able if r[low] > bar), key=lambda r: r["speedup"], default=None)
    if best is None:
        return {"plain": True, "bar": bar, "why": _plain_why(measured, able, curve, margin, noise, bar)}
    chosen = {"plain": False, "settings": best["settings"], "label": best["label"], "speedup": best["speedup"],
              "speedup_low": best["speedup_low"], "tau": best["tau"], "bar": bar}
    model = max((r for r in measured if not lookup_alone(r["settings"])), key=lambda r: r["speedup"], default=None)
    if lookup_alone(best["settings"]) and model is not None:
        chosen["why"] = (f"prompt lookup alone (x{best['speedup']:.3f} of plain, τ {best['tau']:.2f}) beat every setting "
                         f"that drafts with the {kind} drafter on the calibration prompts; the best of those "
                         f"({model['label']}) reached x{model['speedup']:.3f} (τ {model['tau']:.2f}, a step costing "
                         f"{model['step_cost']:.2f} plain steps: {split_text(model)}): here the drafter costs more "
                         "than it adds over free "
                         "n-gram drafts; re-plan where verification is cheaper (a GPU) or after more training")
    return chosen


def _plain_why(measured: list[dict], able: list[dict], curve, margin: float, noise: dict, bar: float) -> str:
    """Why plain decoding was chosen: nothing built, nothing accepted, or nothing beat the bar (with the figures)."""
    fastest = max(measured, key=lambda r: r["speedup"], default=None)
    if fastest is None:
        return "no candidate could be built"
    null = "" if not accepted_nothing(fastest) else (
        f"; {fastest['label']} looked x{fastest['speedup']:.3f} but accepted no draft token (τ {fastest['tau']:.2f}): "
        "timing noise, never a choice")
    best = max(able, key=lambda r: r["speedup"], default=None)
    if best is None:
        return ("no candidate accepted a draft token on the calibration prompts (τ 1.00 everywhere), so none can be "
                f"faster than plain decoding{null}")
    guard = (f"less one standard error, x{best['speedup_low']:.3f}, is not above x{bar:.3f} (margin {margin:.0%} + "
             f"{noise_text(noise)})") if margin >= 0 else f"not above x{bar:.3f} (margin {margin:.0%}, no noise guard)"
    return (f"the best candidate ({best['label']}) reached only x{best['speedup']:.3f} ± {best['speedup_se']:.3f} of "
            f"plain decoding on the calibration prompts, which {guard}: it accepted τ {best['tau']:.2f} tokens a "
            f"step, and a step of it (drafting + verifying + accepting) cost {best['step_cost']:.2f} plain steps here "
            f"({split_text(best)}); verifying " + verify_ratios(curve) + " alone" + null)


def make_plan(target, serving, prompts: str = "spec-bench", calibration: int = 8, offset: int = 240,
              max_new_tokens: int = 64, margin: float = 0.03, progress: bool = True,
              batch_sizes: tuple[int, ...] | list[int] = (1,), contexts: tuple[int, ...] | list[int] = (256,)) -> dict:
    """Measure every candidate on the calibration prompts at each batch size; returns the plan (see the module doc).

    The top level holds the smallest batch size's plan (`candidates`, `chosen`, `verify_cost_ms`); `by_batch`
    holds every batch size's, and serving picks the one measured at its batch size (eval/serving.py `Plan.at`).
    `serving` (eval/serving.py) names the drafter, its folder read once."""
    drafter_cfg, folder = serving.drafter, serving.folder
    batch_sizes = sorted(set(batch_sizes))
    if not batch_sizes or batch_sizes[0] < 1:
        raise ValueError(f"plan batch sizes must be positive integers, got {batch_sizes}")
    records = select_prompts(EvalConfig(prompts=prompts, limit=max(calibration, batch_sizes[-1]), offset=offset))
    ids = [target.chat_ids(r["prompt"]) for r in records]
    contexts, context = verify_contexts(target, contexts, statistics.mean(map(len, ids)) + max_new_tokens / 2)
    options = drafter_cfg.settings.serving_candidates(folder.config if folder is not None else {})
    if drafter_cfg.spec.trainable:
        options = [*options, *(o for o in (LOOKUP_ALONE, LOOKUP_TRIE) if o not in options)]
    options = with_datastore(options, drafter_cfg.lookup_datastore, drafter_cfg.kind)
    by_batch = {}
    for batch in batch_sizes:
        rows, plain_rates = _measure(target, serving, options, ids, max_new_tokens, batch, progress)
        noise = timing_noise(plain_rates)
        curves = {c: verify_cost(target, batch=batch, context=c) for c in contexts}
        curve = curves[context]
        by_batch[str(batch)] = {"batch_size": batch, "verify_cost_ms": curve, "verify_context": context,
                                "verify_cost_ms_by_context": {str(c): v for c, v in curves.items()},
                                "plain_tokens_per_s": round(statistics.median(plain_rates), 3) if plain_rates else None,
                                "noise": noise, "candidates": rows,
                                "chosen": _choose(rows, curve, margin, drafter_cfg.kind, noise)}
    first = by_batch[str(batch_sizes[0])]
    return {"kind": drafter_cfg.kind, "drafter": str(folder.path) if folder is not None else drafter_cfg.kind,
            "dtype": dtype_name(target.dtype), "machine": machine_info(target), "margin": margin,
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
        lines.append(f"chosen at batch {batch}: " + (f"plain decoding: {chosen['why']}" if chosen["plain"] else
                                                     f"{chosen['label']} (x{chosen['speedup']:.3f} of plain, τ "
                                                     f"{chosen['tau']:.2f})" + (f": {chosen['why']}" if chosen.get("why") else "")))
    return "\n".join(lines)


def default_out(run_dir: str | Path, drafter: str | Path) -> Path:
    """Where `draftsmith plan` writes without --out: `<run_dir>/plan/<run>` (`runs/X/drafter` -> `runs/plan/X`, an
    export `runs/X/export/hf` -> `runs/plan/X-hf`), never into the drafter folder, whose plan eval would serve."""
    run, fmt = run_of(drafter)
    return Path(run_dir) / "plan" / (f"{run}-{fmt}" if fmt else run)


def prepare_out(folder: str | Path) -> Path:
    """The folder a plan will be written to, created and checked writable now, before minutes of measuring."""
    folder = Path(folder)
    probe = folder / (PLAN + ".tmp")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"cannot write the plan into {folder} ({exc.strerror or exc}): pass --out a folder you "
                         "can create and write") from None
    return folder


def write_plan(folder: str | Path, plan: dict) -> Path:
    """`serving.json` in `folder` (created if missing), written whole or not at all (a temporary file renamed)."""
    path = Path(folder) / PLAN
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(plan, indent=2) + "\n")
    tmp.rename(path)
    return path


CHOICE = "choice.json"


def _choice_row(name: str, plan: dict, batch: int) -> dict:
    """One drafter's line at `batch`: its plan's choice and figures (plain: speedup 1.0 by definition)."""
    part = plan_at(plan, batch)
    chosen = part["chosen"]
    row = {"name": name, "kind": plan["kind"], "drafter": plan["drafter"], "plain": chosen["plain"],
           "label": chosen.get("label", "plain decoding"), "speedup": 1.0 if chosen["plain"] else chosen["speedup"],
           "speedup_low": 1.0 if chosen["plain"] else chosen["speedup_low"], "tau": chosen.get("tau", 1.0),
           "noise": (part.get("noise") or {}).get("relative"), "plain_tokens_per_s": part.get("plain_tokens_per_s")}
    if not chosen["plain"]:
        row["settings"] = chosen["settings"]
        row["lookup_alone"] = lookup_alone(chosen["settings"])
        best = next((c for c in part["candidates"] if c.get("label") == chosen["label"]), {})
        row["tokens_per_s"], row["step_ms"] = best.get("tokens_per_s"), best.get("step_ms")
    return row


def compare_plans(plans: dict[str, dict]) -> dict:
    """Across drafters' plans (module doc): per batch size every drafter's choice, the one to serve and why."""
    if not plans:
        raise ValueError("compare_plans needs at least one plan")
    batches = sorted({int(b) for plan in plans.values() for b in plan.get("batch_sizes") or [1]})
    by_batch = {}
    for batch in batches:
        rows = sorted((_choice_row(name, plan, batch) for name, plan in plans.items()), key=lambda r: -r["speedup"])
        able = [r for r in rows if not r["plain"]]
        if not able:
            why = ("no drafter's plan beat plain decoding beyond its noise: "
                   + "; ".join(f"{r['name']} ({r['kind']}) chose plain" for r in rows))
            by_batch[str(batch)] = {"batch_size": batch, "drafters": rows, "chosen": {"plain": True}, "why": why}
            continue
        best = able[0]
        runner = next((r for r in rows[1:] if not r.get("lookup_alone") or not best.get("lookup_alone")), None)
        runner_speedup = runner["speedup"] if runner is not None else 1.0
        noise = max((r["noise"] or 0.0) for r in (best, runner) if r is not None)
        lead = best["speedup"] / runner_speedup - 1
        clear = lead > noise
        chosen = {"plain": False, "name": None if best.get("lookup_alone") else best["name"],
                  "kind": "prompt-lookup" if best.get("lookup_alone") else best["kind"],
                  "drafter": None if best.get("lookup_alone") else best["drafter"], "serving": f"{best['name']}/{PLAN}",
                  "label": best["label"], "settings": best["settings"], "speedup": best["speedup"], "tau": best["tau"],
                  "lead": round(lead, 4), "noise": round(noise, 4), "clear": clear}
        what = (f"prompt lookup alone ({best['label']}, measured in {best['name']}'s plan)" if best.get("lookup_alone")
                else f"{best['name']} ({best['kind']}, {best['label']})")
        other = (f"the runner-up {runner['name']} ({runner['kind']}, {runner['label']}) x{runner_speedup:.3f}"
                 if runner is not None else "plain decoding")
        why = (f"{what} served x{best['speedup']:.3f} of plain (τ {best['tau']:.2f}) against {other}: a lead of "
               f"{lead:.1%}, " + ("beyond" if clear else "within") + f" the timing noise {noise:.1%}"
               + ("" if clear else "; the two are a tie here, re-measure with more calibration prompts to separate "
                                   "them"))
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
            lines.append(f"  {r['name']:<24} {r['kind']:<10} {r['label']:<60} x{r['speedup']:.3f}  τ {r['tau']:.2f}")
        lines.append(f"serve at batch {batch}: " + part["why"])
    return "\n".join(lines)


def write_choice(folder: str | Path, comparison: dict) -> Path:
    """`choice.json` in `folder`, written whole or not at all."""
    path = Path(folder) / CHOICE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(comparison, indent=2) + "\n")
    tmp.rename(path)
    return path
