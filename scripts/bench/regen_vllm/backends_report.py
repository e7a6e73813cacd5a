"""regen_backends.sh's report: tokens/s and wall time of backend hf and backend openai on the same prompts,
and the run whose server was killed mid-way (the first run's exit status and error, the rerun, ids duplicated,
lost or extra against the uninterrupted openai run) -> OUT/regen-backends.json, printed.

    python scripts/bench/regen_vllm/backends_report.py OUT PROMPTS
"""

from __future__ import annotations

import collections
import json
import re
import sys
from pathlib import Path

LINE = re.compile(r"\[regenerate\] (\d+) new conversations \((\d+) already done\), (\d+) tokens at ([\d.]+) "
                  r"tok/s")


def rows(out: Path, name: str) -> list[dict]:
    return [json.loads(x) for x in (out / name / "regenerated.jsonl").read_text().splitlines() if x.strip()]


def line(log: str) -> dict | None:
    m = LINE.search(log)
    return dict(zip(("written", "already_done", "tokens", "tokens_per_s"),
                    (int(m[1]), int(m[2]), int(m[3]), float(m[4])))) if m else None


def main() -> None:
    out, n = Path(sys.argv[1]), int(sys.argv[2])
    report = {"prompts": n,
              "server": "transformers serve (transformers' OpenAI-compatible server), bf16, CPU",
              "backends": {}}
    for name in ("hf", "openai"):
        report["backends"][name] = dict(line((out / f"{name}.log").read_text()) or {},
                                        wall_s=float((out / f"{name}.wall").read_text()))
    killed = rows(out, "openai-killed")
    ids = collections.Counter(r["id"] for r in killed)
    reference = {r["id"] for r in rows(out, "openai")}
    report["server_killed"] = {
        "first_run_rc": int((out / "killed-first.rc").read_text()),
        "first_run_error": next((x for x in (out / "killed-first.log").read_text().splitlines()
                                 if "error" in x.lower()), None),
        "rerun": line((out / "killed-rerun.log").read_text()),
        "answers": len(killed), "unique_ids": len(ids), "duplicated": sum(c - 1 for c in ids.values()),
        "lost": len(reference - set(ids)), "extra": len(set(ids) - reference)}
    (out / "regen-backends.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
