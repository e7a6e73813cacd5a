"""`draftsmith bench`: batched speculative decoding over batch sizes and temperatures, with a fall-back and
peers.

Beside the eval stage (`eval/measure/evaluate.py`, batch 1, losslessness): this one asks how much faster a
drafter makes serving a batch. For every temperature and batch size, prompts are cut into batches
and, batch by batch so machine drift hits every method alike, run through

    HF `generate` (left-padded batch)           peer at every batch size
    HF prompt lookup, HF assisted (draft-LM)    peers at batch 1 only (HF assisted decoding is batch-1)
    our plain loop                              the baseline (`SpeculativeDecoder` without drafts)
    each drafter                                `SpeculativeDecoder` with that drafter

Fall-back (on by default): before the timed batches, each drafter and the plain loop decode
`calibration_prompts` prompts (at least one batch) for `calibration_tokens` tokens, alternating: the
prompts that follow the timed ones in the stratified order, so the choice is made on prompts it is not
judged on (a prompt set with none left over calibrates on the first timed ones, and bench.json says so).
The timed methods run in an order that alternates per batch. If speculation did not beat plain there by
`fallback_margin` (default 5%, above timing noise), that configuration runs plain decoding and says
`"fell_back": true` with the measured reason. A fallen-back configuration *is* the plain loop, so it is not
decoded a second time: it reports the plain loop's own tally (speedup exactly 1.0, τ 1.0), and a configuration
that kept speculating is one that won calibration. The calibration's own speedup and τ, and the per-batch
speedups, are kept beside the total.

Writes `<out>/configs/<drafter>-b<B>-t<T>.json` (one per configuration), `<out>/bench.json` (all of
them, the peers and the machine) and the PNGs of `eval/measure/plots.py`.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from draftsmith.distill.loading import dtype_name, load_target
from draftsmith.distill.target import Target
from draftsmith.eval.decode.decoder import SpeculativeDecoder, hf_generate_batch, one_at_a_time
from draftsmith.eval.decode.machine import machine_info
from draftsmith.eval.decode.results import BatchResult, ms_per_step
from draftsmith.eval.measure.evaluate import EvalConfig, drafter_title, run_of, select_prompts
from draftsmith.eval.serving import Serving, serving_line
from draftsmith.heads.registry import DrafterConfig
from draftsmith.heads.runtime.acceptance import acceptance_by_depth, tau
from draftsmith.heads.runtime.verify import SamplingConfig


@dataclass
class BenchConfig:
    """What `draftsmith bench` sweeps and how it measures."""

    batch_sizes: list[int] = field(default_factory=lambda: [1, 4, 16])
    temperatures: list[float] = field(default_factory=lambda: [0.0])
    prompts: str = "spec-bench"
    limit: int | None = 32
    categories: list[str] = field(default_factory=list)
    max_new_tokens: int = 128
    dtype: str | None = None  # None: each target's model.dtype
    seed: int = 0
    fallback: bool = True
    calibration_tokens: int = 32
    # the first prompts (at least one batch): stratified, so every category is in
    calibration_prompts: int = 8
    fallback_margin: float = 0.05  # speculation must beat plain by this fraction in calibration to be kept
    peers: bool = True
    out: str = "runs/bench"

    def __post_init__(self) -> None:
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise ValueError(f"--batch-sizes must be positive integers, got {self.batch_sizes}")
        if not self.temperatures or min(self.temperatures) < 0:
            raise ValueError(f"--temperatures must be >= 0 (0 = greedy), got {self.temperatures}")
        if min(self.max_new_tokens, self.calibration_tokens, self.calibration_prompts) < 1:
            raise ValueError("--max-new-tokens, --calibration-tokens and --calibration-prompts must be >= 1")
        if self.fallback_margin < 0:
            raise ValueError("--fallback-margin must be >= 0 (a fraction, e.g. 0.05), got "
                             f"{self.fallback_margin}")


@dataclass
class Calibration:
    speculative_tokens_per_s: float
    plain_tokens_per_s: float
    tau: float
    new_tokens: int
    acceptance_by_depth: list[float] = field(default_factory=list)  # kept: a fallen-back run drafts nothing

    @property
    def speedup(self) -> float:
        return self.speculative_tokens_per_s / self.plain_tokens_per_s if self.plain_tokens_per_s else 0.0


@dataclass
class Tally:
    """Tokens and seconds of one method over the timed batches."""

    tokens: int = 0
    seconds: float = 0.0
    results: list = field(default_factory=list)  # GenerationResult per prompt (ours and the baseline)
    batch_rates: list[float] = field(default_factory=list)
    steps: int = 0  # our decoder's target forwards after prefill, and where their time went (`phase_seconds`)
    phases: dict[str, float] = field(default_factory=dict)

    def add(self, tokens: int, seconds: float, results=(), steps: int = 0,
            phases: dict | None = None) -> None:
        self.tokens, self.seconds = self.tokens + tokens, self.seconds + seconds
        self.steps += steps
        self.results += list(results)
        self.batch_rates.append(tokens / seconds if seconds > 0 else 0.0)
        for k, v in (phases or {}).items():
            self.phases[k] = self.phases.get(k, 0.0) + v

    @property
    def step_ms(self) -> dict[str, float] | None:
        """ms per step spent drafting / verifying / accepting (our decoder; None for HF's)."""
        return ms_per_step(self.phases, self.steps)

    @property
    def rate(self) -> float | None:
        return round(self.tokens / self.seconds, 3) if self.seconds > 0 else None


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a and b else None


def seeded(target: Target, seed: int) -> torch.Generator:
    return torch.Generator(device=target.device).manual_seed(seed)


def calibrate(spec: SpeculativeDecoder, plain: SpeculativeDecoder, batches: list[list[list[int]]],
              tokens: int, sampling: SamplingConfig, seed: int) -> Calibration:
    """Plain then speculative decoding of each batch for `tokens` tokens; tokens/s of each over all of
    them."""
    spent = {"plain": Tally(), "spec": Tally()}
    for i, batch in enumerate(batches):
        for name, decoder in (("plain", plain), ("spec", spec)):
            out = decoder.generate_batch(batch, tokens, sampling, seeded(spec.target, seed + i))
            spent[name].add(out.new_tokens, out.wall_time, out.results)
    return Calibration(spent["spec"].tokens / spent["spec"].seconds,
                       spent["plain"].tokens / spent["plain"].seconds, tau(spent["spec"].results),
                       spent["spec"].tokens, acceptance_by_depth(spent["spec"].results))


def fallback_reason(cal: Calibration, batch_size: int, margin: float = 0.0) -> str | None:
    """Why plain decoding should replace speculation at this batch size, or None when speculation won."""
    if cal.speedup > 1.0 + margin:
        return None
    return (f"calibration at batch {batch_size}: speculative {cal.speculative_tokens_per_s:.1f} tok/s (τ "
            f"{cal.tau:.2f}) vs plain {cal.plain_tokens_per_s:.1f} tok/s, ×{cal.speedup:.2f} ≤ "
            f"×{1 + margin:.2f}")


def drafter_label(drafter: DrafterConfig, taken: set[str]) -> str:
    """A file-name-safe, unique name: the kind, the folder, the run for a run's `drafter/` folder, or
    `<run>-<format>` for an export (`runs/draft/export/hf` -> `draft-hf`)."""
    if drafter.path:
        run, fmt = run_of(drafter.path)
        name = f"{run}-{fmt}" if fmt else run
    else:
        name = drafter.kind
    base = re.sub(r"[^A-Za-z0-9_.-]+", "-", name)
    label, i = base, 2
    while label in taken:
        label, i = f"{base}-{i}", i + 1
    taken.add(label)
    return label


def config_record(label, serving: Serving, decoder, model, dtype, batch, temperature, ours: Tally,
                  base: Tally, hf: Tally, categories: list[str], reason: str | None,
                  cal: Calibration | None) -> dict:
    by_cat: dict[str, list] = {}
    for cat, r in zip(categories, ours.results):
        by_cat.setdefault(cat, []).append(r)
    proposer, drafter = decoder.proposer, serving.drafter
    return {
        "drafter": label, "title": drafter_title(drafter, proposer.name, serving.by_plan),
        "drafter_path": drafter.path or drafter.kind, "served_by_plan": serving.by_plan,
        "drafter_kind": proposer.name,
        "tree": proposer.tree, "target": model.target,
        "dtype": dtype, "batch_size": batch, "temperature": temperature, "n_prompts": len(ours.results),
        "n_batches": len(base.batch_rates),
        "new_tokens": ours.tokens, "tokens_per_s": ours.rate, "baseline_tokens_per_s": base.rate,
        # measured: drafting / verifying / accepting
        "step_ms": ours.step_ms, "baseline_step_ms": base.step_ms, "speedup": ratio(ours.rate, base.rate),
        "speedup_by_batch": [round(a / b, 4) for a, b in zip(ours.batch_rates, base.batch_rates) if b],
        "hf_generate_tokens_per_s": hf.rate, "speedup_vs_hf": ratio(ours.rate, hf.rate),
        "baseline_vs_hf": ratio(base.rate, hf.rate),
        "tau": round(tau(ours.results), 4),
        "acceptance_by_depth": acceptance_by_depth(ours.results),
        "by_category": {c: {"tau": round(tau(rs), 4), "n": categories.count(c)} for c, rs in by_cat.items()},
        "fell_back": reason is not None, "fallback_reason": reason,
        "calibration": None if cal is None else dict(asdict(cal), speedup=round(cal.speedup, 4)),
        "equal_to_plain": (sum(a.output_ids == b.output_ids for a, b in zip(ours.results, base.results))
                           if temperature == 0 else None),
    }


class BenchRun:
    """One target: its drafters, batch by batch, every (temperature, batch size)."""

    def __init__(self, target: Target, entries: list[tuple[str, Serving]], cfg: BenchConfig,
                 prompts: list[dict], dtype: str, calibration: list[dict] | None = None):
        self.target, self.cfg, self.dtype, self.model = target, cfg, dtype, entries[0][1].model
        self.prompts = prompts
        self.ids = [target.chat_ids(rec["prompt"]) for rec in prompts]
        # the fall-back decides on prompts disjoint from the timed ones (the stratified order after them)
        self.calibration_ids = [
            target.chat_ids(rec["prompt"]) for rec in calibration] if calibration else self.ids
        self.plain = SpeculativeDecoder(target)
        self.drafters = dict(entries)
        # (label, the batch size its plan was measured at) -> decoder
        self.built: dict[tuple, SpeculativeDecoder] = {}
        # HF peers at batch 1 (name -> generate kwargs), from each kind's hf_peer
        self.peers: dict[str, dict] = {}
        for label, s in entries if cfg.peers else []:
            peer = s.drafter.spec.hf_peer
            named = peer(s.drafter, target, label, s.folder) if peer else None
            if named:
                self.peers[named[0]] = named[1]

    def decoder(self, label: str, batch: int) -> SpeculativeDecoder:
        """The drafter's decoder at `batch`: a folder's plan chooses serving settings per batch size, so one
        is built per measured plan (once when there is none), and reused across temperatures and the batch
        sizes it serves."""
        serving = self.drafters[label]
        key = (label, serving.plan_batch(batch))
        if key not in self.built:
            proposer = serving.proposer(self.target, batch)
            if serving.by_plan:
                print(serving_line(serving.record(proposer, self.target, batch)), flush=True)
            self.built[key] = SpeculativeDecoder(self.target, proposer)
        return self.built[key]

    def run(self, temperature: float, batch: int, bar=None) -> tuple[list[dict], list[dict]]:
        cfg, target = self.cfg, self.target
        sampling = SamplingConfig(temperature)
        batches = [self.ids[i: i + batch] for i in range(0, len(self.ids), batch)]
        first, warm = batches[0], min(8, cfg.max_new_tokens)
        peers = ["hf-generate", *(self.peers if batch == 1 else [])] if cfg.peers else []
        decoders = {label: self.decoder(label, batch) for label in self.drafters}
        for decoder in [self.plain, *decoders.values()]:  # untimed warm-up: allocator, kernels
            decoder.generate_batch(first, warm, sampling, seeded(target, cfg.seed))
        for name in peers:
            hf_generate_batch(target, first, warm, sampling, **self.peers.get(name, {}))
        cal_ids = self.calibration_ids[: max(cfg.calibration_prompts, batch)]
        probe = [cal_ids[i: i + batch] for i in range(0, len(cal_ids), batch)]
        probe_tokens = min(cfg.calibration_tokens, cfg.max_new_tokens)
        cals = {label: calibrate(decoder, self.plain, probe, probe_tokens, sampling,
                                 cfg.seed) if cfg.fallback else None
                for label, decoder in decoders.items()}
        reasons = {label: fallback_reason(cal, batch, cfg.fallback_margin) if cal else None
                   for label, cal in cals.items()}
        speculating = [(label, decoder) for label, decoder in decoders.items() if not reasons[label]]
        tallies = {name: Tally() for name in ["plain", *peers, *dict(speculating)]}
        for i, prompts in enumerate(batches):
            seed = cfg.seed + 1000 + i

            def peer(name, prompts=prompts, seed=seed):
                torch.manual_seed(seed)
                outs, seconds = hf_generate_batch(target, prompts, cfg.max_new_tokens, sampling,
                                                  **self.peers.get(name, {}))
                tallies[name].add(sum(map(len, outs)), seconds)

            def ours(name, decoder, prompts=prompts, seed=seed):
                out: BatchResult = decoder.generate_batch(prompts, cfg.max_new_tokens, sampling,
                                                          seeded(target, seed))
                tallies[name].add(out.new_tokens, out.wall_time, out.results, out.steps, out.phase_seconds)

            methods = [(lambda n=n: peer(n)) for n in peers]
            methods += [(lambda n=n, d=d: ours(n, d)) for n, d in [("plain", self.plain), *speculating]]
            for method in methods if i % 2 == 0 else methods[::-1]:  # alternating order: drift hits all alike
                method()
            if bar is not None:
                bar.update(1)
        # a fallen-back configuration serves the plain loop: its figures are the plain loop's own
        tallies.update({label: tallies["plain"] for label, reason in reasons.items() if reason})
        hf = tallies.get("hf-generate", Tally())
        categories = [rec["category"] for rec in self.prompts]
        records = [config_record(label, self.drafters[label], decoder, self.model, self.dtype, batch,
                                 temperature, tallies[label], tallies["plain"], hf, categories,
                                 reasons[label], cals[label])
                   for label, decoder in decoders.items()]
        peer_rows = [{"peer": "draftsmith-plain" if name == "plain" else name, "target": self.model.target,
                      "batch_size": batch, "temperature": temperature, "new_tokens": tallies[name].tokens,
                      "tokens_per_s": tallies[name].rate,
                      "speedup_vs_hf_generate": ratio(tallies[name].rate, hf.rate)}
                     for name in [*peers, "plain"]]
        return records, peer_rows


def run_bench(drafters: list[Serving], cfg: BenchConfig, progress: bool = True) -> dict:
    """Benchmark every drafter at every (temperature, batch size); write the JSONs and PNGs; return
    bench.json."""
    from tqdm.auto import tqdm

    from draftsmith.eval.measure.plots import write_bench_plots

    if not drafters:
        raise ValueError("draftsmith bench needs at least one --drafter")
    out = Path(cfg.out)
    (out / "configs").mkdir(parents=True, exist_ok=True)
    prompts = select_prompts(EvalConfig(prompts=cfg.prompts, limit=cfg.limit, categories=cfg.categories))
    try:  # the calibration split: the stratified prompts after the timed ones
        calibration = select_prompts(EvalConfig(prompts=cfg.prompts,
                                                limit=max(cfg.calibration_prompts, *cfg.batch_sizes),
                                                categories=cfg.categories, offset=len(prompts)))
    # a prompt set with nothing left over: calibrate on the first timed prompts, and say so
    except ValueError:
        calibration = None
    taken: set[str] = set()
    groups: dict[str, list] = {}  # drafters served with the same target share its load and its baselines
    for serving in drafters:
        groups.setdefault(serving.model.target, []).append((drafter_label(serving.drafter, taken), serving))
    configs, peers, machine = [], [], None
    total = len(groups) * len(cfg.temperatures) * sum(-(-len(prompts) // b) for b in cfg.batch_sizes)
    with tqdm(total=total, desc="bench", unit="batch", disable=not progress) as bar:
        for entries in groups.values():
            model = entries[0][1].model
            target = load_target(model, dtype=cfg.dtype or model.dtype)
            refused = one_at_a_time(target.model) if max(cfg.batch_sizes) > 1 else None
            if refused:
                raise ValueError(f"--batch-sizes {max(cfg.batch_sizes)}: {refused}")
            run = BenchRun(target, entries, cfg, prompts, dtype_name(target.dtype), calibration)
            machine = machine or machine_info(run.target)
            for temperature in cfg.temperatures:
                for batch in cfg.batch_sizes:
                    records, peer_rows = run.run(temperature, batch, bar)
                    for rec in records:
                        name = f"{rec['drafter']}-b{batch}-t{temperature:g}.json"
                        (out / "configs" / name).write_text(json.dumps(rec, indent=2) + "\n")
                    configs += records
                    peers += peer_rows
    drafted = [{"drafter": label, "target": s.model.target,
                **asdict(s.drafter)} for g in groups.values() for label, s in g]
    bench = {"settings": asdict(cfg), "drafters": drafted, "n_prompts": len(prompts), "machine": machine,
             "calibration_prompts": [r["id"] for r in calibration] if calibration else "the first timed "
                                                                                       "prompts",
             "configs": configs, "peers": peers,
             "speedup_definition": "total new tokens / total wall time over the same batches, ours over our "
                                   "plain batched loop (speedup) or HF generate at the same batch size "
                                   "(speedup_vs_hf)"}
    (out / "bench.json").write_text(json.dumps(bench, indent=2) + "\n")
    write_bench_plots(bench, out)
    return bench


def format_bench(bench: dict) -> str:
    """One line per configuration, for the terminal."""
    lines = []
    for c in bench["configs"]:
        back = f"  fell back ({c['fallback_reason']})" if c["fell_back"] else ""
        lines.append(f"{c['drafter']:>20} b{c['batch_size']:<3} T{c['temperature']:<4g} τ {c['tau']:.2f}  "
                     f"{c['tokens_per_s'] or 0:.1f} tok/s  ×{c['speedup'] or 0:.2f} vs plain  "
                     f"×{c['speedup_vs_hf'] or 0:.2f} vs HF{back}")
    return "\n".join(lines)
