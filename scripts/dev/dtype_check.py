"""Which compute dtype pays on this machine: matmul and decode speed of the reference target per dtype, and
what `dtype: auto` resolves to here (bfloat16 only where the CPU multiplies it natively;
distill/loading.resolve_dtype).

    python scripts/dev/dtype_check.py OUT.json [--tokens 16]

A CPU without avx512_bf16/AMX runs bf16 matmuls of many rows (tree verification, prefill, training) and every
bf16 backward through torch's reference gemm: the figures in this JSON are what the README's dtype paragraph
quotes. Timings: keep the machine otherwise idle.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from draftsmith.distill.loading import ModelConfig, cpu_has_native, load_target, resolve_dtype
from draftsmith.eval.decode.machine import machine_info
from draftsmith.eval.measure.plan import verify_cost


def seconds(fn, repeat: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(name: str, dtype: torch.dtype, target_name: str, tokens: int):
    """One dtype: nn.Linear at the target's MLP shape (576 -> 1536) for 1 / 16 / 1536 rows (a decode step, a
    16-node verification, a training batch of 4 x 384), the same with its backward, a 128-token forward of the
    target and greedy decoding, and the target's cost to verify k new tokens after 256 of context."""
    w = torch.randn(1536, 576, dtype=dtype, requires_grad=True)
    row: dict = {"native": cpu_has_native(dtype)}
    for n in (1, 16, 1536):
        x = torch.randn(n, 576, dtype=dtype)
        row[f"linear_{n}_ms"] = round(1e3 * seconds(lambda x=x: torch.nn.functional.linear(x, w), 5), 3)
    x = torch.randn(1536, 576, dtype=dtype, requires_grad=True)
    row["linear_1536_fwd_bwd_ms"] = round(
        1e3 * seconds(lambda: torch.nn.functional.linear(x, w).sum().backward(), 3), 2)
    target = load_target(ModelConfig(target=target_name, dtype=name, device="cpu"))
    ids = target.chat_ids("What is speculative decoding? Answer in one sentence.")
    chunk = torch.randint(0, target.vocab_size, (1, 128))
    with torch.no_grad():
        row["target_forward_128_ms"] = round(1e3 * seconds(lambda: target.model(chunk), 3), 1)
    decode = seconds(lambda: target.generate([ids], max_new_tokens=tokens, min_new_tokens=tokens), 1)
    row["decode_tokens_per_s"] = round(tokens / decode, 2)
    # what a tree of k nodes costs to verify (the plan's curve)
    cost = verify_cost(target, ks=(1, 4, 8, 16, 32))
    row["verify_cost_ms"] = cost
    row["verify_cost_over_one_token"] = {k: round(v / cost[1], 2) for k, v in cost.items()}
    print(name, row, flush=True)
    return row, target


def main() -> None:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("out")
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--tokens", type=int, default=16, help="greedy tokens decoded per dtype")
    args = ap.parse_args()
    rows = {}
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        rows[name], target = measure(name, dtype, args.target, args.tokens)
    record = {"machine": machine_info(target), "auto_resolves_to": resolve_dtype("auto", "cpu"),
              "dtypes": rows, "bf16_over_fp32_time": {k: round(rows["bfloat16"][k] / rows["float32"][k], 2)
                                      for k, v in rows["float32"].items() if k.endswith("_ms")
                                                      and not isinstance(v, dict)}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
