"""The target's regenerated answers in a run: the pipeline's regenerate stage and the data sources that name
them.

In the flow: `draftsmith regenerate` and the pipeline's first stage (`run_regenerate`) answer
`data.regenerate.prompts` with the target into `<run>/regenerated.jsonl` (hf backend split over the ranks, or
vLLM's OpenAI server started for the stage: `regenerate_server`) and `data.regenerate.validation_prompts` into
`<run>/regenerated-validation.jsonl` (prompts chosen into `validation-prompts.jsonl` as eval orders them, past
the ones eval reports on: `check_validation_prompts` refuses the overlap). Every later stage reads the config
through `with_run_sources`, which turns the source names `regenerated` (in `data.train` and
`drafter.lookup_datastore`) and `regenerated-validation` (in `data.validation`) into those files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path

from draftsmith.train.runtime import build_accelerator, rank0_print

REGENERATED = "regenerated"
REGENERATED_VALIDATION = "regenerated-validation"


def regenerated_path(cfg, run_dir: Path) -> Path:
    return Path(cfg.data.regenerate.out) if cfg.data.regenerate.out else run_dir / "regenerated.jsonl"


def regenerated_validation_path(run_dir: Path) -> Path:
    return run_dir / "regenerated-validation.jsonl"


def with_run_sources(cfg, run_dir: Path):
    """A copy of `cfg` whose `data.train` and `drafter.lookup_datastore` name this run's regenerated file
    instead of `regenerated` (the target's own answers: what the drafter trains on, and what prompt lookup can
    draft from), and whose `data.validation` names its regenerated validation answers instead of
    `regenerated-validation`."""
    def run_sources(sources):
        return [str(regenerated_path(cfg, run_dir)) if s == REGENERATED else s for s in sources]

    if REGENERATED_VALIDATION in cfg.data.validation and not cfg.data.regenerate.validation_prompts:
        raise ValueError("data.validation names regenerated-validation (the target's answers to held-out "
                         "prompts) and data.regenerate.validation_prompts is empty: name the prompts to "
                         "answer (e.g. [spec-bench] with validation_offset past the prompts eval reports "
                         "on), or validate on your own answers")
    check_validation_prompts(cfg)
    validation = [str(regenerated_validation_path(run_dir)) if s == REGENERATED_VALIDATION else s
                  for s in cfg.data.validation]
    data = dataclasses.replace(cfg.data, train=run_sources(cfg.data.train), validation=validation)
    drafter = dataclasses.replace(cfg.drafter, lookup_datastore=run_sources(cfg.drafter.lookup_datastore))
    return dataclasses.replace(cfg, data=data, drafter=drafter)


def check_validation_prompts(cfg) -> None:
    """Validation answers to the prompts eval reports on would choose checkpoints on the test set: refused."""
    settings, ev = cfg.data.regenerate, cfg.eval
    reported = None if ev.limit is None else ev.offset + ev.limit
    if ev.prompts in settings.validation_prompts and (reported is None
                                                      or settings.validation_offset < reported):
        raise ValueError(f"data.regenerate.validation_prompts answers {ev.prompts} from prompt "
                         f"{settings.validation_offset} on, and eval reports on its prompts {ev.offset}.."
                         f"{'the last' if reported is None else reported - 1}: validation would choose on "
                         "the prompts the run is judged on. Set data.regenerate.validation_offset to at "
                         "least "
                         + (f"{reported}" if reported is not None else
                            "eval.offset + eval.limit (with eval.limit set)"))


def run_regenerate(cfg, run_dir: Path, target=None, accelerator=None) -> None:
    """Under `accelerate launch` the hf backend splits the prompts across the ranks (each on its own device);
    backend vllm: rank 0 starts vLLM's server for the stage and drives it (`regenerate_server`)."""
    from draftsmith.distill.loading import load_target
    from draftsmith.distill.regenerate import regenerate

    check_validation_prompts(cfg)
    accelerator = accelerator or build_accelerator()
    target = target or load_target(cfg.model, device=str(accelerator.device))
    settings = cfg.data.regenerate
    jobs = [(regenerated_path(cfg, run_dir), settings, "")] if settings.prompts else []
    if settings.validation_prompts:
        prompts = validation_prompts_file(settings, run_dir, accelerator)
        # answered as eval decodes (its length and sampling), every prompt however long: eval measures them
        # all
        jobs.append((regenerated_validation_path(run_dir),
                     dataclasses.replace(settings, prompts=[str(prompts)], limit=None,
                                         max_prompt_tokens=1 << 30, max_new_tokens=cfg.eval.max_new_tokens,
                                         temperature=cfg.eval.temperature, top_p=cfg.eval.top_p),
                     " validation"))
    for out, job, which in jobs:
        with regenerate_server(cfg, target, out, accelerator.is_main_process) as server:
            if server is not None:
                job = dataclasses.replace(job, url=server.url, model=server.model)
            report = regenerate(target, job, out, cfg.data.system_prompt, progress=cfg.log.progress,
                                rank=accelerator.process_index, world=accelerator.num_processes,
                                barrier=accelerator.wait_for_everyone, engine=server and server.meta("vllm"))
        rank0_print(f"[regenerate{which}] {report.written} new conversations ({report.skipped_done} already "
                    f"done), {report.new_tokens} tokens at {report.tokens_per_s:.1f} tok/s "
                    f"({report.backend}, {'batch' if report.backend == 'hf' else 'concurrency'} "
                    f"{report.batch_size})")


def validation_prompts_file(settings, run_dir: Path, accelerator) -> Path:
    """`data.regenerate.validation_prompts` -> `validation-prompts.jsonl` in the run folder: the first turn of
    each prompt in eval's order (eval/measure/evaluate.py `select_prompts`: round-robin over categories), from
    `validation_offset` on, at most `validation_limit` -- prompts disjoint from the first `validation_offset`
    that eval reports on, from their distribution. Written by the main process; the same on every rank and
    rerun."""
    from draftsmith.eval.measure.evaluate import EvalConfig, select_prompts

    out = run_dir / "validation-prompts.jsonl"
    if accelerator.is_main_process:
        chosen, seen = [], set()
        for source in settings.validation_prompts:
            for p in select_prompts(EvalConfig(prompts=source, limit=settings.validation_limit,
                                               offset=settings.validation_offset)):
                if p["id"] not in seen:  # spec-bench holds mt-bench's ids
                    seen.add(p["id"])
                    chosen.append({"id": p["id"], "category": p["category"], "prompt": p["prompt"]})
        chosen = chosen[: settings.validation_limit]
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(p) + "\n" for p in chosen))
        tmp.replace(out)
        # answers to prompts no longer chosen (other offset) go
        answers = regenerated_validation_path(run_dir)
        if answers.is_file():
            keep = {p["id"] for p in chosen}
            lines = answers.read_text().splitlines(keepends=True)
            kept = [line for line in lines if _answer_id(line) in keep]
            if len(kept) < len(lines):
                answers.with_suffix(".tmp").write_text("".join(kept))
                answers.with_suffix(".tmp").replace(answers)
                rank0_print(f"[regenerate validation] {len(lines) - len(kept)} answers to prompts no longer "
                            "chosen (validation_offset / validation_limit changed) dropped")
    accelerator.wait_for_everyone()
    return out


def _answer_id(line: str) -> str | None:
    try:
        return str(json.loads(line)["id"])
    except (ValueError, KeyError, TypeError):
        return None  # a torn last line: regenerate's resume cuts it anyway


@contextlib.contextmanager
def regenerate_server(cfg, target, out: Path, main: bool):
    """Backend vllm, on the main process: vLLM's OpenAI server (the engine venv) serving the resolved target
    folder in the target's dtype for the length of the block, its log beside the answers; otherwise None."""
    if cfg.data.regenerate.backend != "vllm" or not main:
        yield None
        return
    from draftsmith.distill.loading import dtype_name, resolve_target
    from draftsmith.eval.measure.engine_server import engine_server, free_port, vllm_server_argv

    port, folder = free_port(), resolve_target(cfg.model.target, cfg.model.revision)
    argv = vllm_server_argv(folder, dtype_name(target.dtype), port, cfg.data.regenerate.seed)
    log = out.with_name(out.name + ".vllm.log")
    rank0_print(f"[regenerate] starting vLLM's server on port {port} ({dtype_name(target.dtype)}; log {log})")
    with engine_server("vllm", argv, port, log) as server:
        rank0_print(f"[regenerate] vLLM {server.version} serving {server.model} at {server.url}")
        yield server
