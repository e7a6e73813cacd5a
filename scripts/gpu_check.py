"""GPU mechanics on random-weight Llama-shaped targets (no downloads): verification cost and decoder overhead.

Run by scripts/gpu_check.sh on a CUDA machine; writes runs/gpu/gpu_check.json. For each target size
(about 1B and 8B parameters, built from configs with random weights, bf16):

- verification cost curve: one forward of k new tokens (k = 1..64) on a 512-token cached context,
  with a tree mask for k > 1, in ms and relative to k = 1 — what a tree of k nodes costs per step;
- decoder overhead: plain greedy decoding of 128 tokens with our decoder (null proposer, the same
  loop every speculative run uses) against HF `generate`, tokens/s and ratio.

Random weights make acceptance meaningless, so no τ is reported here: only the cost side.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch
import transformers
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from draftsmith.distill.target import Target
from draftsmith.eval.decode.decoder import SpeculativeDecoder, hf_generate
from draftsmith.eval.decode.kv_cache import crop_cache
from draftsmith.eval.decode.tree import build_tree_buffers, position_ids, verification_mask

SIZES = {  # name -> Llama config (Llama-3.2-1B and Llama-3.1-8B shapes, 32k vocab to keep memory modest)
    "llama-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=32000),
    "llama-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=32000),
}


def build(name: str) -> Target:
    config = LlamaConfig(**SIZES[name], max_position_embeddings=4096, eos_token_id=None, bos_token_id=1)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return Target(model, tokenizer=None, name=name)


def cuda_ms(fn, repeats: int = 20) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats * 1000


@torch.inference_mode()
def verification_curve(target: Target, context: int = 512) -> dict:
    cache = DynamicCache(config=target.config)
    ids = torch.randint(3, 30000, (1, context), device="cuda")
    target.forward(ids, cache=cache, use_cache=True, logits_to_keep=1)
    rows = {}
    for k in (1, 2, 4, 8, 16, 32, 48, 64):
        parents = [-1] * min(k - 1, 4) + list(range(max(0, k - 1 - 4)))  # a bushy-then-deep tree of k-1 nodes
        bufs = build_tree_buffers(parents[: k - 1]).to("cuda")
        new = torch.randint(3, 30000, (1, k), device="cuda")
        mask = verification_mask(bufs.visible, context, target.dtype) if k > 1 else None
        pos = position_ids(bufs.depth, context) if k > 1 else None

        def step(new=new, mask=mask, pos=pos):
            target.forward(new, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True)
            crop_cache(cache, context)

        rows[k] = round(cuda_ms(step), 3)
    return {"context": context, "ms": rows, "relative": {k: round(v / rows[1], 3) for k, v in rows.items()}}


@torch.inference_mode()
def decoder_overhead(target: Target, new_tokens: int = 128) -> dict:
    prompt = torch.randint(3, 30000, (64,), generator=torch.Generator().manual_seed(0)).tolist()
    ours = SpeculativeDecoder(target)
    ours.generate(prompt, 16)
    hf_generate(target, prompt, 16)
    t_ours = min(ours.generate(prompt, new_tokens).wall_time for _ in range(3))
    t_hf = min(hf_generate(target, prompt, new_tokens, eos_token_id=None)[1] for _ in range(3))
    return {"new_tokens": new_tokens, "ours_tok_s": round(new_tokens / t_ours, 1), "hf_tok_s": round(new_tokens / t_hf, 1),
            "ours_over_hf": round(t_hf / t_ours, 3)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="runs/gpu/gpu_check.json")
    parser.add_argument("--sizes", default=",".join(SIZES))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA device")
    report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
              "transformers": transformers.__version__, "python": platform.python_version(),
              "command": "bash scripts/gpu_check.sh", "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
              "dtype": "bfloat16", "targets": {}}
    for name in args.sizes.split(","):
        target = build(name)
        params = sum(p.numel() for p in target.model.parameters())
        report["targets"][name] = {"parameters": params, "verification": verification_curve(target),
                                   "decoder_overhead": decoder_overhead(target)}
        print(name, json.dumps(report["targets"][name]), flush=True)
        del target
        torch.cuda.empty_cache()
        out = Path(args.out)  # written after every size: a run cut short by the lease keeps what it measured
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
