"""`draftsmith plan`: the serving settings that make a drafter fastest on *this* machine, measured.

Speedup is τ over cost, and both the cost of verifying k tokens and the cost of drafting are properties
of the machine, so the tree a drafter should serve with is found where it serves. The plan:

1. measures the target's verification cost: one forward of k = 1..64 new tokens after a context of each
   length asked (`--contexts`, default 256 tokens), at each batch size asked (`verify_cost`, ms; attention
   makes long contexts dearer, more so on a GPU); the curve at the asked length nearest the calibration
   prompts' own contexts is the one every choice below is explained against (`verify_cost_ms`), all are
   recorded (`verify_cost_ms_by_context`);
2. decodes the calibration prompts — a split of the prompt set disjoint from what `eval` and `bench`
   time (`EvalConfig.offset`) — with the plain loop and with each candidate configuration of the
   drafter's kind (chains and trees of several sizes, dynamic trees, adaptive drafting, a prompt-lookup
   branch; with `drafter.lookup_datastore`, each prompt-lookup candidate again drafting from that datastore of
   the target's answers too) and prompt lookup alone with the drafter unused, alternating the order per
   prompt, at each batch size asked (`--batch-sizes`, default 1), and records τ, tokens/s and speedup for
   each;
3. picks, per batch size, the configuration with the most tokens/s among those that beat plain decoding beyond
   the measured timing noise: a candidate that accepted no draft token (τ 1.00) is never chosen, whatever its
   timing (it does plain decoding's work plus drafting, so a lead is noise), and a choice's speedup less one
   standard error of its per-batch paired ratios must exceed 1 + `margin` + the noise (the spread of the plain
   loop's tokens/s over its runs, one beside each candidate: `noise`). Plain decoding when none does (then the
   plan says so and why), prompt lookup alone when it beats every setting that uses the drafter (and the plan
   says by how much);
4. writes `serving.json` where asked (`draftsmith plan --out DIR`, default `<log.run_dir>/plan/<run>`; into
   the drafter folder only with `--into-drafter`, as the pipeline's plan stage does): the machine and dtype it
   was measured on, the drafter it was measured for, the noise, every candidate's figures — with the measured
   ms per step spent drafting, verifying and accepting, beside the plain loop's (`step_ms`, `plain_step_ms`) —
   the verify curve, the choice as drafter settings. `eval --serving FILE` serves a plan from anywhere; a
   drafter folder's own serving.json is served by default (`drafter.plan: false` serves the recipe's
   settings), and eval says which it served. SERVE.md notes which machine a plan was made for — a plan made on
   a CPU is not a GPU engine's flags.

Candidates are drafter-setting overrides (the `DrafterConfig` serving fields), so a plan is nothing but
settings a user could also type. This module measures and writes (1, 2, 4); the choice (3), the plan's
terminal table and the comparison across drafters below are eval/measure/plan_choice.py.

Several drafters of one target (`draftsmith plan --drafter A --drafter B ...`, e.g. EAGLE-3 beside a DFlash
and a P-EAGLE drafter): each is planned as above on the same calibration prompts (OUT/NAME/serving.json,
prompt lookup alone among every plan's candidates), and `compare_plans` picks, per batch size, the drafter
whose plan chose the fastest setting over its own plain runs (speedups, not raw tokens/s, so drift between the
plans' turns cancels); the lead over the runner-up (the next drafter, or plain) counts only beyond the larger
of the two plans' timing noise, and OUT/choice.json says which drafter to serve, with which serving.json, and
why.
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
from draftsmith.eval.decode.decoder import SpeculativeDecoder, one_at_a_time
from draftsmith.eval.decode.machine import machine_info
from draftsmith.eval.measure.bench import Tally
from draftsmith.eval.measure.evaluate import EvalConfig, run_of, select_prompts
from draftsmith.eval.measure.plan_choice import choose, lookup_alone
from draftsmith.eval.serving import PLAN
from draftsmith.heads.runtime.acceptance import tau
from draftsmith.heads.runtime.verify import SamplingConfig


@dataclass
class PlanConfig:
    """`plan:` section — the pipeline's plan stage after eval (`draftsmith plan` with these settings, in the
    eval dtype), then a second eval served with the plan into `<run>/eval-plan`."""

    enabled: bool = False
    prompts: str = "spec-bench"
    calibration: int = 8  # calibration prompts, from `offset` on (disjoint from eval's first prompts)
    offset: int = 240
    max_new_tokens: int = 64
    # speculation must beat plain decoding by this beyond the measured timing noise to be chosen (negative:
    # the fastest candidate that accepted anything, even slower than plain, no noise guard)
    margin: float = 0.03
    # a plan for each (serving picks its own)
    batch_sizes: list[int] = dataclasses.field(default_factory=lambda: [1])
    # verify-cost curves after these contexts
    contexts: list[int] = dataclasses.field(default_factory=lambda: [256])


# every trained drafter's plan also measures prompt lookup alone (the drafter unloaded), as a chain and as a
# trie of several matches: where the drafter's cost outweighs what it adds over free n-gram drafts, serving it
# is slower than not using it, and the plan says so
LOOKUP_ALONE = {"num_speculative_tokens": 0, "lookup_branch": 5}
LOOKUP_TRIE = {"num_speculative_tokens": 0, "lookup_branch": 8, "lookup_matches": 3}


def with_datastore(options: list[dict], datastore: list[str], kind: str) -> list[dict]:
    """`options` and, where `datastore` is given, a twin of each that drafts with prompt lookup (alone, as the
    kind or as a branch) drafting from the datastore too: the plan measures whether its path pays."""
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
    return ", ".join(f"{k}=" + ("the folder's" if v is None and k == "tree" else f"{v}")
                     for k, v in overrides.items()
                     if k != "lookup_datastore") + store or "recipe"


@torch.no_grad()
def verify_cost(target, ks=(1, 2, 4, 8, 12, 16, 24, 32, 48, 64), context: int = 256, reps: int = 5,
                batch: int = 1) -> dict[int, float]:
    """ms of one target forward of k new tokens per row after `context` cached tokens, `batch` rows (median of
    `reps`, after one untimed forward of that shape, whose first call may allocate and pick kernels: without
    it one AMD host's plan read k = 1, the first measured, at 85.7 ms against 81.0 for k = 2). On a target
    with recurrent layers every forward keeps each token's state as a verification does (short_scan.recorded):
    that is what a verification costs there, and it lets the cache be cropped back."""
    from draftsmith.heads.runtime.kv_cache import crop_cache, new_cache
    from draftsmith.heads.runtime.short_scan import recorded

    device = target.device
    ids = torch.randint(10, target.vocab_size - 10, (batch, context + max(ks)),
                        generator=torch.Generator().manual_seed(0))
    cache = new_cache(target.config)
    target.model(input_ids=ids[:, :context].to(device), cache=cache, use_cache=True)
    out = {}
    for k in ks:
        times = []
        for rep in range(reps + 1):
            crop_cache(cache, context)
            start = time.perf_counter()
            with recorded(target.model, cache, k):
                target.model(input_ids=ids[:, context: context + k].to(device), cache=cache, use_cache=True)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if rep:  # the first is the warm-up
                times.append(time.perf_counter() - start)
        out[k] = round(1000 * statistics.median(times), 3)
    return out


def verify_contexts(target, contexts, typical: float) -> tuple[list[int], int]:
    """The context lengths to measure verification after (sorted, checked against the target's window) and the
    one nearest `typical` (the calibration prompts' mean context): the curve the choice is explained
    against."""
    contexts = sorted({int(c) for c in contexts})
    window = getattr(target.config, "max_position_embeddings", None)
    if not contexts or contexts[0] < 1:
        raise ValueError("plan contexts must be positive token counts (e.g. --contexts 256,2048), got "
                         f"{contexts}")
    if window and contexts[-1] + 64 > window:
        raise ValueError(f"plan context {contexts[-1]} + 64 new tokens exceeds the target's window of "
                         f"{window} (config.max_position_embeddings): ask for contexts up to {window - 64}")
    return contexts, min(contexts, key=lambda c: (abs(c - typical), c))


def _decode(decoder: SpeculativeDecoder, prompts: list[list[int]], max_new: int, batch: int = 1) -> Tally:
    """The calibration prompts in batches of `batch` (greedy) -> their tally (tokens, seconds, per-sequence
    results, steps and where the steps' time went), as bench keeps it."""
    tally = Tally()
    for i in range(0, len(prompts), batch):
        out = decoder.generate_batch(prompts[i: i + batch], max_new, SamplingConfig())
        tally.add(out.new_tokens, out.wall_time, out.results, out.steps, out.phase_seconds)
    return tally


def _measure(target, serving, options, ids, max_new_tokens, batch,
             progress) -> tuple[list[dict], list[float]]:
    """Every candidate against the plain loop at one batch size, alternating which runs first -> (rows, plain
    decoding's tokens/s in each of its runs: at least two, their spread is the calibration's timing noise)."""
    from tqdm.auto import tqdm

    base = dataclasses.replace(serving.drafter, plan=False)
    plain = SpeculativeDecoder(target)
    plain.generate_batch(ids[:batch], 8)  # untimed warm-up
    rows, plain_rates = [], []
    for i, overrides in enumerate(tqdm(options, desc=f"plan b{batch}", unit="config", disable=not progress)):
        cfg = base.with_plan({"chosen": {"settings": overrides}})  # exactly what serving.json would serve
        try:
            decoder = SpeculativeDecoder(target, dataclasses.replace(serving, drafter=cfg,
                                                                     plan=None).proposer(target))
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
    # one candidate measured: plain once more, or there is no spread
    while plain_rates and len(plain_rates) < 2:
        again = _decode(plain, ids, max_new_tokens, batch)
        plain_rates.append(again.tokens / again.seconds)
    return rows, plain_rates


def _figures(spec: Tally, plain: Tally) -> dict:
    """One candidate's calibration figures against the plain run beside it: τ, draft tokens accepted,
    tokens/s, the speedup and its standard error over the batches (paired: each batch's speculative over its
    plain tokens/s)."""
    rate, plain_rate = spec.tokens / spec.seconds, plain.tokens / plain.seconds
    speedup = rate / plain_rate
    ratios = [s / p for s, p in zip(spec.batch_rates, plain.batch_rates) if p > 0]
    # one batch: no spread to estimate, the plain runs' noise is then the only guard
    se = statistics.stdev(ratios) / math.sqrt(len(ratios)) if len(ratios) > 1 else 0.0
    return {"tau": round(tau(spec.results), 4), "accepted": sum(sum(r.accepted_drafts) for r in spec.results),
            "tokens_per_s": round(rate, 3), "plain_tokens_per_s": round(plain_rate, 3),
            "speedup": round(speedup, 4), "speedup_se": round(se, 4), "speedup_low": round(speedup - se, 4),
            # what one speculative step (drafting + verifying + accepting) cost, in plain steps: τ / speedup
            "step_cost": round(tau(spec.results) / speedup, 4),
            # and where it went, measured: ms per step drafting / verifying / accepting, beside plain's
            "step_ms": spec.step_ms, "plain_step_ms": plain.step_ms}


def timing_noise(plain_rates: list[float]) -> dict:
    """The calibration's run-to-run timing noise: the range of plain decoding's tokens/s over its runs (the
    same work each time, one run beside each candidate) over their median. With several runs the range spans
    about the two-sigma spread of a ratio of two such runs, which is what a candidate's speedup is."""
    if len(plain_rates) < 2:
        return {"method": "plain-runs-range", "runs": len(plain_rates), "relative": None}
    return {"method": "plain-runs-range", "runs": len(plain_rates),
            "relative": round((max(plain_rates) - min(plain_rates)) / statistics.median(plain_rates), 4),
            "plain_tokens_per_s": [round(r, 3) for r in plain_rates]}


def make_plan(target, serving, prompts: str = "spec-bench", calibration: int = 8, offset: int = 240,
              max_new_tokens: int = 64, margin: float = 0.03, progress: bool = True,
              batch_sizes: tuple[int, ...] | list[int] = (1,),
              contexts: tuple[int, ...] | list[int] = (256,)) -> dict:
    """Measure every candidate on the calibration prompts at each batch size; returns the plan (see the module
    doc).

    The top level holds the smallest batch size's plan (`candidates`, `chosen`, `verify_cost_ms`); `by_batch`
    holds every batch size's, and serving picks the one measured at its batch size (eval/serving.py
    `Plan.at`). `serving` (eval/serving.py) names the drafter, its folder read once."""
    drafter_cfg, folder = serving.drafter, serving.folder
    batch_sizes = sorted(set(batch_sizes))
    if not batch_sizes or batch_sizes[0] < 1:
        raise ValueError(f"plan batch sizes must be positive integers, got {batch_sizes}")
    refused = one_at_a_time(target.model) if batch_sizes[-1] > 1 else None
    if refused:  # the plan proposes only what the target can serve
        raise ValueError(f"--batch-sizes {batch_sizes[-1]}: {refused}")
    records = select_prompts(EvalConfig(prompts=prompts, limit=max(calibration, batch_sizes[-1]),
                                        offset=offset))
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
                                "plain_tokens_per_s": round(statistics.median(plain_rates),
                                                            3) if plain_rates else None,
                                "noise": noise, "candidates": rows,
                                "chosen": choose(rows, curve, margin, drafter_cfg.kind, noise)}
    first = by_batch[str(batch_sizes[0])]
    return {"kind": drafter_cfg.kind, "drafter": str(folder.path) if folder is not None else drafter_cfg.kind,
            "dtype": dtype_name(target.dtype), "machine": machine_info(target), "margin": margin,
            "calibration": {"prompts": prompts, "offset": offset, "n": len(ids),
                            "max_new_tokens": max_new_tokens, "ids": [r["id"] for r in records]},
            **first, "batch_sizes": batch_sizes, "by_batch": by_batch}


def default_out(run_dir: str | Path, drafter: str | Path) -> Path:
    """Where `draftsmith plan` writes without --out: `<run_dir>/plan/<run>` (`runs/X/drafter` ->
    `runs/plan/X`, an export `runs/X/export/hf` -> `runs/plan/X-hf`), never into the drafter folder, whose
    plan eval would serve."""
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
        raise ValueError(f"cannot write the plan into {folder} ({exc.strerror or exc}): pass --out a folder "
                         "you can create and write") from None
    return folder


def write_plan(folder: str | Path, plan: dict) -> Path:
    """`serving.json` in `folder` (created if missing), written whole or not at all (a temporary file
    renamed)."""
    path = Path(folder) / PLAN
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(plan, indent=2) + "\n")
    tmp.rename(path)
    return path
