"""Our drafters served by llama.cpp (build 11434, `draftsmith engine install llamacpp`) beside our own
decoder:

    draftsmith eval --engine llamacpp --drafter DIR [--tree chain-K] [--engine-ngram all|none|TYPE,...]
                    [--engine-draft-threads N] [--engine-combine none|TYPE,...]

The chain: `--tree chain-K`, else the one `draftsmith plan --engine llamacpp --into-drafter` chose
(serving-llamacpp.json in the folder), else the folder's serving tree's depth. The draft model's threads
(`-td/-tbd`): `--engine-draft-threads N`, else the plan's where its chain came from the plan (a `chain-K-tdN`
choice), else the target's.

The vLLM engine eval's twin (eval/measure/engine.py), with the same summary keys (`engine_summary` does
the arithmetic). On the same prompts with a chain of k, greedy or at T > 0 (both sides then draft the argmax
and accept d with probability p(d), llama.cpp's rule: heads/engines.py RULES["llamacpp-sampling"]):
- ours: our decoder on the target in the eval dtype (float32 judges acceptance);
- llama.cpp: `llama-server` on the target as a GGUF converted in that dtype (f32: the weights our decoder
  runs, with an f32 KV cache; a Q4 target computes other logits), the drafter exported as `gguf` in it
  too, served with the kind's `--spec-type` (draft-simple, draft-eagle3, draft-dflash) and
  `--spec-draft-n-max k`; then plain (no drafter), then each n-gram spec type (the drafter-free rows), then
  the drafter behind an n-gram type where asked (`--engine-combine TYPE`, or the plan chose `TYPE+chain-K`:
  `--spec-type TYPE,draft-...`, the n-gram type drafting first and the drafter where it finds nothing,
  RULES["llamacpp-spec-combined"]; a speed row, its α mixing the two), then, where the target came from a
  quantized GGUF (a preset, or a .gguf target), that GGUF as it is with and without the drafter (its figures
  beside).

Every run is one server (`--metrics`, one slot, every core); each prompt is one `/completion` request with
the prompt as draftsmith's chat-templated token ids (so both sides decode the same tokens) and
`return_tokens`. Served α per position comes from llama.cpp's own counters at `/metrics`
(`spec_decode_num_drafts_total`: verification steps; `spec_decode_num_accepted_tokens_per_pos_total`),
read before and after the timed prompts (heads/engines.py RULES["llamacpp-counters"]); the per-request
`timings.draft_n` / `draft_n_accepted` are kept in engine.json too. `summary.json`: the vLLM eval's keys,
`engine: llamacpp`, plus `ngram` (per spec type: τ, α by position, tok/s, speedup, greedy equality),
`combined` (the same per n-gram type the drafter was served behind) and `quantized` (the quantized target's
spec and plain figures).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from draftsmith.eval.measure.engine import chain_k, chain_serving, planned_chain
from draftsmith.eval.measure.engine_compare import engine_summary, sampled_outputs
from draftsmith.eval.measure.llamacpp_server import serve_runs
from draftsmith.eval.serving import Serving
from draftsmith.heads import llamacpp
from draftsmith.heads.engines import llamacpp_combined_type, llamacpp_spec_type

LLAMACPP_PLAN = "serving-llamacpp.json"  # its engine plan (eval/measure/engine_plan_llamacpp.py)
NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
# the n-gram types a plan tries the drafter behind (RULES["llamacpp-spec-combined"]): llama.cpp's first
COMBINE_TYPES = ("ngram-simple",)


def quantized_gguf(model) -> Path | None:
    """The quantized GGUF the target came from: a .gguf model.target, or a preset's downloaded file."""
    from draftsmith.distill.cache import draftsmith_home
    from draftsmith.distill.loading import PRESETS

    if str(model.target).endswith(".gguf") and Path(model.target).is_file():
        return Path(model.target)
    if model.target in PRESETS:
        path = draftsmith_home() / "downloads" / model.target / PRESETS[model.target].gguf
        return path if path.is_file() else None
    return None


def row(raw_run: dict, base_run: dict | None) -> dict:
    """τ, α by position, speed and greedy equality of one run against its plain twin."""
    from draftsmith.eval.measure.engine_compare import alpha_from_counters

    rec = raw_run["by_concurrency"]["1"]
    counters, base = rec["counters"], (base_run or {}).get("by_concurrency", {}).get("1")
    drafts = counters["vllm:spec_decode_num_drafts"]
    per_pos = counters["vllm:spec_decode_num_accepted_tokens_per_pos"]
    alpha, _ = alpha_from_counters(counters, len(per_pos))
    tps = rec["new_tokens"] / rec["seconds"] if rec["seconds"] else None
    base_tps = base["new_tokens"] / base["seconds"] if base and base["seconds"] else None
    equal = [a == b for a, b in zip(rec["output_ids"], base["output_ids"])] if base else []
    accepted = counters["vllm:spec_decode_num_accepted_tokens"]
    return {"num_drafts": drafts, "num_draft_tokens": counters["vllm:spec_decode_num_draft_tokens"],
            "num_accepted_tokens": accepted, "tau": round(1 + accepted / drafts, 4) if drafts else None,
            "alpha_by_position": [None if a is None else round(a, 4) for a in alpha],
            "tokens_per_s": round(tps, 3) if tps else None,
            "baseline_tokens_per_s": round(base_tps, 3) if base_tps else None,
            "speedup": round(tps / base_tps, 4) if tps and base_tps else None,
            "greedy_equal": all(equal) if base else None, "greedy_equal_count": sum(equal) if base else None}


def make_job(serving: Serving, cfg, out_dir: Path, target, k: int, ngram: tuple[str, ...],
             quantized: bool = True, draft_threads: int | None = None, combine: tuple[str, ...] = ()) -> dict:
    """The GGUFs (target and drafter in the eval dtype, converted once) and the runs to serve (the quantized
    target's pair only with `quantized`; the drafter's runs with `-td/-tbd draft_threads` where given; the
    drafter behind each n-gram type of `combine`, `TYPE+spec`: RULES["llamacpp-spec-combined"])."""
    from draftsmith.distill.loading import resolve_target
    from draftsmith.eval.measure.evaluate import select_prompts
    from draftsmith.heads.export import export_drafter

    folder, model = serving.folder, serving.model
    dtype = str(target.dtype).removeprefix("torch.")
    out_type = llamacpp.outtype(dtype)
    source = resolve_target(model.target, model.revision)
    cached = llamacpp.home() / "targets" / f"{source.name}-{out_type}.gguf"
    target_gguf = llamacpp.convert_target(source, cached, out_type)
    spec_type = llamacpp_spec_type("gguf", folder.kind)
    if folder.format != "draftsmith" or spec_type is None:
        raise ValueError(f"--engine llamacpp serves a drafter folder whose kind llama.cpp serves (a GGUF "
                         f"export of it is written here); {folder.path} is a {folder.kind} {folder.format} "
                         "folder")
    export = export_drafter(folder, "gguf", out_dir / "export" / "gguf", dtype=dtype,
                            target_model=target.model)
    draft = llamacpp.gguf_of(export)
    prompts = [target.chat_ids(rec["prompt"]) for rec in select_prompts(cfg)]
    kv = "f32" if out_type == "f32" else "f16"
    # a confidence stop llama.cpp applies as our decoder does (the other draft types draft the whole chain)
    gguf = llamacpp.GGUF_KINDS.get(folder.kind)
    p_min = serving.drafter.confidence_threshold if gguf and gguf.p_min_is_confidence else 0.0
    own = {**({"p_min": p_min} if p_min else {}),
           **({"draft_threads": draft_threads} if draft_threads else {})}
    runs = [{"name": "spec", "model": str(target_gguf), "spec_type": spec_type, "draft": str(draft),
             "kv": kv, **own},
            {"name": "plain", "model": str(target_gguf), "kv": kv}]
    runs += [{"name": t, "model": str(target_gguf), "spec_type": t, "kv": kv} for t in ngram]
    runs += [{**runs[0], "name": f"{t}+spec", "spec_type": llamacpp_combined_type(t, spec_type)}
             for t in combine]
    quantized = quantized_gguf(model) if quantized else None
    if quantized is not None:
        runs += [{"name": "quantized-spec", "model": str(quantized), "spec_type": spec_type,
                  "draft": str(draft), "kv": "f16", **own},
                 {"name": "quantized-plain", "model": str(quantized), "kv": "f16"}]
    ctx = 256 * math.ceil((max(map(len, prompts)) + cfg.max_new_tokens + k + 8) / 256)
    return {"target_gguf": str(target_gguf), "draft_gguf": str(draft), "spec_type": spec_type, "k": k,
            "ctx": ctx, "prompts": prompts, "max_tokens": cfg.max_new_tokens,
            "stop_token_ids": list(target.eos_token_ids), "warmup": cfg.warmup, "runs": runs,
            "sampling": {"temperature": cfg.temperature, "top_k": cfg.top_k, "top_p": cfg.top_p,
                         "seed": cfg.seed},
            "quantized_gguf": str(quantized) if quantized else None, "draft_threads": draft_threads,
            "combine": list(combine)}


def run_llamacpp_eval(serving: Serving, cfg, out_dir: str | Path, ngram: tuple[str, ...] = NGRAM_TYPES,
                      progress: bool = True, quantized: bool = True,
                      draft_threads: int | None = None, combine: tuple[str, ...] | None = None) -> dict:
    """Serve `serving`'s drafter folder in llama.cpp and with our decoder on the same prompts (module doc);
    write summary.json, job.json, engine.json, ours/, export/gguf/ and one server log per run. The draft model
    runs on `draft_threads` threads, else on the count the folder's llama.cpp plan chose with its chain, else
    on the target's. The drafter is also served behind each n-gram type of `combine` (else the one the plan
    chose it behind, `TYPE+chain-K`), a speed row beside the comparison."""
    from draftsmith.distill.loading import load_target
    from draftsmith.eval.measure.evaluate import run_eval

    llamacpp.require()
    if serving.folder is None:
        raise ValueError("--engine llamacpp serves a drafter folder: pass --drafter DIR")
    for flag, types in (("--engine-ngram", ngram), ("--engine-combine", combine or ())):
        unknown = [t for t in types if t not in NGRAM_TYPES]
        if unknown:
            raise ValueError(f"{flag} {','.join(unknown)}: llama.cpp's n-gram types are "
                             f"{', '.join(NGRAM_TYPES)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    k = chain_k(serving, LLAMACPP_PLAN)
    if draft_threads is not None and draft_threads < 1:
        raise ValueError(f"--engine-draft-threads {draft_threads}: give the draft model 1 or more threads")
    planned = planned_chain(serving.folder.path / LLAMACPP_PLAN)
    if draft_threads is None and not serving.drafter.tree and planned:
        draft_threads = planned[1]
    if combine is None:  # the n-gram type the plan chose the drafter behind, where its chain is served
        combine = (planned[2],) if planned and planned[2] and not serving.drafter.tree else ()
    target = load_target(serving.model, dtype=cfg.dtype or serving.model.dtype)
    # at T > 0 our decoder drafts as llama.cpp does: the argmax, verified as one-hot
    # (RULES["llamacpp-sampling"])
    ours_cfg = dataclasses.replace(cfg, baselines=False, out=str(out_dir / "ours"), draft_sampling="greedy")
    ours = run_eval(chain_serving(serving, k), ours_cfg, out_dir / "ours", progress=progress, target=target)
    our_samples = [json.loads(line) for line in (out_dir / "ours" / "samples.jsonl").read_text().splitlines()]
    job = make_job(serving, cfg, out_dir, target, k, ngram, quantized, draft_threads, tuple(combine))
    (out_dir / "job.json").write_text(json.dumps(job) + "\n")
    raw = serve_runs(job, out_dir)
    return write_summary(raw, ours, our_samples, job, serving, cfg, out_dir)


def write_summary(raw: dict, ours: dict, our_samples: list[dict], job: dict, serving: Serving, cfg,
                  out_dir: Path) -> dict:
    runs = {run["name"]: run for run in raw["runs"]}
    meta = {"target": serving.model.target, "drafter_path": str(serving.folder.path), "served_format": "gguf",
            "served_export": job["draft_gguf"], "method": job["spec_type"], "target_gguf": job["target_gguf"],
            "dtype": ours["dtype"], "temperature": cfg.temperature, "top_k": cfg.top_k, "top_p": cfg.top_p,
            "draft_sampling": "greedy", "prompts": cfg.prompts, "draft_threads": job.get("draft_threads"),
            "max_new_tokens": cfg.max_new_tokens, "concurrency": [1]}
    main = {"host": raw["host"], "runs": [runs["spec"], runs["plain"]]}
    summary = engine_summary(main, ours, our_samples, job["k"], meta)
    summary.update(
        engine="llamacpp", engine_version=f"b{raw['host']['engine_version']}",
        load_seconds={name: run["load_seconds"] for name, run in runs.items()},
        ngram={t: row(runs[t], runs["plain"]) for t in runs if t in NGRAM_TYPES},
        # the drafter behind an n-gram type: speed and greedy equality; its α mixes the two proposers
        combined={t: row(runs[f"{t}+spec"], runs["plain"]) for t in job.get("combine", [])},
        quantized=({"gguf": job["quantized_gguf"],
                    "spec": row(runs["quantized-spec"], runs["quantized-plain"]),
                    "plain_tokens_per_s": row(runs["quantized-plain"], None)["tokens_per_s"]}
                   if "quantized-spec" in runs else None),
        tau_note="served tau counts llama.cpp's verification steps and accepted drafts; a draft is cut to "
                 "the tokens left - 1 near max_tokens (tools/server/server-context.cpp get_n_draft_max), "
                 "ours drafts the whole chain and counts emitted tokens: the last step of each prompt "
                 "differs",
        speedup_note="llama.cpp with / without the drafter on the same prompts at batch 1, one after the "
                     "other; not a figure on a host whose cores other work shares")
    if cfg.temperature:
        sampled_outputs(summary, "llamacpp-sampling")
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def ngram_types(text: str) -> tuple[str, ...]:
    """`--engine-ngram all|none|TYPE,...` (or `--engine-combine`) as the n-gram spec types, each once."""
    if text in ("all", ""):
        return NGRAM_TYPES
    return () if text == "none" else tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))


def format_llamacpp_summary(s: dict) -> str:
    """The vLLM eval's lines, then the n-gram rows and the quantized target's."""
    from draftsmith.eval.measure.engine_compare import format_engine_summary

    lines = [format_engine_summary(s)]
    combined = {f"{t} then the drafter": r for t, r in (s.get("combined") or {}).items()}
    for name, r in {**(s.get("ngram") or {}), **combined}.items():
        lines.append(f"{name}: tau {r['tau']}, alpha {r['alpha_by_position']}, {r['tokens_per_s']} tok/s "
                     f"(x{r['speedup']}), greedy equal {r['greedy_equal_count']}/{s['n_prompts']}"
                     if r.get("greedy_equal_count") is not None else f"{name}: tau {r['tau']}, alpha "
                     f"{r['alpha_by_position']}, {r['tokens_per_s']} tok/s (x{r['speedup']})")
    q = s.get("quantized")
    if q:
        r = q["spec"]
        lines.append(f"quantized target {Path(q['gguf']).name}: tau {r['tau']}, alpha "
                     f"{r['alpha_by_position']}, {r['tokens_per_s']} tok/s vs plain "
                     f"{q['plain_tokens_per_s']} (x{r['speedup']}), greedy equal "
                     f"{r['greedy_equal_count']}/{s['n_prompts']}")
    return "\n".join(lines)
