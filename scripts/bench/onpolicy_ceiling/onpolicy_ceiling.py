"""How off-policy is training-time test on a recipe's answers? The ceiling of on-policy drafter training (#40
item 3).

    python scripts/bench/onpolicy_ceiling/onpolicy_ceiling.py OUT.json [-c smollm2-eagle3] [--limit 256]
        [--dtypes float32 bfloat16] [--depth 5] [--seed 0]

At T=0 a verification accepts a drafted token only where it is the target's argmax after the accepted prefix,
so the prefixes a drafter is judged on are the target's own greedy continuations. Training-time test
(heads/eagle/model.py `unroll`) trains depth j at query t on the data's tokens x_{t-j+2..t+1} as the
already-drafted prefix: that prefix is one a verification accepts exactly where each of those j tokens is the
target's argmax after the data before it. On-policy training (Draft-OPD, arXiv 2605.29343: the drafter's own
rollouts, the target's distribution at the prefixes they reach) changes what depth j trains on only at the
other positions. This measures that share on the recipe's own training answers, teacher-forced through the
target in each dtype:

- `token_agreement`: answer tokens equal to the target's argmax given the data before them;
- `onpolicy_share[j]`: positions of TTT depth j (the label x_p an answer token, its base p-2-j >= 0, as
  `unroll` counts them) whose j preceding tokens (the drafted
  prefix) agree wherever they are answer tokens (prompt tokens are given) -- the share of depth j's training
  that is already on-policy at T=0;
- `answers_identical`: answers the target's greedy decoding reproduces token for token (teacher-forced).

Rows are a seeded sample of the config's training rows (`data.train`, tokenised as training does,
`data.max_length` cuts included). Loads the target: run it alone on the cores.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from draftsmith.eval.measure.campaign import command_line, host_block


def agreement(model, rows: list[dict], depth: int) -> dict:
    """Teacher-forced agreement of `rows` (input_ids, loss_mask) with `model`'s argmax, one row at a time (no
    padding, so no batch-shape rounding). Returns the counts and shares described in the module docstring."""
    import torch

    device = next(model.parameters()).device
    agree_n = tokens = identical = 0
    onpolicy, counted = [0] * depth, [0] * depth
    for row in rows:
        ids = torch.tensor(row["input_ids"], device=device)
        mask = torch.tensor(row["loss_mask"], dtype=torch.bool)
        with torch.no_grad():
            # [T-1]: prediction of x_{p}, p >= 1
            pred = model(input_ids=ids[None]).logits[0, :-1].argmax(-1).cpu()
        ok = torch.zeros(len(mask), dtype=torch.bool)
        ok[1:] = pred == ids[1:].cpu()
        answer = mask.clone()
        answer[0] = False  # the first token has no prediction
        agree_n += int(ok[answer].sum())
        tokens += int(answer.sum())
        identical += bool(ok[answer].all())
        last_bad = -1  # the last answer token before p that is not the target's argmax
        for p in range(len(mask)):
            if answer[p]:
                # depth j: label x_p, drafted after x_{p-j..p-1} from base p-2-j >= 0
                for j in range(min(depth, p - 1)):
                    counted[j] += 1
                    onpolicy[j] += last_bad < p - j
                if not ok[p]:
                    last_bad = p
    return {"sequences": len(rows), "answer_tokens": tokens, "token_agreement": agree_n / max(tokens, 1),
            "answers_identical": identical / max(len(rows), 1),
            "onpolicy_share": [onpolicy[j] / max(counted[j], 1) for j in range(depth)], "counted": counted}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, help="output JSON")
    parser.add_argument("-c", "--config", default="smollm2-eagle3",
                        help="the recipe whose training answers to read")
    parser.add_argument("--limit", type=int, default=256, help="rows sampled (seeded) from the training rows")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--depth", type=int, default=5, help="TTT depths reported (0..depth-1)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.limit < 1 or args.depth < 1:
        sys.exit("onpolicy_ceiling: --limit and --depth must be >= 1")

    from draftsmith.distill.data import target_datasets
    from draftsmith.distill.loading import load_target
    from draftsmith.train.config import load_config

    cfg = load_config(args.config)
    result = {"command": command_line(), "host": host_block(), "config": args.config,
              "data": list(map(str, cfg.data.train)), "max_length": cfg.data.max_length, "seed": args.seed,
              "depth": args.depth, "dtypes": {}}
    rows = None
    for dtype in args.dtypes:
        target = load_target(cfg.model, dtype=dtype)
        if rows is None:
            train_rows, _, stats = target_datasets(cfg.data, target)
            pick = sorted(random.Random(args.seed).sample(range(len(train_rows)),
                                                          min(args.limit, len(train_rows))))
            rows = [dict(train_rows[i]) for i in pick]
            result["data_line"] = stats.summary()
        result["dtypes"][dtype] = agreement(target.model, rows, args.depth)
        r = result["dtypes"][dtype]
        print(f"{dtype}: {r['answer_tokens']} answer tokens in {r['sequences']} answers: agreement "
              f"{r['token_agreement']:.4f}, identical answers {r['answers_identical']:.3f}, on-policy share "
              "by depth "
              + " / ".join(f"{s:.3f}" for s in r["onpolicy_share"]), flush=True)
        del target
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
