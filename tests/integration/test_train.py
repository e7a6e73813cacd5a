"""The training engine on a tiny target: loss falls, resume is exact, bad states are refused.

Integration tier (CPU, tens of seconds): the real `train` / `extract` / `pipeline` code paths on a
tiny random Llama with conversations it wrote itself, Medusa heads as the drafter.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from draftsmith.distill.features import FeatureError, extraction_cost, read_index
from draftsmith.train.config import load_config
from draftsmith.train.loop import train
from draftsmith.train.pipeline import run_extract_stage, run_pipeline
from draftsmith.train.runtime import TrainingError

ROOT = Path(__file__).resolve().parents[2]


def tiny_overrides(workspace, *extra) -> list[str]:
    """The dotted overrides of a tiny Medusa run on the workspace's target and conversations (+ `extra`)."""
    root, target, data = workspace
    return [f"model.target={target}", "model.dtype=float32", f"data.train=[{data}]", "data.max_length=160",
            "data.system_prompt=Be brief.", "data.val_fraction=0.1", "drafter.kind=medusa",
            "drafter.medusa.heads=2", "train.batch_size=4", "train.lr=3e-3", "train.log_every=1",
            "train.eval_every=0", "train.save_every=3", "train.seed=1", "train.mixed_precision=no",
            "log.progress=false", "eval.prompts=mt-bench", "eval.limit=2", "eval.max_new_tokens=8",
            "eval.warmup=0", *extra]


def make_cfg(workspace, *overrides):
    return load_config(None, tiny_overrides(workspace, *overrides))


def losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if r["split"] == "train"}


def test_loss_falls_and_drafter_is_written(workspace, tmp_path):
    out = train(make_cfg(workspace, "train.max_steps=12", "train.save_every=0"), tmp_path)
    loss = losses(tmp_path)
    assert len(loss) == 12 and sum(list(loss.values())[-3:]) < sum(list(loss.values())[:3])
    assert (out / "draftsmith.json").is_file() and (tmp_path / "config.resolved.yaml").is_file()
    summary = json.loads((tmp_path / "train_summary.json").read_text())
    assert summary["steps"] == 12 and summary["replicas_identical"]


def test_select_keeps_the_drafter_with_the_best_validation_expected_tau(workspace, tmp_path):
    from safetensors.torch import load_file

    train(make_cfg(workspace, "train.max_steps=8", "train.eval_every=2", "train.save_every=0",
                   "train.lr=3e-2", "train.select=expected_tau"), tmp_path)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    selected = json.loads((tmp_path / "train_summary.json").read_text())["selected"]
    # Medusa reports rank accuracies: the choice is by the simulated τ of its serving setting (2 heads, a
    # chain)
    assert selected["metric"] == "expected_tau_serving"
    val = {r["step"]: r["expected_tau_serving"] for r in rows if r["split"] == "validation"}
    best = max(val, key=lambda s: (val[s], -s))  # the first step reaching the highest value
    assert selected["by"] == "expected_tau" and selected["step"] == best, (val, selected)
    kept = load_file(str(tmp_path / "drafter" / "model.safetensors"))
    ref = load_file(str(tmp_path / "drafter-best" / "model.safetensors"))
    assert all(torch.equal(kept[k], ref[k]) for k in ref)
    assert (tmp_path / "drafter-last").is_dir() == (best != 8)


class Killed(Exception):
    pass


def train_until_killed(cfg, run_dir: Path, at_step: int) -> None:
    """Train `cfg` into `run_dir` and die right after the checkpoint of `at_step` is written."""
    from draftsmith.train import loop

    real_save = loop.save_checkpoint

    def save_then_die(accelerator, run_dir, step, *rest):
        path = real_save(accelerator, run_dir, step, *rest)
        if step == at_step:
            raise Killed(path)
        return path

    with pytest.MonkeyPatch.context() as patch, pytest.raises(Killed):
        patch.setattr(loop, "save_checkpoint", save_then_die)
        train(cfg, run_dir)


@pytest.mark.parametrize("optimizer", ["adamw", "muon", "adamw+group_by_length"])
def test_resume_continues_at_the_same_step_with_the_same_loss(workspace, tmp_path, monkeypatch, optimizer):
    """Muon's momentum and AdamW's moments travel in the checkpoint (train/optim.py MuonWithAdamW); with
    train.group_by_length the resumed epoch takes the same grouped order (of seed, epoch and batch)."""
    optimizer, _, grouped = optimizer.partition("+")
    full, part, opt = tmp_path / "full", tmp_path / "part", f"train.optimizer={optimizer}"
    opt = (opt, "train.group_by_length=true", "train.batch_size=2") if grouped else (opt,)
    train(make_cfg(workspace, "train.max_steps=6", *opt), full)
    train_until_killed(make_cfg(workspace, "train.max_steps=6", *opt), part, at_step=3)
    train(make_cfg(workspace, "train.max_steps=6", *opt), part, resume=True)
    a, b = losses(full), losses(part)
    assert sorted(b) == [1, 2, 3, 4, 5, 6]
    for step in (4, 5, 6):
        assert b[step] == pytest.approx(a[step], rel=1e-5), f"step {step}"
    # the summary counts the whole run, the killed process's steps included (each step once)
    whole, resumed = (json.loads((d / "train_summary.json").read_text()) for d in (full, part))
    for key in ("samples_seen", "assistant_tokens_seen", "counted_from_step"):
        assert resumed[key] == whole[key], key
    assert whole["counted_from_step"] == 0 and resumed["seconds"] > 0


def fake_clock(monkeypatch):
    """train/budget.py's clock reads 0, 10, 20, ... s: the probe measures 2 s a step (steps 2-6 take 10 s) and
    20 s gone at its decision after step 6, whatever this machine's speed."""
    from draftsmith.train import budget

    ticks = iter(range(0, 10_000, 10))
    monkeypatch.setattr(budget, "clock", lambda: float(next(ticks)))


BUDGETED = ["data.val_fraction=0", "train.max_steps=12", "train.warmup_steps=6", "train.save_every=3",
            f"train.max_minutes={(20 + 3 * 2.0 + 1) / 60}"]  # after 20 s: 7 s left = 3 more steps of 2 s


def test_a_time_budget_trains_the_steps_that_fit_as_a_run_sized_to_them(workspace, tmp_path, monkeypatch):
    """train.max_minutes fixes the step count after its probe and re-sizes the schedule: the run equals, rate
    for rate and weight for weight, the run with train.max_steps set to that count from the start."""
    from safetensors.torch import load_file

    fake_clock(monkeypatch)
    train(make_cfg(workspace, *BUDGETED), tmp_path / "budget")
    budget = json.loads((tmp_path / "budget" / "train_summary.json").read_text())["budget"]
    assert budget["step_seconds"] == 2.0 and budget["decided_at_step"] == 6 and budget["steps_cap"] == 12
    assert budget["max_steps"] == 9 and budget["bound"] == "minutes", budget
    assert sorted(losses(tmp_path / "budget")) == list(range(1, 10))
    train(make_cfg(workspace, *BUDGETED[:-1], "train.max_steps=9"), tmp_path / "sized")
    assert lr_curve(tmp_path / "budget") == pytest.approx(lr_curve(tmp_path / "sized"), rel=1e-12)
    mine, ref = (load_file(str(tmp_path / d / "drafter" / "model.safetensors")) for d in ("budget", "sized"))
    assert all(torch.equal(mine[k], ref[k]) for k in ref)


def test_resume_keeps_the_time_budgets_decision(workspace, tmp_path, monkeypatch):
    """Killed after the decision (checkpoint of step 6), the resumed run goes on to the same 9 steps with the
    same losses and rates, on a clock that would now allow far more: the decision travels in the
    checkpoint."""
    from draftsmith.train import budget

    fake_clock(monkeypatch)
    train(make_cfg(workspace, *BUDGETED), tmp_path / "full")
    fake_clock(monkeypatch)
    train_until_killed(make_cfg(workspace, *BUDGETED), tmp_path / "part", at_step=6)
    monkeypatch.setattr(budget, "clock", lambda: 0.0)  # resumed on a machine where no time passes
    train(make_cfg(workspace, *BUDGETED), tmp_path / "part", resume=True)
    a, b = losses(tmp_path / "full"), losses(tmp_path / "part")
    assert sorted(b) == list(range(1, 10))
    for step in (7, 8, 9):
        assert b[step] == pytest.approx(a[step], rel=1e-5), f"step {step}"
    assert lr_curve(tmp_path / "part")[-3:] == pytest.approx(lr_curve(tmp_path / "full")[-3:], rel=1e-12)


def test_resume_from_another_config_is_refused(workspace, tmp_path):
    train(make_cfg(workspace, "train.max_steps=3"), tmp_path)
    with pytest.raises(TrainingError, match=r"train\.lr: finished with 0\.003, now 0\.01"):
        train(make_cfg(workspace, "train.max_steps=6", "train.lr=0.01"), tmp_path, resume=True)


@pytest.mark.parametrize("tamper", ["extra file", "changed byte", "no manifest"])
def test_resume_only_from_a_checkpoint_draftsmith_recorded(workspace, tmp_path, tamper):
    """A checkpoint's files are unpickled on resume, so anything not in its manifest (sha256 per file) is
    refused before loading, naming the file."""
    train(make_cfg(workspace, "train.max_steps=3", "train.save_every=3"), tmp_path)
    ckpt = tmp_path / "checkpoints" / "step-3"
    manifest = json.loads((ckpt / "manifest.json").read_text())
    assert manifest["written_by"] == "draftsmith" and "trainer_state.json" in manifest["files"]
    if tamper == "extra file":
        (ckpt / "evil.pkl").write_bytes(b"cos\nsystem\n(S'echo owned'\ntR.")
        why = "evil.pkl: not in the manifest"
    elif tamper == "changed byte":
        victim = next(ckpt / n for n in manifest["files"] if n.startswith("optimizer"))
        data = bytearray(victim.read_bytes())
        data[len(data) // 2] ^= 0xFF
        victim.write_bytes(bytes(data))
        why = f"{victim.name}: checksum differs"
    else:
        (ckpt / "manifest.json").unlink()
        why = "no manifest.json"
    with pytest.raises(TrainingError, match=f"(?s)refusing to resume .*{why}"):
        train(make_cfg(workspace, "train.max_steps=6", "train.save_every=3"), tmp_path, resume=True)


def test_nan_loss_stops_naming_the_step_and_keeps_the_checkpoint(workspace, tmp_path, monkeypatch):
    from draftsmith.heads import medusa

    real = medusa.MedusaHeads.compute_loss
    calls = {"n": 0}

    def poisoned(self, batch):
        calls["n"] += 1
        loss, metrics = real(self, batch)
        return (loss * float("nan"), metrics) if calls["n"] == 5 else (loss, metrics)

    monkeypatch.setattr(medusa.MedusaHeads, "compute_loss", poisoned)
    with pytest.raises(TrainingError, match=r"non-finite loss .* at step 5.*step-3"):
        train(make_cfg(workspace, "train.max_steps=8"), tmp_path)
    assert (tmp_path / "checkpoints" / "step-3" / "COMPLETE").is_file()
    assert not (tmp_path / "checkpoints" / "step-6").exists()


def test_offline_shards_train_and_a_bad_checksum_is_named(workspace, tmp_path):
    cfg = make_cfg(workspace, "extract.enabled=true", "extract.top_k_logits=16", "extract.shard_size=8",
                   "train.max_steps=4", "train.save_every=0")
    run_extract_stage(cfg, tmp_path)
    index = read_index(tmp_path / "features" / "train")
    assert index.feature_keys == ["final"] and index.top_k_logits == 16 and len(index.shards) >= 5
    # every shard records what extracting it took, in the shard itself: a resumed extraction sums them all
    assert sorted(index.shard_cost) == sorted(index.shards)
    assert all(c["seconds"] > 0 and c["processes"] == 1 and c["threads"] >= 1
               for c in index.shard_cost.values())
    first, last = sorted(index.shards)[0], sorted(index.shards)[-1]
    (tmp_path / "features" / "train" / last).unlink()
    run_extract_stage(cfg, tmp_path)
    again = read_index(tmp_path / "features" / "train")
    assert again.shard_cost[first] == index.shard_cost[first]
    assert sorted(again.shard_cost) == sorted(again.shards)
    cost = extraction_cost(tmp_path / "features" / "train")["wall_seconds"]
    assert cost == pytest.approx(sum(c["seconds"] for c in again.shard_cost.values()), abs=1e-2)
    train(cfg, tmp_path)
    assert len(losses(tmp_path)) == 4
    # the data changed since extraction (fewer conversations): one error naming the folder and the fix, no
    # training
    fewer = make_cfg(workspace, "extract.enabled=true", f"extract.out={tmp_path / 'features'}",
                     "train.max_steps=4", f"data.limit={index.num_sequences - 3}", "train.save_every=0")
    with pytest.raises(TrainingError,
                       match=rf"features/train holds features of {index.num_sequences} sequences and the "
                             r"data gives \d+: the data changed.*extract again"):
        train(fewer, tmp_path / "changed")
    # the same count of other tokens (another system prompt): the fingerprint the extraction recorded names it
    assert len(index.data_fingerprint) == 64
    other = make_cfg(workspace, "extract.enabled=true", f"extract.out={tmp_path / 'features'}",
                     "train.max_steps=4", "data.system_prompt=Answer briefly.", "train.save_every=0")
    with pytest.raises(TrainingError,
                       match=r"features/train holds features of other sequences than the data gives \(the "
                             r"same count.*extract again"):
        train(other, tmp_path / "other")
    shard = tmp_path / "features" / "train" / sorted(index.shards)[1]
    shard.write_bytes(shard.read_bytes()[:-8] + b"corrupt!")
    with pytest.raises(FeatureError, match=shard.name + ".*checksum"):
        read_index(tmp_path / "features" / "train")
    (tmp_path / "features" / "train" / "index.json").write_text(
        json.dumps(dict(json.loads((tmp_path / "features" / "train" / "index.json").read_text()),
                        schema_version=99)))
    with pytest.raises(FeatureError, match="schema version 99"):
        read_index(tmp_path / "features" / "train")


def test_float8_features_are_half_the_disk_and_train(workspace, tmp_path):
    """extract.dtype float8_e4m3: e4m3 hidden states with a per-row scale, read back as bfloat16 close to the
    bfloat16 extraction of the same sequences; the folder is smaller and offline training runs on it."""
    from draftsmith.distill.features import FeatureStore

    folders = {}
    for dtype in ("bfloat16", "float8_e4m3"):
        cfg = make_cfg(workspace, "extract.enabled=true", "extract.top_k_logits=4", "extract.shard_size=8",
                       f"extract.dtype={dtype}", "train.max_steps=2", "train.save_every=0")
        run_extract_stage(cfg, tmp_path / dtype)
        folders[dtype] = tmp_path / dtype / "features" / "train"
    train(cfg, tmp_path / "float8_e4m3")
    assert len(losses(tmp_path / "float8_e4m3")) == 2
    size = {d: sum(p.stat().st_size for p in f.glob("shard-*")) for d, f in folders.items()}
    # the tiny target's H is 64: (64 + 4 + 29) / (128 + 29)
    assert size["float8_e4m3"] < 0.8 * size["bfloat16"]
    ref, fp8 = FeatureStore(folders["bfloat16"]), FeatureStore(folders["float8_e4m3"])
    assert fp8.index.dtype == "float8_e4m3" and len(ref) == len(fp8)
    for i in range(len(ref)):
        a, b = ref[i]["hidden"]["final"].float(), fp8[i]["hidden"]["final"]
        assert b.dtype == torch.bfloat16 and b.shape == a.shape
        assert ((b.float() - a).abs() <= a.abs() * 2 ** -3 + a.abs().amax(-1, keepdim=True) * 2 ** -9).all()
        assert torch.equal(ref[i]["topk_indices"], fp8[i]["topk_indices"])


def test_pipeline_runs_every_stage_then_skips_them(workspace, tmp_path, capsys):
    cfg = make_cfg(workspace, "train.max_steps=3", "export.formats=[medusa,medusa-vllm]",
                   "eval.dtype=float32", "drafter.tree_nodes=4")
    summary = run_pipeline(cfg, tmp_path)
    assert summary["greedy_equal"] is True and summary["n_prompts"] == 2
    assert json.loads((tmp_path / "drafter" / "tree.json").read_text())["nodes"] == 4  # tree-opt stage
    assert summary["tree"] == "tree-opt-4"  # the serving tree the folder records (draftsmith.json "tree")
    assert json.loads((tmp_path / "drafter" / "draftsmith.json").read_text())["tree"]["file"] == "tree.json"
    for fmt in ("medusa", "medusa-vllm"):
        assert (tmp_path / "export" / fmt / "config.json").is_file()
    run_pipeline(cfg, tmp_path)
    assert capsys.readouterr().out.count("complete, skipped") >= 4
    from draftsmith.train.cli import main

    assert main(["tree-opt", "--run", str(tmp_path), "--nodes", "6", "--ranks", "3"]) == 0
    tree = json.loads((tmp_path / "tree-opt-6.json").read_text())
    assert tree["nodes"] == 6 and tree["expected_tau"] >= 1.0
    assert main(["report", str(tmp_path / "eval"), "--out", str(tmp_path / "report")]) == 0
    report = (tmp_path / "report" / "report.md").read_text()
    assert "acceptance_by_depth.png" in report and (tmp_path / "report" / "tau_by_category.png").is_file()
    assert main(["report", str(tmp_path / "nowhere"), "--out", str(tmp_path / "r2")]) == 2


def test_pipeline_plans_the_serving_settings_and_evals_with_them(workspace, tmp_path, capsys):
    """plan.enabled: after the recipe's eval, a plan on calibration prompts disjoint from eval's, written into
    the drafter folder, and a second eval served with it; the first eval keeps the recipe's settings."""
    cfg = make_cfg(workspace, "train.max_steps=2", "eval.dtype=float32", "export.formats=[]",
                   # margin -1: always speculate
                   "plan.enabled=true", "plan.calibration=2", "plan.max_new_tokens=4", "plan.margin=-1.0",
                   "plan.contexts=[16,64]")
    summary = run_pipeline(cfg, tmp_path)
    plan = json.loads((tmp_path / "drafter" / "serving.json").read_text())
    assert (plan["calibration"]["offset"] == 240 and len(plan["candidates"]) >= 3
            and not plan["chosen"]["plain"])
    assert set(plan["verify_cost_ms_by_context"]) == {"16", "64"}  # plan.contexts reaches the plan
    assert set(summary["step_ms"]) == {"draft", "verify", "accept"}  # eval's measured split of a step's time
    planned = json.loads((tmp_path / "eval-plan" / "summary.json").read_text())
    assert planned["greedy_equal"] is True and summary["greedy_equal"] is True
    assert summary["tree"] == "chain-2"  # the recipe's: a chain over the 2 heads
    chosen = plan["candidates"][[r["label"] for r in plan["candidates"]].index(plan["chosen"]["label"])]
    assert planned["tree"] == chosen["tree"]  # the second eval served what the plan chose
    assert planned["served_by_plan"] and not summary["served_by_plan"]
    # the plan's choice rests on timings (any candidate may win on a loaded machine): a hybrid adds "+ lookup"
    # and prompt lookup alone serves no Medusa at all
    hybrid = bool(chosen["settings"].get("lookup_branch"))
    alone = chosen["settings"].get("num_speculative_tokens") == 0
    expected = summary["drafter"].replace("Medusa", "prompt lookup" if alone else "Medusa + lookup" if hybrid
                                          else "Medusa", 1)
    assert planned["drafter"] == expected + " · plan" and "/" not in summary["drafter"]
    record = json.loads((tmp_path / "pipeline.json").read_text())
    assert record["eval_plan"].endswith("eval-plan/summary.json")
    run_pipeline(cfg, tmp_path)
    assert "[pipeline] plan: complete, skipped" in capsys.readouterr().out


def test_medusa2_trains_lora_jointly_and_serves_with_the_merged_target(workspace, tmp_path):
    cfg = make_cfg(workspace, "drafter.medusa.lora_rank=4", "train.max_steps=6", "train.save_every=0",
                   "eval.dtype=float32")
    summary = run_pipeline(cfg, tmp_path)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines() if '"train"' in x]
    assert all("keep_kl" in r and "heads_loss" in r for r in rows)
    assert rows[-1]["heads_loss"] < rows[0]["heads_loss"] and rows[-1]["keep_kl"] > 0  # the LoRA moved
    drafter = tmp_path / "drafter"
    meta = json.loads((drafter / "draftsmith.json").read_text())
    assert meta["serve_target"] == "target" and (drafter / "lora" / "adapter_config.json").is_file()
    assert (drafter / "target" / "config.json").is_file()
    assert summary["target"] == str(drafter / "target") and summary["greedy_equal"] is True


TWO_PROCESS_ARGS = ["model.dtype=float32", "data.max_length=160", "data.system_prompt=Be brief.",
                    "drafter.kind=medusa", "drafter.medusa.heads=2", "train.batch_size=2",
                    "train.max_steps=6", "train.lr=3e-3", "train.log_every=1", "train.save_every=3",
                    "train.eval_every=0", "train.mixed_precision=no", "train.warmup_steps=2",
                    "log.progress=false"]


def lr_curve(run_dir: Path) -> list[float]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["lr"] for r in rows if r["split"] == "train"]


def run_two_processes(workspace, out: Path, launcher: list[str], *extra: str, env: dict | None = None,
                      steps: int = 6) -> dict:
    """Train `steps` steps (6 unless `extra` sets train.max_steps) with two CPU processes under `launcher`;
    returns train_summary.json after checks, among them: the learning rate at every step equals a one-process
    run's with the same schedule, and the saved drafter equals, tensor for tensor, a one-process run that
    accumulates the same two micro-batches (rank r's batch of a step is the one-process run's micro-batch r,
    so only summation order differs)."""
    from safetensors.torch import load_file

    root, target, data = workspace
    with socket.socket() as sock:  # a free port: parallel runs must not meet on torchrun's default
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    other_kind = any(e.startswith("drafter.kind=") for e in extra)  # then Medusa's own setting goes
    args = [f"model.target={target}", f"data.train=[{data}]",
            *[a for a in TWO_PROCESS_ARGS if not (other_kind and a.startswith("drafter.medusa."))], *extra]
    cmd = [sys.executable, "-m", *[port if a == "PORT" else a for a in launcher],
           "-m", "draftsmith.train", "train", "--out", str(out), *args]
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="offline", **(env or {}))
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["replicas_identical"] in (True, None), summary
    # 2 ranks x 2 per step
    assert summary["samples_seen"] == steps * 2 * 2 and summary["samples_per_step"] == 4
    assert (out / "checkpoints" / f"step-{steps}" / "COMPLETE").is_file()
    loss = losses(out)
    assert list(loss.values())[-1] < list(loss.values())[0]
    one = [a for a in args if not a.startswith("train.deepspeed")]
    single = out.parent / f"{out.name}-one-process"
    train(load_config(None, one), single)
    assert lr_curve(out) == pytest.approx(lr_curve(single), rel=1e-9), (lr_curve(out), lr_curve(single))
    assert json.loads((single / "train_summary.json").read_text())["samples_per_step"] == 2
    accumulated = out.parent / f"{out.name}-one-process-accumulated"
    train(load_config(None, [*one, "train.grad_accum=2"]), accumulated)
    mine, ref = (load_file(str(d / "drafter" / "model.safetensors")) for d in (out, accumulated))
    assert mine.keys() == ref.keys()
    for name in ref:  # fp32, 6 steps: a different summation order moves the last bits only
        assert torch.allclose(mine[name], ref[name], rtol=1e-5, atol=1e-6), name
    return summary


@pytest.mark.parametrize("schedule", ["cosine", "linear", "cosine+max_minutes", "cosine+group_by_length"])
def test_two_process_ddp_ends_with_identical_weights(workspace, tmp_path, schedule):
    """`accelerate launch --multi_gpu --num_processes 2` on CPU really runs two gloo processes. With a time
    budget (one that does not bind: 9 steps fit in an hour anywhere) both ranks time the probe, take the
    slowest rank's figures and decide the same step count, so the run still equals the one-process runs. With
    train.group_by_length the order depends on the micro-batch size alone, so rank r still takes the
    one-process run's micro-batch r."""
    extra = [f"train.schedule={schedule.split('+')[0]}"]
    if "group_by_length" in schedule:
        extra.append("train.group_by_length=true")
    if "max_minutes" in schedule:
        extra += ["train.max_steps=9", "train.max_minutes=60"]
    summary = run_two_processes(workspace, tmp_path / "two", [
        "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--main_process_port", "PORT",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"], *extra,
        steps=9 if "max_minutes" in schedule else 6)
    assert summary["distributed_type"] == "MULTI_CPU" and summary["sharded"] is False
    if "max_minutes" in schedule:
        assert summary["budget"]["decided_at_step"] == 6 and summary["budget"]["max_steps"] == 9, (
            summary["budget"])


TORCHRUN = ["torch.distributed.run", "--nproc_per_node", "2", "--master_port", "PORT"]


def test_deepspeed_zero2_two_cpu_processes(workspace, tmp_path):
    """ZeRO-2 through our own entry point on CPU (torchrun + gloo; see runtime.build_accelerator)."""
    summary = run_two_processes(workspace, tmp_path / "two", TORCHRUN,
                                f"train.deepspeed={ROOT / 'configs/deepspeed/zero2.json'}")
    assert summary["distributed_type"] == "DEEPSPEED"


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_deepspeed_zero3_saves_the_gathered_drafter(workspace, tmp_path, kind):
    """ZeRO-3 with every parameter partitioned (persistence threshold 0): the target loads whole, the final
    save gathers through accelerator.get_state_dict, and equals the one-process drafter."""
    zero3 = json.loads((ROOT / "configs/deepspeed/zero3.json").read_text())
    zero3["zero_optimization"]["stage3_param_persistence_threshold"] = 0  # even tiny tensors are sharded
    path = tmp_path / "zero3.json"
    path.write_text(json.dumps(zero3))
    summary = run_two_processes(workspace, tmp_path / "two", TORCHRUN, f"train.deepspeed={path}",
                                *KIND_ARGS[kind])
    assert summary["distributed_type"] == "DEEPSPEED" and summary["sharded"] is True


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_fsdp2_two_cpu_processes(workspace, tmp_path, kind):
    """`accelerate launch --use_fsdp --fsdp_version 2` on CPU: FSDP2 (fully_shard) over gloo, not a silent
    DDP."""
    summary = run_two_processes(workspace, tmp_path / "two", [
        "accelerate.commands.launch", "--use_fsdp", "--fsdp_version", "2", "--num_processes", "2",
        "--main_process_port", "PORT", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend",
        "no"], *KIND_ARGS[kind])
    assert summary["distributed_type"] == "FSDP" and summary["sharded"] is True


# eagle: frozen target copies beside trained layers
KIND_ARGS = {"medusa": [], "eagle": ["drafter.kind=eagle"]}


def test_two_process_regeneration_equals_one_process(workspace, tmp_path):
    """`torchrun --nproc_per_node 2 -m draftsmith.train regenerate`: each rank answers half, rank 0 merges;
    the file holds the one-process run's answers (greedy), each id once."""
    from draftsmith.distill.data import RegenerateConfig
    from draftsmith.distill.loading import load_target
    from draftsmith.distill.regenerate import regenerate

    root, target, data = workspace
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    args = [f"model.target={target}", "model.dtype=float32", f"data.regenerate.prompts=[{data}]",
            "data.regenerate.limit=10", "data.regenerate.max_new_tokens=4", "data.regenerate.batch_size=3",
            "log.progress=false"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", port,
           "-m", "draftsmith.train", "regenerate", "--out", str(tmp_path / "two"), *args]
    result = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"),
                            cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[regenerate] 5 new conversations" in result.stdout, result.stdout  # rank 0 answered its half
    two = [json.loads(x) for x in (tmp_path / "two" / "regenerated.jsonl").read_text().splitlines()]
    one_path = tmp_path / "one.jsonl"
    regenerate(load_target(str(target), dtype="float32"), RegenerateConfig(
        prompts=[str(data)], limit=10, max_new_tokens=4, batch_size=3), one_path, progress=False)
    one = [json.loads(x) for x in one_path.read_text().splitlines()]
    assert len(two) == 10 and {r["id"] for r in two} == {r["id"] for r in one}
    assert {r["id"]: r for r in two} == {r["id"]: r for r in one}
    assert not list((tmp_path / "two").glob("*.part"))
