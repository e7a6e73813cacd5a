"""llama.cpp's server as the engine evals and plans drive it (eval/measure/engine_llamacpp.py,
engine_plan_llamacpp.py): `llama-server` on a free port (`llama_server`), one greedy or sampled
`/completion` per prompt at batch 1 (`decode`), the spec-decode counters at `/metrics` in the vLLM names
engine_summary reads (`metrics`, `delta`; heads/engines.py RULES["llamacpp-counters"]), and each run of a job
on its own server (`serve_runs`, its raw record engine.json)."""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from draftsmith.eval.measure.engine import EngineError
from draftsmith.eval.measure.engine_server import _stop, free_port
from draftsmith.heads import llamacpp
from draftsmith.heads.engines import amx_host, llamacpp_server_argv

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
