"""OUT/peer.json from a finished speculators_peer.sh output folder (its last step), and the step count its
equal wall-clock row trains for.

    python scripts/bench/speculators_peer/collect.py peer-json OUT STEPS COMMAND PROMPT_SETS TREES \
        [--arm eagle3|dflash] [--columns "dynamic-16 chain-5"]
    python scripts/bench/speculators_peer/collect.py wall-steps OUT

peer-json: per trainer (ours = draftsmith, peer = speculators) the steps and training seconds, τ and
acceptance by depth of its Spec-Bench evals of the page's columns (--columns: the EAGLE-3 arm's 16-node
dynamic tree and a chain of 5, the DFlash arm's chains of 4 and 3), every prompt set and tree when more
were judged (PROMPT_SETS, TREES: space-separated), what vLLM served beside our decoder, ours's validation at
its last step and the same estimate on the decoder's own answers (validate_outputs.py, the EAGLE-3 arm),
ours − peer in τ paired over the prompts (draftsmith.eval.measure.campaign `pooled_delta`), the peer's log
span, sittings and median s / step; then the peer's data sizes (peer.json of `speculators_peer.py convert`)
with the arm and, for DFlash, the blocks per step of each (peer/anchors.json), what each trainer ran with
(`settings`: ours's config.resolved.yaml, the peer's argv from its ckpt/train_command.txt), the columns,
COMMAND and the host. wall-steps: as many steps as the peer's training seconds buy at ours's seconds per step.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
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

COLUMNS = ("dynamic-16", "chain-5")  # the EAGLE-3 arm's page columns (the committed pages: no `columns`)
# the peer's flags recorded in `settings` (its argv), by flag
PEER_FLAGS = ("--speculator-type", "--num-layers", "--optimizer", "--lr", "--muon-lr", "--block-size",
              "--max-anchors", "--mask-token-id", "--loss-fn", "--per-position-loss-weight")


def folder(out: Path, who: str, prompt_set: str, tree: str) -> Path:
    return out / (f"eval-{who}-{tree}" if prompt_set == "spec-bench" else f"eval-{who}-{prompt_set}-{tree}")


def summary(path: Path) -> dict:
    """One eval, as the page shows it."""
    s = json.loads((path / "summary.json").read_text())
    return {k: s[k] for k in ("tau", "acceptance_by_depth", "n_prompts", "max_new_tokens", "dtype")}


def trainers(out: Path, steps: int, sets: list[str], all_trees: list[str],
             columns: tuple[str, ...] | list[str] = COLUMNS) -> dict:
    """Both trainers' steps, seconds and evals, and what vLLM served of each (absent with ENGINE_LIMIT=0)."""
    seconds = {"ours": json.loads((out / "ours" / "train_summary.json").read_text())["seconds"],
               "peer": float((out / "peer" / "train_seconds").read_text())}
    rows = {who: {"train_steps": steps, "train_seconds": seconds[who],
                  **{tree: summary(folder(out, who, "spec-bench", tree)) for tree in columns}}
            for who in ("ours", "peer")}
    state = out / "peer" / "ckpt" / "0" / "training_state.json"
    if state.exists():  # the steps it took: its packed epoch can end a step or so before STEPS
        rows["peer"]["train_steps"] = json.loads(state.read_text())["global_step"]
    # every set and tree judged (the full head-to-head)
    if sets != ["spec-bench"] or all_trees != list(columns):
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


def paired(out: Path, rows: dict, sets: list[str], all_trees: list[str],
           columns: tuple[str, ...] | list[str] = COLUMNS) -> None:
    """The equal wall-clock row where it ran, and ours − peer in τ paired over the prompts (both decoded the
    same ones): pooled Δτ and a bootstrap 95 % interval, per tree and, for the full head-to-head, per set and
    tree."""
    if (out / "ours-wall" / "train_summary.json").exists() and all(
            (out / f"eval-ours-wall-{t}" / "summary.json").exists() for t in columns):
        wall = json.loads((out / "ours-wall" / "train_summary.json").read_text())
        rows["ours_wall"] = {"train_steps": wall["steps"], "train_seconds": wall["seconds"],
                             **{tree: summary(folder(out, "ours-wall", "spec-bench", tree))
                                for tree in columns}}
    rows["paired"] = {}
    if "evals" in rows["ours"]:  # per prompt set and tree
        rows["paired_by_set"] = {f"{s} {t}": pooled_delta(accept_lengths(folder(out, "ours", s, t)),
                                                          accept_lengths(folder(out, "peer", s, t)))
                                 for s in sets for t in all_trees}
    for tree, mine in [(t, m) for m in ("ours", "ours-wall") for t in columns
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


def number(text: str):
    """A flag's value as the JSON number it reads as, else the text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def settings(out: Path) -> dict:
    """What each trainer ran with: ours's optimiser (and DFlash's block, anchors, loss) from its
    config.resolved.yaml, the peer's flags from the argv speculators writes to ckpt/train_command.txt (its
    last line; the lines above are comments)."""
    import yaml

    got = {}
    if (f := out / "ours" / "config.resolved.yaml").exists():
        cfg = yaml.safe_load(f.read_text())
        train, drafter = cfg.get("train") or {}, cfg.get("drafter") or {}
        ours = {"optimizer": train.get("optimizer"), "lr": train.get("lr"),
                **({"muon_lr": train.get("muon_lr")} if train.get("optimizer") == "muon" else {})}
        if drafter.get("kind") == "dflash":
            own = drafter.get("dflash") or {}
            ours.update(block_size=own.get("block_size") or drafter.get("num_speculative_tokens"),
                        anchors=own.get("anchors"), loss=drafter.get("loss"),
                        slot_weights=own.get("slot_weights"))
        got["ours"] = ours
    if (f := out / "peer" / "ckpt" / "train_command.txt").exists():
        lines = [line for line in f.read_text().splitlines() if line.strip() and not line.startswith("#")]
        argv, peer = shlex.split(lines[-1]) if lines else [], {}
        for flag, value in zip(argv, [*argv[1:], None]):
            if flag in PEER_FLAGS and value is not None:
                peer[flag[2:].replace("-", "_")] = number(value)
            elif flag in ("--sample-from-anchor", "--no-sample-from-anchor"):
                peer["sample_from_anchor"] = flag == "--sample-from-anchor"
        got["peer"] = peer
    return got


def peer_json(out: Path, steps: int, command: str, sets: list[str], all_trees: list[str],
              arm: str = "eagle3", columns: tuple[str, ...] | list[str] = COLUMNS) -> dict:
    rows = trainers(out, steps, sets, all_trees, columns)
    estimates(out, rows)
    paired(out, rows, sets, all_trees, columns)
    timing(out, rows)
    rows["peer_info"] = {**json.loads((out / "peer" / "peer.json").read_text()), "arm": arm}
    if (out / "peer" / "seq_len").exists():  # --total-seq-len, its packed epoch's steps, ours's epoch's steps
        packed = [int(x) for x in (out / "peer" / "seq_len").read_text().split()]
        rows["peer_info"].update(total_seq_len=packed[0], packed_epoch_steps=packed[1],
                                 our_epoch_steps=packed[2])
    if (out / "peer" / "anchors.json").exists():  # DFlash: blocks per step, speculators_peer.py anchors
        rows["peer_info"]["blocks_per_step"] = json.loads((out / "peer" / "anchors.json").read_text())
    if got := settings(out):
        rows["settings"] = got
    rows.update(columns=list(columns), command=command, host=host_block())
    return rows


def report(rows: dict) -> None:
    columns = rows.get("columns") or list(COLUMNS)
    for who in ("ours", "peer"):
        r = rows[who]
        served = r.get("engine") or {}
        print(f"{who:5s} {r['train_seconds']:8.0f} s  tau "
              + "  ".join(f"{tree} {r[tree]['tau']:.3f}" for tree in columns)
              + f"  served alpha {served.get('alpha_by_position')} "
                f"(ours {(served.get('ours') or {}).get('alpha_by_position')})")
    chain = max((t for t in columns if t.startswith("chain-")), key=lambda t: int(t.split("-")[1]),
                default=columns[-1])
    if "validation" in rows["ours"]:
        v = rows["ours"]["validation"]
        print(f"ours validation: expected tau {chain} joint {v.get('expected_tau_joint')} marginal "
              f"{v.get('expected_tau')} vs measured {rows['ours'][chain]['tau']:.3f}")


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
    p.add_argument("--arm", choices=("eagle3", "dflash"), default="eagle3")
    p.add_argument("--columns", default=" ".join(COLUMNS), help="the page's columns (space-separated trees)")
    w = sub.add_parser("wall-steps", help="print the steps of the equal wall-clock row")
    w.add_argument("out")
    args = parser.parse_args()
    out = Path(args.out)
    if args.what == "wall-steps":
        print(wall_steps(out))
        return
    rows = peer_json(out, int(args.steps), args.command, args.prompt_sets.split(), args.trees.split(),
                     args.arm, args.columns.split())
    (out / "peer.json").write_text(json.dumps(rows, indent=2) + "\n")
    report(rows)


if __name__ == "__main__":
    main()
