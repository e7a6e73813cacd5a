"""The eval stage: a drafter through the tree-verification decoder on benchmark prompts.

Last stop of the flow (`draftsmith eval`, and the pipeline's final stage). Per prompt, interleaved
so machine drift cancels: HF `generate`, our autoregressive loop (same engine and timer as the
speculative run), then speculative decoding. Writes `samples.jsonl` (one record per prompt) and
`summary.json` (τ with the bonus token counted, conditional acceptance by depth, tokens/s of all
three, speedups, greedy equality with HF `generate`, per category, the machine it ran on, and `serving`: the
serving settings measured and where they came from — a plan's serving.json named with `--serving`, the drafter
folder's own serving.json, the tree the folder recorded, or the config — said on the console too).

Resumable: each prompt's record is appended to `samples.jsonl.partial` as it finishes, under a first line
holding what decides the figures (`resume_key`: the eval, model and drafter settings, what is served, the
files of the drafter, of a local target and of local datastores, the prompts' token ids, the machine's timing
key, the library versions). A run stopped by a kill, Ctrl-C or an error leaves the finished outputs as they
were and the partial file beside them; the same command continues after its last whole record (every prompt
seeds its own generator, so a resumed run decodes what one sitting would), and other settings start over.
`sittings` in the summary names the prompt each sitting began at.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from draftsmith.distill.loading import ComputeDtype, dtype_name, load_target
from draftsmith.distill.records import load_records
from draftsmith.eval.decode.decoder import SpeculativeDecoder, hf_generate
from draftsmith.eval.decode.machine import machine_info, machine_key
from draftsmith.eval.decode.results import GenerationResult, ms_per_step
from draftsmith.eval.serving import Serving, serving_line
from draftsmith.heads.registry import DrafterConfig
from draftsmith.heads.runtime.acceptance import acceptance_by_depth, tau
from draftsmith.heads.runtime.verify import SamplingConfig

# Spec-Bench reports its 80 MT-bench questions as one category ("mt_bench"), 6 categories in all.
MT_BENCH_CATEGORIES = {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem",
                       "humanities"}


@dataclass
class EvalConfig:
    """`eval:` section — prompts, lengths, sampling and what to compare against."""

    prompts: str = "spec-bench"  # vendored name or a .jsonl/.json/.parquet file
    limit: int | None = 40
    # skip the first N prompts of the stratified order (a calibration split disjoint from eval's)
    offset: int = 0
    categories: list[str] = field(default_factory=list)
    max_new_tokens: int = 128
    dtype: ComputeDtype | None = None  # None: model.dtype; auto: bfloat16 where native, else float32
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    # at T > 0, how drafters that can sample draft: from their own law q ("sampled"), or q's argmax treated as
    # one-hot ("greedy": what vLLM by default and llama.cpp serve; heads/runtime/verify.py SamplingConfig)
    draft_sampling: Literal["sampled", "greedy"] = "sampled"
    seed: int = 0
    warmup: int = 1  # untimed prompts run first
    baselines: bool = True  # time our autoregressive loop and HF generate on every prompt
    out: str = ""  # empty: <run dir>/eval


def run_of(path: str | Path) -> tuple[str, str | None]:
    """(the run, the export format or None) a drafter folder belongs to: `runs/X/drafter` -> (X, None),
    `runs/X/export/hf` -> (X, "hf"), any other folder -> (its name, None)."""
    folder = Path(path)
    if folder.name == "drafter" and folder.parent.name:
        return folder.parent.name, None
    if folder.parent.name == "export" and folder.parent.parent.name:
        return folder.parent.parent.name, folder.name
    return folder.name, None


def drafter_title(drafter: DrafterConfig, kind: str, planned: bool = False) -> str:
    """How tables and plots name a drafter: its kind's title and the run it came from
    (`EAGLE-3 · eagle3-quick`, `draft LM · draft (hf export)`, `· plan` when its serving.json chose the
    settings); a training-free kind without a folder is its title alone."""
    from draftsmith.heads.registry import KINDS

    base, _, extra = kind.partition("+")  # a hybrid proposer is "<kind>+lookup"; plain decoding is "none"
    title = KINDS[base].display if base in KINDS else "plain decoding" if base == "none" else base
    title += f" + {extra}" if extra else ""
    if not drafter.path:
        return title
    run, fmt = run_of(drafter.path)
    return f"{title} · {run}" + (f" ({fmt} export)" if fmt else "") + (" · plan" if planned else "")


def select_prompts(cfg: EvalConfig) -> list[dict]:
    """Benchmark prompts, stratified: round-robin over categories so any limit covers them all."""
    records, _ = load_records(cfg.prompts)
    by_cat: dict[str, list[dict]] = {}
    for rec in records:
        turns = [m["content"] for m in rec["messages"] if m["role"] == "user"]
        sub = rec["category"]
        cat = "mt_bench" if cfg.prompts == "spec-bench" and sub in MT_BENCH_CATEGORIES else (sub or "all")
        if cfg.categories and cat not in cfg.categories and sub not in cfg.categories:
            continue
        by_cat.setdefault(cat, []).append({"id": rec["id"], "category": cat, "subcategory": sub,
                                           "prompt": turns[0]})
    if not by_cat:
        raise ValueError(f"no prompts in {cfg.prompts} for categories {cfg.categories}")
    out, queues = [], list(by_cat.values())
    want = None if cfg.limit is None else cfg.offset + cfg.limit
    while queues and (want is None or len(out) < want):
        for q in queues:
            if q and (want is None or len(out) < want):
                out.append(q.pop(0))
        queues = [q for q in queues if q]
    if cfg.offset and len(out) <= cfg.offset:
        raise ValueError(f"{cfg.prompts}: offset {cfg.offset} leaves no prompt ({len(out)} in all)")
    return out[cfg.offset:]


def _rate(tokens: int, seconds: float) -> float | None:
    return round(tokens / seconds, 3) if seconds > 0 else None


def step_ms(samples: list[dict], key: str, steps: int) -> dict[str, float] | None:
    """ms per step spent drafting / verifying / accepting over the samples (None when a sample has no
    split)."""
    phases = [s.get(key) or {} for s in samples]
    if not all(phases):
        return None
    return ms_per_step({k: sum(p.get(k, 0.0) for p in phases) for k in ("draft", "verify", "accept")}, steps)


def summarize(samples: list[dict], results: list[GenerationResult], meta: dict) -> dict:
    spec_tok, spec_s = sum(s["new_tokens"] for s in samples), sum(s["wall_time"] for s in samples)
    summary = dict(meta, n_prompts=len(samples), new_tokens=spec_tok, tau=round(tau(results), 4),
                   acceptance_by_depth=acceptance_by_depth(results), tokens_per_s=_rate(spec_tok, spec_s))
    has_base = all("baseline_wall_time" in s for s in samples) and samples
    base = _rate(sum(s["baseline_new_tokens"] for s in samples),
                 sum(s["baseline_wall_time"] for s in samples)) if has_base else None
    hf = _rate(sum(s["hf_new_tokens"] for s in samples),
               sum(s["hf_wall_time"] for s in samples)) if has_base else None
    summary["step_ms"] = step_ms(samples, "phase_seconds", sum(len(s["accept_lengths"]) for s in samples))
    # the plain loop: one step per new token after the first (its first comes from the prefill)
    summary["baseline_step_ms"] = step_ms(samples, "baseline_phase_seconds",
                                          sum(s.get("baseline_new_tokens",
                                                    0) - 1 for s in samples)) if has_base else None
    summary.update(baseline_tokens_per_s=base, hf_generate_tokens_per_s=hf,
                   speedup=round(summary["tokens_per_s"] / base, 4) if base else None,
                   speedup_vs_hf=round(summary["tokens_per_s"] / hf, 4) if hf else None,
                   baseline_vs_hf=round(base / hf, 4) if base and hf else None)
    greedy = meta["temperature"] == 0 and has_base
    summary["greedy_equal"] = all(s["equal_to_hf"] for s in samples) if greedy else None
    summary["greedy_equal_count"] = sum(s["equal_to_hf"] for s in samples) if greedy else None
    by_cat: dict[str, dict] = {}
    for s, r in zip(samples, results):
        c = by_cat.setdefault(s["category"],
                              {"results": [], "tok": 0, "sec": 0.0, "btok": 0, "bsec": 0.0, "n": 0})
        c["results"].append(r)
        c["tok"], c["sec"], c["n"] = c["tok"] + s["new_tokens"], c["sec"] + s["wall_time"], c["n"] + 1
        if has_base:
            c["btok"], c["bsec"] = c["btok"] + s["baseline_new_tokens"], c["bsec"] + s["baseline_wall_time"]
    summary["by_category"] = {
        cat: {"tau": round(tau(c["results"]), 4),
              "speedup": round((c["tok"] / c["sec"]) / (c["btok"] / c["bsec"]),
                               4) if has_base and c["bsec"] else None,
              "n": c["n"]} for cat, c in by_cat.items()}
    return summary


def sample_record(rec: dict, prompt_ids: list[int], out: dict) -> dict:
    """samples.jsonl's record of one prompt: the speculative run, and the baselines where they ran."""
    r = out["spec"]
    sample = {"id": rec["id"], "category": rec["category"], "subcategory": rec["subcategory"],
              "prompt_tokens": len(prompt_ids), "new_tokens": r.new_tokens,
              "wall_time": round(r.wall_time, 5), "tau": round(r.tau, 4), "accept_lengths": r.accept_lengths,
              "output_ids": r.output_ids, "phase_seconds": r.phase_seconds,
              "draft_depths": r.draft_depths, "accepted_drafts": r.accepted_drafts}
    if "hf" in out:
        (hf_ids, hf_s), base = out["hf"], out["base"]
        sample.update(baseline_new_tokens=base.new_tokens, baseline_wall_time=round(base.wall_time, 5),
                      baseline_phase_seconds=base.phase_seconds, hf_new_tokens=len(hf_ids),
                      hf_wall_time=round(hf_s, 5), equal_to_hf=r.output_ids == hf_ids,
                      baseline_equal_to_hf=base.output_ids == hf_ids)
    return sample


PARTIAL_FORMAT = 1  # samples.jsonl.partial's layout: a new field in the records means a new number


def files_stamp(path: str | None) -> list | None:
    """What tells that a folder (or file) changed since a stopped eval: each file's path, size and mtime."""
    if not path or not Path(path).exists():
        return None
    root = Path(path)
    files = sorted(root.rglob("*")) if root.is_dir() else [root]
    return [[str(f.relative_to(root)) if root.is_dir() else f.name, f.stat().st_size, f.stat().st_mtime_ns]
            for f in files if f.is_file()]


def resume_key(cfg: EvalConfig, served: dict, model, dtype: str, drafter: DrafterConfig, prompts: list[dict],
               token_ids: list[list[int]], target) -> dict:
    """Everything that decides an eval's figures: a stopped run continues only under the same key (the eval,
    model and drafter settings whole, what is served, the files of the drafter, of a local target and of the
    drafter's datastores, the prompts' token ids, the machine's timing key and the library versions)."""
    import hashlib
    from importlib.metadata import version

    import transformers

    ids = hashlib.sha256(json.dumps(token_ids).encode()).hexdigest()
    sources = [str(s) for s in getattr(drafter, "lookup_datastore", None) or [] if Path(str(s)).exists()]
    key = {"format": PARTIAL_FORMAT, "eval": {k: v for k, v in dataclasses.asdict(cfg).items() if k != "out"},
           "model": dataclasses.asdict(model), "drafter_settings": dataclasses.asdict(drafter),
           "serving": served, "dtype": dtype, "drafter_files": files_stamp(drafter.path),
           "target_files": files_stamp(model.target), "datastores": [files_stamp(s) for s in sources],
           "prompts": [p["id"] for p in prompts], "prompt_ids_sha256": ids,
           "machine": list(machine_key(machine_info(target))),
           "versions": [version("draftsmith"), torch.__version__, transformers.__version__]}
    return json.loads(json.dumps(key, default=str))  # as it reads back from the file


def resumed_samples(partial: Path, key: dict, prompts: list[dict]) -> tuple[list[dict], list[int]]:
    """The whole records a stopped eval with this key left in `partial`, in prompt order, and the prompts its
    sittings began at (([], []) when there is none, or its settings differ: said on the console)."""
    if not partial.is_file():
        return [], []
    lines = partial.read_text().splitlines()
    try:
        head = json.loads(lines[0]) if lines else {}
    except json.JSONDecodeError:
        head = {}
    if head.get("eval_settings") != key:
        print(f"[eval] {partial} was left by an eval with other settings: starting over", flush=True)
        return [], []
    samples = []
    for line, rec in zip(lines[1:], prompts):
        try:
            sample = json.loads(line)
        except json.JSONDecodeError:  # the line a kill cut short
            break
        if sample.get("id") != rec["id"]:
            break
        samples.append(sample)
    if samples:
        print(f"[eval] continuing a stopped eval: {len(samples)} of {len(prompts)} prompts done", flush=True)
    return samples, [n for n in head.get("sittings", []) if n < len(samples)]


def result_of(sample: dict) -> GenerationResult:
    """A finished prompt's speculative run, back from its samples.jsonl record."""
    return GenerationResult(output_ids=sample["output_ids"], accept_lengths=sample["accept_lengths"],
                            draft_depths=sample["draft_depths"], accepted_drafts=sample["accepted_drafts"],
                            wall_time=sample["wall_time"], phase_seconds=sample["phase_seconds"])


def decode_resumably(prompts: list[dict], token_ids: list[list[int]], partial: Path, key: dict, run_one,
                     desc: str, progress: bool) -> tuple[list[dict], list[GenerationResult], list[int]]:
    """Every prompt's record (samples.jsonl's), appended to `partial` as it finishes under the settings line
    `key`, after those a stopped run with this key left there; (records, speculative results, the prompt each
    sitting began at). `run_one(i)` decodes prompt i (chat ids `token_ids[i]`): its methods' results."""
    from tqdm.auto import tqdm

    samples, sittings = resumed_samples(partial, key, prompts)
    results, sittings = [result_of(s) for s in samples], sittings + [len(samples)]
    bar = tqdm(total=len(prompts), initial=len(samples), desc=desc, unit="prompt", disable=not progress)
    # rewritten whole, then swapped in (a kill while rewriting loses nothing): drops a record a kill cut short
    fresh = partial.with_name(partial.name + ".new")
    fresh.write_text("".join(json.dumps(s) + "\n" for s in [{"eval_settings": key, "sittings": sittings},
                                                              *samples]))
    fresh.replace(partial)
    try:
        with open(partial, "a") as fh:
            for i in range(len(samples), len(prompts)):
                out = run_one(i)
                r, sample = out["spec"], sample_record(prompts[i], token_ids[i], out)
                fh.write(json.dumps(sample) + "\n")
                fh.flush()
                samples.append(sample)
                results.append(r)
                bar.update(1)
                bar.set_postfix(tau=f"{tau(results):.2f}")
    except BaseException:
        print(f"\n[eval] stopped after {len(samples)} of {len(prompts)} prompts: the same command continues "
              f"from there ({partial})", flush=True)
        raise
    finally:
        bar.close()
    return samples, results, sittings


def run_eval(serving: Serving, cfg: EvalConfig, out_dir: str | Path, progress: bool = True,
             target=None) -> dict:
    """Benchmark what `serving` serves (eval/serving.py: its drafter, plan and target) at batch 1; write
    samples.jsonl and summary.json into `out_dir`; return the summary."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model, drafter = serving.model, serving.drafter
    target = target or load_target(model, dtype=cfg.dtype or model.dtype)
    dtype = dtype_name(target.dtype)  # what ran (dtype auto resolved)
    proposer = serving.proposer(target)  # eval decodes one prompt at a time
    served = serving.record(proposer, target)
    print(serving_line(served), flush=True)
    spec, base = SpeculativeDecoder(target, proposer), SpeculativeDecoder(target)
    sampling = SamplingConfig(cfg.temperature, cfg.top_k, cfg.top_p, cfg.draft_sampling)
    prompts = select_prompts(cfg)
    gen = torch.Generator(device=target.device)

    def run_one(prompt_ids: list[int], max_new: int, index: int):
        """HF, plain, speculative on one prompt; the order alternates per prompt, so drift hits all alike."""
        def hf():
            torch.manual_seed(cfg.seed + index)
            return hf_generate(target, prompt_ids, max_new, sampling)

        def ours(decoder):
            gen.manual_seed(cfg.seed + index)
            return decoder.generate(prompt_ids, max_new, sampling, gen)

        methods = [("hf", hf), ("base", lambda: ours(base))] if cfg.baselines else []
        methods.append(("spec", lambda: ours(spec)))
        return {name: fn() for name, fn in (methods if index % 2 == 0 else methods[::-1])}

    token_ids = [target.chat_ids(rec["prompt"]) for rec in prompts]  # tokenised once: key and decoding
    for i, ids in enumerate(token_ids[: cfg.warmup]):  # untimed: allocator, kernels, caches
        run_one(ids, min(16, cfg.max_new_tokens), i)
    # written beside the old outputs and swapped in at the end: a run that stops half-way (an error, Ctrl-C, a
    # kill) leaves the folder's outputs as they were, never half of a new eval, and the same command continues
    partial = out_dir / "samples.jsonl.partial"
    key = resume_key(cfg, served, model, dtype, drafter, prompts, token_ids, target)
    samples, results, sittings = decode_resumably(
        prompts, token_ids, partial, key, lambda i: run_one(token_ids[i], cfg.max_new_tokens, i),
        f"eval {proposer.name}", progress)
    meta = {"target": model.target, "drafter": drafter_title(drafter, proposer.name, serving.by_plan),
            "served_by_plan": serving.by_plan, "serving": served,
            "drafter_path": drafter.path or drafter.kind, "drafter_kind": proposer.name,
            "dtype": dtype, "temperature": cfg.temperature, "top_k": cfg.top_k, "top_p": cfg.top_p,
            "draft_sampling": cfg.draft_sampling,
            "tree": proposer.tree, "prompts": cfg.prompts, "offset": cfg.offset,
            "max_new_tokens": cfg.max_new_tokens, "speedup_definition": "total new tokens / total wall time, "
                                                                        "speculative over our autoregressive "
                                                                        "loop (speedup) or HF generate "
                                                                        "(speedup_vs_hf), same prompts, "
                                                                        "interleaved",
            "machine": machine_info(target), "sittings": sittings}
    summary = summarize(samples, results, meta)
    (out_dir / "summary.json.partial").write_text(json.dumps(summary, indent=2) + "\n")
    fresh = partial.with_name(partial.name + ".new")
    fresh.write_text("".join(json.dumps(s) + "\n" for s in samples))  # the records, without the settings line
    fresh.replace(out_dir / "samples.jsonl")
    (out_dir / "summary.json.partial").replace(out_dir / "summary.json")
    partial.unlink()
    return summary

