"""Choose prompt lookup's datastore settings offline: replay the target's own greedy answers through the real
proposer.

Greedy speculative decoding accepts the longest draft path that the target's greedy answer continues with,
plus the bonus token, so given the answers τ of any prompt-lookup configuration (chain, trie, datastore path)
is a replay of `PromptLookupProposer.continuations` along them — no target forward per configuration. The
answers come from HF `generate` (bf16 by default, batch 8: a bf16 near-tie can differ from batch 1, so τ here
is an estimate), on a prompt split disjoint from the one bench and eval time (default Spec-Bench from prompt
40 on: choose here, report there). The estimated speedup divides τ by the step's verification cost from this
machine's measured curve (plan's `verify_cost`: k draft nodes + the root), ignoring drafting cost (a lookup
costs well under a millisecond).

    # writes the JSON and prints the table
    python scripts/bench/serving_speed/datastore_sim.py --out runs/datastore-sim.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import numpy as np
import torch

from draftsmith.distill.loading import load_target
from draftsmith.eval.decode.decoder import hf_generate_batch
from draftsmith.eval.measure.evaluate import EvalConfig, select_prompts
from draftsmith.eval.measure.plan import verify_cost
from draftsmith.heads.prompt_lookup.datastore import load_datastore
from draftsmith.heads.prompt_lookup.proposer import PromptLookupProposer

SOURCES = ["smollm2-selfdistill-4k", "smollm2-selfdistill-extra"]


def replay(proposer: PromptLookupProposer, prompt: list[int], answer: list[int],
           cost) -> tuple[int, int, int, float]:
    """(tokens, steps, draft nodes, cost in plain steps) of greedy speculative decoding of `answer` after
    `prompt` with `proposer`; `cost(k)`: a forward of k new tokens in one-token forwards."""
    i = steps = nodes = 0
    spent = 0.0
    while i < len(answer):
        context, truth = prompt + answer[:i], answer[i:]
        paths = proposer.continuations(context)
        accepted = max((next((j for j, (x, y) in enumerate(zip(p, truth)) if x != y), min(len(p), len(truth)))
                        for p in paths), default=0)
        tree = len({tuple(p[: d + 1]) for p in paths for d in range(len(p))})
        nodes, spent = nodes + tree, spent + cost(tree + 1)
        i += min(accepted + 1, len(answer) - i)
        steps += 1
    return len(answer), steps, nodes, spent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--offset", type=int, default=40)
    ap.add_argument("--limit", type=int, default=40)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--datastore", default=",".join(SOURCES),
                    help="comma-separated data sources (their answers)")
    ap.add_argument("--out", default="runs/datastore-sim.json")
    args = ap.parse_args()

    torch.manual_seed(0)
    target = load_target(args.target, dtype=args.dtype)
    records = select_prompts(EvalConfig(limit=args.limit, offset=args.offset))
    prompts = [target.chat_ids(r["prompt"]) for r in records]
    start = time.time()
    answers = []
    for i in range(0, len(prompts), 8):
        answers += hf_generate_batch(target, prompts[i: i + 8], args.max_new_tokens)[0]
    generated = time.time() - start
    curve = verify_cost(target)
    ks = sorted(curve)

    # verifying k tokens, in one-token forwards, linear between the measured points
    def cost(k: int) -> float:
        return float(np.interp(k, ks, [curve[x] for x in ks])) / curve[1]

    sources = [s for s in args.datastore.split(",") if s]
    rows = []
    for chain, matches, ds_tokens, ngram in itertools.chain(
            [(5, 1, 0, 4), (8, 1, 0, 4), (8, 3, 0, 4)],
            itertools.product([5], [1], [1, 2, 3, 5, 8], [4]),
            itertools.product([5], [1], [3], [2, 3, 6]),
            [(3, 1, 3, 4), (8, 3, 3, 4)]):
        store = load_datastore(sources, target.tokenizer, ngram) if ds_tokens else None
        proposer = PromptLookupProposer(chain, 3, 1, matches, store, ds_tokens or 3)
        tokens = steps = nodes = 0
        spent = 0.0
        for prompt, answer in zip(prompts, answers):
            t, s, n, c = replay(proposer, prompt, answer, cost)
            tokens, steps, nodes, spent = tokens + t, steps + s, nodes + n, spent + c
        # a step's verification in plain steps (drafting not counted)
        tau, step_cost = tokens / steps, spent / steps
        rows.append({"chain": chain, "matches": matches, "datastore_tokens": ds_tokens,
                     "datastore_ngram_max": ngram, "tree": proposer.tree, "tau": round(tau, 4),
                     "mean_draft_nodes": round(nodes / steps, 2), "step_cost": round(step_cost, 4),
                     "estimated_speedup": round(tau / step_cost, 4)})
        print(f"{proposer.tree:44s} ngram<={ngram}  τ {tau:.3f}  nodes {nodes / steps:.2f}  est "
              f"×{tau / step_cost:.3f}", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"target": args.target, "dtype": args.dtype, "prompts": "spec-bench",
                               "offset": args.offset, "n_prompts": len(prompts),
                               "max_new_tokens": args.max_new_tokens, "datastore": sources,
                               "generate_seconds": round(generated, 1), "verify_cost_ms": curve,
                               "rows": rows}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
