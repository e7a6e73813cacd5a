"""Decoder-loop speed on the reference target, for comparing two draftsmith trees (a refactor's before/after).

One process = one tree: times plain decoding and prompt lookup at batch 1 and batch 4 with that tree's
decoder, and HF `generate` at the same batch sizes, over the same Spec-Bench prompts (bf16, greedy),
after an untimed warm-up; writes one JSON. It runs on trees before the one-loop decoder
(a batch-1 decoder beside a separate batched loop) and after it (`SpeculativeDecoder.generate_batch`,
eval/decode/decoder.py).
`scripts/bench/loop_speed/loop_speed.sh` alternates two trees' runs and takes medians.

    python scripts/bench/loop_speed/loop_speed.py --out OUT.json [--limit 16] [--tokens 64]
        [--only plain-b4,hf-b4]
"""

from __future__ import annotations

import argparse
import json

import torch

from draftsmith.distill.loading import load_target
from draftsmith.eval.measure.evaluate import EvalConfig, select_prompts
from draftsmith.eval.serving import build_proposer
from draftsmith.heads.registry import DrafterConfig
from draftsmith.heads.runtime.verify import SamplingConfig


def decoders(target, proposer):
    """(one-sequence generate, batch generate) of this tree, for a proposer (None = plain)."""
    try:  # one loop for every batch size
        from draftsmith.eval.decode.decoder import SpeculativeDecoder

        dec = SpeculativeDecoder(target, proposer)
        dec.generate_batch  # noqa: B018 (older trees lack it)
        return dec.generate, dec.generate_batch
    except AttributeError:  # before: decoder.py for batch 1, batched.py for batches
        from draftsmith.eval.batched import BatchedSpeculativeDecoder
        from draftsmith.eval.decode.decoder import SpeculativeDecoder

        return SpeculativeDecoder(target, proposer).generate, BatchedSpeculativeDecoder(target,
                                                                                        proposer).generate


def hf_batch():
    """This tree's timed HF `generate` on a left-padded batch: (outputs, seconds)."""
    try:
        from draftsmith.eval.decode.decoder import hf_generate_batch
    except ImportError:  # before: it lived in the bench
        from draftsmith.eval.measure.bench import hf_generate_batch
    return hf_generate_batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--limit", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--only", default="", help="comma-separated cells to time (default all: "
                        "plain-b1,plain-b4,prompt-lookup-b1,prompt-lookup-b4,hf-b1,hf-b4)")
    args = parser.parse_args()
    target = load_target("smollm2-135m-instruct", dtype="bfloat16", device="cpu")
    prompts = [target.chat_ids(r["prompt"])
               for r in select_prompts(EvalConfig(prompts="spec-bench", limit=args.limit))]
    wanted = set(filter(None, args.only.split(","))) or None
    result = {"threads": torch.get_num_threads(), "limit": args.limit, "tokens": args.tokens}
    for name, cfg in (("plain", None), ("prompt-lookup", DrafterConfig(kind="prompt-lookup"))):
        if wanted and not wanted & {f"{name}-b1", f"{name}-b4"}:
            continue
        proposer = build_proposer(cfg, target) if cfg else None
        one, many = decoders(target, proposer)
        one(prompts[0], 8)  # warm-up
        many(prompts[:4], 8)
        if not wanted or f"{name}-b1" in wanted:
            tok = sec = 0.0
            for p in prompts:
                r = one(p, args.tokens)
                tok, sec = tok + r.new_tokens, sec + r.wall_time
            result[f"{name}-b1"] = tok / sec
        if not wanted or f"{name}-b4" in wanted:
            tok = sec = 0.0
            for b in range(0, len(prompts), 4):
                r = many(prompts[b: b + 4], args.tokens)
                tok, sec = tok + r.new_tokens, sec + r.wall_time
            result[f"{name}-b4"] = tok / sec
    hf = hf_batch()
    for batch in (1, 4):
        if wanted and f"hf-b{batch}" not in wanted:
            continue
        hf(target, prompts[:batch], 8, SamplingConfig())
        tok = sec = 0.0
        for b in range(0, len(prompts), batch):
            outs, seconds = hf(target, prompts[b: b + batch], args.tokens, SamplingConfig())
            tok, sec = tok + sum(map(len, outs)), sec + seconds
        result[f"hf-b{batch}"] = tok / sec
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
