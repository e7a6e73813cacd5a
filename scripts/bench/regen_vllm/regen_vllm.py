"""Self-distillation through vLLM against HF `generate`: the same prompts, the same recipe, tokens/s each.

    python scripts/bench/regen_vllm/regen_vllm.py OUT [--prompts 64] [--tokens 128] [--concurrency 16]
        [--dtype auto] [--repeat 1]

Runs `draftsmith regenerate -c configs/runs/smollm2-regenerate.yaml` (the reference target answering the first
N training prompts) twice into OUT/hf and OUT/vllm: backend hf (the recipe's batch 16) and backend vllm
(vLLM's OpenAI server from the engine venv, `data.regenerate.concurrency` requests in flight), same dtype,
T=0. Each backend's tokens/s is the stage's own figure (the `[regenerate] ... tok/s` line: answer tokens over
the answering time, so neither the HF target's load nor the server's start is in it); the whole command's wall
time, which includes them, is recorded beside it. Also: how many answers are the same text on both sides.
`--repeat R` runs the pair R times (fresh folders) and keeps every run's figures. Writes OUT/regen-vllm.json
with the host and the command. Needs the engine (`draftsmith engine install vllm`); keep the host otherwise
idle for figures.
"""

import argparse
import json
import re
import shutil
import subprocess
import time
from pathlib import Path

from draftsmith.eval.measure.campaign import command_line, host_block

ROOT = Path(__file__).resolve().parents[3]

LINE = re.compile(r"\[regenerate\] (\d+) new conversations \((\d+) already done\), (\d+) tokens at ([\d.]+) "
                  r"tok/s")


def run(out: Path, backend: str, args) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    command = [str(ROOT / ".venv" / "bin" / "draftsmith"), "regenerate", "-c", "smollm2-regenerate",
               f"data.regenerate.limit={args.prompts}", f"data.regenerate.max_new_tokens={args.tokens}",
               f"model.dtype={args.dtype}", f"data.regenerate.backend={backend}", "log.progress=false",
               *([f"data.regenerate.concurrency={args.concurrency}"] if backend == "vllm" else []), "--out",
               str(out)]
    t0 = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    (out.parent / f"{out.name}.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"{backend}: exit {done.returncode}; {out.parent / f'{out.name}.log'}")
    m = LINE.search(done.stdout + done.stderr)
    meta = json.loads((out / "regenerated.jsonl.meta.json").read_text())
    return {"written": int(m[1]), "tokens": int(m[3]), "tokens_per_s": float(m[4]), "wall_s": round(wall, 2),
            "engine": meta.get("engine"), "command": " ".join(command[1:])}


def answers(folder: Path) -> dict[str, list[str]]:
    rows = [json.loads(line) for line in (folder / "regenerated.jsonl").read_text().splitlines()]
    return {r["id"]: [m["content"] for m in r["conversation"] if m["role"] == "assistant"] for r in rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--repeat", type=int, default=1)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    runs = []
    for r in range(args.repeat):
        pair = {name: run(args.out / f"{name}-{r}", name, args) for name in ("hf", "vllm")}
        hf, vllm = answers(args.out / f"hf-{r}"), answers(args.out / f"vllm-{r}")
        pair["same_answers"] = sum(hf[i] == vllm.get(i) for i in hf)
        pair["vllm_over_hf"] = round(pair["vllm"]["tokens_per_s"] / pair["hf"]["tokens_per_s"], 3)
        runs.append(pair)
        print(json.dumps(pair), flush=True)
    report = {"campaign": "regen-vllm", "prompts": args.prompts, "max_new_tokens": args.tokens,
              "dtype": args.dtype, "temperature": 0.0, "hf_batch": 16, "vllm_concurrency": args.concurrency,
              "runs": runs, "host": host_block(), "command": command_line()}
    (args.out / "regen-vllm.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "host"}, indent=2))


if __name__ == "__main__":
    main()
