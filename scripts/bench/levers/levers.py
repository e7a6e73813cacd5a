"""The levers table (scripts/bench/levers/levers.sh): every finished row under OUT, what it trained with (read
from its own config.resolved.yaml and train_summary.json, not from a hand-kept list), its evals, and its τ
paired against the baseline row's on the same prompts -> OUT/levers.json.

    python scripts/bench/levers/levers.py OUT [--baseline eagle3] [--command "..."] [--note "..." ...]

Paired: Δτ = (Σ accepted / Σ steps of the row) - (the same of the baseline) over the prompts both decoded,
with a 2,000-resample bootstrap 95 % interval over prompts (draftsmith.eval.measure.campaign `pooled_delta`,
as scripts/bench/speculators_peer/speculators_peer.sh's).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from draftsmith.eval.measure.campaign import (
    EVAL_KEYS,
    accept_lengths,
    command_line,
    engine_record,
    eval_summary,
    host_block,
    pooled_delta,
    row_record,
)


def collect(out: Path, baseline: str) -> dict:
    rows, missing = {}, []
    for run in sorted(p for p in out.iterdir() if p.is_dir()):
        if not (run / "train_summary.json").is_file():
            missing.append(run.name)
            continue
        rec = row_record(run)
        rec["evals"] = {e.name[len("eval-"):]: {k: s.get(k) for k in EVAL_KEYS}
                        for e in sorted(run.glob("eval-*")) if (s := eval_summary(e))}
        engine = eval_summary(run / "engine")
        if engine:
            rec["engine"] = engine_record(engine)
        rows[run.name] = rec
    if baseline in rows:
        base = out / baseline
        for name, rec in rows.items():
            if name == baseline:
                continue
            rec["paired"] = {e: pooled_delta(accept_lengths(out / name / f"eval-{e}"),
                                             accept_lengths(base / f"eval-{e}"))
                             for e in rec["evals"] if (base / f"eval-{e}" / "samples.jsonl").is_file()
                             and (out / name / f"eval-{e}" / "samples.jsonl").is_file()}
    return {"baseline": baseline, "rows": rows, "unfinished": missing}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--baseline", default="eagle3")
    parser.add_argument("--command", default=None, help="the levers.sh command line to record")
    parser.add_argument("--note", action="append", default=[],
                        help="a line for the page (what the rows cannot say)")
    args = parser.parse_args()
    out = Path(args.out)
    data = collect(out, args.baseline)
    data.update(command=args.command or command_line(), host=host_block(), notes=args.note)
    (out / "levers.json").write_text(json.dumps(data, indent=2) + "\n")
    for name, r in data["rows"].items():
        taus = "  ".join(f"{e} {v['tau']:.3f}"
                         + (f" ({r['paired'][e]['delta_tau']:+.3f})" if e in r.get("paired", {})
                                                    else "") for e, v in r["evals"].items())
        print(f"{name:8s} {r['kind']:7s} {r['train_steps']:5d} steps {r['train_seconds']:6.0f} s  {taus}")
    for name in data["unfinished"]:
        print(f"{name}: not finished (no train_summary.json), left out")


if __name__ == "__main__":
    main()
