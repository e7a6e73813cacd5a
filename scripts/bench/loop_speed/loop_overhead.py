"""Where a decoder loop's time goes: the target's forward vs everything else, for comparing two draftsmith
trees.

One process = one tree (run it with each tree's python): plain decoding at batch 4 on Spec-Bench prompts
(bf16, greedy, after an untimed warm-up), timing every `Target.forward` call. Writes one JSON: wall seconds,
forward seconds, the fraction outside the forward, forward calls, tokens, and the first forwards' input shapes
and mask dtypes (equal inputs mean equal work for the target).

    python scripts/bench/loop_speed/loop_overhead.py --out OUT.json [--limit 8] [--tokens 64] [--batch 4]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from loop_speed import decoders  # this folder's loop_speed.py: the same per-tree decoder choice

from draftsmith.distill.loading import load_target
from draftsmith.distill.target import Target
from draftsmith.eval.measure.evaluate import EvalConfig, select_prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4)
    args = parser.parse_args()
    target = load_target("smollm2-135m-instruct", dtype="bfloat16", device="cpu")
    prompts = [target.chat_ids(r["prompt"])
               for r in select_prompts(EvalConfig(prompts="spec-bench", limit=args.limit))]
    acc = {"seconds": 0.0, "calls": 0, "inputs": []}
    forward = Target.forward

    def timed_forward(self, *a, **k):
        start = time.perf_counter()
        out = forward(self, *a, **k)
        acc["seconds"] += time.perf_counter() - start
        acc["calls"] += 1
        if len(acc["inputs"]) < 3:
            ids, mask = (a[0] if a else k["input_ids"]), k.get("attention_mask")
            acc["inputs"].append({"ids": list(ids.shape),
                                  "mask": None if mask is None else [list(mask.shape), str(mask.dtype)]})
        return out

    Target.forward = timed_forward
    _, many = decoders(target, None)
    many(prompts[: args.batch], 8)  # warm-up
    acc.update(seconds=0.0, calls=0, inputs=[])
    wall = tokens = 0
    for b in range(0, len(prompts), args.batch):
        r = many(prompts[b: b + args.batch], args.tokens)
        wall, tokens = wall + r.wall_time, tokens + r.new_tokens
    result = {"batch": args.batch, "limit": args.limit, "tokens": args.tokens, "wall_seconds": wall,
              "forward_seconds": acc["seconds"], "outside_forward_fraction": (wall - acc["seconds"]) / wall,
              "forward_calls": acc["calls"], "new_tokens": tokens, "first_inputs": acc["inputs"]}
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
