"""Which compute dtype pays on this machine: matmul and decode speed of the reference target per dtype, and what
`dtype: auto` resolves to here (bfloat16 only where the CPU multiplies it natively; distill/target.resolve_dtype).

    python scripts/dtype_check.py OUT.json [--tokens 16]

A CPU without avx512_bf16/AMX runs bf16 matmuls through torch's reference gemm, two orders of magnitude slower than
fp32: the figures in this JSON are what the README's dtype paragraph quotes. Timings: keep the machine otherwise idle.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from draftsmith.distill.target import ModelConfig, cpu_has_native, load_target, resolve_dtype
from draftsmith.eval.machine import machine_info


def seconds(fn, repeat: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(name: str, dtype: torch.dtype, target_name: str, tokens: int):
    a, b = torch.randn(1536, 576, dtype=dtype), torch.randn(576, 4096, dtype=dtype)  # 4 x 384 tokens x (H -> 4096)
    x, w = torch.randn(1, 576, dtype=dtype), torch.randn(576, 49152, dtype=dtype)  # one token through the lm_head
    target = load_target(ModelConfig(target=target_name, dtype=name, device="cpu"))
    ids = target.chat_ids("What is speculative decoding? Answer in one sentence.")
    decode = seconds(lambda: target.generate([ids], max_new_tokens=tokens, min_new_tokens=tokens), 1)
    row = {"matmul_1536x576x4096_s": round(seconds(lambda: a @ b, 3), 4),
           "gemv_576x49152_s": round(seconds(lambda: x @ w, 5), 5),
           "decode_tokens_per_s": round(tokens / decode, 2), "native": cpu_has_native(dtype)}
    print(name, row, flush=True)
    return row, target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--tokens", type=int, default=16, help="greedy tokens decoded per dtype")
    args = ap.parse_args()
    rows = {}
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        rows[name], target = measure(name, dtype, args.target, args.tokens)
    record = {"machine": machine_info(target), "auto_resolves_to": resolve_dtype("auto", "cpu"), "dtypes": rows,
              "bf16_over_fp32_decode_time": round(rows["float32"]["decode_tokens_per_s"]
                                                  / rows["bfloat16"]["decode_tokens_per_s"], 2)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
