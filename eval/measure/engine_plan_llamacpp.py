"""`draftsmith plan --engine llamacpp`: what serves a drafter fastest *in llama.cpp* on this machine, measured
there (the vLLM engine plan's twin, eval/measure/engine_plan.py).

llama.cpp drafts chains (`--spec-draft-n-max k`) or speculates without a drafter (its n-gram spec types),
or both (`--spec-type ngram-simple,draft-eagle3`: the n-gram type drafts first, the drafter where it finds
nothing, heads/engines.py RULES["llamacpp-spec-combined"]), so its plan is one of: the drafter as a chain
of k, an n-gram type, the drafter behind an n-gram type (candidate `TYPE+chain-K`, each chain tried so,
behind the types of `combine`: ngram-simple, llama.cpp's first), or plain decoding. One `llama-server` per
candidate on prompts disjoint from eval's (`--offset`), each prompt one greedy `/completion` at batch 1 (one
slot, every core): plain, the drafter at each k asked, each n-gram type, plain again (the two plain runs'
spread is the timing noise). On a host of several cores each chain is also tried with the draft model on one
thread (`-td 1`, candidate `chain-K-td1`): a small draft's ops are too short to split, and llama.cpp's threads
meet at a barrier after every op, so on a CPU the draft can run faster on fewer threads. The choice
(engine_plan.py `choose`) is the fastest candidate that accepted draft tokens and beat plain by more than
`margin` + noise, else plain with the reason. The target is served as the GGUF converted in the eval dtype
(eval/measure/engine_llamacpp.py make_job): measure with the weights you serve. Writes serving-llamacpp.json
into the plan's folder and, where that folder holds a SERVE.md, a section with the measured `llama-server`
command."""

from __future__ import annotations

import json
import os
from pathlib import Path

from draftsmith.eval.measure.engine_llamacpp import COMBINE_TYPES, LLAMACPP_PLAN, NGRAM_TYPES, make_job
from draftsmith.eval.measure.engine_plan import choose, replace_section, run_figures
from draftsmith.eval.measure.llamacpp_server import serve_runs
from draftsmith.heads import llamacpp
from draftsmith.heads.engines import llamacpp_combined_type, llamacpp_server_argv

SECTION = "## Measured in llama.cpp (draftsmith plan --engine llamacpp)"


def llamacpp_sweep(serving, cfg, out_dir: str | Path, ks: list[int], ngram: tuple[str, ...] = NGRAM_TYPES,
                   margin: float = 0.03, cores: int | None = None,
                   combine: tuple[str, ...] = COMBINE_TYPES) -> dict:
    """Serve the drafter at each chain length in `ks`, each n-gram type in `ngram` and each chain behind each
    type of `combine` on `cfg`'s prompts, plain before and after; the plan record (module doc). Writes
    OUT/job.json, engine.json, server logs."""
    from draftsmith.distill.loading import load_target
    from draftsmith.eval.decode.machine import machine_info

    llamacpp.require()
    if cfg.temperature != 0:
        raise ValueError("an engine plan compares greedy runs: use temperature 0")
    if serving.folder is None:
        raise ValueError("an engine plan serves a drafter folder: pass --drafter DIR")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = load_target(serving.model, dtype=cfg.dtype or serving.model.dtype)
    job = make_job(serving, cfg, out_dir, target, max(ks), (), quantized=False)
    spec = job["runs"][0]
    plain = {"name": "plain", "model": spec["model"], "kv": spec["kv"]}
    one_thread = [1] if (cores or os.cpu_count() or 1) > 1 else []  # the draft on one thread (module doc)
    chains = [*[{**spec, "name": f"chain-{k}", "k": k} for k in ks],
              *[{**spec, "name": f"chain-{k}-td{t}", "k": k, "draft_threads": t}
                for k in ks for t in one_thread]]
    job["runs"] = [plain, *chains,
                   *[{"name": t, "model": spec["model"], "spec_type": t, "kv": spec["kv"]} for t in ngram],
                   *[{**run, "name": f"{t}+{run['name']}", "spec_type": llamacpp_combined_type(
                       t, run["spec_type"])} for t in combine for run in chains],
                   {**plain, "name": "plain-again"}]
    (out_dir / "job.json").write_text(json.dumps(job) + "\n")
    print(f"[engine-plan] llamacpp: {spec['spec_type']} {job['draft_gguf']}, chains {ks}, n-gram "
          f"{list(ngram) or 'none'}, behind {list(combine) or 'none'}, {len(job['prompts'])} prompts x "
          f"{job['max_tokens']} tokens", flush=True)
    raw = serve_runs(job, out_dir)
    by_name = {run["name"]: run["by_concurrency"]["1"] for run in raw["runs"]}
    candidates = []
    for run in job["runs"][1:-1]:
        k, threads = run.get("k", max(ks)), run.get("draft_threads")
        own = ("-td", str(threads), "-tbd", str(threads)) if threads else ()
        candidates.append({"name": run["name"], "k": k, "spec_type": run["spec_type"],
                           # what choose() reports for the choice: llama.cpp's own flags
                           "speculative_config": {"spec-type": run["spec_type"],
                                                  **({"spec-draft-n-max": k} if run.get("draft") else {}),
                                                  **({"spec-draft-threads": threads} if threads else {})},
                           "argv": llamacpp_server_argv(run["model"], run["spec_type"], run.get("draft"), k,
                                                        own),
                           "by_concurrency": {"1": run_figures(by_name[run["name"]], k, by_name["plain"])}})
    plain_tps = [r["new_tokens"] / r["seconds"] for r in (by_name["plain"], by_name["plain-again"])
                 if r["seconds"] > 0]
    return {"engine": "llamacpp", "engine_version": f"b{raw['host']['engine_version']}",
            "for": "llama.cpp (chains and n-gram types, one slot)", "target": serving.model.target,
            "target_gguf": job["target_gguf"], "drafter_path": str(serving.folder.path),
            "draft_gguf": job["draft_gguf"], "dtype": str(target.dtype).removeprefix("torch."),
            "prompts": cfg.prompts, "offset": cfg.offset, "n_prompts": len(job["prompts"]),
            "max_new_tokens": cfg.max_new_tokens, "concurrency": [1], "margin": margin,
            "plain": {"1": {"tokens_per_s": [round(t, 3) for t in plain_tps]}}, "candidates": candidates,
            "choice": {"1": choose(candidates, plain_tps, "1", margin)},
            "host": {"engine": raw["host"], "draftsmith": machine_info(target)},
            "note": "tokens/s are llama.cpp's, one server after another; a figure only on a host whose cores "
                    "no other work shares"}


def llamacpp_command(plan: dict) -> str:
    """The `llama-server` command that serves the plan's choice."""
    choice = plan["choice"]["1"]
    if choice["choice"] == "plain":
        return f"llama-server -m {plan['target_gguf']}"
    cand = next(c for c in plan["candidates"] if c["name"] == choice["choice"])
    return " ".join(cand["argv"])


def write_llamacpp_plan(out: Path, plan: dict) -> Path:
    """serving-llamacpp.json into `out`; where `out` holds a SERVE.md, its measured llama.cpp section is
    replaced."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / LLAMACPP_PLAN
    path.write_text(json.dumps(plan, indent=1) + "\n")
    serve = out / "SERVE.md"
    if serve.is_file():
        choice, host = plan["choice"]["1"], plan["host"]["engine"]
        what = choice["choice"] if choice["choice"] != "plain" else f"plain decoding ({choice['why']})"
        section = [SECTION, "", f"llama.cpp {plan['engine_version']} ({host.get('cpu_count')} cores), "
                   f"{plan['dtype']} target GGUF, {plan['n_prompts']} calibration prompts x "
                   f"{plan['max_new_tokens']} tokens ({plan['prompts']} from {plan['offset']}): **{what}**"
                   + (f", x{choice['speedup']:.2f} of llama.cpp plain, τ {choice['tau']}"
                      if choice.get("speedup") else ""), "", f"`{llamacpp_command(plan)}`", ""]
        replace_section(serve, SECTION, "\n".join(section))
    return path
