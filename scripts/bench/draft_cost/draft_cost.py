"""What drafting costs per verification on this machine: EAGLE-3 levels against one-forward blocks (P-EAGLE,
DFlash).

    python scripts/bench/draft_cost/draft_cost.py OUT.json [--limit 8] [--tokens 64] [--repeats 2]
        [--dtype float32]

Each arm is a drafter of the reference target built with a recipe's settings and random weights (cost does not
depend on training: an untrained drafter is rejected at its first token, so every step drafts the whole chain
or block), saved as a drafter folder and decoded by our decoder on the first `limit` Spec-Bench prompts x
`tokens` tokens at T=0. Per arm: drafting ms per verification (the decoder's step split, phase "draft" /
steps) and the target's verification ms per step beside it. Arms run in turn, `repeats` rounds (the spread
between rounds is the noise). An EAGLE-3 "level" is its chain-1 cost: one drafter forward and its lm_head over
the draft vocabulary. The JSON records the host and command;
`python scripts/bench/results_pages.py --add draft-cost OUT.json` publishes it. Only a run with nothing else
on the cores is a figure.
"""

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from draftsmith.eval.measure.campaign import command_line, host_block

VOCAB = 16384  # the smollm2 recipes' draft vocabulary (EAGLE-3, P-EAGLE and DFlash alike)
ARMS = [  # (name, kind, chain, kind settings)
    ("eagle3 chain-1 (one level)", "eagle3", 1, {"draft_vocab": VOCAB}),
    ("eagle3 chain-4", "eagle3", 4, {"draft_vocab": VOCAB}),
    ("eagle3 chain-8", "eagle3", 8, {"draft_vocab": VOCAB}),
    ("peagle block-4", "peagle", 4, {"draft_vocab": VOCAB}),
    ("peagle block-8", "peagle", 8, {"draft_vocab": VOCAB}),
    ("dflash block-4, full vocabulary", "dflash", 4, {"draft_vocab": 0}),
    ("dflash block-4", "dflash", 4, {"draft_vocab": VOCAB}),
    ("dflash block-8", "dflash", 8, {"draft_vocab": VOCAB}),
]


def build_arm(kind: str, k: int, own: dict, target, root: Path) -> Path:
    import torch

    from draftsmith.heads.files import target_signature
    from draftsmith.heads.registry import DrafterConfig, build_drafter

    cfg = DrafterConfig.for_kind(kind, num_speculative_tokens=k, **own)
    torch.manual_seed(0)
    counts = torch.arange(target.vocab_size).flip(0)  # which ids are "frequent" does not change the cost
    drafter = build_drafter(cfg, target.model, counts)
    return drafter.save_pretrained(root / f"{kind}-{k}-{own.get('draft_vocab')}", target=target.name,
                                   tokenizer=target.tokenizer,
                                   signature=target_signature(target.model, target.tokenizer))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    from draftsmith.distill.loading import load_target
    from draftsmith.eval.decode.decoder import SpeculativeDecoder
    from draftsmith.eval.measure.engine import chain_drafter
    from draftsmith.eval.measure.evaluate import EvalConfig, select_prompts
    from draftsmith.eval.serving import build_proposer
    from draftsmith.heads.registry import DrafterConfig

    target = load_target("smollm2-135m-instruct", dtype=args.dtype, device="cpu")
    prompts = [target.chat_ids(r["prompt"])
               for r in select_prompts(EvalConfig(prompts="spec-bench", limit=args.limit))]
    rounds: dict[str, list[dict]] = {name: [] for name, *_ in ARMS}
    with tempfile.TemporaryDirectory() as tmp:
        decoders = {}
        for name, kind, k, own in ARMS:
            folder = build_arm(kind, k, own, target, Path(tmp))
            cfg = chain_drafter(DrafterConfig(kind=kind, path=str(folder)), k)
            decoders[name] = SpeculativeDecoder(target, build_proposer(cfg, target))
            decoders[name].generate(prompts[0], 8)  # warm-up
        for r in range(args.repeats):
            for name, *_ in ARMS:
                steps = draft = verify = 0.0
                drafted = 0
                for prompt in prompts:
                    out = decoders[name].generate(prompt, args.tokens)
                    n = len(out.accept_lengths)
                    steps, drafted = steps + n, drafted + sum(out.draft_depths)
                    draft, verify = draft + out.phase_seconds["draft"], verify + out.phase_seconds["verify"]
                rounds[name].append({"steps": int(steps), "draft_ms": 1000 * draft / steps,
                                     "verify_ms": 1000 * verify / steps, "mean_draft_depth": drafted / steps})
                print(f"[draft-cost] round {r + 1} {name}: draft {rounds[name][-1]['draft_ms']:.2f} ms, "
                      f"verify {rounds[name][-1]['verify_ms']:.2f} ms per step", flush=True)
    arms = []
    for name, kind, k, own in ARMS:
        rs = rounds[name]
        arms.append({"name": name, "kind": kind, "k": k,
                     "draft_vocab": own.get("draft_vocab") or target.vocab_size,
                     "draft_ms": statistics.mean(r["draft_ms"] for r in rs),
                     "draft_ms_rounds": [round(r["draft_ms"], 3) for r in rs],
                     "verify_ms": statistics.mean(r["verify_ms"] for r in rs), "steps": rs[0]["steps"],
                     "mean_draft_depth": rs[0]["mean_draft_depth"]})
    level = arms[0]["draft_ms"]
    for a in arms:
        a["of_one_eagle3_level"] = a["draft_ms"] / level
    result = {"command": command_line(), "host": host_block(), "dtype": args.dtype, "limit": args.limit,
              "tokens": args.tokens, "repeats": args.repeats, "arms": arms,
              "notes": ["untrained drafters with the recipes' shapes (a 16,384-token draft vocabulary unless "
                        "the arm says full): cost only, no acceptance"]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
