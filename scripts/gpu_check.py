"""GPU mechanics on random-weight Llama-shaped targets (no downloads): verification cost and decoder overhead.

Run by scripts/gpu_check.sh on a CUDA machine; writes runs/gpu/gpu_check.json. For each target size
(about 1B and 8B parameters, built from configs with random weights, bf16):

- verification cost curve: one forward of k new tokens (k = 1..64) on a 512-token cached context,
  with a tree mask for k > 1, in ms and relative to k = 1 — what a tree of k nodes costs per step;
- decoder overhead: plain greedy decoding of 128 tokens with our decoder (null proposer, the same
  loop every speculative run uses) against HF `generate`, tokens/s and ratio;
- draft cost (`--draft-cost`, on by default): drafting ms per verification of untrained drafters built for the
  target as the recipes build them (16,384-token draft vocabulary): one EAGLE-3 level (chain 1), its chain of
  4, P-EAGLE and DFlash blocks of 4 and 8, each a decoder run's step split (the CPU twin:
  scripts/bench/draft_cost/draft_cost.py).

Random weights make acceptance meaningless, so no τ is reported here: only the cost side.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import torch
import transformers
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from draftsmith.distill.target import Target
from draftsmith.eval.decode.decoder import SpeculativeDecoder, hf_generate
from draftsmith.heads.runtime.kv_cache import crop_cache
from draftsmith.heads.runtime.tree import build_tree_buffers, position_ids, verification_mask

SIZES = {  # name -> Llama config (Llama-3.2-1B and Llama-3.1-8B shapes, 32k vocab to keep memory modest)
    "llama-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=32000),
    "llama-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=32000),
}


SIZES["llama-tiny"] = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                           # `--device cpu --sizes llama-tiny`: a smoke run
                           num_key_value_heads=2, vocab_size=32000)

DRAFT_VOCAB = 16384
DRAFT_ARMS = [("eagle3 chain-1 (one level)", "eagle3", 1), ("eagle3 chain-4", "eagle3", 4),
              ("peagle block-4", "peagle", 4), ("peagle block-8", "peagle", 8),
              ("dflash block-4", "dflash", 4), ("dflash block-8", "dflash", 8)]


def build(name: str, device: str = "cuda") -> Target:
    config = LlamaConfig(**SIZES[name], max_position_embeddings=4096, eos_token_id=None, bos_token_id=1)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16 if device == "cuda" else torch.float32)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return Target(model, tokenizer=None, name=name)


def cuda_ms(fn, repeats: int = 20) -> float:
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(3):
        fn()
    sync()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync()
    return (time.perf_counter() - start) / repeats * 1000


@torch.inference_mode()
def verification_curve(target: Target, context: int = 512) -> dict:
    device = target.device
    cache = DynamicCache(config=target.config)
    ids = torch.randint(3, 30000, (1, context), device=device)
    target.forward(ids, cache=cache, use_cache=True, logits_to_keep=1)
    rows = {}
    for k in (1, 2, 4, 8, 16, 32, 48, 64):
        parents = [-1] * min(k - 1, 4) + list(range(max(0, k - 1 - 4)))  # a bushy-then-deep tree of k-1 nodes
        bufs = build_tree_buffers(parents[: k - 1]).to(device)
        new = torch.randint(3, 30000, (1, k), device=device)
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
    return {"new_tokens": new_tokens, "ours_tok_s": round(new_tokens / t_ours, 1),
            "hf_tok_s": round(new_tokens / t_hf, 1), "ours_over_hf": round(t_hf / t_ours, 3)}


@torch.inference_mode()
def draft_cost(target: Target, prompts: int = 4, new_tokens: int = 64, rounds: int = 3) -> dict:
    """Drafting ms per verification of each DRAFT_ARMS drafter (random weights: every step drafts the whole
    chain or block), from our decoder's step split over `prompts` random prompts; relative to one EAGLE-3
    level."""
    from draftsmith.eval.measure.engine import chain_drafter
    from draftsmith.eval.serving import build_proposer
    from draftsmith.heads.registry import DrafterConfig, build_drafter

    gen = torch.Generator().manual_seed(1)
    inputs = [torch.randint(3, 30000, (64,), generator=gen).tolist() for _ in range(prompts)]
    counts = torch.arange(target.vocab_size).flip(0)  # which ids are "frequent" does not change the cost
    arms, decoders = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, kind, k in DRAFT_ARMS:
            cfg = DrafterConfig.for_kind(kind, num_speculative_tokens=k, draft_vocab=DRAFT_VOCAB)
            torch.manual_seed(0)
            folder = build_drafter(cfg, target.model, counts).save_pretrained(f"{tmp}/{kind}-{k}",
                                                                              target=target.name)
            decoders[name] = SpeculativeDecoder(target, build_proposer(
                chain_drafter(DrafterConfig(kind=kind, path=str(folder)), k), target))
            decoders[name].generate(inputs[0], 8)  # warm-up
        for _ in range(rounds):  # arms in turn, every round: the spread between rounds is the noise
            for name, kind, k in DRAFT_ARMS:
                steps = draft = verify = 0.0
                for prompt in inputs:
                    out = decoders[name].generate(prompt, new_tokens)
                    steps += len(out.accept_lengths)
                    draft, verify = draft + out.phase_seconds["draft"], verify + out.phase_seconds["verify"]
                arm = arms.setdefault(name,
                                      {"kind": kind, "k": k, "draft_ms_rounds": [], "verify_ms_rounds": [],
                                             "steps": int(steps)})
                arm["draft_ms_rounds"].append(round(1000 * draft / steps, 3))
                arm["verify_ms_rounds"].append(round(1000 * verify / steps, 3))
        del decoders
    for arm in arms.values():
        # best round: launch-bound forwards only gain noise
        arm["draft_ms"] = round(min(arm["draft_ms_rounds"]), 3)
        arm["verify_ms"] = round(min(arm["verify_ms_rounds"]), 3)
    level = arms[DRAFT_ARMS[0][0]]["draft_ms"]
    for arm in arms.values():
        arm["of_one_eagle3_level"] = round(arm["draft_ms"] / level, 3)
    return {"draft_vocab": DRAFT_VOCAB, "prompts": prompts, "new_tokens": new_tokens, "rounds": rounds,
            "arms": arms}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="runs/gpu/gpu_check.json")
    parser.add_argument("--sizes", default="llama-1b,llama-8b")
    parser.add_argument("--device", default="cuda",
                        help="cpu: a smoke run of the script (use --sizes llama-tiny)")
    parser.add_argument("--no-draft-cost", dest="draft_cost", action="store_false")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA device")
    cuda = args.device == "cuda"
    report = {"device": torch.cuda.get_device_name(0) if cuda else "cpu", "torch": torch.__version__,
              "cuda": torch.version.cuda,
              "transformers": transformers.__version__, "python": platform.python_version(),
              "command": "bash scripts/gpu_check.sh",
              "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
              "dtype": "bfloat16" if cuda else "float32", "targets": {}}
    for name in args.sizes.split(","):
        target = build(name, args.device)
        params = sum(p.numel() for p in target.model.parameters())
        report["targets"][name] = {"parameters": params, "verification": verification_curve(target),
                                   "decoder_overhead": decoder_overhead(target)}
        if args.draft_cost:
            report["targets"][name]["draft_cost"] = draft_cost(target)
        print(name, json.dumps(report["targets"][name]), flush=True)
        del target
        torch.cuda.empty_cache()
        out = Path(args.out)  # written after every size: a run cut short by the lease keeps what it measured
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
