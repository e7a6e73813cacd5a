"""Our drafters served by llama.cpp (build 11434, `draftsmith engine install llamacpp`) beside our own
decoder:

    draftsmith eval --engine llamacpp --drafter DIR [--tree chain-K] [--engine-ngram all|none|TYPE,...]
                    [--engine-draft-threads N]

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
  `--spec-draft-n-max k`; then plain (no drafter), then each n-gram spec type (the drafter-free rows), then,
  where the target came from a quantized GGUF (a preset, or a .gguf target), that GGUF as it is with and
  without the drafter (its figures beside).

Every run is one server (`--metrics`, one slot, every core); each prompt is one `/completion` request with
the prompt as draftsmith's chat-templated token ids (so both sides decode the same tokens) and
`return_tokens`. Served α per position comes from llama.cpp's own counters at `/metrics`
(`spec_decode_num_drafts_total`: verification steps; `spec_decode_num_accepted_tokens_per_pos_total`),
read before and after the timed prompts (heads/engines.py RULES["llamacpp-counters"]); the per-request
`timings.draft_n` / `draft_n_accepted` are kept in engine.json too. `summary.json`: the vLLM eval's keys,
`engine: llamacpp`, plus `ngram` (per spec type: τ, α by position, tok/s, speedup, greedy equality) and
`quantized` (the quantized target's spec and plain figures).
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import math
import os
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from draftsmith.eval.measure.engine import EngineError, chain_k, chain_serving, planned_chain
from draftsmith.eval.measure.engine_compare import engine_summary, sampled_outputs
from draftsmith.eval.measure.engine_server import _stop, free_port
from draftsmith.eval.serving import Serving
from draftsmith.heads import llamacpp
from draftsmith.heads.engines import amx_host, llamacpp_server_argv, llamacpp_spec_type

LLAMACPP_PLAN = "serving-llamacpp.json"  # its engine plan (eval/measure/engine_plan_llamacpp.py)
NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
# llama.cpp's /metrics names -> the counter names engine_summary reads (vLLM's)
COUNTERS = {"llamacpp:spec_decode_num_drafts_total": "vllm:spec_decode_num_drafts",
            "llamacpp:spec_decode_num_draft_tokens_total": "vllm:spec_decode_num_draft_tokens",
            "llamacpp:spec_decode_num_accepted_tokens_total": "vllm:spec_decode_num_accepted_tokens"}
PER_POS = re.compile(r'llamacpp:spec_decode_num_accepted_tokens_per_pos_total\{position="(\d+)"\} (\S+)')
REQUEST_SECONDS = 1800.0


def _post(url: str, body: dict, timeout: float = REQUEST_SECONDS) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def metrics(base: str) -> dict:
    """llama.cpp's spec-decode counters now, in engine_summary's names (per position as a list)."""
    with urllib.request.urlopen(base + "/metrics", timeout=30) as response:
        text = response.read().decode()
    out = {name: 0 for name in COUNTERS.values()}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in COUNTERS:
            out[COUNTERS[name]] = int(float(value))
    per_pos = sorted((int(m.group(1)), int(float(m.group(2)))) for m in PER_POS.finditer(text))
    out["vllm:spec_decode_num_accepted_tokens_per_pos"] = [v for _, v in per_pos]
    return out


def delta(after: dict, before: dict) -> dict:
    key = "vllm:spec_decode_num_accepted_tokens_per_pos"
    out = {k: after[k] - before[k] for k in COUNTERS.values()}
    prev = before[key] + [0] * (len(after[key]) - len(before[key]))
    out[key] = [a - b for a, b in zip(after[key], prev)]
    return out


def _die_with_parent() -> None:
    """In the server's process: SIGKILL it when draftsmith dies (a SIGTERM or SIGKILL that skips the `finally`
    below would otherwise leave it serving; Linux's PR_SET_PDEATHSIG, nothing elsewhere)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


@contextmanager
def llama_server(argv: list[str], log: Path, timeout: float = 600.0) -> Iterator[str]:
    """`argv` (llamacpp_server_argv's, its first word the binary's name) listening on a free port; yield the
    base url once /health answers; stop the server (its process group) when the block ends."""
    port = free_port()
    command = [str(llamacpp.binary(argv[0])), *argv[1:], "--host", "127.0.0.1", "--port", str(port)]
    base = f"http://127.0.0.1:{port}"
    with open(log, "w") as fh:
        fh.write(" ".join(command) + "\n")
        fh.flush()
        proc = subprocess.Popen(command, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=_die_with_parent)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
                raise EngineError(f"llama-server exited (code {proc.returncode}) before answering; {log} "
                                  f"ends:\n{tail}")
            try:
                with urllib.request.urlopen(base + "/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise EngineError(f"llama-server did not answer on {base}/health within {timeout:.0f} s; see "
                                  f"{log}")
            time.sleep(0.5)
        yield base
    finally:
        _stop(proc)


def sampler_params(sampling: dict) -> dict:
    """A /completion request's sampling fields for our law (heads/runtime/verify.py logits_to_probs:
    temperature, then top-k, then top-p): llama.cpp's other samplers off (its defaults keep top-k 40, top-p
    0.95, min-p 0.05) and its chain in our order (RULES["llamacpp-sampling"]). T=0 is greedy."""
    if not sampling.get("temperature"):
        return {"temperature": 0.0}
    return {"temperature": sampling["temperature"], "top_k": sampling.get("top_k", 0),
            "top_p": sampling.get("top_p", 1.0), "min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0,
            "samplers": ["top_k", "temperature", "top_p"]}


def complete(base: str, ids: list[int], max_tokens: int, sampling: dict | None = None,
             seed: int = 0) -> tuple[dict, float]:
    """One /completion of token ids (greedy, or sampled with `sampling`'s law and `seed`); (response, wall
    seconds)."""
    t0 = time.perf_counter()
    body = {"prompt": ids, "n_predict": max_tokens, **sampler_params(sampling or {}), "cache_prompt": False,
            "return_tokens": True, "seed": seed}
    out = _post(base + "/completion", body)
    return out, time.perf_counter() - t0


def decode(base: str, prompts: list[list[int]], max_tokens: int, stop_ids: list[int], warmup: int,
           sampling: dict | None = None) -> dict:
    """Every prompt in order at batch 1: wall seconds, output ids (the stop token kept, as ours keep it),
    per-request timings and the counters' deltas. Sampled runs seed prompt i with `sampling["seed"] + i`."""
    sampling = sampling or {}
    for ids in prompts[:warmup]:  # untimed: kernels, allocator; their counters are left out by the delta
        complete(base, ids, min(16, max_tokens), sampling)
    before, outputs, timings, seconds = metrics(base), [], [], 0.0
    for i, ids in enumerate(prompts):
        out, wall = complete(base, ids, max_tokens, sampling, sampling.get("seed", 0) + i)
        tokens = list(out.get("tokens") or [])
        if out.get("stop_type") == "eos" and (not tokens or tokens[-1] not in stop_ids):
            tokens.append(stop_ids[0])  # llama.cpp leaves the end-of-generation token out of `tokens`
        outputs.append(tokens)
        timings.append(out.get("timings", {}))
        seconds += wall
    return {"seconds": seconds, "output_ids": outputs, "new_tokens": sum(len(o) for o in outputs),
            "timings": timings, "counters": delta(metrics(base), before)}


def server_extra(ctx: int, kv: str, draft: bool, draft_threads: int | None = None) -> tuple[str, ...]:
    """The flags every run shares: one slot, every core ($DRAFTSMITH_LLAMACPP_THREADS: fewer, e.g. 1 on a host
    whose cores other work shares: llama.cpp's threads wait for each other at every op, and a descheduled
    one stalls them all), the context, /metrics, the KV cache type; `draft_threads` gives the draft model
    its own count (`-td`/`-tbd`; the same as the target's by default)."""
    threads = os.environ.get("DRAFTSMITH_LLAMACPP_THREADS") or str(os.cpu_count() or 1)
    extra = ["-np", "1", "-t", threads, "-tb", threads, "-c", str(ctx), "--metrics", "--no-webui", "-ctk", kv,
             "-ctv", kv]
    if draft:
        extra += ["--spec-draft-type-k", kv, "--spec-draft-type-v", kv]
        if draft_threads:
            extra += ["-td", str(draft_threads), "-tbd", str(draft_threads)]
    return tuple(extra)


def serve_runs(job: dict, out_dir: Path) -> dict:
    """Each run of the job on its own server; the raw record (engine.json), written after every run."""
    raw_path = out_dir / "engine.json"
    raw = {"host": host(), "runs": []}
    for run in job["runs"]:
        spec, draft = run.get("spec_type"), run.get("draft")
        argv = llamacpp_server_argv(run["model"], spec, draft, run.get("k", job["k"]),
                                    server_extra(job["ctx"], run["kv"], draft is not None,
                                                 run.get("draft_threads")),
                                    p_min=run.get("p_min", 0.0))
        print(f"[engine] llama.cpp run {run['name']}: {' '.join(argv)}", flush=True)
        t0 = time.perf_counter()
        with llama_server(argv, out_dir / f"server-{run['name']}.log") as base:
            loaded = time.perf_counter() - t0
            record = decode(base, job["prompts"], job["max_tokens"], job["stop_token_ids"], job["warmup"],
                            job.get("sampling"))
        raw["runs"].append({"name": run["name"], "argv": argv, "load_seconds": round(loaded, 2),
                            "by_concurrency": {"1": record}})
        raw_path.write_text(json.dumps(raw))
    return raw


def host() -> dict:
    done = subprocess.run([str(llamacpp.binary()), "--version"], capture_output=True, text=True)
    version = (done.stdout + done.stderr).strip().splitlines()
    # the binary says build 0 (no .git in the sdist): the build is the sdist's
    # (eval/measure/llamacpp_install.py)
    return {"engine_version": str(llamacpp.BUILD), "version_lines": version, "cpu_count": os.cpu_count(),
            "threads": os.environ.get("DRAFTSMITH_LLAMACPP_THREADS") or os.cpu_count(), "amx": amx_host()}


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
             quantized: bool = True, draft_threads: int | None = None) -> dict:
    """The GGUFs (target and drafter in the eval dtype, converted once) and the runs to serve (the quantized
    target's pair only with `quantized`; the drafter's runs with `-td/-tbd draft_threads` where given)."""
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
            "quantized_gguf": str(quantized) if quantized else None, "draft_threads": draft_threads}


def run_llamacpp_eval(serving: Serving, cfg, out_dir: str | Path, ngram: tuple[str, ...] = NGRAM_TYPES,
                      progress: bool = True, quantized: bool = True,
                      draft_threads: int | None = None) -> dict:
    """Serve `serving`'s drafter folder in llama.cpp and with our decoder on the same prompts (module doc);
    write summary.json, job.json, engine.json, ours/, export/gguf/ and one server log per run. The draft model
    runs on `draft_threads` threads, else on the count the folder's llama.cpp plan chose with its chain, else
    on the target's."""
    from draftsmith.distill.loading import load_target
    from draftsmith.eval.measure.evaluate import run_eval

    llamacpp.require()
    if serving.folder is None:
        raise ValueError("--engine llamacpp serves a drafter folder: pass --drafter DIR")
    unknown = [t for t in ngram if t not in NGRAM_TYPES]
    if unknown:
        raise ValueError(f"--engine-ngram {','.join(unknown)}: llama.cpp's n-gram types are "
                         f"{', '.join(NGRAM_TYPES)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    k = chain_k(serving, LLAMACPP_PLAN)
    if draft_threads is not None and draft_threads < 1:
        raise ValueError(f"--engine-draft-threads {draft_threads}: give the draft model 1 or more threads")
    planned = planned_chain(serving.folder.path / LLAMACPP_PLAN)
    if draft_threads is None and not serving.drafter.tree and planned:
        draft_threads = planned[1]
    target = load_target(serving.model, dtype=cfg.dtype or serving.model.dtype)
    # at T > 0 our decoder drafts as llama.cpp does: the argmax, verified as one-hot
    # (RULES["llamacpp-sampling"])
    ours_cfg = dataclasses.replace(cfg, baselines=False, out=str(out_dir / "ours"), draft_sampling="greedy")
    ours = run_eval(chain_serving(serving, k), ours_cfg, out_dir / "ours", progress=progress, target=target)
    our_samples = [json.loads(line) for line in (out_dir / "ours" / "samples.jsonl").read_text().splitlines()]
    job = make_job(serving, cfg, out_dir, target, k, ngram, quantized, draft_threads)
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
    """`--engine-ngram all|none|TYPE,...` as the n-gram spec types to serve."""
    if text in ("all", ""):
        return NGRAM_TYPES
    return () if text == "none" else tuple(t.strip() for t in text.split(",") if t.strip())


def format_llamacpp_summary(s: dict) -> str:
    """The vLLM eval's lines, then the n-gram rows and the quantized target's."""
    from draftsmith.eval.measure.engine_compare import format_engine_summary

    lines = [format_engine_summary(s)]
    for name, r in (s.get("ngram") or {}).items():
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
