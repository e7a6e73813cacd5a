"""Compare two run folders tensor by tensor and record by record (a refactor's before/after check).

    python scripts/dev/compare_runs.py BEFORE AFTER [--out diff.json]

For every run present in both (scripts/dev/house_check.sh writes them): each `*.safetensors` / `*.pt` file of
the drafter folder and its exports (tensor names, dtypes and values: equal or the max abs difference),
`samples.jsonl` (per prompt: output ids, accept lengths; timing fields are ignored), `metrics.jsonl`
(per step and split: every metric but time/throughput), and the JSON files of the drafter folder
(parsed, so key order does not count). Prints one line per difference and exits 0 either way; the JSON
lists them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import load_file

TIMING = {"time", "tokens_per_s", "wall_time", "baseline_wall_time", "hf_wall_time", "phase_seconds",
          "baseline_phase_seconds"}


def tensors(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path)) if path.suffix == ".safetensors" else torch.load(path, weights_only=True)


def compare_tensors(a: Path, b: Path) -> list[str]:
    ta, tb = tensors(a), tensors(b)
    out = [f"names differ: only before {sorted(set(ta) - set(tb))}, only after {sorted(set(tb) - set(ta))}"] \
        if set(ta) != set(tb) else []
    for k in sorted(set(ta) & set(tb)):
        x, y = ta[k], tb[k]
        if x.dtype != y.dtype or x.shape != y.shape:
            out.append(f"{k}: {x.dtype}{tuple(x.shape)} vs {y.dtype}{tuple(y.shape)}")
        elif not torch.equal(x, y):
            out.append(f"{k}: max |diff| {float((x.double() - y.double()).abs().max()):.3g}")
    return out


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def compare_jsonl(a: Path, b: Path, key) -> list[str]:
    ra, rb = {key(r): r for r in rows(a)}, {key(r): r for r in rows(b)}
    out = [
        f"records only on one side: {sorted(set(ra) ^ set(rb), key=str)[:5]}"] if set(ra) != set(rb) else []
    for k in sorted(set(ra) & set(rb), key=str):
        fields = sorted((set(ra[k]) | set(rb[k])) - TIMING)
        diff = [f for f in fields if ra[k].get(f) != rb[k].get(f)]
        if diff:
            out.append(f"{k}: {', '.join(f'{f} {ra[k].get(f)!r} -> {rb[k].get(f)!r}'[:160] for f in diff)}")
    return out


def compare_run(a: Path, b: Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(a.rglob("*")):
        rel = path.relative_to(a)
        other = b / rel
        if rel.parts[0] in ("checkpoints", "features") or not path.is_file():
            continue
        if not other.is_file():
            found[str(rel)] = ["missing after"]
        elif path.suffix in (".safetensors", ".pt"):
            found[str(rel)] = compare_tensors(path, other)
        elif path.name == "samples.jsonl":
            found[str(rel)] = compare_jsonl(path, other, key=lambda r: r["id"])
        elif path.name == "metrics.jsonl":
            found[str(rel)] = compare_jsonl(path, other, key=lambda r: (r["step"], r["split"]))
        elif path.suffix == ".json" and rel.parts[0] in ("drafter", "export"):
            x, y = json.loads(path.read_text()), json.loads(other.read_text())
            found[str(rel)] = [] if x == y else [
                f"{k}: {x.get(k)!r} -> {y.get(k)!r}"[:200] for k in sorted(set(x) | set(y))
                if x.get(k) != y.get(k)]
    return {k: v for k, v in found.items() if v}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    report = {}
    for run in sorted(p.name for p in args.before.iterdir() if p.is_dir()):
        if (args.after / run).is_dir():
            report[run] = compare_run(args.before / run, args.after / run)
            print(f"== {run}: {'identical' if not report[run] else f'{len(report[run])} files differ'}")
            for rel, lines in report[run].items():
                for line in lines[:8]:
                    print(f"   {rel}: {line}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
