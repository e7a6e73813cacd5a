"""Validation on the decoder's own answers: why the training-time estimate of τ differs from the measured one.

    python scripts/bench/speculators_peer/validate_outputs.py DRAFTER EVAL_DIR [--target NAME] [--depth 5]
                                             [--batch 4] [--dtype float32] [--out JSON]

An EAGLE drafter's validation (heads/eagle/model.py `compute_loss` in eval mode) teacher-forces the drafter
along held-out answers and reports per-depth conditional accuracies and `expected_tau_joint`, the τ a chain
would get if every position were a drafting root. At T=0 the decoder's answers *are* the target's greedy
answers (lossless), so running that same validation on the answers `draftsmith eval` wrote
(EVAL_DIR/samples.jsonl, its prompts rebuilt from EVAL_DIR/summary.json) removes one suspect at a time:

- held-out training answers vs these answers: the prompt distribution (and the answers' own sampling);
- these answers' estimate vs the measured τ on them: what is left is how the decoder picks its roots (only
  where the last verification ended) and the chain's depth, not the data.

Writes a JSON with the estimate (joint and as-if-independent), the conditional rates by depth beside the
decoder's measured acceptance by depth, and the measured τ. The drafter's `ttt_steps` is raised to `--depth`
for the estimate (the unroll at inference is as deep as the chain). Loads the target (fp32 by default): run it
alone.
"""

import argparse
import json
import sys
from pathlib import Path

from draftsmith.eval.measure.campaign import command_line, host_block


def answers(eval_dir: Path, target) -> list[dict]:
    """(prompt ids + the decoder's output ids, loss on the output) for every sample of an eval folder."""
    from draftsmith.eval.measure.evaluate import EvalConfig, select_prompts

    summary = json.loads((eval_dir / "summary.json").read_text())
    samples = [json.loads(line) for line in (eval_dir / "samples.jsonl").read_text().splitlines()
               if line.strip()]
    if summary.get("temperature", 0.0) != 0.0:
        sys.exit(f"validate_outputs: {eval_dir} was sampled at T={summary['temperature']}: only a T=0 eval's "
                 "answers are the target's own greedy answers; rerun draftsmith eval at T=0")
    prompts = {p["id"]: p["prompt"]
               for p in select_prompts(EvalConfig(prompts=summary["prompts"], limit=None))}
    rows = []
    for s in samples:
        if s["id"] not in prompts:
            sys.exit(f"validate_outputs: prompt {s['id']} of {eval_dir} is not in {summary['prompts']}")
        prompt = target.chat_ids(prompts[s["id"]])
        rows.append({"input_ids": prompt + s["output_ids"],
                     "loss_mask": [0] * len(prompt) + [1] * len(s["output_ids"])})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("drafter", type=Path)
    parser.add_argument("eval_dir", type=Path)
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--depth", type=int, default=5)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--top-k", type=int, default=64,
                        help="target logits kept for the loss (the metrics use none)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    import torch

    from draftsmith.distill.collate import collate
    from draftsmith.distill.loading import load_target
    from draftsmith.heads.folder import read_folder
    from draftsmith.train.loop import average
    from draftsmith.train.sources import OnlineSource, to_device

    target = load_target(args.target, dtype=args.dtype)
    drafter = read_folder(args.drafter).load(target.model).to(target.device)  # loads on the CPU
    if not hasattr(drafter, "ttt_steps"):
        sys.exit(f"validate_outputs: {args.drafter} is a {type(drafter).__name__}; the joint estimate is an "
                 "EAGLE drafter's validation (eagle, eagle3)")
    drafter.ttt_steps = max(drafter.ttt_steps, args.depth)
    drafter.eval()
    source = OnlineSource(target, list(drafter.feature_layers), args.top_k)
    rows = answers(args.eval_dir, target)
    scored = []
    with torch.no_grad():
        for i in range(0, len(rows), args.batch):
            batch = to_device(source(to_device(collate(rows[i:i + args.batch]), target.device)),
                              target.device, torch.float32)
            _, metrics = drafter.compute_loss(batch)
            scored.append((metrics, int(batch["loss_mask"].sum())))
    m = average(scored)
    summary = json.loads((args.eval_dir / "summary.json").read_text())
    depth = args.depth
    result = {"command": command_line(), "host": host_block(), "drafter": str(args.drafter),
              "eval": str(args.eval_dir), "tree": summary.get("tree"), "n_answers": len(rows),
              "answer_tokens": sum(sum(r["loss_mask"]) for r in rows), "depth": depth,
              "expected_tau_joint": m.get("expected_tau_joint"),
              "expected_tau_marginal": m.get("expected_tau"),
              "cond_acc": [m.get(f"cond_acc/step{j}") for j in range(depth)],
              "acc_top1": [m.get(f"acc_top1/step{j}") for j in range(depth)], "measured_tau": summary["tau"],
              "measured_acceptance_by_depth": summary.get("acceptance_by_depth")}
    text = json.dumps(result, indent=1) + "\n"
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(f"on {len(rows)} answers of {args.eval_dir}: expected tau (chain of {depth}) joint "
          f"{result['expected_tau_joint']}, as if independent {result['expected_tau_marginal']}; measured "
          f"{result['measured_tau']} ({summary.get('tree')})")
    print(" conditional by depth:", result["cond_acc"], " measured:", result["measured_acceptance_by_depth"])


if __name__ == "__main__":
    main()
