"""What levers.sh reads back from finished runs before it trains a row (it prints them for the shell to read).

    python scripts/bench/levers/readback.py baseline PEER          answers, steps, lr and steps per epoch of
                                                                   PEER/ours
    python scripts/bench/levers/readback.py wall-steps BASE ROW    the steps ROW's seconds per step buy in
                                                                   BASE's seconds

`baseline`: the speculators_peer.sh run every row is paired against, from its own record
(config.resolved.yaml, train_summary.json and the features' index.json): data.limit, its steps, train.lr and
ceil(train sequences / batch). `wall-steps`: BASE's training seconds over ROW's seconds per step (both
train_summary.json), whole steps.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import yaml


def baseline(peer: Path) -> str:
    cfg = yaml.safe_load((peer / "ours" / "config.resolved.yaml").read_text())
    summary = json.loads((peer / "ours" / "train_summary.json").read_text())
    sequences = json.loads((peer / "ours" / "features" / "train" / "index.json").read_text())["num_sequences"]
    return (f"{cfg['data']['limit']} {summary['steps']} {cfg['train']['lr']} "
            f"{math.ceil(sequences / cfg['train']['batch_size'])}")


def wall_steps(base: Path, row: Path) -> int:
    seconds = json.loads((base / "train_summary.json").read_text())["seconds"]
    r = json.loads((row / "train_summary.json").read_text())
    return int(seconds / (r["seconds"] / r["steps"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("baseline").add_argument("peer", type=Path)
    w = sub.add_parser("wall-steps")
    w.add_argument("base", type=Path)
    w.add_argument("row", type=Path)
    args = parser.parse_args()
    print(baseline(args.peer) if args.what == "baseline" else wall_steps(args.base, args.row))


if __name__ == "__main__":
    main()
