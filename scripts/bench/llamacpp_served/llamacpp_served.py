"""Served by llama.cpp vs ours: each drafter served by llama.cpp (build 11434, `draftsmith engine install
llamacpp`) beside llama.cpp plain and its n-gram spec types, and in our decoder on the same prompts (fp32,
T=0, a chain of k), one `draftsmith eval --engine llamacpp` per drafter (eval/measure/engine_llamacpp.py).

    python scripts/bench/llamacpp_served/llamacpp_served.py OUT
           NAME=DRAFTER[,chain=K][,td=N][,combine=TYPE] ... [--limit 40] [--tokens 128] [--chain 3]
           [--offset 0] [--drafters-only] [--note TEXT ...]

Each drafter is served with a chain of `--chain` (or its own `chain=K`) and its draft model on every core (or
on its own `td=N` threads, llama.cpp's `-td/-tbd`: what `draftsmith plan --engine llamacpp` may choose on a
multi-core CPU); `combine=TYPE` also serves it behind llama.cpp's n-gram type TYPE (`--spec-type
TYPE,draft-...`: the n-gram type drafts first, the drafter where it finds nothing; heads/engines.py
RULES["llamacpp-spec-combined"]), a speed row beside the drafter's own.

The n-gram spec types and the quantized target (the preset's Q4_1 GGUF, with and without the drafter) are
served beside the first drafter only (they do not depend on the drafter; `--drafters-only`: not at all). A
finished drafter (OUT/NAME/summary.json with its settings) is kept on a rerun. Writes OUT/llamacpp-served.json
(per drafter: served and our α per position, τ, the comparison, greedy equality, tokens/s with and without it;
the n-gram rows; the quantized target's figures; the host; the command), which `python
scripts/bench/results_pages.py --add llamacpp-served OUT/llamacpp-served.json` publishes. Speed is a figure
only when nothing else ran on the host's cores.
"""

import argparse
import json
from pathlib import Path

from draftsmith.eval.measure.campaign import command_line, host_block


def parse(item: str, chain: int) -> tuple[str, Path, int, int | None, tuple[str, ...]]:
    """NAME=FOLDER[,chain=K][,td=N][,combine=TYPE] -> (name, folder, chain, draft threads, n-gram types)."""
    name, _, rest = item.partition("=")
    path, *options = rest.split(",")
    own = dict(o.partition("=")[::2] for o in options)
    unknown = set(own) - {"chain", "td", "combine"}
    if not name or not path or unknown:
        raise SystemExit(f"{item}: give NAME=DRAFTER_FOLDER[,chain=K][,td=N][,combine=TYPE]")
    combine = (own["combine"],) if own.get("combine") else ()
    return (name, Path(path), int(own.get("chain", chain)), int(own["td"]) if "td" in own else None,
            combine)


def serve(name: str, path: Path, out: Path, args, ngram: bool, chain: int, threads: int | None,
          combine: tuple[str, ...]) -> dict:
    from draftsmith.eval.measure.engine_llamacpp import NGRAM_TYPES, run_llamacpp_eval
    from draftsmith.eval.measure.evaluate import EvalConfig
    from draftsmith.eval.serving import decide
    from draftsmith.heads.folder import read_folder
    from draftsmith.heads.registry import DrafterConfig
    from draftsmith.train.config import load_config

    done = out / name / "summary.json"
    if done.is_file():
        old = json.loads(done.read_text())
        kept = (old["n_prompts"], old["max_new_tokens"], old["num_speculative_tokens"],
                old.get("draft_threads"), tuple(old.get("combined") or ()))
        # a drafter served with the n-gram rows (or without them, --drafters-only) is kept only as asked
        if kept == (args.limit, args.tokens, chain, threads, combine) and bool(old.get("ngram")) == ngram:
            return old
    folder = read_folder(path)
    cfg = load_config(None, [f"model.target={folder.serve_target or folder.target}"])
    drafter = DrafterConfig(kind=folder.kind, path=str(folder.path), tree=f"chain-{chain}", plan=False)
    ecfg = EvalConfig(prompts="spec-bench", limit=args.limit, offset=args.offset, max_new_tokens=args.tokens,
                      dtype="float32", temperature=0.0, warmup=1, baselines=False)
    print(f"[llamacpp-served] {name}: chain-{chain}" + (f", draft on {threads} threads" if threads else "")
          + f", {args.limit} prompts x {args.tokens} tokens"
          + (f", behind {', '.join(combine)} too" if combine else "")
          + (", with the n-gram types and the quantized target" if ngram else ""), flush=True)
    return run_llamacpp_eval(decide(cfg.model, drafter), ecfg, out / name, NGRAM_TYPES if ngram else (),
                             progress=False, quantized=ngram, draft_threads=threads, combine=combine)


def summarize(name: str, s: dict) -> dict:
    """One drafter's row: what the page shows of its summary."""
    keep = ("method", "served_format", "num_speculative_tokens", "n_prompts", "max_new_tokens", "tau",
            "alpha_by_position", "acceptance_by_depth", "comparison", "greedy_equal", "greedy_equal_count",
            "equal_to_ours_count", "tokens_per_s", "baseline_tokens_per_s", "speedup", "load_seconds",
            "draft_threads")
    row = {"drafter": name, "kind": None, "drafter_path": s["drafter_path"], **{k: s.get(k) for k in keep}}
    row["ours"] = {k: s["ours"][k] for k in ("tau", "alpha_by_position", "steps", "tree", "dtype")}
    row["combined"] = s.get("combined") or {}
    rec = s["by_concurrency"]["1"]
    row["counts"] = {k: rec[k] for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens",
                                         "accepted_per_pos")}
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("drafters", nargs="+", help="NAME=DRAFTER_FOLDER[,chain=K][,td=N][,combine=TYPE]")
    p.add_argument("--limit", type=int, default=40)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--chain", type=int, default=3)
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--drafters-only", action="store_true",
                   help="serve the drafters alone: no n-gram rows, no quantized target")
    p.add_argument("--note", action="append", default=[])
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, ngram, quantized, engine = [], {}, None, None
    for i, item in enumerate(args.drafters):
        name, path, chain, threads, combine = parse(item, args.chain)
        s = serve(name, path, out, args, i == 0 and not args.drafters_only, chain, threads, combine)
        from draftsmith.heads.folder import read_folder

        row = summarize(name, s)
        row["kind"] = read_folder(Path(path)).kind
        rows.append(row)
        if not args.drafters_only:
            ngram = ngram or s.get("ngram") or {}
            quantized = quantized or s.get("quantized")
        engine = engine or {"version": s["engine_version"], "host": s["host"]["engine"]}
    record = {"engine": "llama.cpp", "engine_info": engine, "command": command_line(), "notes": args.note,
              "host": host_block(), "date": host_block().get("date"),
              "settings": {"prompts": "spec-bench", "offset": args.offset, "limit": args.limit,
                           "tokens": args.tokens, "chain": args.chain, "dtype": "float32",
                           "temperature": 0.0},
              "rows": rows, "ngram": ngram, "quantized": quantized}
    (out / "llamacpp-served.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out / 'llamacpp-served.json'}")


if __name__ == "__main__":
    main()
