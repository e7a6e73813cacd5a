"""OUT/peer.json from a finished speculators_peer.sh output folder (its last step), and the step count its
equal wall-clock row trains for.

    python scripts/bench/speculators_peer/collect.py peer-json OUT STEPS COMMAND PROMPT_SETS TREES
    python scripts/bench/speculators_peer/collect.py wall-steps OUT

peer-json: per trainer (ours = draftsmith, peer = speculators) the steps and training seconds, τ and
acceptance by depth of its two Spec-Bench evals (the page's columns: the 16-node dynamic tree and a chain of
5), every prompt set and tree when more were judged (PROMPT_SETS, TREES: space-separated), what vLLM served
beside our decoder, ours's validation at its last step and the same estimate on the decoder's own answers
(validate_outputs.py), ours − peer in τ paired over the prompts (draftsmith.eval.measure.campaign
`pooled_delta`), the peer's log span, sittings and median s / step; then the peer's data sizes (peer.json of
`speculators_peer.py convert`), COMMAND and the host. wall-steps: as many steps as the peer's training seconds
buy at ours's seconds per step.
"""

from __future__ import annotations

import argparse
import json
import re
from datetime import datetime
from pathlib import Path

from draftsmith.eval.measure.campaign import (
    accept_lengths,
    engine_record,
    host_block,
    jsonl,
    median_step_seconds,
    pooled_delta,
)

TREES = ("dynamic-16", "chain-5")  # the page's columns


def folder(out: Path, who: str, prompt_set: str, tree: str) -> Path:
    return out / (f"eval-{who}-{tree}" if prompt_set == "spec-bench" else f"eval-{who}-{prompt_set}-{tree}")


def summary(path: Path) -> dict:
    """One eval, as the page shows it."""
    s = json.loads((path / "summary.json").read_text())
    return {k: s[k] for k in ("tau", "acceptance_by_depth", "n_prompts", "max_new_tokens", "dtype")}


def trainers(out: Path, steps: int, sets: list[str], all_trees: list[str]) -> dict:
    """Both trainers' steps, seconds and evals, and what vLLM served of each (absent with ENGINE_LIMIT=0)."""
    seconds = {"ours": json.loads((out / "ours" / "train_summary.json").read_text())["seconds"],
               "peer": float((out / "peer" / "train_seconds").read_text())}
    rows = {who: {"train_steps": steps, "train_seconds": seconds[who],
                  **{tree: summary(folder(out, who, "spec-bench", tree)) for tree in TREES}}
            for who in ("ours", "peer")}
    state = out / "peer" / "ckpt" / "0" / "training_state.json"
    if state.exists():  # the steps it took: its packed epoch can end a step or so before STEPS
        rows["peer"]["train_steps"] = json.loads(state.read_text())["global_step"]
    # every set and tree judged (the full head-to-head)
    if sets != ["spec-bench"] or all_trees != list(TREES):
        for who in ("ours", "peer"):
            rows[who]["evals"] = {s: {t: summary(folder(out, who, s, t)) for t in all_trees} for s in sets}
    for who in ("ours", "peer"):  # served by vLLM beside our decoder, as the levers page keeps it too
        if (f := out / f"engine-{who}" / "summary.json").exists():  # Spec-Bench
            rows[who]["engine"] = engine_record(json.loads(f.read_text()))
        more = {s: engine_record(json.loads(f.read_text())) for s in sets if s != "spec-bench"
                if (f := out / f"engine-{who}-{s}" / "summary.json").exists()}
        if more:  # the other prompt sets
            rows[who]["engine_by_set"] = more
    return rows


def estimates(out: Path, rows: dict) -> None:
    """Ours's validation at its last step (train.eval_every = steps: what training predicts for a chain of 5),
    and the same estimate for both on the decoder's own answers."""
    val = [row for row in jsonl(out / "ours" / "metrics.jsonl") if row.get("split") == "validation"]
    if val:
        last = val[-1]
        rows["ours"]["validation"] = {"step": last["step"], **{k: v for k, v in last.items() if k.startswith(
            ("expected_tau", "acc_top1/", "cond_acc/", "joint_acc/"))}}
    for who in ("ours", "peer"):
        f = out / f"validate-{who}.json"
        if f.exists():
            v = json.loads(f.read_text())
            rows[who]["on_answers"] = {k: v[k] for k in ("n_answers", "answer_tokens", "expected_tau_joint",
                                                          "expected_tau_marginal", "cond_acc", "measured_tau",
                                                          "measured_acceptance_by_depth")}


def paired(out: Path, rows: dict, sets: list[str], all_trees: list[str]) -> None:
    """The equal wall-clock row where it ran, and ours − peer in τ paired over the prompts (both decoded the
    same ones): pooled Δτ and a bootstrap 95 % interval, per tree and, for the full head-to-head, per set and
    tree."""
    if (out / "ours-wall" / "train_summary.json").exists() and all(
            (out / f"eval-ours-wall-{t}" / "summary.json").exists() for t in TREES):
        wall = json.loads((out / "ours-wall" / "train_summary.json").read_text())
        rows["ours_wall"] = {"train_steps": wall["steps"], "train_seconds": wall["seconds"],
                             **{tree: summary(folder(out, "ours-wall", "spec-bench", tree))
                                for tree in TREES}}
    rows["paired"] = {}
    if "evals" in rows["ours"]:  # per prompt set and tree
        rows["paired_by_set"] = {f"{s} {t}": pooled_delta(accept_lengths(folder(out, "ours", s, t)),
                                                          accept_lengths(folder(out, "peer", s, t)))
                                 for s in sets for t in all_trees}
    for tree, mine in [(t, m) for m in ("ours", "ours-wall") for t in TREES
                       if (out / f"eval-{m}-{t}" / "samples.jsonl").exists()]:
        rows["paired"][tree if mine == "ours" else f"{tree}, equal wall-clock"] = pooled_delta(
            accept_lengths(out / f"eval-{mine}-{tree}"), accept_lengths(out / f"eval-peer-{tree}"))


def log_span(log: str) -> float:
    """Seconds from the peer log's first line (after its imports) to its last training-step line (before its
    validation pass and the save), summed over its sittings: a resumed run appends to the log, and a gap over
    5 minutes starts a new sitting."""
    stamps = [(datetime.strptime(m.group(1), "%H:%M:%S"), "train/loss" in line) for line in log.splitlines()
              if (m := re.match(r"\[(\d\d:\d\d:\d\d)\]", line))]
    sittings, span = [[]], 0.0
    for (t, is_step), prev in zip(stamps, [None, *stamps]):
        if prev is not None and (t - prev[0]).total_seconds() % 86400 > 300:
            sittings.append([])
        sittings[-1].append((t, is_step))
    for part in sittings:
        steps_at = [t for t, is_step in part if is_step]
        if steps_at:
            span += (steps_at[-1] - part[0][0]).total_seconds() % 86400
    return span


def timing(out: Path, rows: dict) -> None:
    """The peer's log span; each trainer's median seconds per step: draftsmith's over its logging intervals of
    10 steps (metrics.jsonl), speculators' over its own per-step timer (profile/step_ms: from before it
    fetches a batch to after the optimizer step), blind to start-ups and to the steps a resumed run repeats,
    which the summed seconds count; how many runs of its trainer the peer's seconds add up."""
    log = (out / "peer" / "train.log").read_text()
    if span := log_span(log):
        rows["peer"]["train_steps_span_seconds"] = span
    for who, run in (("ours", "ours"), ("ours_wall", "ours-wall")):
        if who in rows and (out / run / "metrics.jsonl").exists():
            rows[who]["median_step_seconds"] = median_step_seconds(jsonl(out / run / "metrics.jsonl"))
    step_ms = sorted(float(x) for x in re.findall(r"profile/step_ms=([0-9.]+(?:e[+-]?\d+)?)", log))
    if step_ms:
        rows["peer"]["median_step_seconds"] = round(step_ms[len(step_ms) // 2] / 1000, 3)
    if (out / "peer" / "train_seconds.sittings").exists():
        rows["peer"]["train_sittings"] = len((out / "peer" / "train_seconds.sittings").read_text().split())


def peer_json(out: Path, steps: int, command: str, sets: list[str], all_trees: list[str]) -> dict:
    rows = trainers(out, steps, sets, all_trees)
    estimates(out, rows)
    paired(out, rows, sets, all_trees)
    timing(out, rows)
    rows["peer_info"] = json.loads((out / "peer" / "peer.json").read_text())
    if (out / "peer" / "seq_len").exists():  # --total-seq-len, its packed epoch's steps, ours's epoch's steps
        packed = [int(x) for x in (out / "peer" / "seq_len").read_text().split()]
        rows["peer_info"].update(total_seq_len=packed[0], packed_epoch_steps=packed[1],
                                 our_epoch_steps=packed[2])
    rows.update(command=command, host=host_block())
    return rows


def report(rows: dict) -> None:
    for who in ("ours", "peer"):
        r = rows[who]
        served = r.get("engine") or {}
        print(f"{who:5s} {r['train_seconds']:8.0f} s  tau dynamic-16 {r['dynamic-16']['tau']:.3f}  chain-5 "
              f"{r['chain-5']['tau']:.3f}  served alpha {served.get('alpha_by_position')} "
              f"(ours {(served.get('ours') or {}).get('alpha_by_position')})")
    if "validation" in rows["ours"]:
        v = rows["ours"]["validation"]
        print(f"ours validation: expected tau chain-5 joint {v.get('expected_tau_joint')} marginal "
              f"{v.get('expected_tau')} vs measured {rows['ours']['chain-5']['tau']:.3f}")


def wall_steps(out: Path) -> int:
    """Ours's steps in the peer's training seconds, at ours's seconds per step."""
    ours = json.loads((out / "ours" / "train_summary.json").read_text())
    return int(float((out / "peer" / "train_seconds").read_text()) / (ours["seconds"] / ours["steps"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("peer-json", help="write OUT/peer.json")
    for name in ("out", "steps", "command", "prompt_sets", "trees"):
        p.add_argument(name)
    w = sub.add_parser("wall-steps", help="print the steps of the equal wall-clock row")
    w.add_argument("out")
    args = parser.parse_args()
    out = Path(args.out)
    if args.what == "wall-steps":
        print(wall_steps(out))
        return
    rows = peer_json(out, int(args.steps), args.command, args.prompt_sets.split(), args.trees.split())
    (out / "peer.json").write_text(json.dumps(rows, indent=2) + "\n")
    report(rows)


if __name__ == "__main__":
    main()
